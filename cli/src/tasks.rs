//! `agent-reach tasks …`: the slow path's operator verbs against a running
//! router (with `--redis`): dead-lettered callbacks listed, shown and
//! replayed. The token must name an `operators:` caller of `acl.yaml`.

use anyhow::Context;
use serde_json::Value;

use crate::connection::{print_json, text, Connection};

#[derive(Debug, clap::Subcommand)]
pub enum TasksCommand {
    /// Callbacks that could not be delivered (five attempts failed): list them,
    /// show one (--show ID) or send one again from its first attempt (--replay ID).
    DeadLetters {
        /// Send this dead letter's callback again (the usual retry schedule follows).
        #[arg(long, value_name = "ID", conflicts_with = "show")]
        replay: Option<String>,
        /// Show this dead letter with the result it holds.
        #[arg(long, value_name = "ID")]
        show: Option<String>,
        /// List at most this many (oldest first, 1-1000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
        limit: u16,
    },
}

pub async fn tasks(connection: &Connection, command: TasksCommand) -> anyhow::Result<()> {
    let TasksCommand::DeadLetters { replay, show, limit } = command;
    let base = format!("{}/v1/dead-letters", connection.router);
    if let Some(id) = replay {
        let url = format!("{base}/{}", path_segment(&id)?);
        let replayed = post(connection, format!("{url}/replay")).await?;
        if connection.json {
            return print_json(&replayed);
        }
        outln!(
            "dead letter {id} replayed: the callback of task {} is due now",
            text(&replayed["task_id"])
        );
        return Ok(());
    }
    if let Some(id) = show {
        let letter = connection.get(format!("{base}/{}", path_segment(&id)?)).await?;
        return print_json(&letter);
    }
    let list = connection.get(format!("{base}?limit={limit}")).await?;
    if connection.json {
        return print_json(&list);
    }
    outln!("{:<18} {:<28} {:<36} ERROR", "ID", "TASK_ID", "URL");
    for letter in list["dead_letters"].as_array().into_iter().flatten() {
        outln!(
            "{:<18} {:<28} {:<36} {}",
            text(&letter["id"]),
            text(&letter["task_id"]),
            text(&letter["url"]),
            text(&letter["error"])
        );
    }
    let shown = list["dead_letters"].as_array().map_or(0, Vec::len);
    outln!("{shown} shown of {} parked", text(&list["total"]));
    Ok(())
}

/// A dead letter id as the router hands them out (`MS-SEQ`), safe in a path.
fn path_segment(id: &str) -> anyhow::Result<&str> {
    let valid = id.split_once('-').is_some_and(|(ms, seq)| {
        !ms.is_empty() && !seq.is_empty() && (ms.bytes().chain(seq.bytes())).all(|byte| byte.is_ascii_digit())
    });
    anyhow::ensure!(
        valid,
        "`{id}` is not a dead letter id (MS-SEQ, e.g. 1700000000000-0; `agent-reach tasks dead-letters` lists them)"
    );
    Ok(id)
}

async fn post(connection: &Connection, url: String) -> anyhow::Result<Value> {
    let response = reqwest::Client::new()
        .post(&url)
        .bearer_auth(connection.token()?)
        .send()
        .await
        .with_context(|| format!("cannot reach {url}"))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .with_context(|| format!("{url} answered {status} without JSON"))?;
    if !status.is_success() {
        anyhow::bail!("{status}: {}", body["error"]);
    }
    Ok(body)
}
