//! Access requests from an agent (DESIGN §2.11): at start-up an agent asks
//! to call a capability `acl.yaml` does not let it call yet; an approver
//! named under `owners:` decides, and once approved every router lets the
//! calls through without a restart of anything.

use serde::Deserialize;
use serde_json::json;

use crate::agent::Agent;
use crate::error::CallError;

/// Where an agent's access to a capability stands after
/// [`Agent::request_access`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessRequest {
    /// The agent may call it already (by `acl.yaml`, or a live grant).
    Allowed,
    /// A request is pending (filed now, or earlier and not yet decided):
    /// its id, and who may approve it.
    Pending { id: String, approvers: Vec<String> },
}

#[derive(Deserialize)]
struct Filed {
    id: String,
    #[serde(default)]
    approvers: Vec<String>,
}

#[derive(Deserialize)]
struct Refusal {
    error: RefusalBody,
}

#[derive(Deserialize)]
struct RefusalBody {
    code: String,
    message: String,
    #[serde(default)]
    details: Option<serde_json::Value>,
}

impl Agent {
    /// Asks to call `capability` as this agent (`POST /v1/access-requests`
    /// on its registry), with `reason` for the approvers; once approved,
    /// the grant lasts `ttl` (`None`: until revoked). Safe to call at every
    /// start: a request already pending is answered again, not filed twice.
    ///
    /// ```no_run
    /// # async fn example(agent: agent_reach_sdk::Agent) -> Result<(), agent_reach_sdk::CallError> {
    /// use agent_reach_sdk::AccessRequest;
    /// match agent.request_access("payment.check", "order_query checks payments", None).await? {
    ///     AccessRequest::Allowed => {}
    ///     AccessRequest::Pending { id, approvers } => {
    ///         tracing::info!(%id, approvers = %approvers.join(","), "asked for payment.check");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// Errors carry the registry's codes, e.g. `CAPABILITY_NOT_FOUND` (no
    /// agent offers it) or `NO_OWNER` (no one could approve it).
    pub async fn request_access(
        &self,
        capability: &str,
        reason: &str,
        ttl: Option<std::time::Duration>,
    ) -> Result<AccessRequest, CallError> {
        let mut body = json!({ "capability": capability, "reason": reason });
        if let Some(ttl) = ttl {
            body["ttl_s"] = json!(ttl.as_secs().max(1));
        }
        let mut failure = CallError::new("REGISTRY_UNREACHABLE", "no registry is configured");
        // The registries share one etcd: the first that answers decides.
        for registry in &self.shared.config.registry {
            let url = format!("{}/v1/access-requests", registry.trim_end_matches('/'));
            let sent = self
                .http
                .post(&url)
                .bearer_auth(&self.shared.links.token)
                .json(&body)
                .timeout(std::time::Duration::from_secs(10))
                .send()
                .await;
            let response = match sent {
                Ok(response) => response,
                Err(error) => {
                    failure = CallError::new("REGISTRY_UNREACHABLE", format!("{url}: {error}")).retryable();
                    continue;
                }
            };
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            if status.is_success() {
                let filed: Filed = serde_json::from_str(&text).map_err(|error| {
                    CallError::new(
                        "INVALID_RESULT",
                        format!("{url} answered {status} with an unreadable body: {error}"),
                    )
                })?;
                tracing::info!(
                    message = "Access requested.",
                    capability,
                    id = %filed.id,
                    approvers = %filed.approvers.join(",")
                );
                return Ok(AccessRequest::Pending {
                    id: filed.id,
                    approvers: filed.approvers,
                });
            }
            let refusal: Refusal = serde_json::from_str(&text).map_err(|_| {
                CallError::new(
                    "INVALID_RESULT",
                    format!(
                        "{url} answered {status}: {}",
                        text.chars().take(200).collect::<String>()
                    ),
                )
            })?;
            if refusal.error.code == "ALREADY_ALLOWED" {
                return Ok(AccessRequest::Allowed);
            }
            let error = CallError {
                code: refusal.error.code,
                message: refusal.error.message,
                retryable: status.is_server_error(),
                status: Some(status.as_u16()),
                details: refusal.error.details,
            };
            if !error.retryable {
                return Err(error);
            }
            failure = error;
        }
        Err(failure)
    }
}
