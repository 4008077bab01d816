//! `agent-reach console` (a short-lived sign-in link to the router's
//! operator console) and `agent-reach requests …` (the router's recent
//! calls: `show ID`, `list`), over the same JSON API the console's page
//! uses (`docs/console.md`). The token must name an `operators:` caller.

use anyhow::Context;
use serde_json::{json, Value};

use crate::connection::{print_json, text, Connection};

#[derive(Debug, clap::Args)]
pub struct ConsoleArgs {
    /// How long the link signs in, in seconds (1-600); the session it opens lasts 8 h.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub ttl: u64,
}

#[derive(Debug, clap::Subcommand)]
pub enum RequestsCommand {
    /// One call by its request id: route, attempts and instances, durations, outcome, trace id, and its task.
    Show {
        request_id: String,
        /// The caller that submitted it (finds a task before any delivery of it ended).
        #[arg(long)]
        caller: Option<String>,
    },
    /// The router's recent calls, newest first.
    List {
        /// Failed calls only.
        #[arg(long)]
        failed: bool,
        /// Calls of this capability only.
        #[arg(long)]
        capability: Option<String>,
        /// At most this many (1-1000).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=1000))]
        limit: u16,
    },
}

/// `agent-reach console`: prints the sign-in link.
pub async fn console(connection: &Connection, args: ConsoleArgs) -> anyhow::Result<()> {
    let url = format!("{}/v1/console/links", connection.router);
    let response = reqwest::Client::new()
        .post(&url)
        .bearer_auth(connection.token()?)
        .json(&json!({ "ttl_s": args.ttl }))
        .send()
        .await
        .with_context(|| format!("cannot reach {url}"))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .with_context(|| format!("{url} answered {status} without JSON"))?;
    if !status.is_success() {
        anyhow::bail!(
            "{status}: {} {}",
            text(&body["error"]["code"]),
            text(&body["error"]["message"])
        );
    }
    let link = format!("{}{}", connection.router.trim_end_matches('/'), text(&body["path"]));
    if connection.json {
        return print_json(
            &json!({ "url": link, "operator": body["operator"], "expires_at_ms": body["expires_at_ms"] }),
        );
    }
    outln!(
        "Open this link within {} s to sign in to the console as {}:",
        args.ttl,
        text(&body["operator"])
    );
    outln!("{link}");
    Ok(())
}

/// A path segment the router takes as a request id (1-128 characters, no `/`, `?` or `#`).
fn segment(id: &str) -> anyhow::Result<String> {
    anyhow::ensure!(
        !id.is_empty() && id.len() <= 128 && !id.contains(['/', '?', '#', '%', ' ']),
        "`{id}` is not a request id (1-128 characters without / ? # % or spaces)"
    );
    Ok(id.to_string())
}

/// `agent-reach requests …`.
pub async fn requests(connection: &Connection, command: RequestsCommand) -> anyhow::Result<()> {
    match command {
        RequestsCommand::Show { request_id, caller } => {
            let mut url = format!("{}/v1/requests/{}", connection.router, segment(&request_id)?);
            if let Some(caller) = caller {
                url.push_str(&format!("?caller={}", segment(&caller)?));
            }
            let found = connection.get(url).await?;
            if connection.json {
                return print_json(&found);
            }
            for call in found["calls"].as_array().into_iter().flatten() {
                let outcome = match &call["error"] {
                    Value::Null => "succeeded".to_string(),
                    error => format!("failed {} {}", text(&error["code"]), text(&error["message"])),
                };
                outln!("request   {}", text(&call["request_id"]));
                outln!(
                    "route     {} {} ({})",
                    text(&call["capability"]),
                    text(&call["capability_version"]),
                    text(&call["entry"])
                );
                outln!("caller    {}", text(&call["caller"]));
                outln!("outcome   {outcome}");
                outln!("duration  {} ms", text(&call["duration_ms"]));
                outln!("trace id  {}", text(&call["trace_id"]));
                for attempt in call["attempts"].as_array().into_iter().flatten() {
                    outln!(
                        "  attempt {} {:<24} {:>9} ms  {}",
                        text(&attempt["attempt"]),
                        text(&attempt["agent_id"]),
                        text(&attempt["duration_ms"]),
                        text(&attempt["outcome"])
                    );
                }
            }
            if !found["task"].is_null() {
                outln!(
                    "task      {} {}",
                    text(&found["task"]["task_id"]),
                    text(&found["task"]["status"])
                );
            }
            Ok(())
        }
        RequestsCommand::List {
            failed,
            capability,
            limit,
        } => {
            let mut url = format!("{}/v1/requests?limit={limit}", connection.router);
            if failed {
                url.push_str("&outcome=failed");
            }
            if let Some(capability) = capability {
                url.push_str(&format!("&capability={}", segment(&capability)?));
            }
            let list = connection.get(url).await?;
            if connection.json {
                return print_json(&list);
            }
            outln!(
                "{:<36} {:<24} {:<10} {:>9} CODE",
                "REQUEST_ID",
                "CAPABILITY",
                "OUTCOME",
                "MS"
            );
            for call in list["calls"].as_array().into_iter().flatten() {
                outln!(
                    "{:<36} {:<24} {:<10} {:>9} {}",
                    text(&call["request_id"]),
                    text(&call["capability"]),
                    text(&call["outcome"]),
                    text(&call["duration_ms"]),
                    text(&call["error"]["code"])
                );
            }
            Ok(())
        }
    }
}
