//! Streaming handlers (DESIGN §8, "Streaming") served by the SDK through a
//! real router: items reach the caller one by one while the handler is still
//! running (it waits for the test between items: ordering, not timing), an
//! error after the first item is `event: error`, a caller that goes away
//! cancels the handler, and a caller that did not ask for events gets the
//! items as an array.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use agent_reach_access::AuthConfig;
use agent_reach_sdk::{Agent, Ctx, Handler, HandlerError};
use agent_reach_testkit::{eventually, Etcd};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::Notify;

const SECRET: &str = "sdk-test-secret-sdk-test-secret-0123456789";
const ACL: &str = r#"
version: 1
permissions:
  - caller: tester
    allow: [demo.*]
providers:
  - agent: token_agent
    provides: [demo.*]
"#;

fn token(name: &str) -> String {
    agent_reach_access::token::issue_hs256(name, SECRET.as_bytes(), Duration::from_secs(3600)).unwrap()
}

#[derive(Debug, Deserialize, JsonSchema)]
struct Prompt {
    text: String,
}

#[derive(Debug, Serialize, JsonSchema)]
struct Token {
    token: String,
}

/// Released by the test between the first and the second item.
fn gate() -> &'static Notify {
    static GATE: OnceLock<Notify> = OnceLock::new();
    GATE.get_or_init(Notify::new)
}

/// Handler streams dropped before they ended (cancelled).
static CANCELLED: AtomicUsize = AtomicUsize::new(0);

struct CountDrop {
    done: bool,
}

impl CountDrop {
    fn finish(mut self) {
        self.done = true;
    }
}

impl Drop for CountDrop {
    fn drop(&mut self) {
        if !self.done {
            CANCELLED.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// `first`, then (after the gate) the words of the prompt; `fail` fails
/// after the first item, `refuse` before it, `hold` never ends; `collect…`
/// does not wait at the gate.
fn tokens(_ctx: Ctx, input: Prompt) -> impl futures::Stream<Item = Result<Token, HandlerError>> {
    futures::stream::unfold(
        (0usize, input.text, CountDrop { done: false }),
        |(step, text, mut watch)| async move {
            if step == 0 {
                if text == "refuse" {
                    watch.done = true;
                    return Some((
                        Err(HandlerError::new("REFUSED", "not this prompt")),
                        (usize::MAX, text, watch),
                    ));
                }
                let first = Token {
                    token: "first".to_string(),
                };
                return Some((Ok(first), (1, text, watch)));
            }
            if step == usize::MAX {
                return None;
            }
            match text.as_str() {
                "hold" => std::future::pending::<()>().await,
                "fail" => {
                    watch.done = true;
                    return Some((
                        Err(HandlerError::new("MODEL_FAILED", "the model gave up")),
                        (usize::MAX, text, watch),
                    ));
                }
                _ => {}
            }
            if step == 1 && !text.starts_with("collect") {
                gate().notified().await;
            }
            let words: Vec<&str> = text.split(' ').collect();
            match words.get(step - 1) {
                Some(word) => {
                    let item = Token {
                        token: word.to_string(),
                    };
                    Some((Ok(item), (step + 1, text, watch)))
                }
                None => {
                    watch.finish();
                    None
                }
            }
        },
    )
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

/// Reads server-sent events from a response, one at a time.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

impl Events {
    async fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let raw: String = self.buffer.drain(..end + 2).collect();
                let mut name = "message".to_string();
                let mut data = String::new();
                for line in raw.lines() {
                    if let Some(value) = line.strip_prefix("event: ") {
                        name = value.to_string();
                    } else if let Some(value) = line.strip_prefix("data: ") {
                        data.push_str(value);
                    }
                }
                return Some((name, serde_json::from_str(&data).unwrap_or(Value::Null)));
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.response.chunk())
                .await
                .expect("an event within 10 s")
                .expect("stream readable")?;
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

async fn stream(stack: &Stack, text: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/v1/invoke", stack.router))
        .bearer_auth(token("tester"))
        .header("accept", "text/event-stream")
        .json(&json!({ "capability": "demo.tokens", "payload": { "text": text }, "timeout_ms": 10_000 }))
        .send()
        .await
        .unwrap()
}

async fn open_events(stack: &Stack, text: &str) -> Events {
    let response = stream(stack, text).await;
    assert_eq!(response.status(), 200);
    Events {
        response,
        buffer: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_handlers_stream_through_the_router() {
    let stack = stack().await;
    let agent = Agent::builder("token_agent", "tokens-1")
        .registry(&stack.registry)
        .router(&stack.router)
        .token(token("token_agent"))
        .ttl_s(3)
        .handler(Handler::streaming("demo.tokens", "1.0.0", tokens))
        .start()
        .await
        .unwrap();
    agent.mark_ready();
    let routable = eventually(Duration::from_secs(10), || async {
        let response = reqwest::Client::new()
            .post(format!("{}/v1/invoke", stack.router))
            .bearer_auth(token("tester"))
            .json(&json!({ "capability": "demo.tokens", "payload": { "text": "collect" } }))
            .send()
            .await
            .unwrap();
        response.status() == 200
    })
    .await;
    assert!(routable, "the streaming agent never became routable");

    // Without `Accept: text/event-stream`: the items as an array (the registered output schema).
    let response = reqwest::Client::new()
        .post(format!("{}/v1/invoke", stack.router))
        .bearer_auth(token("tester"))
        .json(&json!({ "capability": "demo.tokens", "payload": { "text": "collect two" } }))
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["output"],
        json!([{ "token": "first" }, { "token": "collect" }, { "token": "two" }]),
        "{body}"
    );

    // Streamed: the first item arrives while the handler waits at the gate.
    let mut events = open_events(&stack, "hello world").await;
    assert_eq!(
        events.next().await,
        Some(("message".to_string(), json!({ "token": "first" })))
    );
    gate().notify_one();
    assert_eq!(
        events.next().await,
        Some(("message".to_string(), json!({ "token": "hello" })))
    );
    assert_eq!(
        events.next().await,
        Some(("message".to_string(), json!({ "token": "world" })))
    );
    let (name, result) = events.next().await.expect("result");
    assert_eq!(name, "result", "{result}");
    assert_eq!(result["agent_id"], "tokens-1");
    assert_eq!(result["events"], 3);
    assert!(events.next().await.is_none());

    // An error after the first item: `event: error` with the handler's code.
    let mut events = open_events(&stack, "fail").await;
    assert_eq!(events.next().await.expect("first").1, json!({ "token": "first" }));
    let (name, error) = events.next().await.expect("error");
    assert_eq!(name, "error", "{error}");
    assert_eq!(error["code"], "AGENT_ERROR");
    assert_eq!(error["details"]["agent_code"], "MODEL_FAILED");
    assert_eq!(error["message"], "the model gave up");

    // An error before the first item: an ordinary failed envelope with the handler's status.
    let response = stream(&stack, "refuse").await;
    assert_eq!(response.status(), 422);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "AGENT_ERROR", "{body}");
    assert!(body.to_string().contains("REFUSED"), "{body}");

    // A caller that goes away cancels the handler.
    let before = CANCELLED.load(Ordering::SeqCst);
    let mut events = open_events(&stack, "hold").await;
    assert_eq!(events.next().await.expect("first").1, json!({ "token": "first" }));
    drop(events);
    let cancelled = eventually(Duration::from_secs(10), || async {
        CANCELLED.load(Ordering::SeqCst) > before
    })
    .await;
    assert!(cancelled, "the handler kept running after its caller left");
    agent.shutdown().await;
}
