//! The SDK against the real thing: etcd (testkit), the registry and the router
//! served in-process on loopback, and agents built with the SDK.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_reach_access::AuthConfig;
use agent_reach_sdk::{handler, Agent, Ctx, Handler, HandlerError};
use agent_reach_testkit::{eventually, Etcd, RegistryProcess};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

const SECRET: &str = "sdk-test-secret-sdk-test-secret-0123456789";
const ACL: &str = r#"
version: 1
permissions:
  - caller: tester
    allow: [demo.*]
  - caller: echo_agent
    allow: [demo.*]
providers:
  - agent: echo_agent
    provides: [demo.*]
"#;

fn token(name: &str) -> String {
    agent_reach_access::token::issue_hs256(name, SECRET.as_bytes(), Duration::from_secs(3600)).unwrap()
}

#[derive(Debug, Deserialize, JsonSchema)]
struct Echo {
    text: String,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
struct Echoed {
    text: String,
    deadline_ms: u64,
    /// The caller the router verified (the envelope's `source`, which the agent checks against the assertion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<String>,
}

/// Echo the text back.
#[handler(capability = "demo.echo", version = "1.0.0", description = "Echo the text back")]
async fn echo(ctx: Ctx, input: Echo) -> Result<Echoed, HandlerError> {
    if input.text == "boom" {
        panic!("asked to panic");
    }
    if input.text == "refuse" {
        return Err(HandlerError::new("REFUSED", "this text is refused"));
    }
    Ok(Echoed {
        text: input.text,
        deadline_ms: ctx.deadline_ms(),
        source: ctx.source().map(str::to_string),
    })
}

/// Calls `demo.echo` through the router and reports what it saw.
#[handler(capability = "demo.relay", version = "1.0.0")]
async fn relay(ctx: Ctx, input: Echo) -> Result<Value, HandlerError> {
    let echoed: Echoed = ctx.call("demo.echo", json!({ "text": input.text })).await?;
    Ok(json!({ "echoed": echoed, "my_deadline_ms": ctx.deadline_ms() }))
}

struct Stack {
    _etcd: Etcd,
    _dir: tempfile::TempDir,
    registry: String,
    router: String,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Stack {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn serve_on_free_port<F, Fut>(serve: F) -> (SocketAddr, tokio::task::JoinHandle<()>)
where
    F: FnOnce(tokio::net::TcpListener) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (addr, tokio::spawn(serve(listener)))
}

async fn stack() -> Stack {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let acl = dir.path().join("acl.yaml");
    std::fs::write(&acl, ACL).unwrap();

    let registry_settings = agent_reach_registry::Settings {
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
    };
    let registry = agent_reach_registry::build(&registry_settings).await.unwrap();
    let (registry_addr, registry_task) = serve_on_free_port(|listener| async move {
        let _ = agent_reach_registry::serve(listener, registry, std::future::pending()).await;
    })
    .await;
    let registry_url = format!("http://{registry_addr}");
    let router_settings = agent_reach_router::Settings::new(
        "127.0.0.1:0".parse().unwrap(),
        registry_url.clone(),
        AuthConfig::Hs256SecretFile(secret),
        acl,
    );
    let router = agent_reach_router::build(&router_settings).await.unwrap();
    let (router_addr, router_task) = serve_on_free_port(|listener| async move {
        let _ = agent_reach_router::serve(listener, router, std::future::pending()).await;
    })
    .await;
    Stack {
        _etcd: etcd,
        _dir: dir,
        registry: registry_url,
        router: format!("http://{router_addr}"),
        tasks: vec![registry_task, router_task],
    }
}

async fn invoke(stack: &Stack, capability: &str, payload: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/invoke", stack.router))
        .bearer_auth(token("tester"))
        .json(&json!({ "capability": capability, "payload": payload, "timeout_ms": 5000 }))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

async fn resolvable(stack: &Stack, capability: &str) -> usize {
    let response = reqwest::Client::new()
        .get(format!("{}/v1/capabilities/{capability}", stack.registry))
        .bearer_auth(token("tester"))
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    body["instances"].as_array().map_or(0, Vec::len)
}

async fn echo_agent(stack: &Stack, agent_id: &str) -> Agent {
    Agent::builder("echo_agent", agent_id)
        .registry(&stack.registry)
        .router(&stack.router)
        .token(token("echo_agent"))
        .ttl_s(3)
        .handler(echo)
        .handler(relay)
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_register_with_derived_schemas_and_serve_after_ready() {
    let stack = stack().await;
    let agent = echo_agent(&stack, "echo-1").await;
    // Registered as `starting`: visible, not routable.
    assert!(
        eventually(Duration::from_secs(5), || async {
            let response = reqwest::Client::new()
                .get(format!("{}/v1/agents/echo-1", stack.registry))
                .bearer_auth(token("tester"))
                .send()
                .await
                .unwrap();
            response.status() == 200
        })
        .await
    );
    let agent_view: Value = reqwest::Client::new()
        .get(format!("{}/v1/agents/echo-1", stack.registry))
        .bearer_auth(token("tester"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(agent_view["status"], "starting");
    let descriptor = agent_view["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|capability| capability["name"] == "demo.echo")
        .unwrap();
    assert_eq!(descriptor["input_schema"]["properties"]["text"]["type"], "string");
    assert_eq!(descriptor["output_schema"]["required"], json!(["text", "deadline_ms"]));
    assert_eq!(descriptor["description"], "Echo the text back");
    assert_eq!(resolvable(&stack, "demo.echo").await, 0, "no traffic before mark_ready");

    agent.mark_ready();
    assert!(
        eventually(Duration::from_secs(5), || async {
            resolvable(&stack, "demo.echo").await == 1
        })
        .await
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            invoke(&stack, "demo.echo", json!({"text": "hi"})).await.0 == 200
        })
        .await
    );
    let (status, result) = invoke(&stack, "demo.echo", json!({"text": "hello"})).await;
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["output"]["text"], "hello");
    assert_eq!(result["agent_id"], "echo-1");
    // Through the router, with its assertion verified, as the caller the router verified.
    assert_eq!(result["output"]["source"], "tester", "{result}");

    // A business error passes through as AGENT_ERROR with the handler's code.
    let (status, result) = invoke(&stack, "demo.echo", json!({"text": "refuse"})).await;
    assert_eq!(result["error"]["code"], "AGENT_ERROR", "{status} {result}");
    assert!(result.to_string().contains("REFUSED"), "{result}");
    // A panicking handler is an error result, and the agent keeps serving.
    let (_, result) = invoke(&stack, "demo.echo", json!({"text": "boom"})).await;
    assert_eq!(result["status"], "failed");
    assert!(result.to_string().contains("HANDLER_PANICKED"), "{result}");
    let (status, _) = invoke(&stack, "demo.echo", json!({"text": "still here"})).await;
    assert_eq!(status, 200);

    // ctx.call goes through the router and carries the caller's deadline.
    let (status, result) = invoke(&stack, "demo.relay", json!({"text": "via relay"})).await;
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["output"]["echoed"]["text"], "via relay");
    assert_eq!(
        result["output"]["echoed"]["deadline_ms"],
        result["output"]["my_deadline_ms"]
    );
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_dedups_by_request_id_and_refuses_expired_work() {
    let stack = stack().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let slow = Handler::new("demo.count", "1.0.0", move |_ctx: Ctx, _input: Value| {
        let counted = counted.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, HandlerError>(counted.fetch_add(1, Ordering::SeqCst) + 1)
        }
    });
    // The router's keys, as a file: this test plays the router and signs its own assertions.
    let keys = TestKeys::new();
    let agent = Agent::builder("echo_agent", "count-1")
        .registry(&stack.registry)
        .token(token("echo_agent"))
        .assertion_keys_file(&keys.jwks)
        .handler(slow)
        .start()
        .await
        .unwrap();
    agent.mark_ready();
    let url = format!("http://{}/invoke", agent.local_addr());
    let far = agent_reach_sdk_test_now() + 60_000;
    let envelope = |request_id: &str, deadline: u64| {
        json!({"version": "1.0", "request_id": request_id, "capability": "demo.count", "capability_version": "1.0.0",
               "source": "tester", "priority": "normal", "deadline": deadline, "attempt": 1, "payload": {}})
    };
    let assertion = keys.assertion("tester", "count-1", "demo.count", 60);
    let client = reqwest::Client::new();
    let send = |body: Value| {
        let (client, url, assertion) = (client.clone(), url.clone(), assertion.clone());
        async move {
            let response = client
                .post(url)
                .bearer_auth(assertion)
                .json(&body)
                .send()
                .await
                .unwrap();
            (response.status().as_u16(), response.json::<Value>().await.unwrap())
        }
    };
    // Concurrent repeats wait for the first; a later repeat gets the same answer.
    let (a, b) = tokio::join!(send(envelope("req-1", far)), send(envelope("req-1", far)));
    let c = send(envelope("req-1", far)).await;
    assert_eq!(a, b);
    assert_eq!(a, c);
    assert_eq!(a.1["output"], 1);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler ran once for one request_id"
    );
    let d = send(envelope("req-2", far)).await;
    assert_eq!(d.1["output"], 2);
    // Work whose deadline has passed is refused without running.
    let (status, body) = send(envelope("req-3", agent_reach_sdk_test_now() - 1)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (504, Some("DEADLINE_EXCEEDED"))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // A broken envelope is a clear error.
    let (status, body) = send(json!({"nonsense": true})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("INVALID_ENVELOPE"))
    );
    // Health reports real readiness.
    let health: Value = client
        .get(format!("http://{}/healthz", agent.local_addr()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ready");
    agent.shutdown().await;
}

/// Issue 20: an agent serves only calls the router vouched for, for itself,
/// unexpired, from the caller named in the envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_a_valid_router_assertion_are_refused() {
    let stack = stack().await;
    let keys = TestKeys::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let count = Handler::new("demo.count", "1.0.0", move |_ctx: Ctx, _input: Value| {
        let counted = counted.clone();
        async move { Ok::<_, HandlerError>(counted.fetch_add(1, Ordering::SeqCst) + 1) }
    });
    let agent = Agent::builder("echo_agent", "guarded-1")
        .registry(&stack.registry)
        .token(token("echo_agent"))
        .assertion_keys_file(&keys.jwks)
        .handler(count)
        .start()
        .await
        .unwrap();
    agent.mark_ready();
    let url = format!("http://{}/invoke", agent.local_addr());
    let envelope = |source: &str, capability: &str| {
        json!({"version": "1.0", "request_id": format!("r-{}", rand_suffix()), "capability": capability,
               "capability_version": "1.0.0", "source": source, "priority": "normal",
               "deadline": agent_reach_sdk_test_now() + 60_000, "attempt": 1, "payload": {}})
    };
    let client = reqwest::Client::new();
    let send = |assertion: Option<String>, body: Value| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let mut request = client.post(url).json(&body);
            if let Some(assertion) = assertion {
                request = request.bearer_auth(assertion);
            }
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.json::<Value>().await.unwrap())
        }
    };
    let (other_key, _) = agent_reach_access::AssertionKey::generate().unwrap();
    let forged_signature = {
        let claims = keys.claims("tester", "guarded-1", "demo.count", 60);
        other_key.sign(&claims).unwrap()
    };
    let cases = [
        (
            "a forged envelope posted straight to the agent",
            None,
            envelope("tester", "demo.count"),
            "missing",
        ),
        (
            "an assertion issued for another agent",
            Some(keys.assertion("tester", "order_query-1", "demo.count", 60)),
            envelope("tester", "demo.count"),
            "wrong_audience",
        ),
        (
            "an expired assertion",
            Some(keys.assertion("tester", "guarded-1", "demo.count", -120)),
            envelope("tester", "demo.count"),
            "expired",
        ),
        (
            "a key the router does not publish",
            Some(forged_signature),
            envelope("tester", "demo.count"),
            "unknown_key",
        ),
        (
            "an envelope whose source is not the asserted caller",
            Some(keys.assertion("tester", "guarded-1", "demo.count", 60)),
            envelope("admin", "demo.count"),
            "source_mismatch",
        ),
        (
            "an assertion for another capability",
            Some(keys.assertion("tester", "guarded-1", "demo.other", 60)),
            envelope("tester", "demo.count"),
            "capability_mismatch",
        ),
        (
            "not a bearer token",
            Some("x".into()),
            envelope("tester", "demo.count"),
            "malformed",
        ),
    ];
    for (what, assertion, body, reason) in cases {
        let (status, answer) = send(assertion, body).await;
        assert_eq!(status, 401, "{what}: {answer}");
        assert_eq!(answer["error"]["code"], "UNAUTHENTICATED", "{what}: {answer}");
        assert_eq!(answer["error"]["details"]["reason"], reason, "{what}: {answer}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no refused call reached the handler");
    let (status, answer) = send(
        Some(keys.assertion("tester", "guarded-1", "demo.count", 60)),
        envelope("tester", "demo.count"),
    )
    .await;
    assert_eq!((status, &answer["output"]), (200, &json!(1)), "{answer}");
    agent.shutdown().await;
}

fn rand_suffix() -> u64 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::SeqCst) as u64
}

/// A router key of the test's own: its JWKS file for agents, and assertions signed with it.
struct TestKeys {
    key: agent_reach_access::AssertionKey,
    jwks: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl TestKeys {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (key, _) = agent_reach_access::AssertionKey::generate().unwrap();
        let jwks = dir.path().join("jwks.json");
        std::fs::write(&jwks, agent_reach_access::assertion::jwks([&key]).to_string()).unwrap();
        Self { key, jwks, _dir: dir }
    }

    fn claims(
        &self,
        caller: &str,
        agent_id: &str,
        capability: &str,
        life_s: i64,
    ) -> agent_reach_access::AssertionClaims {
        let now = (agent_reach_sdk_test_now() / 1000) as i64;
        agent_reach_access::AssertionClaims {
            iss: agent_reach_access::assertion::DEFAULT_ISSUER.into(),
            sub: caller.into(),
            aud: agent_id.into(),
            cap: capability.into(),
            tenant: "default".into(),
            iat: (now - 1) as u64,
            exp: (now + life_s) as u64,
            ..Default::default()
        }
    }

    fn assertion(&self, caller: &str, agent_id: &str, capability: &str, life_s: i64) -> String {
        self.key
            .sign(&self.claims(caller, agent_id, capability, life_s))
            .unwrap()
    }
}

fn agent_reach_sdk_test_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reregisters_after_lease_loss_and_drains_on_shutdown() {
    let stack = stack().await;
    let agent = echo_agent(&stack, "echo-2").await;
    agent.mark_ready();
    assert!(
        eventually(Duration::from_secs(5), || async {
            resolvable(&stack, "demo.echo").await == 1
        })
        .await
    );

    // The registration vanishes behind the agent's back (e.g. an operator or a lease loss).
    let deleted = reqwest::Client::new()
        .delete(format!("{}/v1/agents/echo-2", stack.registry))
        .bearer_auth(token("echo_agent"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert_eq!(resolvable(&stack, "demo.echo").await, 0);
    // The next heartbeat answers LEASE_EXPIRED and the SDK registers again, still ready.
    assert!(
        eventually(Duration::from_secs(5), || async {
            resolvable(&stack, "demo.echo").await == 1
        })
        .await,
        "the agent did not re-register by itself"
    );
    // The router follows the registry through its watch, a moment later.
    assert!(
        eventually(Duration::from_secs(5), || async {
            invoke(&stack, "demo.echo", json!({"text": "back"})).await.0 == 200
        })
        .await,
        "the router never routed to the re-registered agent"
    );

    // Shutdown: draining at once (no new traffic), in-flight work finishes, then gone.
    let slow = tokio::spawn({
        let router = stack.router.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{router}/v1/invoke"))
                .bearer_auth(token("tester"))
                .json(&json!({"capability": "demo.echo", "payload": {"text": "last"}, "timeout_ms": 5000}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    });
    assert_eq!(slow.await.unwrap(), 200);
    agent.shutdown().await;
    let gone = reqwest::Client::new()
        .get(format!("{}/v1/agents/echo-2", stack.registry))
        .bearer_auth(token("tester"))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404, "deregistered on shutdown");
}

#[test]
fn descriptor_schemas_are_the_types_schemas() {
    use agent_reach_sdk::IntoHandler;
    let handler = echo.into_handler();
    let descriptor = handler.descriptor();
    assert_eq!(
        descriptor.input_schema,
        serde_json::to_value(schemars::schema_for!(Echo)).unwrap()
    );
    assert_eq!(
        descriptor.output_schema,
        serde_json::to_value(schemars::schema_for!(Echoed)).unwrap()
    );
    assert_eq!(descriptor.version, "1.0.0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reregisters_by_itself_after_a_registry_restart() {
    use agent_reach_registry::store::Store;
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let acl = dir.path().join("acl.yaml");
    std::fs::write(&acl, ACL).unwrap();
    let settings = |listen: SocketAddr| agent_reach_registry::Settings {
        listen,
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
    };
    let mut registry = RegistryProcess::start(settings("127.0.0.1:0".parse().unwrap()));
    let registry_url = format!("http://{}", registry.addr);
    let keys = TestKeys::new();
    let agent = Agent::builder("echo_agent", "echo-3")
        .registry(&registry_url)
        .token(token("echo_agent"))
        .assertion_keys_file(&keys.jwks)
        .ttl_s(2)
        .handler(echo)
        .start()
        .await
        .unwrap();
    agent.mark_ready();
    let store = agent_reach_registry::store::EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    let key = "/agent-reach/v1/default/agents/echo-3";
    let is_ready = || async {
        store
            .get(key)
            .await
            .unwrap()
            .is_some_and(|kv| String::from_utf8_lossy(&kv.value).contains("\"status\":\"ready\""))
    };
    assert!(eventually(Duration::from_secs(5), is_ready).await);

    // The registry dies long enough for the lease to expire in etcd ...
    registry.kill();
    assert!(
        eventually(Duration::from_secs(10), || async {
            store.get(key).await.unwrap().is_none()
        })
        .await,
        "the lease never expired"
    );
    // ... and comes back on the same address: the agent registers again by itself.
    let _registry = RegistryProcess::start(settings(registry.addr));
    assert!(
        eventually(Duration::from_secs(15), is_ready).await,
        "the agent did not re-register after the registry came back"
    );
    agent.shutdown().await;
}

// Issue 23, point 5: agents and routers take several registries and fail over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_and_router_fail_over_to_the_second_registry() {
    use agent_reach_registry::store::Store;
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let acl = dir.path().join("acl.yaml");
    std::fs::write(&acl, ACL).unwrap();
    let settings = || agent_reach_registry::Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        listener_tls: None,
        store: agent_reach_registry::StoreChoice::Etcd(vec![etcd.endpoint()]),
        acl: acl.clone(),
        auth: AuthConfig::Hs256SecretFile(secret.clone()),
        service: agent_reach_registry::RegistryConfig {
            ttl: agent_reach_registry::TtlBounds {
                min_s: 1,
                max_s: 300,
                default_s: 15,
            },
            ..Default::default()
        },
    };
    let mut first = RegistryProcess::start(settings());
    let second = RegistryProcess::start(settings());
    let both = format!("{},{}", first.url(), second.url());

    let mut router_settings = agent_reach_router::Settings::new(
        "127.0.0.1:0".parse().unwrap(),
        first.url(),
        AuthConfig::Hs256SecretFile(secret.clone()),
        acl.clone(),
    );
    router_settings.registry = vec![first.url(), second.url()];
    let router = agent_reach_router::build(&router_settings).await.unwrap();
    let (router_addr, router_task) = serve_on_free_port(|listener| async move {
        let _ = agent_reach_router::serve(listener, router, std::future::pending()).await;
    })
    .await;
    let router_url = format!("http://{router_addr}");
    let call = || async {
        let response = reqwest::Client::new()
            .post(format!("{router_url}/v1/invoke"))
            .bearer_auth(token("tester"))
            .json(&json!({ "capability": "demo.echo", "payload": {"text": "hi"}, "timeout_ms": 5000 }))
            .send()
            .await
            .unwrap();
        response.status().as_u16()
    };

    let start_agent = |agent_id: &'static str| {
        let both = both.clone();
        let router_url = router_url.clone();
        async move {
            let agent = Agent::builder("echo_agent", agent_id)
                .registry(&both)
                .router(&router_url)
                .token(token("echo_agent"))
                .ttl_s(2)
                .handler(echo)
                .start()
                .await
                .unwrap();
            agent.mark_ready();
            agent
        }
    };
    let agent = start_agent("echo-a").await;
    assert!(eventually(Duration::from_secs(10), || async { call().await == 200 }).await);
    let store = agent_reach_registry::store::EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    let key = "/agent-reach/v1/default/agents/echo-a";
    let lease = store.get(key).await.unwrap().expect("registered").lease;

    // The registry both the agent and the router use dies.
    first.kill();
    // Three TTLs later the agent is still registered on the same lease: its
    // heartbeats went to the second registry, no re-registration was needed.
    let until = std::time::Instant::now() + Duration::from_secs(6);
    while std::time::Instant::now() < until {
        let record = store.get(key).await.unwrap();
        assert_eq!(record.map(|kv| kv.lease), Some(lease), "the registration was lost");
        assert_eq!(call().await, 200, "the router stopped routing to the agent");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The router follows the second registry: a deregistration reaches it,
    // and so does a new agent's registration.
    agent.shutdown().await;
    assert!(
        eventually(Duration::from_secs(5), || async { call().await != 200 }).await,
        "the router never saw the deregistration"
    );
    let replacement = start_agent("echo-b").await;
    assert!(
        eventually(Duration::from_secs(10), || async { call().await == 200 }).await,
        "the router never saw the new registration"
    );
    replacement.shutdown().await;
    router_task.abort();
}
