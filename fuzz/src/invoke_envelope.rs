//! `invoke_envelope`: a `POST /v1/invoke` body through the router's envelope
//! parse and checks (`router/src/envelope.rs`), then, once accepted, through
//! the router's own writers of what it sends on (`router/src/json.rs`).
//!
//! Holds, for every input:
//! - a refusal is `INVALID_ENVELOPE` (400), names its field (`.` for the whole
//!   body) in the failed envelope's `details.field`, and is not retryable;
//! - an accepted envelope keeps every promise of `check`: a supported
//!   version, a dotted capability, a parsed version requirement exactly when
//!   one was given, `timeout_ms` above 0, a printable request id of 1-128
//!   characters, a session id for `consistent_hash`;
//! - an accepted envelope written back as JSON is accepted again, the same;
//! - the router's hand-written forwarded and succeeded envelopes are
//!   byte-equal to serde_json's output for the contract types.

use agent_reach_access::Caller;
use agent_reach_pipeline::fuzzing::{self, Accepted, Refusal};
use agent_reach_proto::envelope::{
    ForwardedEnvelope, InvokeRequest, ResultEnvelope, ResultStatus, TargetPolicy, ENVELOPE_VERSION,
};
use serde_json::value::RawValue;

use crate::support::same_json;

pub fn run(data: &[u8]) {
    match fuzzing::invoke_envelope(data) {
        Ok(accepted) => accepted_holds(&accepted),
        Err(refusal) => refusal_holds(&refusal),
    }
}

fn refusal_holds(refusal: &Refusal) {
    assert_eq!((refusal.code, refusal.status.as_u16()), ("INVALID_ENVELOPE", 400));
    let field = refusal
        .field
        .as_deref()
        .expect("a refused envelope names its field (`.` for the whole body)");
    let error = &refusal.error;
    // Empty only when the unknown field's name is the empty string.
    assert!(
        !field.is_empty() || error.message.contains("unknown field ``"),
        "an empty field name: {}",
        error.message
    );
    assert_eq!(error.code, refusal.code);
    assert!(!error.retryable, "a bad envelope stays bad");
    assert!(!error.message.is_empty(), "a refusal without a message");
    let named = error.details.as_ref().and_then(|details| details.get("field"));
    assert_eq!(named.and_then(serde_json::Value::as_str), Some(field));
    serde_json::to_vec(error).expect("a failed envelope's error serialises");
}

fn accepted_holds(accepted: &Accepted) {
    let request = &accepted.request;
    if let Some(version) = &request.version {
        assert_eq!(version, ENVELOPE_VERSION);
    }
    agent_reach_access::acl::check_dotted(&request.capability).expect("an accepted capability is a dotted name");
    let requirement = request.capability_version.as_deref().map(str::trim);
    assert_eq!(
        accepted.version_req.is_some(),
        !matches!(requirement, None | Some("") | Some("*")),
        "a version requirement {requirement:?} parsed as {:?}",
        accepted.version_req
    );
    assert_ne!(request.timeout_ms, Some(0));
    if let Some(id) = &request.request_id {
        assert!(
            (1..=128).contains(&id.len()) && id.bytes().all(|byte| byte.is_ascii_graphic()),
            "request id {id:?}"
        );
    }
    assert_eq!(accepted.policy, request.target_policy);
    if accepted.policy == Some(TargetPolicy::ConsistentHash) {
        assert!(request.session_id.as_deref().is_some_and(|id| !id.is_empty()));
    }

    let written = serde_json::to_vec(request).expect("an envelope serialises");
    let again = match fuzzing::invoke_envelope(&written) {
        Ok(again) => again,
        Err(refusal) => panic!(
            "an accepted envelope written back is refused: {} ({:?})",
            refusal.error.message, refusal.field
        ),
    };
    assert!(
        same_envelope(&again.request, request),
        "{:?} became {:?}",
        request,
        again.request
    );

    writers_match_the_contract_types(request);
}

fn same_envelope(a: &InvokeRequest, b: &InvokeRequest) -> bool {
    let without_payload = |request: &InvokeRequest| InvokeRequest {
        payload: serde_json::Value::Null,
        ..request.clone()
    };
    without_payload(a) == without_payload(b) && same_json(&a.payload, &b.payload)
}

/// `json.rs` promises the contract types' bytes; the strings come from the
/// input (session and context ids are any Unicode, so escaping is exercised).
fn writers_match_the_contract_types(request: &InvokeRequest) {
    let request_id = request.request_id.as_deref().unwrap_or("generated-id");
    let source = request.context_id.clone().unwrap_or_else(|| "caller".to_string());
    let agent_id = request.session_id.as_deref().unwrap_or("agent-1");
    let deadline = request.deadline.unwrap_or(1_700_000_000_000);
    for caller in [Caller::agent(source.as_str()), Caller::Unauthenticated] {
        let written = fuzzing::forwarded_envelope(request, request_id, "1.2.3", &caller, deadline, 2)
            .expect("a forwarded envelope is written");
        let contract = ForwardedEnvelope {
            version: ENVELOPE_VERSION.to_string(),
            request_id: request_id.to_string(),
            session_id: request.session_id.clone(),
            context_id: request.context_id.clone(),
            capability: request.capability.clone(),
            capability_version: "1.2.3".to_string(),
            source: caller.name().map(str::to_string),
            priority: request.priority.unwrap_or_default(),
            deadline,
            attempt: 2,
            payload: request.payload.clone(),
            task_id: None,
            budget: None,
            history: None,
            run_id: None,
            checkpoint: None,
        };
        let expected = serde_json::to_vec(&contract).expect("a forwarded envelope serialises");
        assert_eq!(
            String::from_utf8_lossy(&written),
            String::from_utf8_lossy(&expected),
            "json.rs's forwarded envelope differs from the contract type's"
        );
    }

    let output = serde_json::to_string(&request.payload).expect("a payload serialises");
    let output = RawValue::from_string(output).expect("serde_json's own output is JSON");
    let written = fuzzing::succeeded_envelope(
        request_id,
        Some(&request.capability),
        "1.2.3",
        agent_id,
        (3, 17),
        Some(&output),
    );
    let contract = ResultEnvelope {
        version: ENVELOPE_VERSION.to_string(),
        request_id: request_id.to_string(),
        status: ResultStatus::Succeeded,
        capability: Some(request.capability.clone()),
        capability_version: Some("1.2.3".to_string()),
        agent_id: Some(agent_id.to_string()),
        attempts: 3,
        duration_ms: 17,
        output: Some(request.payload.clone()),
        error: None,
        budget: None,
    };
    let expected = serde_json::to_vec(&contract).expect("a result envelope serialises");
    assert_eq!(
        String::from_utf8_lossy(&written),
        String::from_utf8_lossy(&expected),
        "json.rs's succeeded envelope differs from the contract type's"
    );
}
