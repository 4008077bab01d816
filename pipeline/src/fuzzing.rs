//! The fuzz targets' way into the router (`fuzz/`, feature `fuzzing`, off in
//! every service build): the invoke envelope's own parse and checks, as every
//! front door runs them, and the router's own writers of the envelopes it
//! sends on (the forwarded and the succeeded result envelope). Not an API.

use agent_reach_access::Caller;
use agent_reach_proto::envelope::{EnvelopeError, InvokeRequest, TargetPolicy, ENVELOPE_VERSION};
use serde_json::value::RawValue;

use crate::envelope;

use crate::error::RouterError;
use crate::json;

/// An envelope the router accepts, as [`envelope::check`] leaves it.
pub struct Accepted {
    pub request: InvokeRequest,
    pub version_req: Option<semver::VersionReq>,
    pub policy: Option<TargetPolicy>,
}

/// How the router refuses an envelope: the status, the stable code's string,
/// the field at fault and the failed envelope's `error`.
pub struct Refusal {
    pub status: http::StatusCode,
    pub code: &'static str,
    pub field: Option<String>,
    pub error: EnvelopeError,
}

impl Refusal {
    fn boxed(error: RouterError) -> Box<Self> {
        Box::new(Self {
            status: error.status(),
            code: error.code.as_str(),
            field: error.field.clone(),
            error: error.envelope_error(),
        })
    }
}

/// A request body through [`envelope::parse`] then [`envelope::check`].
pub fn invoke_envelope(body: &[u8]) -> Result<Accepted, Box<Refusal>> {
    let checked = envelope::parse(body)
        .and_then(envelope::check)
        .map_err(Refusal::boxed)?;
    Ok(Accepted {
        request: checked.request,
        version_req: checked.version_req,
        policy: checked.policy,
    })
}

/// The forwarded envelope the router writes for `request` with its own
/// writer (`json.rs`): `caller` calling version `capability_version` with
/// `deadline` and `attempt`.
pub fn forwarded_envelope(
    request: &InvokeRequest,
    request_id: &str,
    capability_version: &str,
    caller: &Caller,
    deadline: u64,
    attempt: u32,
) -> serde_json::Result<Vec<u8>> {
    json::Forwarded::new(
        request,
        request_id,
        (&request.capability, capability_version),
        caller,
        deadline,
        attempt,
    )
    .to_vec()
}

/// The succeeded result envelope the router writes with its own writer
/// (`json.rs`) for these fields.
pub fn succeeded_envelope(
    request_id: &str,
    capability: Option<&str>,
    capability_version: &str,
    agent_id: &str,
    (attempts, duration_ms): (u32, u64),
    output: Option<&RawValue>,
) -> Vec<u8> {
    json::Succeeded {
        version: ENVELOPE_VERSION,
        request_id,
        capability,
        capability_version,
        agent_id,
        attempts,
        duration_ms,
        output,
        budget: None,
    }
    .to_vec()
}
