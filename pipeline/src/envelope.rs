//! The request envelope at the edge: bounded body reading, strict parsing that
//! names the failing field, and the semantic checks serde cannot express.
//! Everything fails as `INVALID_ENVELOPE` (400) except an oversized body
//! (`PAYLOAD_TOO_LARGE`, 413).

use agent_reach_proto::envelope::{InvokeRequest, TargetPolicy, ENVELOPE_VERSION};
use agent_reach_serving::HeaderLookup;
use axum::body::Body;
use serde_json::Value;

use crate::error::{Code, RouterError};

/// A request envelope that passed every check.
pub struct CheckedRequest {
    pub request: InvokeRequest,
    pub version_req: Option<semver::VersionReq>,
    /// The policy the caller named, if any (else the capability's, else the default).
    pub policy: Option<TargetPolicy>,
    /// Set only by the task worker (never from a caller's envelope): the
    /// delivery carries it, and the agent may answer `202` and report later.
    pub task_id: Option<String>,
    /// Set only by the task worker, delivering a multi-turn task's next turn:
    /// the conversation so far (docs/design.md, "Multi-turn tasks").
    pub history: Option<serde_json::Value>,
    /// Set only by the task worker for a workflow step: the run it is part
    /// of, forwarded and claimed in the hop assertion (`run`).
    pub run_id: Option<String>,
    /// Set only by the task worker for a paused task it resumes: the
    /// handler's checkpoint, forwarded with the delivery.
    pub checkpoint: Option<Value>,
}

fn invalid(field: &str, message: impl Into<String>) -> RouterError {
    RouterError::field(Code::InvalidEnvelope, field, message)
}

/// Reads at most `limit` bytes of body (more: `PAYLOAD_TOO_LARGE`).
pub async fn read_body(headers: &impl HeaderLookup, body: Body, limit: usize) -> Result<bytes::Bytes, RouterError> {
    Ok(agent_reach_serving::read_limited(headers, body, limit).await?)
}

/// Parses JSON into the envelope, naming the field at fault, and folds the
/// seeds' alias forms into the canonical fields (DESIGN §3.2).
pub fn parse(bytes: &[u8]) -> Result<InvokeRequest, RouterError> {
    let mut request: InvokeRequest = agent_reach_serving::parse_json(bytes).map_err(|problem| {
        let field = problem.field().unwrap_or(".").to_string();
        RouterError {
            field: Some(field),
            ..problem.into()
        }
    })?;
    canonical(&mut request)?;
    Ok(request)
}

/// The envelope of a call made in the router (an A2A message's, an MCP
/// tool call's): nothing but the capability, the payload and the ids,
/// checked as a parsed envelope is.
pub fn call(
    capability: &str,
    payload: serde_json::Value,
    request_id: String,
    session_id: Option<String>,
) -> Result<CheckedRequest, RouterError> {
    let mut request = InvokeRequest {
        version: None,
        request_id: Some(request_id),
        session_id,
        context_id: None,
        capability: capability.to_string(),
        capability_version: None,
        target_policy: None,
        priority: None,
        timeout_ms: None,
        deadline: None,
        timeout: None,
        trace_id: None,
        source: None,
        replay_of: None,
        payload,
        budget: None,
    };
    canonical(&mut request)?;
    check(request)
}

/// The seeds' envelope in the router's words: `cap:` dropped from the
/// capability, `timeout {value, unit}` as `timeout_ms`, `source` forgotten
/// (identity comes from the token). `msg_id`, `agent_capability` and
/// `weighted_random` are serde aliases; `trace_id` is read by the front door.
fn canonical(request: &mut InvokeRequest) -> Result<(), RouterError> {
    if let Some(name) = request.capability.strip_prefix("cap:") {
        request.capability = name.to_string();
    }
    if let Some(timeout) = request.timeout.take() {
        if request.timeout_ms.is_some() {
            return Err(invalid("timeout", "give `timeout_ms` or `timeout`, not both"));
        }
        let millis = timeout
            .as_millis()
            .map_err(|why| invalid("timeout", format!("`timeout`: {why}")))?;
        request.timeout_ms = Some(millis);
    }
    request.source = None;
    Ok(())
}

/// Checks what the types alone cannot.
pub fn check(request: InvokeRequest) -> Result<CheckedRequest, RouterError> {
    let (version_req, policy) = check_fields(&request)?;
    Ok(CheckedRequest {
        request,
        version_req,
        policy,
        task_id: None,
        history: None,
        run_id: None,
        checkpoint: None,
    })
}

/// [`check`] without taking the request: the requirement and policy it
/// parses, or the first field at fault.
pub fn check_fields(
    request: &InvokeRequest,
) -> Result<(Option<semver::VersionReq>, Option<TargetPolicy>), RouterError> {
    if let Some(version) = &request.version {
        if version != ENVELOPE_VERSION {
            return Err(invalid(
                "version",
                format!("envelope version `{version}` is not supported (expected `{ENVELOPE_VERSION}`)"),
            ));
        }
    }
    agent_reach_access::acl::check_dotted(&request.capability)
        .map_err(|why| invalid("capability", format!("capability `{}`: {why}", request.capability)))?;
    let version_req = match request.capability_version.as_deref().map(str::trim) {
        None | Some("") | Some("*") => None,
        Some(text) => Some(semver::VersionReq::parse(text).map_err(|error| {
            invalid(
                "capability_version",
                format!("`{text}` is not a semver requirement (e.g. `^1.2`): {error}"),
            )
        })?),
    };
    if request.timeout_ms == Some(0) {
        return Err(invalid("timeout_ms", "timeout_ms must be above 0"));
    }
    for (field, id) in [("request_id", &request.request_id), ("replay_of", &request.replay_of)] {
        if let Some(id) = id {
            let printable = id.chars().all(|c| c.is_ascii_graphic());
            if id.is_empty() || id.len() > 128 || !printable {
                return Err(invalid(
                    field,
                    format!("{field} must be 1..=128 printable ASCII characters without spaces"),
                ));
            }
        }
    }
    if let Some(budget) = &request.budget {
        if budget.calls.is_none() && budget.cost.is_none() {
            return Err(invalid("budget", "a budget names `calls`, `cost` or both"));
        }
        if budget.cost.is_some_and(|cost| !(cost.is_finite() && cost >= 0.0)) {
            return Err(invalid("budget", "budget.cost must be a number of at least 0"));
        }
    }
    let policy = request.target_policy.clone();
    if policy == Some(TargetPolicy::ConsistentHash) && request.session_id.as_deref().unwrap_or("").is_empty() {
        return Err(invalid(
            "session_id",
            "target_policy `consistent_hash` is keyed by session_id; send one",
        ));
    }
    Ok((version_req, policy))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(error: RouterError) -> String {
        assert_eq!(error.code, Code::InvalidEnvelope);
        error.envelope_error().details.unwrap()["field"]
            .as_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn names_the_failing_field() {
        assert_eq!(field_of(parse(br#"{"payload":{}}"#).unwrap_err()), "capability");
        assert_eq!(
            field_of(parse(br#"{"capability":"a","timeout_ms":"x"}"#).unwrap_err()),
            "timeout_ms"
        );
        assert_eq!(
            field_of(parse(br#"{"capability":"a","target_policy":"random"}"#).unwrap_err()),
            "target_policy"
        );
        assert_eq!(
            field_of(parse(br#"{"capability":"a","extra":1}"#).unwrap_err()),
            "extra"
        );
        assert_eq!(parse(b"{not json").unwrap_err().code, Code::InvalidEnvelope);
        // A key spelt like the root is named (it was `""`; found by the `invoke_envelope` fuzz target).
        assert_eq!(field_of(parse(br#"{".":1}"#).unwrap_err()), ".");
        assert!(parse(br#"{".":1}"#).unwrap_err().message.contains("unknown field `.`"));
    }

    #[test]
    fn the_seeds_envelope_is_an_alias_form() {
        let seeds = br#"{"version": "1.0", "msg_id": "msg_8a7f3c92", "session_id": "session_001",
            "trace_id": "trace_6e2b1d", "agent_capability": "cap:text_summarize", "source": "agent_002",
            "target_policy": "weighted_random", "timeout": {"value": 15, "unit": "s"},
            "deadline": 1710000000000, "payload": {"text": "..."}}"#;
        let request = parse(seeds).unwrap();
        assert_eq!(request.request_id.as_deref(), Some("msg_8a7f3c92"));
        assert_eq!(request.capability, "text_summarize");
        assert_eq!(request.target_policy, Some(TargetPolicy::WeightedRoundRobin));
        assert_eq!(request.timeout_ms, Some(15_000));
        assert_eq!(request.timeout, None);
        assert_eq!(request.trace_id.as_deref(), Some("trace_6e2b1d"));
        assert_eq!(request.source, None, "a caller's source is never believed");
        assert!(check(request).is_ok());
        let plain = parse(br#"{"capability": "cap:text_summarize", "timeout": {"value": 250}}"#).unwrap();
        assert_eq!(
            (plain.capability.as_str(), plain.timeout_ms),
            ("text_summarize", Some(250))
        );
        // Two names for one field, a timeout twice, a bad unit: each names its field.
        assert_eq!(
            field_of(parse(br#"{"capability": "a", "msg_id": "x", "request_id": "y"}"#).unwrap_err()),
            "request_id"
        );
        assert_eq!(
            field_of(parse(br#"{"capability": "a", "timeout_ms": 5, "timeout": {"value": 1}}"#).unwrap_err()),
            "timeout"
        );
        assert_eq!(
            field_of(parse(br#"{"capability": "a", "timeout": {"value": 1, "unit": "fortnights"}}"#).unwrap_err()),
            "timeout"
        );
        // Anything outside the aliases is still refused.
        assert_eq!(
            field_of(parse(br#"{"capability": "a", "callback_url": "x"}"#).unwrap_err()),
            "callback_url"
        );
    }

    #[test]
    fn semantic_checks() {
        let check_text = |text: &str| check(parse(text.as_bytes()).unwrap());
        assert_eq!(
            field_of(check_text(r#"{"capability":"Order"}"#).err().unwrap()),
            "capability"
        );
        assert_eq!(
            field_of(
                check_text(r#"{"capability":"a","capability_version":"x.y"}"#)
                    .err()
                    .unwrap()
            ),
            "capability_version"
        );
        assert_eq!(
            field_of(
                check_text(r#"{"capability":"a","target_policy":"consistent_hash"}"#)
                    .err()
                    .unwrap()
            ),
            "session_id"
        );
        for bad in [
            r#"{"capability":"a","budget":{}}"#,
            r#"{"capability":"a","budget":{"cost":-1}}"#,
        ] {
            assert_eq!(field_of(check_text(bad).err().unwrap()), "budget", "{bad}");
        }
        for bad in [
            r#"{"capability":"a","budget":{"calls":-1}}"#,
            r#"{"capability":"a","budget":{"calls":5,"tokens":3}}"#,
            r#"{"capability":"a","budget":5}"#,
        ] {
            assert_eq!(parse(bad.as_bytes()).unwrap_err().code, Code::InvalidEnvelope, "{bad}");
        }
        let ok = check_text(r#"{"capability":"order.query","capability_version":"^1.2"}"#)
            .ok()
            .unwrap();
        assert!(ok.version_req.unwrap().matches(&semver::Version::new(1, 3, 0)));
    }
}
