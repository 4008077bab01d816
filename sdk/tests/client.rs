//! The SDK's client side against the real thing (issue 21, point 8): a
//! handler's calls with a version requirement, a policy, a priority and a
//! timeout; a session context closed by an agent; and [`Client`], the caller
//! for programs that are not agents (invoke, tasks with signed callbacks,
//! events, cancel, session results). etcd, Redis, the registry, the router and
//! the context service are real; so are the agents and the callback receiver.

use crate::support;

use std::time::Duration;

use agent_reach_sdk::{
    verify_callback, Agent, CallError, CallOptions, Callback, Client, ContextTier, Ctx, Handler, HandlerError,
    Priority, TargetPolicy, TaskStatus,
};
use agent_reach_testkit::eventually;
use serde_json::{json, Value};
use support::Stack;
use tokio::sync::{mpsc, watch};

/// `demo.version` at `version`: answers which version served it and the priority it was given.
fn version(version: &'static str) -> Handler {
    Handler::new("demo.version", version, move |ctx: Ctx, _input: Value| async move {
        Ok::<_, HandlerError>(json!({"version": version, "priority": ctx.priority()}))
    })
}

fn echo() -> Handler {
    Handler::new("demo.echo", "1.0.0", |_ctx: Ctx, input: Value| async move {
        Ok::<_, HandlerError>(input)
    })
}

/// `demo.hold`: answers once the gate opens.
fn hold(gate: watch::Receiver<bool>) -> Handler {
    Handler::new("demo.hold", "1.0.0", move |_ctx: Ctx, _input: Value| {
        let mut gate = gate.clone();
        async move {
            let _ = gate.wait_for(|open| *open).await;
            Ok::<_, HandlerError>(json!("released"))
        }
    })
}

/// A call's outcome as JSON, so the test can look at successes and failures alike.
fn outcome(result: Result<agent_reach_sdk::ResultEnvelope, CallError>) -> Value {
    match result {
        Ok(envelope) => json!({
            "version": envelope.capability_version,
            "agent_id": envelope.agent_id,
            "output": envelope.output,
        }),
        Err(error) => json!({"code": error.code, "status": error.status}),
    }
}

/// `demo.relay`: calls `input.capability` with the options `input` names and
/// answers the outcome: what a handler's `Ctx::call_with` does end to end.
fn relay() -> Handler {
    Handler::new("demo.relay", "1.0.0", |ctx: Ctx, input: Value| async move {
        let mut options = CallOptions::new();
        if let Some(requirement) = input["version"].as_str() {
            options = options.version(requirement);
        }
        if let Some(policy) = input.get("policy") {
            let policy: TargetPolicy = serde_json::from_value(policy.clone())
                .map_err(|error| HandlerError::invalid_input(error.to_string()))?;
            options = options.policy(policy);
        }
        if let Some(priority) = input.get("priority") {
            let priority: Priority = serde_json::from_value(priority.clone())
                .map_err(|error| HandlerError::invalid_input(error.to_string()))?;
            options = options.priority(priority);
        }
        if let Some(ms) = input["timeout_ms"].as_u64() {
            options = options.timeout(Duration::from_millis(ms));
        }
        if let Some(session) = input["session_id"].as_str() {
            options = options.session_id(session);
        }
        let capability = input["capability"].as_str().unwrap_or("demo.version");
        Ok::<_, HandlerError>(outcome(ctx.call_envelope_with(capability, json!({}), &options).await))
    })
}

/// `demo.close`: reads the request's context, closes it, and reports what a
/// read and a second close answer afterwards.
fn close() -> Handler {
    Handler::new("demo.close", "1.0.0", |ctx: Ctx, _input: Value| async move {
        let before = ctx.context().get(&[]).await?;
        ctx.context().close().await?;
        let read_after = ctx.context().get(&[]).await.err().map(|error| error.code);
        let close_again = ctx.context().close().await.err().map(|error| error.code);
        Ok::<_, HandlerError>(json!({
            "topic": before.fields.get("topic"),
            "read_after": read_after,
            "close_again": close_again,
        }))
    })
}

/// Starts `agent` and marks it ready.
async fn ready(builder: agent_reach_sdk::AgentBuilder) -> Agent {
    let agent = builder.start().await.unwrap();
    agent.mark_ready();
    agent
}

/// Relays through `demo.relay` with `input` as `tester` (with `priority`, if any).
async fn relayed(stack: &Stack, input: Value, priority: Option<&str>) -> Value {
    let (status, output) = try_relayed(stack, input, priority).await;
    assert_eq!(status, 200, "{output}");
    output
}

/// [`relayed`] without the check: (status, output or the whole failed envelope).
async fn try_relayed(stack: &Stack, input: Value, priority: Option<&str>) -> (u16, Value) {
    let mut body = json!({"capability": "demo.relay", "payload": input, "timeout_ms": 10_000});
    if let Some(priority) = priority {
        body["priority"] = json!(priority);
    }
    let (status, result) = stack.invoke_on(stack.router(), body).await;
    if status == 200 {
        (status, result["output"].clone())
    } else {
        (status, result)
    }
}

/// A handler's calls choose the version, the policy, the priority and the
/// time allowed; without options the router's defaults apply (the highest
/// version, the caller's priority, the caller's deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_calls_take_version_policy_priority_and_timeout() {
    let stack = Stack::start(1).await;
    let (_open, gate) = watch::channel(false);
    let one = ready(
        stack
            .agent("relay-v1")
            .handler(version("1.0.0"))
            .handler(relay())
            .handler(hold(gate)),
    )
    .await;
    let two = ready(stack.agent("version-v2").handler(version("2.0.0"))).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            stack.instance("version-v2").await["status"] == "ready"
                && stack.resolvable("demo.relay").await == ["relay-v1"]
        })
        .await
    );
    // The router's watch caught up with both versions.
    assert!(
        eventually(Duration::from_secs(10), || async {
            try_relayed(&stack, json!({}), None).await.1["version"] == "2.0.0"
        })
        .await
    );

    // Version requirement: `^1` is served by 1.0.0, `=2.0.0` by 2.0.0, `^3` by nobody.
    let pinned = relayed(&stack, json!({"version": "^1"}), None).await;
    assert_eq!(
        (&pinned["version"], &pinned["output"]["version"]),
        (&json!("1.0.0"), &json!("1.0.0")),
        "{pinned}"
    );
    let exact = relayed(&stack, json!({"version": "=2.0.0"}), None).await;
    assert_eq!(exact["version"], "2.0.0", "{exact}");
    let missing = relayed(&stack, json!({"version": "^3"}), None).await;
    assert_eq!(missing["code"], "VERSION_NOT_FOUND", "{missing}");

    // Priority: inherited from the request the handler serves, unless given.
    let inherited = relayed(&stack, json!({}), Some("low")).await;
    assert_eq!(inherited["output"]["priority"], "low", "{inherited}");
    let given = relayed(&stack, json!({"priority": "high"}), Some("low")).await;
    assert_eq!(given["output"]["priority"], "high", "{given}");
    let default = relayed(&stack, json!({}), None).await;
    assert_eq!(default["output"]["priority"], "normal", "{default}");

    // Policy: `consistent_hash` reaches the router, which needs a session for it.
    let unkeyed = relayed(&stack, json!({"policy": "consistent_hash"}), None).await;
    assert_eq!(
        (&unkeyed["code"], &unkeyed["status"]),
        (&json!("INVALID_ENVELOPE"), &json!(400)),
        "{unkeyed}"
    );
    let keyed = relayed(&stack, json!({"policy": "consistent_hash", "session_id": "s-7"}), None).await;
    let chosen = keyed["agent_id"].clone();
    assert!(chosen.is_string(), "{keyed}");
    for _ in 0..5 {
        let again = relayed(&stack, json!({"policy": "consistent_hash", "session_id": "s-7"}), None).await;
        assert_eq!(again["agent_id"], chosen, "one session, one instance: {again}");
    }

    // Timeout: a call to work that never ends comes back DEADLINE_EXCEEDED at
    // the call's own timeout, well before the handler's 10 s deadline.
    let started = std::time::Instant::now();
    let timed_out = relayed(&stack, json!({"capability": "demo.hold", "timeout_ms": 300}), None).await;
    assert_eq!(timed_out["code"], "DEADLINE_EXCEEDED", "{timed_out}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "the timeout was not applied: {:?}",
        started.elapsed()
    );
    one.shutdown().await;
    two.shutdown().await;
}

/// An agent closes the session context: gone at once for everybody
/// (`CONTEXT_NOT_FOUND` for a read, and for a second close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_closes_a_session_context() {
    let stack = Stack::start(1).await;
    let agent = ready(stack.agent("closer-1").handler(close()).handler(echo())).await;
    // The router's watch caught up with the instance (an echo has no side effects).
    assert!(
        eventually(Duration::from_secs(10), || async {
            stack.invoke("demo.echo", json!(1)).await.0 == 200
        })
        .await
    );
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{}/v1/contexts", stack.context))
        .bearer_auth(support::token("tester"))
        .json(&json!({"fields": {"topic": "refund"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let context_id = created["context_id"].as_str().unwrap().to_string();

    let (status, result) = stack
        .invoke_on(
            stack.router(),
            json!({"capability": "demo.close", "payload": {}, "context_id": context_id, "timeout_ms": 10_000}),
        )
        .await;
    assert_eq!(status, 200, "{result}");
    assert_eq!(
        result["output"],
        json!({"topic": "refund", "read_after": "CONTEXT_NOT_FOUND", "close_again": "CONTEXT_NOT_FOUND"})
    );
    // Gone for its creator too.
    let read = http
        .get(format!("{}/v1/contexts/{context_id}", stack.context))
        .bearer_auth(support::token("tester"))
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 404);
    agent.shutdown().await;
}

/// Receives task callbacks on a loopback port: (headers' task id, signature, body).
async fn callback_receiver() -> (String, mpsc::UnboundedReceiver<(String, String, Vec<u8>)>) {
    let (sender, receiver) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: http::HeaderMap, body: axum::body::Bytes| {
            let sender = sender.clone();
            async move {
                let header = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|value| value.to_str().ok())
                        .unwrap_or("")
                        .to_string()
                };
                let _ = sender.send((
                    header("x-agent-reach-task-id"),
                    header("x-agent-reach-signature"),
                    body.to_vec(),
                ));
                http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, receiver)
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A program that is not an agent: invokes with options, submits a task with
/// a callback (signed, verified here), follows and waits for it, repeats a
/// submission idempotently, cancels a task, reads the session's results; and
/// each failure carries the router's code and status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_invokes_runs_tasks_with_callbacks_and_reads_session_results() {
    let stack = Stack::start(1).await;
    let (open, gate) = watch::channel(false);
    let one = ready(
        stack
            .agent("client-v1")
            .handler(version("1.0.0"))
            .handler(echo())
            .handler(hold(gate)),
    )
    .await;
    let two = ready(stack.agent("client-v2").handler(version("2.0.0"))).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            stack.instance("client-v1").await["status"] == "ready"
                && stack.instance("client-v2").await["status"] == "ready"
        })
        .await
    );
    let client = Client::new(stack.router(), support::token("tester")).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            let answer: Result<Value, _> = client.invoke("demo.version", json!({})).await;
            answer.is_ok_and(|output| output["version"] == "2.0.0")
        })
        .await
    );

    // Invoke: plain, and with options.
    let echoed: Value = client.invoke("demo.echo", json!({"n": 1})).await.unwrap();
    assert_eq!(echoed, json!({"n": 1}));
    let options = CallOptions::new()
        .version("^1")
        .priority(Priority::High)
        .policy(TargetPolicy::LeastConnections)
        .timeout(Duration::from_secs(5));
    let envelope = client
        .invoke_envelope("demo.version", json!({}), &options)
        .await
        .unwrap();
    assert_eq!(envelope.capability_version.as_deref(), Some("1.0.0"));
    assert_eq!(envelope.output, Some(json!({"version": "1.0.0", "priority": "high"})));
    // Failures: the router's code and status.
    let missing = client.invoke::<Value>("demo.nothing", json!({})).await.unwrap_err();
    assert_eq!(
        (missing.code.as_str(), missing.status),
        ("CAPABILITY_NOT_FOUND", Some(404)),
        "{missing}"
    );
    let timed_out = client
        .invoke_with::<Value>(
            "demo.hold",
            json!({}),
            &CallOptions::new().timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    assert_eq!(timed_out.code, "DEADLINE_EXCEEDED", "{timed_out}");
    let stranger = Client::new(stack.router(), "not-a-token").unwrap();
    let refused = stranger.invoke::<Value>("demo.echo", json!({})).await.unwrap_err();
    assert_eq!(
        (refused.code.as_str(), refused.status),
        ("UNAUTHENTICATED", Some(401)),
        "{refused}"
    );

    // A task with a callback: stored, delivered, POSTed back signed.
    let (hook, mut callbacks) = callback_receiver().await;
    let session = CallOptions::new().session_id("s-client").request_id("client-task-1");
    let accepted = client
        .submit_task("demo.echo", json!({"n": 2}), &session, Some(&Callback::new(&hook)))
        .await
        .unwrap();
    assert_eq!((accepted.status, accepted.duplicate), (TaskStatus::Pending, false));
    let done = client
        .wait_task(&accepted.task_id, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(done.status, TaskStatus::Succeeded);
    assert_eq!(done.output::<Value>().unwrap(), json!({"n": 2}));
    assert_eq!(done.session_id.as_deref(), Some("s-client"));
    let (task_id, signature, body) = tokio::time::timeout(Duration::from_secs(20), callbacks.recv())
        .await
        .expect("no callback within 20 s")
        .unwrap();
    assert_eq!(task_id, accepted.task_id);
    let window = Duration::from_secs(300);
    assert!(verify_callback(
        support::CALLBACK_SECRET,
        &signature,
        &body,
        window,
        now_s()
    ));
    assert!(!verify_callback(
        b"another-secret-another-secret-0123",
        &signature,
        &body,
        window,
        now_s()
    ));
    let delivered: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(delivered["output"], json!({"n": 2}));

    // The same request id again: the stored task, not a second one.
    let repeated = client
        .submit_task("demo.echo", json!({"n": 2}), &session, None)
        .await
        .unwrap();
    assert_eq!(
        (repeated.task_id.as_str(), repeated.duplicate),
        (accepted.task_id.as_str(), true)
    );

    // Events of a task that never ends until canceled: the stream ends with `canceled`.
    let held = client
        .submit_task("demo.hold", json!({}), &CallOptions::new().session_id("s-client"), None)
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || async {
            client
                .task(&held.task_id)
                .await
                .is_ok_and(|view| view.status == TaskStatus::Running)
        })
        .await
    );
    let follower = {
        let (client, task_id) = (client.clone(), held.task_id.clone());
        tokio::spawn(async move {
            use futures::StreamExt;
            let events = client.task_events(&task_id).await.unwrap();
            events
                .map(|event| event.map(|event| event.status))
                .collect::<Vec<_>>()
                .await
        })
    };
    let canceled = client.cancel_task(&held.task_id).await.unwrap();
    assert_eq!(canceled.status, TaskStatus::Canceled);
    let statuses = tokio::time::timeout(Duration::from_secs(20), follower)
        .await
        .expect("the event stream did not end")
        .unwrap();
    assert_eq!(statuses.last(), Some(&Ok(TaskStatus::Canceled)), "{statuses:?}");
    let ended = client.wait_task(&held.task_id, Duration::from_secs(5)).await.unwrap();
    assert_eq!(ended.output::<Value>().unwrap_err().code, "CANCELED");
    let again = client.cancel_task(&held.task_id).await.unwrap_err();
    assert_eq!(
        (again.code.as_str(), again.status),
        ("TASK_CONFLICT", Some(409)),
        "{again}"
    );
    let unknown = client.task("t_000000000000000000000000").await.unwrap_err();
    assert_eq!(
        (unknown.code.as_str(), unknown.status),
        ("TASK_NOT_FOUND", Some(404)),
        "{unknown}"
    );

    // The session's finished tasks, in order, by cursor.
    let page = client.session_results("s-client", None, None).await.unwrap();
    let ids: Vec<&str> = page.results.iter().map(|result| result.task_id.as_str()).collect();
    assert_eq!(ids, [accepted.task_id.as_str(), held.task_id.as_str()], "{page:?}");
    assert_eq!(page.results[0].status, TaskStatus::Succeeded);
    let rest = client
        .session_results("s-client", Some(&page.results[0].cursor), Some(10))
        .await
        .unwrap();
    assert_eq!(rest.results.len(), 1);
    let bad = client
        .session_results("s-client", Some("nonsense"), None)
        .await
        .unwrap_err();
    assert_eq!((bad.code.as_str(), bad.status), ("INVALID_QUERY", Some(400)), "{bad}");

    // A session context of its own: created, shared with an agent, closed.
    let without = client.context("ctx-none").get(&[]).await.unwrap_err();
    assert_eq!(without.code, "NO_CONTEXT_SERVICE", "{without}");
    let client = client.context_service(&stack.context).unwrap();
    let context = client
        .create_context(ContextTier::OneShot, [("topic", json!("refund"))])
        .await
        .unwrap();
    let context_id = context.id().unwrap().to_string();
    let version = context.patch().set("topic", "exchange").send().await.unwrap();
    let seen = client.context(&context_id).get(&["topic"]).await.unwrap();
    assert_eq!((seen.version, &seen.fields["topic"]), (version, &json!("exchange")));
    let refused = client
        .create_context(ContextTier::Default, [("budget", json!(1))])
        .await
        .unwrap_err();
    assert_eq!(refused.code, "FORBIDDEN", "outside tester's write whitelist: {refused}");
    context.close().await.unwrap();
    let gone = client.context(&context_id).get(&[]).await.unwrap_err();
    assert_eq!(gone.code, "CONTEXT_NOT_FOUND", "{gone}");

    open.send(true).unwrap();
    one.shutdown().await;
    two.shutdown().await;
}
