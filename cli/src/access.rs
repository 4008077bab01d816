//! `agent-reach access …` (DESIGN §2.11): access requests against a running
//! registry: file one, list them and the live grants, approve or deny (an
//! approver `owners:` names), revoke a grant, export the grants as
//! `permissions` entries to fold into `acl.yaml`; and `agent-reach acl
//! check`, which shows the live grants beside the file's verdict.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};

use crate::canary::{send, success};
use crate::connection::{print_json, text, Connection};

#[derive(Debug, clap::Subcommand)]
pub enum AccessCommand {
    /// Ask to call CAPABILITY (as the token's caller, or `--as` another when an
    /// operator); the capability's approvers (`owners:` in acl.yaml) decide.
    Request {
        /// The capability to call, e.g. order.query.
        #[arg(long)]
        capability: String,
        /// Why: shown to the approvers and kept with the request.
        #[arg(long)]
        reason: String,
        /// Ask for another caller (operators only).
        #[arg(long = "as", value_name = "CALLER")]
        caller: Option<String>,
        /// The grant's life once approved, e.g. 30m, 24h, 7d (none: until revoked).
        #[arg(long, value_parser = crate::parse_duration)]
        ttl: Option<Duration>,
    },
    /// The requests the token may see (its own; every one of the capabilities
    /// it approves; all for operators), then the live grants.
    Ls {
        /// Only requests in this status.
        #[arg(long, value_parser = ["pending", "approved", "denied", "revoked", "expired"])]
        status: Option<String>,
    },
    /// Approve a pending request (its capability's approvers): the grant reaches every router.
    Approve {
        id: String,
        /// A note kept with the decision.
        #[arg(long)]
        note: Option<String>,
    },
    /// Deny a pending request (its capability's approvers).
    Deny {
        id: String,
        /// A note kept with the decision (why, for the requester).
        #[arg(long)]
        note: Option<String>,
    },
    /// Revoke a grant (by its id, or its request's): every router refuses its calls at once.
    Revoke { id: String },
    /// Print the live grants as `permissions` entries for acl.yaml (GitOps):
    /// fold them into the file, then revoke the grants.
    Export {
        /// Only this caller's grants.
        #[arg(long)]
        caller: Option<String>,
    },
}

#[derive(Debug, clap::Args)]
pub struct AclCheckArgs {
    /// The policy file.
    #[arg(long, env = "AGENT_REACH_ACL", default_value = "acl.yaml")]
    pub acl: PathBuf,
    #[arg(long)]
    pub caller: String,
    #[arg(long)]
    pub capability: String,
    /// The registry whose live grants are shown beside the file (with a token).
    #[arg(long, env = "AGENT_REACH_REGISTRY", default_value = "http://127.0.0.1:7400")]
    pub registry: String,
    /// A token to read the registry's grants with; without one, the file alone is checked.
    #[arg(long, env = "AGENT_REACH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// A request or grant id as the registry hands them out, safe in a path.
fn id_segment(id: &str) -> anyhow::Result<&str> {
    let valid = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_');
    anyhow::ensure!(
        valid,
        "`{id}` is not an access request or grant id (e.g. ar-1f2e…, gr-9a8b…)"
    );
    Ok(id)
}

/// "in 59m", "3s ago": a time relative to now, for people.
fn relative(epoch_ms: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64);
    let (seconds, future) = if epoch_ms >= now {
        ((epoch_ms - now) / 1000, true)
    } else {
        ((now - epoch_ms) / 1000, false)
    };
    let span = match seconds {
        0..=119 => format!("{seconds}s"),
        120..=7199 => format!("{}m", seconds / 60),
        7200..=172_799 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    };
    if future {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

fn expiry(value: &Value) -> String {
    value.as_u64().map_or_else(|| "never".to_string(), relative)
}

pub async fn access(connection: &Connection, command: AccessCommand) -> anyhow::Result<()> {
    let requests = format!("{}/v1/access-requests", connection.registry);
    let client = reqwest::Client::new();
    match command {
        AccessCommand::Request {
            capability,
            reason,
            caller,
            ttl,
        } => {
            let mut body = json!({ "capability": capability, "reason": reason });
            if let Some(caller) = caller {
                body["caller"] = json!(caller);
            }
            if let Some(ttl) = ttl {
                body["ttl_s"] = json!(ttl.as_secs());
            }
            let (status, answer) = send(connection, client.post(&requests).json(&body), &requests).await?;
            let filed = success((status, answer))?;
            if connection.json {
                return print_json(&filed);
            }
            let approvers: Vec<String> = filed["approvers"].as_array().into_iter().flatten().map(text).collect();
            outln!(
                "{} {}: `{}` asks to call `{}`; approvers: {}",
                if status == reqwest::StatusCode::CREATED {
                    "filed"
                } else {
                    "already pending"
                },
                text(&filed["id"]),
                text(&filed["caller"]),
                text(&filed["capability"]),
                approvers.join(", ")
            );
            Ok(())
        }
        AccessCommand::Ls { status } => {
            let query = status.map(|status| format!("?status={status}")).unwrap_or_default();
            let list = connection.get(format!("{requests}{query}")).await?;
            let grants = connection.get(format!("{}/v1/grants", connection.registry)).await?;
            if connection.json {
                return print_json(&json!({ "requests": list["requests"], "grants": grants["grants"] }));
            }
            outln!(
                "{:<20} {:<9} {:<18} {:<24} {:<14} {:<14} REASON",
                "REQUEST",
                "STATUS",
                "CALLER",
                "CAPABILITY",
                "APPROVERS",
                "DECIDED_BY"
            );
            for request in list["requests"].as_array().into_iter().flatten() {
                let approvers: Vec<String> = request["approvers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(text)
                    .collect();
                outln!(
                    "{:<20} {:<9} {:<18} {:<24} {:<14} {:<14} {}",
                    text(&request["id"]),
                    text(&request["status"]),
                    text(&request["caller"]),
                    text(&request["capability"]),
                    if approvers.is_empty() {
                        "-".to_string()
                    } else {
                        approvers.join(",")
                    },
                    text(&request["decided_by"]),
                    text(&request["reason"])
                );
            }
            outln!();
            print_grants(&grants);
            Ok(())
        }
        AccessCommand::Approve { id, note } => decide(connection, &id, "approve", note).await,
        AccessCommand::Deny { id, note } => decide(connection, &id, "deny", note).await,
        AccessCommand::Revoke { id } => {
            let mut grant = id_segment(&id)?.to_string();
            if grant.starts_with("ar-") {
                // A request's id: revoke the grant it was approved into.
                let request = connection.get(format!("{requests}/{grant}")).await?;
                grant = request["grant_id"]
                    .as_str()
                    .with_context(|| format!("request {id} is {}: it has no grant", text(&request["status"])))?
                    .to_string();
            }
            let url = format!("{}/v1/grants/{grant}", connection.registry);
            success(send(connection, client.delete(&url), &url).await?)?;
            if connection.json {
                return print_json(&json!({ "grant_id": grant, "revoked": true }));
            }
            outln!("revoked {grant}: every router refuses its calls now");
            Ok(())
        }
        AccessCommand::Export { caller } => {
            let query = caller.map(|caller| format!("?caller={caller}")).unwrap_or_default();
            let grants = connection
                .get(format!("{}/v1/grants{query}", connection.registry))
                .await?;
            if connection.json {
                return print_json(&grants);
            }
            outln!("{}", export_yaml(&grants, &connection.registry));
            Ok(())
        }
    }
}

async fn decide(connection: &Connection, id: &str, verb: &str, note: Option<String>) -> anyhow::Result<()> {
    let url = format!("{}/v1/access-requests/{}/{verb}", connection.registry, id_segment(id)?);
    let body = note.map_or_else(|| json!({}), |note| json!({ "note": note }));
    let request = reqwest::Client::new().post(&url).json(&body);
    let decided = success(send(connection, request, &url).await?)?;
    if connection.json {
        return print_json(&decided);
    }
    match decided["grant_id"].as_str() {
        Some(grant) => outln!(
            "approved {id}: `{}` may call `{}` (grant {grant}, expires {})",
            text(&decided["caller"]),
            text(&decided["capability"]),
            expiry(&decided["expires_at_ms"])
        ),
        None => outln!(
            "denied {id}: `{}` may not call `{}`",
            text(&decided["caller"]),
            text(&decided["capability"])
        ),
    }
    Ok(())
}

fn print_grants(grants: &Value) {
    outln!(
        "{:<20} {:<18} {:<24} {:<14} {:<12} REQUEST",
        "GRANT",
        "CALLER",
        "CAPABILITY",
        "GRANTED_BY",
        "EXPIRES"
    );
    for grant in grants["grants"].as_array().into_iter().flatten() {
        outln!(
            "{:<20} {:<18} {:<24} {:<14} {:<12} {}",
            text(&grant["id"]),
            text(&grant["caller"]),
            text(&grant["capability"]),
            text(&grant["granted_by"]),
            expiry(&grant["expires_at_ms"]),
            text(&grant["request_id"])
        );
    }
}

/// The grants as acl.yaml `permissions` entries, one per caller, each
/// capability with the grant it comes from in a comment.
fn export_yaml(grants: &Value, registry: &str) -> String {
    let mut by_caller: std::collections::BTreeMap<String, Vec<&Value>> = std::collections::BTreeMap::new();
    for grant in grants["grants"].as_array().into_iter().flatten() {
        by_caller.entry(text(&grant["caller"])).or_default().push(grant);
    }
    let mut yaml = format!(
        "# Live access grants of the registry at {registry}, as acl.yaml permissions.\n\
         # Fold them into the file's `permissions:`, then revoke the grants\n\
         # (`agent-reach access revoke ID`); grants that expire are marked.\n\
         permissions:\n"
    );
    if by_caller.is_empty() {
        yaml.push_str("  []  # no live grant\n");
    }
    for (caller, grants) in by_caller {
        yaml.push_str(&format!("  - caller: {caller}\n    allow:\n"));
        for grant in grants {
            let expires = match grant["expires_at_ms"].as_u64() {
                Some(at) => format!(", expires {} (epoch ms {at})", relative(at)),
                None => String::new(),
            };
            yaml.push_str(&format!(
                "      - {}  # grant {}, approved by {}{expires}\n",
                text(&grant["capability"]),
                text(&grant["id"]),
                text(&grant["granted_by"])
            ));
        }
    }
    yaml.trim_end().to_string()
}

/// `acl check`: the file's verdict, and the registry's live grants for the
/// pair when a token can read them. Exit code 0 when either allows, 1 otherwise.
pub async fn acl_check(args: &AclCheckArgs, json: bool) -> anyhow::Result<()> {
    let acl = agent_reach_access::Acl::load(&args.acl)?;
    let by_file = acl.may_call(&args.caller, &args.capability);
    let grants = match &args.token {
        None => None,
        Some(token) => {
            let url = format!(
                "{}/v1/grants?caller={}&capability={}",
                args.registry,
                percent_encoding::utf8_percent_encode(&args.caller, percent_encoding::NON_ALPHANUMERIC),
                percent_encoding::utf8_percent_encode(&args.capability, percent_encoding::NON_ALPHANUMERIC)
            );
            match read_grants(&url, token).await {
                Ok(grants) => Some(grants),
                Err(error) => {
                    // Loud, not silent: the answer below is the file's alone.
                    eprintln!("warning: the registry's grants could not be read ({error:#}); the file alone decides");
                    None
                }
            }
        }
    };
    let granted: Vec<Value> = grants
        .as_ref()
        .and_then(|grants| grants["grants"].as_array().cloned())
        .unwrap_or_default();
    let allowed = by_file || !granted.is_empty();
    if json {
        print_json(&json!({
            "caller": args.caller,
            "capability": args.capability,
            "allowed": allowed,
            "by_file": by_file,
            "grants": grants.as_ref().map(|_| granted.clone()),
        }))?;
    } else {
        if by_file {
            outln!(
                "allowed: `{}` may call `{}` (acl.yaml permissions)",
                args.caller,
                args.capability
            );
        } else if granted.is_empty() {
            outln!(
                "denied: no `permissions` rule lets `{}` call `{}`{}",
                args.caller,
                args.capability,
                if grants.is_some() {
                    ", and no live grant does"
                } else {
                    ""
                }
            );
        } else {
            outln!(
                "allowed: `{}` may call `{}` by a live grant (no `permissions` rule does)",
                args.caller,
                args.capability
            );
        }
        for grant in &granted {
            outln!(
                "  grant {} approved by {}, expires {} (request {})",
                text(&grant["id"]),
                text(&grant["granted_by"]),
                expiry(&grant["expires_at_ms"]),
                text(&grant["request_id"])
            );
        }
    }
    if !allowed {
        std::process::exit(1);
    }
    Ok(())
}

async fn read_grants(url: &str, token: &str) -> anyhow::Result<Value> {
    let response = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .with_context(|| format!("cannot reach {url}"))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .with_context(|| format!("{url} answered {status} without JSON"))?;
    anyhow::ensure!(status.is_success(), "{status}: {}", body["error"]);
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_export_as_permissions_by_caller() {
        let grants = json!({ "grants": [
            { "id": "gr-1", "caller": "intent_parser", "capability": "order.query", "granted_by": "alice" },
            { "id": "gr-2", "caller": "billing", "capability": "order.detail", "granted_by": "bob", "expires_at_ms": 1 },
            { "id": "gr-3", "caller": "intent_parser", "capability": "order.detail", "granted_by": "alice" },
        ]});
        let yaml = export_yaml(&grants, "http://r");
        let parsed: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
        let permissions = parsed["permissions"].as_sequence().unwrap();
        assert_eq!(permissions.len(), 2);
        assert_eq!(permissions[0]["caller"].as_str(), Some("billing"));
        assert_eq!(permissions[1]["allow"].as_sequence().unwrap().len(), 2);
        assert!(yaml.contains("# grant gr-2, approved by bob, expires"), "{yaml}");
        // The entries are valid acl.yaml.
        assert!(agent_reach_access::Acl::parse(&format!("version: 1\n{yaml}"))
            .unwrap()
            .may_call("billing", "order.detail"));
        let empty = export_yaml(&json!({ "grants": [] }), "http://r");
        assert!(
            agent_reach_access::Acl::parse(&format!("version: 1\n{empty}")).is_ok(),
            "{empty}"
        );
        assert!(id_segment("ar-0123abcd").is_ok() && id_segment("../etc").is_err() && id_segment("").is_err());
    }
}
