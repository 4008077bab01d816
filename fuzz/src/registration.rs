//! `registration`: a `POST /v1/agents` body through the registry's HTTP body
//! parse (`registry/src/http.rs`, the edge's bounded read and strict JSON) and
//! its registration checks (`registry/src/validate.rs`), as the route runs
//! them before anything is written.
//!
//! Holds, for every input:
//! - a refusal carries one of the registration's stable codes with its status
//!   (413 for `PAYLOAD_TOO_LARGE`, else 400), its `{"error": …}` body says the
//!   same, and every check past the JSON names the field at fault;
//! - an accepted registration keeps every promise of the checks (id, name,
//!   endpoint, protocol, weight, TTL, status, tags, 1-64 distinct capabilities
//!   with dotted names, semver versions and bounded timeouts);
//! - the accepted registration, written back with its defaults filled in, is
//!   accepted again as the same registration.

use std::collections::HashSet;

use agent_reach_proto::http::RegisterRequest;
use agent_reach_registry::fuzzing::{self, Refusal};

use crate::support::{ready, same_json};

/// The codes a registration body can be refused with before authorisation.
const CODES: [&str; 21] = [
    "MALFORMED_JSON",
    "MISSING_FIELD",
    "INVALID_FIELD_TYPE",
    "UNKNOWN_FIELD",
    "PAYLOAD_TOO_LARGE",
    "INVALID_AGENT_ID",
    "INVALID_NAME",
    "INVALID_ENDPOINT",
    "INVALID_PROTOCOL",
    "INVALID_WEIGHT",
    "INVALID_TTL",
    "INVALID_STATUS",
    "INVALID_TAGS",
    "NO_CAPABILITIES",
    "INVALID_CAPABILITY_NAME",
    "INVALID_VERSION",
    "INVALID_SCHEMA",
    "SCHEMA_TOO_LARGE",
    "SCHEMA_TOO_DEEP",
    "INVALID_TIMEOUT",
    "DUPLICATE_CAPABILITY",
];

/// Codes that may come without a field: the body is not JSON, too large, or
/// of the wrong type as a whole (`[]`).
const WHOLE_BODY_CODES: [&str; 3] = ["MALFORMED_JSON", "PAYLOAD_TOO_LARGE", "INVALID_FIELD_TYPE"];

pub fn run(data: &[u8]) {
    match ready(fuzzing::registration(data)) {
        Ok(accepted) => accepted_holds(&accepted),
        Err(refusal) => refusal_holds(&refusal),
    }
}

fn refusal_holds(refusal: &Refusal) {
    assert!(CODES.contains(&refusal.code), "unexpected code {}", refusal.code);
    let status = if matches!(refusal.code, "PAYLOAD_TOO_LARGE" | "SCHEMA_TOO_LARGE") {
        413
    } else {
        400
    };
    assert_eq!(refusal.status.as_u16(), status, "{}", refusal.code);
    let error = &refusal.body.error;
    assert_eq!(error.code, refusal.code);
    assert_eq!(error.field, refusal.field);
    assert!(!error.message.is_empty(), "a refusal without a message");
    if !WHOLE_BODY_CODES.contains(&refusal.code) {
        // Empty only when the unknown field's name is the empty string.
        let named = refusal
            .field
            .as_deref()
            .is_some_and(|field| !field.is_empty() || error.message.contains("unknown field ``"));
        assert!(named, "{} names no field: {}", refusal.code, error.message);
    }
}

fn accepted_holds(accepted: &RegisterRequest) {
    let id = &accepted.agent_id;
    assert!(
        (1..=128).contains(&id.len())
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && id != "."
            && id != "..",
        "agent_id {id:?}"
    );
    agent_reach_access::acl::check_agent_name(&accepted.name).expect("an accepted name");
    let endpoint = url::Url::parse(&accepted.endpoint).expect("an accepted endpoint is a URL");
    assert!(matches!(endpoint.scheme(), "http" | "https"), "{endpoint}");
    assert!(endpoint.host_str().is_some_and(|host| !host.is_empty()), "{endpoint}");
    assert!(
        endpoint.username().is_empty() && endpoint.password().is_none(),
        "credentials in {endpoint}"
    );
    assert_eq!(accepted.protocol.as_deref(), Some("http"));
    assert!(accepted.weight.is_some_and(|weight| (1..=1000).contains(&weight)));
    assert!(accepted.ttl_s.is_some_and(|ttl| (3..=300).contains(&ttl)));
    let status = accepted.status.as_deref();
    assert!(
        matches!(status, Some("starting" | "ready" | "busy" | "overloaded")),
        "{status:?}"
    );
    assert!(accepted.tags.len() <= 64);
    assert!((1..=64).contains(&accepted.capabilities.len()));
    let mut seen = HashSet::new();
    for capability in &accepted.capabilities {
        agent_reach_access::acl::check_dotted(&capability.name).expect("an accepted capability name");
        let version = semver::Version::parse(&capability.version).expect("an accepted version");
        assert!(
            seen.insert((capability.name.clone(), version)),
            "a duplicate capability"
        );
        assert!(capability.description.as_ref().is_none_or(|text| text.len() <= 4096));
        assert!(capability
            .timeout_ms
            .is_none_or(|timeout| (1..=3_600_000).contains(&timeout)));
    }

    let written = serde_json::to_vec(accepted).expect("a registration serialises");
    let again = match ready(fuzzing::registration(&written)) {
        Ok(again) => again,
        Err(refusal) => panic!(
            "an accepted registration written back is refused: {} {} ({:?})",
            refusal.code, refusal.body.error.message, refusal.field
        ),
    };
    let value = |request: &RegisterRequest| serde_json::to_value(request).expect("a registration serialises");
    assert!(
        same_json(&value(&again), &value(accepted)),
        "{accepted:?} became {again:?}"
    );
}
