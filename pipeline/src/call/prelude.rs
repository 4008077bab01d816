//! The prelude of every door that takes an invoke envelope (`/v1/invoke`,
//! streamed or not, `/v1/broadcast`, `/v1/tasks`): the caller first (an
//! unauthenticated caller learns nothing, not even parse errors), then the
//! body within the limit, the envelope parsed strictly and checked, and the
//! request-id rule: a usable id of the caller's is the call's from the
//! moment it is read (a refusal of the rest still answers with it), any
//! other gets a fresh one. Every refusal is the failed result envelope with
//! what is known of the request ([`Refusal`]).

use agent_reach_proto::envelope::InvokeRequest;
use agent_reach_serving::{HeaderLookup, RequestBody};
use serde_json::Value;

use crate::answer::{failed_answer, Known};
use crate::call::identify::Identified;
use crate::call::{Call, Door};
use crate::envelope::{self, CheckedRequest};
use crate::error::RouterError;
use crate::outcome::Failure;
use crate::service::RouterService;
use crate::trace;

/// A request an envelope door refused: what is known of it, and why.
pub struct Refusal {
    pub known: Known,
    pub failure: Failure,
}

impl Refusal {
    /// A refusal before anything of the request was read.
    pub fn fresh(error: RouterError, identified: &Identified) -> Self {
        Self {
            known: Known::fresh(identified.received.instant),
            failure: error.into(),
        }
    }

    /// The failed result envelope.
    pub fn answer(self) -> agent_reach_serving::front::Answer {
        failed_answer(self.known, self.failure)
    }
}

/// An envelope door's call, and the `callback` of a task's submission.
pub struct Envelope {
    pub call: Call,
    /// `POST /v1/tasks`' callback, as sent (checked by the slow path).
    pub callback: Option<Value>,
}

/// A task submission: the invoke envelope plus `callback` (taken out before
/// the envelope is parsed, so the envelope stays as strict as everywhere).
fn with_callback(bytes: &[u8]) -> Result<(InvokeRequest, Option<Value>), RouterError> {
    let mut value: Value = agent_reach_serving::parse_json(bytes).map_err(RouterError::from)?;
    let callback = value
        .as_object_mut()
        .and_then(|object| object.remove("callback"))
        .filter(|callback| !callback.is_null());
    let request = envelope::parse(value.to_string().as_bytes())?;
    Ok((request, callback))
}

/// Reads, parses and checks the envelope of a request to `door`.
pub async fn envelope(
    service: &RouterService,
    identified: Identified,
    headers: &impl HeaderLookup,
    body: RequestBody,
    door: Door,
) -> Result<Envelope, Refusal> {
    let received = identified.received;
    let refuse = |known: Known, error: RouterError| Refusal {
        known,
        failure: error.into(),
    };
    let caller = match identified.caller {
        Ok(caller) => caller,
        Err(error) => {
            // The body is not read for unauthenticated callers: the ids are the trace's and a fresh one.
            let known = Known::fresh(received.instant);
            let trace = crate::trace::TraceContext::from_header(headers.value("traceparent"));
            tracing::info!(
                message = "Unauthenticated call refused.",
                trace_id = %trace.trace_id, request_id = %known.request_id, session_id = "",
                door = door.as_str(), %error
            );
            return Err(refuse(known, error));
        }
    };
    let parsed = match body.read(headers, service.tuning().max_body_bytes).await {
        Ok(bytes) if door == Door::Tasks => with_callback(&bytes),
        Ok(bytes) => envelope::parse(&bytes).map(|request| (request, None)),
        Err(problem) => Err(RouterError::from(problem)),
    };
    let (request, callback) = match parsed {
        Ok(request) => request,
        Err(error) => {
            service.metrics().record_rejected(error.code);
            return Err(refuse(Known::fresh(received.instant), error));
        }
    };
    // From here on the caller's id (when usable) and capability are known.
    let known = |request: &InvokeRequest| Known {
        request_id: request
            .request_id
            .clone()
            .filter(|id| !id.is_empty() && id.len() <= 128)
            .unwrap_or_else(trace::new_request_id),
        capability: Some(request.capability.clone()),
        started: received.instant,
    };
    let (version_req, policy) = match envelope::check_fields(&request) {
        Ok(checks) => checks,
        Err(error) => {
            service.metrics().record_rejected(error.code);
            return Err(refuse(known(&request), error));
        }
    };
    let checked = CheckedRequest {
        request,
        version_req,
        policy,
        task_id: None,
        history: None,
    };
    Ok(Envelope {
        call: Call::begin(door, caller, checked, headers, received),
        callback,
    })
}
