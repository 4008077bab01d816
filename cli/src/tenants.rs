//! `agent-reach tenants …`: the tenants a running router serves (DESIGN §8
//! "Tenants"), from `GET /v1/tenants`: `list` (placement and quotas) and
//! `usage` (instances, calls in flight, requests and refusals since the
//! router started, tasks waiting). The token must name an `operators:` caller
//! of the router's home tenant.

use serde_json::Value;

use crate::connection::{print_json, text, Connection};

#[derive(Debug, clap::Subcommand)]
pub enum TenantsCommand {
    /// Each tenant served: its placement (shared or its own Redis, no secrets), ACL file and quotas.
    List,
    /// Each tenant's usage of this router: instances, in flight, requests, refusals, tasks waiting.
    Usage,
}

pub async fn tenants(connection: &Connection, command: TenantsCommand) -> anyhow::Result<()> {
    let answer = connection.get(format!("{}/v1/tenants", connection.router)).await?;
    if connection.json {
        return print_json(&answer);
    }
    let tenants = answer["tenants"].as_array().cloned().unwrap_or_default();
    match command {
        TenantsCommand::List => {
            outln!(
                "{:<20} {:<32} {:>10} {:>8} {:>12} {:>12} ACL",
                "TENANT",
                "PLACEMENT",
                "RATE/S",
                "BURST",
                "CONCURRENCY",
                "TASK_BACKLOG"
            );
            for tenant in &tenants {
                let quotas = &tenant["quotas"];
                outln!(
                    "{:<20} {:<32} {:>10} {:>8} {:>12} {:>12} {}",
                    home_marked(&answer, tenant),
                    text(&tenant["placement"]),
                    text(&quotas["rate_per_s"]),
                    text(&quotas["burst"]),
                    text(&quotas["concurrency"]),
                    text(&quotas["task_backlog"]),
                    text(&tenant["acl"])
                );
            }
        }
        TenantsCommand::Usage => {
            outln!(
                "{:<20} {:>10} {:>10} {:>14} {:>14} {:>14}",
                "TENANT",
                "INSTANCES",
                "IN_FLIGHT",
                "REQUESTS",
                "RATE_LIMITED",
                "TASKS_WAITING"
            );
            for tenant in &tenants {
                let usage = &tenant["usage"];
                outln!(
                    "{:<20} {:>10} {:>10} {:>14} {:>14} {:>14}",
                    home_marked(&answer, tenant),
                    text(&usage["instances"]),
                    text(&usage["in_flight"]),
                    text(&usage["requests_total"]),
                    text(&usage["rate_limited_total"]),
                    text(&usage["task_backlog"])
                );
            }
        }
    }
    Ok(())
}

/// The tenant's name, `*` after the home tenant's.
fn home_marked(answer: &Value, tenant: &Value) -> String {
    let name = text(&tenant["name"]);
    if answer["home"] == tenant["name"] {
        format!("{name} *")
    } else {
        name
    }
}
