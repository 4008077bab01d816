//! Canary commands (DESIGN §2.9): `capabilities split`, `capabilities
//! policy`, `agents weight` and `agents drain`, the operator API of the
//! registry from the command line.

use anyhow::Context;
use serde_json::{json, Value};

use crate::connection::{print_json, text, Connection};

/// `VERSION=WEIGHT` into the split body's entry; the registry checks the
/// version and the weight's range, so its codes reach the operator unchanged.
fn share(pair: &str) -> anyhow::Result<(String, Value)> {
    let (version, weight) = pair
        .rsplit_once('=')
        .with_context(|| format!("`{pair}` is not VERSION=WEIGHT (e.g. 2.0.0=5)"))?;
    let weight: i64 = weight
        .trim()
        .parse()
        .with_context(|| format!("the weight in `{pair}` is not an integer"))?;
    Ok((version.trim().to_string(), json!(weight)))
}

/// Sends one request to the registry: its status and JSON answer (`null` for a `204`).
pub(crate) async fn send(
    connection: &Connection,
    request: reqwest::RequestBuilder,
    url: &str,
) -> anyhow::Result<(reqwest::StatusCode, Value)> {
    let response = request
        .bearer_auth(connection.token()?)
        .send()
        .await
        .with_context(|| format!("cannot reach {url}"))?;
    let status = response.status();
    if status == reqwest::StatusCode::NO_CONTENT {
        return Ok((status, Value::Null));
    }
    let body: Value = response
        .json()
        .await
        .with_context(|| format!("{url} answered {status} without JSON"))?;
    Ok((status, body))
}

/// The answer on success; otherwise an error naming the status, the code and the message.
pub(crate) fn success((status, body): (reqwest::StatusCode, Value)) -> anyhow::Result<Value> {
    if !status.is_success() {
        anyhow::bail!(
            "{status}: {} {}",
            text(&body["error"]["code"]),
            text(&body["error"]["message"])
        );
    }
    Ok(body)
}

fn print_split(split: &Value) {
    let weights = split["weights"].as_object().cloned().unwrap_or_default();
    let total: u64 = weights.values().filter_map(Value::as_u64).sum();
    let mut shares: Vec<(semver::Version, u64)> = weights
        .iter()
        .filter_map(|(version, weight)| Some((semver::Version::parse(version).ok()?, weight.as_u64()?)))
        .collect();
    shares.sort_by(|a, b| b.0.cmp(&a.0));
    outln!(
        "{}: unpinned calls split by weight (set by {})",
        text(&split["capability"]),
        text(&split["updated_by"])
    );
    outln!("{:<16} {:>7} {:>8}", "VERSION", "WEIGHT", "SHARE");
    for (version, weight) in shares {
        let percent = if total == 0 {
            0.0
        } else {
            weight as f64 * 100.0 / total as f64
        };
        outln!("{:<16} {:>7} {:>7.1}%", version.to_string(), weight, percent);
    }
}

/// `capabilities split NAME [VERSION=WEIGHT...] [--clear]`.
pub async fn split(connection: &Connection, name: &str, shares: &[String], clear: bool) -> anyhow::Result<()> {
    let url = format!("{}/v1/capabilities/{name}/split", connection.registry);
    let client = reqwest::Client::new();
    if clear {
        success(send(connection, client.delete(&url), &url).await?)?;
        if connection.json {
            return print_json(&json!({ "capability": name, "split": null }));
        }
        outln!("{name}: split cleared; unpinned calls go to the highest routable version");
        return Ok(());
    }
    let answer = if shares.is_empty() {
        // No pairs: show the split, or say there is none.
        let (status, body) = send(connection, client.get(&url), &url).await?;
        if body["error"]["code"] == "SPLIT_NOT_FOUND" {
            if connection.json {
                return print_json(&json!({ "capability": name, "split": null }));
            }
            outln!("{name}: no split; unpinned calls go to the highest routable version");
            return Ok(());
        }
        success((status, body))?
    } else {
        let weights = shares
            .iter()
            .map(|pair| share(pair))
            .collect::<anyhow::Result<serde_json::Map<_, _>>>()?;
        success(send(connection, client.put(&url).json(&json!({ "weights": weights })), &url).await?)?
    };
    if connection.json {
        return print_json(&answer);
    }
    print_split(&answer);
    Ok(())
}

/// `capabilities policy NAME [POLICY] [--clear]`.
pub async fn policy(connection: &Connection, name: &str, policy: Option<&str>, clear: bool) -> anyhow::Result<()> {
    let url = format!("{}/v1/capabilities/{name}/policy", connection.registry);
    let client = reqwest::Client::new();
    let answer = match (policy, clear) {
        (_, true) => {
            success(send(connection, client.delete(&url), &url).await?)?;
            Value::Null
        }
        (Some(policy), false) => {
            success(send(connection, client.put(&url).json(&json!({ "policy": policy })), &url).await?)?
        }
        (None, false) => {
            let (status, body) = send(connection, client.get(&url), &url).await?;
            if body["error"]["code"] == "POLICY_NOT_FOUND" {
                Value::Null
            } else {
                success((status, body))?
            }
        }
    };
    if connection.json {
        return print_json(&if answer.is_null() {
            json!({ "capability": name, "policy": null })
        } else {
            answer
        });
    }
    if answer.is_null() {
        outln!("{name}: no policy of its own; calls that name none use the router's default (weighted_round_robin)");
    } else {
        outln!(
            "{name}: calls that name no policy use {} (set by {})",
            text(&answer["policy"]),
            text(&answer["updated_by"])
        );
    }
    Ok(())
}

/// `agents weight AGENT_ID N`.
pub async fn weight(connection: &Connection, agent_id: &str, weight: u32) -> anyhow::Result<()> {
    let url = format!("{}/v1/agents/{agent_id}/weight", connection.registry);
    let request = reqwest::Client::new().put(&url).json(&json!({ "weight": weight }));
    let answer = success(send(connection, request, &url).await?)?;
    if connection.json {
        return print_json(&answer);
    }
    outln!(
        "{}: weight {} (until it registers again)",
        text(&answer["agent_id"]),
        text(&answer["weight"])
    );
    Ok(())
}

/// `agents drain AGENT_ID`: the instance takes no new calls (operators).
pub async fn drain(connection: &Connection, agent_id: &str) -> anyhow::Result<()> {
    let url = format!("{}/v1/agents/{agent_id}/drain", connection.registry);
    let answer = success(send(connection, reqwest::Client::new().post(&url), &url).await?)?;
    if connection.json {
        return print_json(&answer);
    }
    outln!(
        "{}: {}; routers send it no new call, it leaves when it stops or deregisters",
        text(&answer["agent_id"]),
        text(&answer["status"])
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_parse_and_refuse_nonsense() {
        assert_eq!(share("2.0.0=5").unwrap(), ("2.0.0".to_string(), json!(5)));
        assert_eq!(share(" 1.4.2 = 95 ").unwrap(), ("1.4.2".to_string(), json!(95)));
        // Negative weights travel to the registry, which answers INVALID_SPLIT.
        assert_eq!(share("1.0.0=-1").unwrap().1, json!(-1));
        assert!(share("2.0.0").is_err());
        assert!(share("2.0.0=five").is_err());
    }
}
