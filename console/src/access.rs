//! Access requests in the console (DESIGN §2.11, §3.12): this router's view
//! of who may call what (`GET /v1/routing/access`: the file's `permissions`
//! and `owners`, and the live grants it applies on top of them, as its
//! `Watch` brought them), and the registry's access routes relayed with the
//! operator's own token ([`crate::relay`]): pending requests, approve, deny,
//! revoke. The registry decides: an operator approves only what `owners:`
//! lets it approve.

use axum::extract::State;
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde_json::json;

use super::{operator, relay, ConsoleState};
use agent_reach_pipeline::answer::refused;
use agent_reach_pipeline::call::identify::Identified;
use agent_reach_pipeline::clock;

/// `GET /v1/routing/access`: the file's rules beside the grants this router applies.
pub async fn view(State(state): State<ConsoleState>, identified: Identified, headers: HeaderMap) -> Response {
    let admission = state.service.admission();
    if let Err(error) = operator(admission, &identified, &headers) {
        return refused(error);
    }
    let acl = admission.acl().current();
    let permissions: Vec<_> = acl
        .permission_rules()
        .into_iter()
        .map(|(caller, allow)| json!({ "caller": caller, "allow": allow }))
        .collect();
    let owners: Vec<_> = acl
        .owners()
        .iter()
        .map(|owner| json!({ "capability": owner.capability.to_string(), "approvers": owner.approvers }))
        .collect();
    let now = clock::epoch_ms();
    let grants: Vec<_> = admission
        .grants()
        .load()
        .all()
        .iter()
        .map(|grant| {
            json!({
                "id": grant.id,
                "caller": grant.caller,
                "capability": grant.capability,
                "granted_by": grant.granted_by,
                "granted_at_ms": grant.granted_at_ms,
                "expires_at_ms": grant.expires_at_ms,
                "request_id": grant.request_id,
                // An expired grant stays until the registry removes it; it allows nothing.
                "live": grant.is_live(now),
            })
        })
        .collect();
    Json(json!({ "permissions": permissions, "owners": owners, "grants": grants })).into_response()
}

/// `GET /v1/access-requests[?status=]`, relayed.
pub async fn requests(
    State(state): State<ConsoleState>,
    uri: http::Uri,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    relay::relay(&state, (&identified, &headers), Method::GET, &uri, Bytes::new()).await
}

/// `POST /v1/access-requests/{id}/approve` and `…/deny`, relayed: the
/// registry checks that the operator is an approver of the capability.
pub async fn decide(
    State(state): State<ConsoleState>,
    uri: http::Uri,
    identified: Identified,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    relay::relay(&state, (&identified, &headers), Method::POST, &uri, body).await
}

/// `DELETE /v1/grants/{id}`, relayed.
pub async fn revoke(
    State(state): State<ConsoleState>,
    uri: http::Uri,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    relay::relay(&state, (&identified, &headers), Method::DELETE, &uri, Bytes::new()).await
}
