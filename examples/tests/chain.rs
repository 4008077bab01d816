//! The worked example on real stores: etcd behind the registry, Redis behind
//! the context service, every agent built with the SDK.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_reach_examples::stack::{Stack, StackOptions};
use agent_reach_examples::{scenario_instances, InstanceSpec};
use agent_reach_testkit::{Etcd, Redis};
use serde_json::{json, Value};

const CAPABILITIES: [&str; 4] = ["intent.parse", "order.query", "shipping.rules", "reply.write"];

async fn stack_on_real_stores(etcd: &Etcd, redis: &Redis, agents: Vec<InstanceSpec>) -> Stack {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    Stack::start(StackOptions {
        registry_listen: any,
        router_listen: any,
        context_listen: any,
        etcd: vec![etcd.endpoint()],
        redis: Some(redis.url()),
        acl: None,
        agents,
    })
    .await
    .unwrap()
}

fn token(stack: &Stack, name: &str) -> String {
    stack.token(name, Duration::from_secs(600)).unwrap()
}

async fn new_context(stack: &Stack, client: &reqwest::Client) -> String {
    let created: Value = client
        .post(format!("{}/v1/contexts", stack.context))
        .bearer_auth(token(stack, "demo_user"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    created["context_id"].as_str().unwrap().to_string()
}

async fn ask(stack: &Stack, client: &reqwest::Client, caller: &str, context_id: &str, question: &str) -> (u16, Value) {
    let response = client
        .post(format!("{}/v1/invoke", stack.router))
        .bearer_auth(token(stack, caller))
        .json(
            &json!({"capability": "intent.parse", "context_id": context_id, "timeout_ms": 10_000,
                      "payload": {"user_id": "u_42", "text": question}}),
        )
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chain_answers_with_whitelisted_context_and_refuses_outsiders() {
    let (etcd, redis) = (Etcd::start(), Redis::start());
    let stack = stack_on_real_stores(&etcd, &redis, scenario_instances()).await;
    stack
        .wait_until_routable(&CAPABILITIES, Duration::from_secs(20))
        .await
        .unwrap();
    let client = reqwest::Client::new();

    let cases = [
        (
            "Can my order SO-2024001 ship today?",
            "good news: order SO-2024001 ships today",
            true,
        ),
        ("Can my order SO-2024002 ship today?", "after the 15:00 cutoff", false),
        ("Will SO-2024003 ship today?", "not paid yet", false),
    ];
    let mut last_context = String::new();
    for (question, expected, ships) in cases {
        let context_id = new_context(&stack, &client).await;
        let (status, answer) = ask(&stack, &client, "demo_user", &context_id, question).await;
        assert_eq!(status, 200, "{answer}");
        let reply = answer["output"]["reply"].as_str().unwrap();
        assert!(
            reply.contains(expected) && reply.starts_with("Hi u_42"),
            "{question}: {reply}"
        );
        assert_eq!(answer["output"]["ships_today"], ships);
        let hops: Vec<&str> = answer["output"]["trace"]
            .as_array()
            .unwrap()
            .iter()
            .map(|hop| hop["capability"].as_str().unwrap())
            .collect();
        assert_eq!(hops, ["order.query", "shipping.rules", "reply.write"]);
        last_context = context_id;
    }

    // Each agent sees only the fields its whitelist allows.
    let read_as = |name: &'static str| {
        let client = client.clone();
        let url = format!("{}/v1/contexts/{last_context}", stack.context);
        let token = token(&stack, name);
        async move {
            let body: Value = client
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let mut fields: Vec<String> = body["fields"].as_object().unwrap().keys().cloned().collect();
            fields.sort();
            fields
        }
    };
    assert_eq!(read_as("reply_writer").await, ["intent", "order_status", "user_id"]);
    assert!(read_as("order_query").await.is_empty());
    assert!(read_as("intent_parser").await.is_empty());
    assert!(read_as("demo_user").await.is_empty());
    // ... and may write only its own fields.
    let forbidden = client
        .patch(format!("{}/v1/contexts/{last_context}", stack.context))
        .bearer_auth(token(&stack, "order_query"))
        .json(&json!({"set": {"intent": "something_else"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(forbidden.status(), 403);

    // A caller outside the ACL is refused; so is a call the ACL does not list.
    let context_id = new_context(&stack, &client).await;
    let (status, answer) = ask(
        &stack,
        &client,
        "stranger",
        &context_id,
        "Can my order SO-2024001 ship today?",
    )
    .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (403, Some("FORBIDDEN")),
        "{answer}"
    );
    let direct = client
        .post(format!("{}/v1/invoke", stack.router))
        .bearer_auth(token(&stack, "demo_user"))
        .json(&json!({"capability": "order.query", "payload": {"order_id": "SO-2024001"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 403, "demo_user may only call intent.parse");
    stack.shutdown().await;
}

/// An `example-agent` process, SIGKILLed if the test ends early.
struct AgentProcess(std::process::Child);

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_order_query(stack: &Stack, agent_id: &str) -> AgentProcess {
    let services = stack.services();
    let child = Command::new(env!("CARGO_BIN_EXE_example-agent"))
        .args(["--agent", "order_query", "--agent-id", agent_id])
        .args([
            "--registry",
            &services.registry,
            "--router",
            &services.router,
            "--context",
            &services.context,
        ])
        .args(["--token", &token(stack, "order_query")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    AgentProcess(child)
}

async fn routable(stack: &Stack, capability: &str) -> Vec<String> {
    let resolved: Value = reqwest::Client::new()
        .get(format!("{}/v1/capabilities/{capability}", stack.registry))
        .bearer_auth(token(stack, "demo_user"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    resolved["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|instance| instance["agent_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_fails_no_request_and_deregisters() {
    let (etcd, redis) = (Etcd::start(), Redis::start());
    let others: Vec<InstanceSpec> = scenario_instances()
        .into_iter()
        .filter(|spec| spec.name != "order_query")
        .collect();
    let stack = Arc::new(stack_on_real_stores(&etcd, &redis, others).await);
    let mut leaving = spawn_order_query(&stack, "order_query-a");
    let _staying = spawn_order_query(&stack, "order_query-b");
    let deadline = Instant::now() + Duration::from_secs(30);
    while routable(&stack, "order.query").await.len() < 2 {
        assert!(Instant::now() < deadline, "agent processes never became routable");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stack
        .wait_until_routable(&CAPABILITIES, Duration::from_secs(20))
        .await
        .unwrap();

    // Steady load from 4 callers until told to stop.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (succeeded, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut callers = Vec::new();
    for _ in 0..4 {
        let (stack, stop, succeeded, failed) = (stack.clone(), stop.clone(), succeeded.clone(), failed.clone());
        callers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let context_id = new_context(&stack, &client).await;
                let (status, answer) =
                    ask(&stack, &client, "demo_user", &context_id, "Can SO-2024001 ship today?").await;
                if status == 200 {
                    succeeded.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                    failures.push(answer);
                }
            }
            failures
        }));
    }
    let warm = Instant::now() + Duration::from_secs(10);
    while succeeded.load(Ordering::Relaxed) < 20 {
        assert!(Instant::now() < warm, "load never got going");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = leaving.0.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    // The process drains, deregisters and exits by itself.
    let exit_deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = leaving.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < exit_deadline, "agent did not exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "agent exited with {status}");
    let after_exit = succeeded.load(Ordering::Relaxed);
    let settle = Instant::now() + Duration::from_secs(10);
    while succeeded.load(Ordering::Relaxed) < after_exit + 20 {
        assert!(Instant::now() < settle, "load stalled after the agent left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for caller in callers {
        failures.extend(caller.await.unwrap());
    }
    assert!(failures.is_empty(), "{} failed requests: {failures:?}", failures.len());
    assert_eq!(routable(&stack, "order.query").await, ["order_query-b"]);
    let gone = reqwest::Client::new()
        .get(format!("{}/v1/agents/order_query-a", stack.registry))
        .bearer_auth(token(&stack, "demo_user"))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404, "the agent deregistered itself");
}
