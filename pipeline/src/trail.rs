//! What the pipeline hands the trail (`agent_reach_trail`, issue 37): one
//! entry per admitted or refused call, built where the call is recorded in
//! the recent calls, offered to the trail's recorder (a push into a bounded
//! buffer, never a wait). Inputs and outputs go in only for the capabilities `acl.yaml`
//! names under `trail.payloads`, with credential fields redacted.

use std::borrow::Cow;
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
    /// when `payloads`, its input, borrowed from the call where they can be.
    /// The end is filled in by [`finish`].
    pub(crate) fn begin<'a>(&self, call: &'a Call, payloads: bool) -> Entry<'a> {
        let request = &call.checked.request;
        Entry {
            at_ms: call.received.epoch_ms,
            request_id: Cow::Borrowed(call.request_id()),
            trace_id: Cow::Owned(call.trace.trace_id.to_string()),
            session_id: request.session_id.as_deref().map(Cow::Borrowed),
            context_id: request.context_id.as_deref().map(Cow::Borrowed),
            // A workflow step's call names its run (the worker sets it from the task).
            run_id: call.checked.run_id.as_deref().map(Cow::Borrowed),
            task_id: call.checked.task_id.as_deref().map(Cow::Borrowed),
            parent_request_id: call
                .upstream
                .as_ref()
                .and_then(|upstream| upstream.request_id.as_deref())
                .map(Cow::Borrowed),
            replay_of: request.replay_of.as_deref().map(Cow::Borrowed),
            caller: Cow::Borrowed(call.caller.name().unwrap_or("")),
            chain: call.chain.get().map(|names| serde_json::json!(names)),
            door: call.door,
            capability: Cow::Borrowed(&request.capability),
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
pub(crate) fn finish<'a>(hook: &TrailHook, mut entry: Entry<'a>, ending: &Ending<'a>, tried: &'a Tried) -> Entry<'a> {
    if let Some(last) = tried.last() {
        entry.agent_id = Some(Cow::Borrowed(&last.instance.agent_id));
        entry.agent = Some(Cow::Borrowed(&last.instance.name));
    }
    entry.attempts = u32::try_from(tried.len()).unwrap_or(u32::MAX);
    entry.capability_version = ending.version.map(Cow::Borrowed);
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
