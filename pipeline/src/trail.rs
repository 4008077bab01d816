//! What the pipeline hands the trail (`agent_reach_trail`, issue 37): one
//! entry per admitted or refused call, built where the call is recorded in
//! the recent calls, offered to the trail's recorder (a push into a bounded
//! buffer, never a wait). Inputs and outputs go in only for the capabilities `acl.yaml`
//! names under `trail.payloads`, with credential fields redacted.

use std::sync::Arc;

use agent_reach_access::credentials::CredentialFields;
use agent_reach_trail::{Entry, Recorder};

use crate::call::Call;
use crate::error::RouterError;
use crate::outcome::Success;
use crate::recent::Tried;

/// Where this part's calls are recorded beyond the ring, and how payloads are redacted.
pub struct TrailHook {
    pub recorder: Arc<Recorder>,
    pub credentials: CredentialFields,
}

impl TrailHook {
    /// `value` with its credential fields redacted.
    fn redacted(&self, mut value: serde_json::Value) -> serde_json::Value {
        self.credentials.redact(&mut value);
        value
    }

    /// The entry of `call` as it began: ids, caller, door, capability and,
    /// when `payloads`, its input. The end is filled in by [`finish`].
    pub(crate) fn begin(&self, call: &Call, payloads: bool) -> Entry {
        let request = &call.checked.request;
        Entry {
            at_ms: call.received.epoch_ms,
            request_id: call.request_id().to_string(),
            trace_id: call.trace.trace_id.to_string(),
            session_id: request.session_id.clone(),
            context_id: request.context_id.clone(),
            // A workflow step's call names its run (the worker sets it from the task).
            run_id: call.checked.run_id.clone(),
            task_id: call.checked.task_id.clone(),
            parent_request_id: call.upstream.as_ref().and_then(|upstream| upstream.request_id.clone()),
            replay_of: request.replay_of.clone(),
            caller: call.caller.name().unwrap_or("").to_string(),
            chain: call.chain.get().map(|names| serde_json::json!(names)),
            door: call.door,
            capability: request.capability.clone(),
            capability_version: None,
            agent_id: None,
            agent: None,
            attempts: 0,
            duration_ms: 0.0,
            status: "failed",
            code: None,
            input: payloads.then(|| self.redacted(request.payload.clone())),
            output: None,
        }
    }
}

/// How a call ended, for its entry.
pub(crate) struct Ending<'a> {
    pub version: Option<&'a str>,
    pub error: Option<&'a RouterError>,
    pub success: Option<&'a Success>,
    pub duration_us: u64,
}

/// Completes `entry` with how the call ended and its attempts.
pub(crate) fn finish(hook: &TrailHook, mut entry: Entry, ending: &Ending<'_>, tried: &Tried) -> Entry {
    if let Some(last) = tried.last() {
        entry.agent_id = Some(last.instance.agent_id.clone());
        entry.agent = Some(last.instance.name.clone());
    }
    entry.attempts = u32::try_from(tried.len()).unwrap_or(u32::MAX);
    entry.capability_version = ending.version.map(str::to_string);
    entry.duration_ms = ending.duration_us as f64 / 1000.0;
    match (ending.error, ending.success) {
        (Some(error), _) => {
            entry.status = "failed";
            entry.code = Some(error.code.as_str());
        }
        (None, Some(success)) if success.accepted.is_some() => entry.status = "accepted",
        (None, success) => {
            entry.status = "succeeded";
            if entry.input.is_some() {
                entry.output = success
                    .and_then(|success| success.output.as_deref())
                    .and_then(|raw| serde_json::from_str(raw.get()).ok())
                    .map(|value| hook.redacted(value));
            }
        }
    }
    entry
}
