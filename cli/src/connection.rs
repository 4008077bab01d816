//! How the operator commands reach and authenticate to the running services
//! ([`Connection`]), and how they print what comes back.

use anyhow::Context;
use serde_json::Value;

/// How to reach and authenticate to the services.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// Registry URL.
    #[arg(
        long,
        env = "AGENT_REACH_REGISTRY",
        default_value = "http://127.0.0.1:7400",
        global = true
    )]
    pub registry: String,
    /// Router URL.
    #[arg(
        long,
        env = "AGENT_REACH_ROUTER",
        default_value = "http://127.0.0.1:7500",
        global = true
    )]
    pub router: String,
    /// Bearer token (JWT).
    #[arg(long, env = "AGENT_REACH_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Act only if the token is of this tenant (its `tenant` claim; none: `default`): a
    /// guard against acting in the wrong tenant. The tenant acted in is always the token's.
    #[arg(long, global = true)]
    pub tenant: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

impl Connection {
    pub(crate) fn token(&self) -> anyhow::Result<&str> {
        let token = self
            .token
            .as_deref()
            .context("no token: pass --token or set AGENT_REACH_TOKEN (agent-reach token issue ...)")?;
        if let Some(wanted) = &self.tenant {
            let header = format!("Bearer {token}");
            let of = agent_reach_access::token::peek_tenant(Some(header.as_bytes()))
                .unwrap_or_else(|| agent_reach_access::token::DEFAULT_TENANT.to_string());
            anyhow::ensure!(
                &of == wanted,
                "the token is of tenant `{of}`, not `{wanted}` (--tenant): issue one with \
                 `agent-reach token issue --tenant {wanted}`"
            );
        }
        Ok(token)
    }

    pub(crate) async fn get(&self, url: String) -> anyhow::Result<Value> {
        let response = reqwest::Client::new()
            .get(&url)
            .bearer_auth(self.token()?)
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
}

pub(crate) fn print_json(value: &Value) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

pub(crate) fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => "-".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection(token: Option<String>, tenant: Option<&str>) -> Connection {
        Connection {
            registry: String::new(),
            router: String::new(),
            token,
            tenant: tenant.map(str::to_string),
            json: false,
        }
    }

    #[test]
    fn the_tenant_guard_refuses_a_token_of_another_tenant() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let ttl = std::time::Duration::from_secs(60);
        let of_a = agent_reach_access::token::issue_hs256_for("ops", Some("team-a"), secret, ttl).unwrap();
        let plain = agent_reach_access::token::issue_hs256_for("ops", None, secret, ttl).unwrap();
        assert!(connection(Some(of_a.clone()), Some("team-a")).token().is_ok());
        assert!(
            connection(Some(of_a.clone()), None).token().is_ok(),
            "no guard, no check"
        );
        assert!(connection(Some(plain.clone()), Some("default")).token().is_ok());
        let refused = connection(Some(of_a), Some("team-b")).token().unwrap_err().to_string();
        assert!(refused.contains("tenant `team-a`, not `team-b`"), "{refused}");
        let refused = connection(Some(plain), Some("team-b")).token().unwrap_err().to_string();
        assert!(refused.contains("tenant `default`"), "{refused}");
        assert!(connection(None, Some("team-a")).token().is_err());
    }
}
