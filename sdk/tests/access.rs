//! `Agent::request_access` against the real registry (issue 39, point 3;
//! DESIGN §2.11): an agent asks at start-up to call a capability acl.yaml
//! does not let it call; asking again answers the same pending request; once
//! an owner approves, it is allowed, and its calls go through the router;
//! bad input has the registry's code.

use crate::support;

use std::time::Duration;

use agent_reach_sdk::{AccessRequest, Client, Ctx, Handler, HandlerError};
use agent_reach_testkit::eventually;
use serde_json::{json, Value};
use support::{token, Stack};

fn audit() -> Handler {
    Handler::new("audit.log", "1.0.0", |_ctx: Ctx, input: Value| async move {
        Ok::<_, HandlerError>(json!({ "logged": input }))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_asks_for_access_at_start_up_and_is_allowed_once_approved() {
    let stack = Stack::start(1).await;
    let agent = stack.agent("echo_agent-1").handler(audit()).start().await.unwrap();
    agent.mark_ready();
    assert!(eventually(Duration::from_secs(10), || async { agent.is_registered() }).await);

    // echo_agent may call demo.*, not audit.*: it asks.
    let asked = agent
        .request_access(
            "audit.log",
            "echo_agent writes audit records",
            Some(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    let AccessRequest::Pending { id, approvers } = asked else {
        panic!("expected a pending request, got {asked:?}");
    };
    assert_eq!(approvers, ["owner"]);
    // At the next start-up: the same request, not a second one.
    let again = agent.request_access("audit.log", "again", None).await.unwrap();
    assert_eq!(
        again,
        AccessRequest::Pending {
            id: id.clone(),
            approvers
        }
    );

    let caller = Client::new(stack.router(), token("echo_agent")).unwrap();
    let refused = caller
        .invoke::<Value>("audit.log", json!({ "n": 1 }))
        .await
        .unwrap_err();
    assert_eq!(refused.code, "FORBIDDEN");

    let http = reqwest::Client::new();
    let approved: Value = http
        .post(format!("{}/v1/access-requests/{id}/approve", stack.registry))
        .bearer_auth(token("owner"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(approved["status"], "approved", "{approved}");
    assert_eq!(
        agent.request_access("audit.log", "once more", None).await.unwrap(),
        AccessRequest::Allowed
    );
    let through = eventually(Duration::from_secs(5), || async {
        caller.invoke::<Value>("audit.log", json!({ "n": 2 })).await.is_ok()
    })
    .await;
    assert!(through, "the approved call goes through the router");

    // Bad input: the registry's codes.
    let missing = agent.request_access("audit.nothing", "r", None).await.unwrap_err();
    assert_eq!(
        (missing.code.as_str(), missing.status),
        ("CAPABILITY_NOT_FOUND", Some(404))
    );
    let blank = agent.request_access("audit.log", " ", None).await.unwrap_err();
    assert_eq!(
        (blank.code.as_str(), blank.status),
        ("INVALID_ACCESS_REQUEST", Some(400))
    );
    agent.shutdown().await;
}
