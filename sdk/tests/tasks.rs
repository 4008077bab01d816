//! Long work with the SDK (issue 21, point 3): a handler that accepts a
//! task's delivery (`202`) and reports later through `Ctx::accept_and_report`,
//! against real etcd, Redis, registry and router; the same handler answers a
//! synchronous call directly.

use std::time::Duration;

use agent_reach_access::AuthConfig;
use agent_reach_sdk::{handler, Agent, Ctx, HandlerError};
use agent_reach_testkit::{eventually, Etcd, Redis};
use serde_json::{json, Value};

const SECRET: &str = "sdk-tasks-secret-sdk-tasks-secret-0123456789";
const ACL: &str = "version: 1\npermissions:\n  - caller: tester\n    allow: [demo.*]\nproviders:\n  - agent: slow_agent\n    provides: [demo.*]\n";

fn token(name: &str) -> String {
    agent_reach_access::token::issue_hs256(name, SECRET.as_bytes(), Duration::from_secs(3600)).unwrap()
}

/// Works for a while, then reports; `fail` reports an error instead.
#[handler(capability = "demo.report", version = "1.0.0")]
async fn build_report(ctx: Ctx, month: String) -> Result<Value, HandlerError> {
    let task = ctx.task_id().map(str::to_string);
    ctx.accept_and_report(async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        if month == "fail" {
            return Err(HandlerError::new("NO_DATA", "no data for that month"));
        }
        Ok(json!({ "report": format!("report for {month}"), "task_id": task }))
    })
    .await
}

async fn serve_on_free_port<F, Fut>(serve: F) -> (String, tokio::task::JoinHandle<()>)
where
    F: FnOnce(tokio::net::TcpListener) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (url, tokio::spawn(serve(listener)))
}

async fn submit(client: &reqwest::Client, router: &str, month: &str) -> String {
    let response = client
        .post(format!("{router}/v1/tasks"))
        .bearer_auth(token("tester"))
        .json(&json!({ "capability": "demo.report", "payload": month, "timeout_ms": 10_000 }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    response.json::<Value>().await.unwrap()["task_id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn ended(client: &reqwest::Client, router: &str, task_id: &str) -> Value {
    let read = || async {
        client
            .get(format!("{router}/v1/tasks/{task_id}"))
            .bearer_auth(token("tester"))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    let done = eventually(Duration::from_secs(15), || async {
        matches!(read().await["status"].as_str(), Some("succeeded" | "failed"))
    })
    .await;
    let task = read().await;
    assert!(done, "the task never ended: {task}");
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_accepts_a_task_and_reports_its_result_later() {
    let etcd = Etcd::start();
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let acl = dir.path().join("acl.yaml");
    std::fs::write(&acl, ACL).unwrap();
    let registry = agent_reach_registry::build(&agent_reach_registry::Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: agent_reach_registry::StoreChoice::Etcd(vec![etcd.endpoint()]),
        acl: acl.clone(),
        auth: AuthConfig::Hs256SecretFile(secret.clone()),
        listener_tls: None,
        service: agent_reach_registry::RegistryConfig {
            ttl: agent_reach_registry::TtlBounds {
                min_s: 1,
                max_s: 300,
                default_s: 15,
            },
            ..Default::default()
        },
    })
    .await
    .unwrap();
    let (registry_url, _registry) = serve_on_free_port(|listener| async move {
        let _ = agent_reach_registry::serve(listener, registry, std::future::pending()).await;
    })
    .await;
    let mut settings = agent_reach_router::Settings::new(
        "127.0.0.1:0".parse().unwrap(),
        registry_url.clone(),
        AuthConfig::Hs256SecretFile(secret),
        acl,
    );
    settings.tasks = Some(agent_reach_router::TasksSettings {
        redis: redis.url(),
        store: agent_reach_task_store::StoreConfig::default(),
        callbacks: agent_reach_task_store::CallbackConfig::new(SECRET.as_bytes().to_vec()),
        workers: 4,
        // The work takes longer than this: the claim is kept while it runs.
        reclaim_after: Duration::from_millis(200),
        max_task_attempts: 3,
        quota_share: Some(std::time::Duration::from_millis(100)),
        trail: None,
        tag_limits: Vec::new(),
    });
    let router = agent_reach_router::build(&settings).await.unwrap();
    let routed = router.clone();
    let (router_url, _router) = serve_on_free_port(|listener| async move {
        let _ = agent_reach_router::serve(listener, router, std::future::pending()).await;
    })
    .await;
    let agent = Agent::builder("slow_agent", "slow_agent-1")
        .registry(&registry_url)
        .router(&router_url)
        .token(token("slow_agent"))
        .ttl_s(3)
        .handler(build_report)
        .start()
        .await
        .unwrap();
    agent.mark_ready();
    assert!(
        eventually(Duration::from_secs(10), || async {
            routed.routed_agent_ids() == ["slow_agent-1"]
        })
        .await
    );

    let client = reqwest::Client::new();
    let task_id = submit(&client, &router_url, "2026-11").await;
    let task = ended(&client, &router_url, &task_id).await;
    assert_eq!(task["status"], "succeeded", "{task}");
    assert_eq!(task["attempts"], 1, "delivered once: {task}");
    assert_eq!(
        task["result"]["output"],
        json!({ "report": "report for 2026-11", "task_id": task_id })
    );

    let failing = submit(&client, &router_url, "fail").await;
    let task = ended(&client, &router_url, &failing).await;
    assert_eq!(task["status"], "failed", "{task}");
    assert_eq!(task["result"]["error"]["code"], "AGENT_ERROR");
    assert_eq!(task["result"]["error"]["details"]["agent_code"], "NO_DATA");

    // A synchronous call has no task to report to: the same handler answers it directly.
    let response = client
        .post(format!("{router_url}/v1/invoke"))
        .bearer_auth(token("tester"))
        .json(&json!({ "capability": "demo.report", "payload": "2026-10", "timeout_ms": 5000 }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(
        answer["output"],
        json!({ "report": "report for 2026-10", "task_id": null })
    );
    agent.shutdown().await;
}
