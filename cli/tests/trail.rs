//! The trail end to end (issue 37): the worked example's four hops recorded
//! in a real Redis by the router, read back as a tree (`agent-reach trail
//! show`), a credential redacted from a recorded payload, the chain verified
//! (`trail verify`) and then caught edited and cut, a replay against a changed
//! v2 agent showing that step's diff while the real context stays untouched,
//! and each bad replay refused with its code.

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::time::Duration;

use agent_reach_examples::stack::{Stack, StackOptions};
use agent_reach_examples::{scenario_instances, Reply, ReplyRequest};
use agent_reach_sdk::{Agent, Ctx, Handler, HandlerError};
use agent_reach_testkit::Redis;
use serde_json::{json, Value};

/// A stream entry as `XRANGE` answers it: its id and its fields, values as bytes.
type StreamEntry = (String, Vec<(String, Vec<u8>)>);

const CAPABILITIES: [&str; 4] = ["intent.parse", "order.query", "shipping.rules", "reply.write"];

/// The example's policy, plus the trail's: `auditor` reads and replays it,
/// every capability's payloads are recorded.
fn acl() -> String {
    format!(
        "{}\nauditors: [auditor]\ntrail:\n  payloads: [\"*\"]\n",
        agent_reach_examples::EXAMPLE_ACL
    )
}

/// The router's slow path and trail on `redis`, segments written every 20 ms.
fn with_trail(redis: String) -> impl FnOnce(&mut agent_reach_router::Settings) {
    move |settings| {
        let mut callbacks =
            agent_reach_task_store::CallbackConfig::new(b"callback-secret-0123456789abcdef-0123".to_vec());
        callbacks.allow_private_targets = true;
        settings.tasks = Some(agent_reach_router::TasksSettings {
            redis,
            store: agent_reach_task_store::StoreConfig::default(),
            callbacks,
            workers: 4,
            reclaim_after: Duration::from_secs(30),
            max_task_attempts: 3,
            quota_share: None,
            trail: Some(agent_reach_router::TrailConfig {
                settings: agent_reach_router::TrailSettings {
                    flush_every: Duration::from_millis(20),
                    ..Default::default()
                },
                credentials: Default::default(),
                otlp: None,
            }),
            tag_limits: Vec::new(),
        });
    }
}

async fn stack(redis: &Redis, dir: &tempfile::TempDir) -> Stack {
    let acl_path = dir.path().join("acl.yaml");
    std::fs::write(&acl_path, acl()).unwrap();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let stack = Stack::start_with(
        StackOptions {
            registry_listen: any,
            router_listen: any,
            context_listen: any,
            etcd: Vec::new(),
            redis: Some(redis.url()),
            acl: Some(acl_path),
            agents: scenario_instances(),
        },
        with_trail(redis.url()),
    )
    .await
    .unwrap();
    stack
        .wait_until_routable(&CAPABILITIES, Duration::from_secs(20))
        .await
        .unwrap();
    stack
}

fn token(stack: &Stack, name: &str) -> String {
    stack.token(name, Duration::from_secs(600)).unwrap()
}

/// `agent-reach trail …` as `caller` against the stack.
fn trail(stack: &Stack, caller: &str, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agent-reach"));
    command
        .arg("trail")
        .args(args)
        .args(["--router", &stack.router, "--registry", &stack.registry])
        .env("AGENT_REACH_TOKEN", token(stack, caller));
    if args.first() == Some(&"replay") {
        command.args(["--context", &stack.context]);
    }
    command.output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
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

async fn context(stack: &Stack, client: &reqwest::Client, id: &str) -> Value {
    client
        .get(format!("{}/v1/contexts/{id}", stack.context))
        .bearer_auth(token(stack, "reply_writer"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Polls `GET /v1/trail?session_id=` until `count` records are in (written off the request path).
async fn recorded(stack: &Stack, client: &reqwest::Client, session: &str, count: usize) -> Value {
    let url = format!("{}/v1/trail?session_id={session}", stack.router);
    let auditor = token(stack, "auditor");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answer: Value = client
            .get(&url)
            .bearer_auth(&auditor)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let found = answer["records"].as_array().map_or(0, Vec::len);
        if found >= count || tokio::time::Instant::now() > deadline {
            assert_eq!(found, count, "{answer:#}");
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn redis_connection(redis: &Redis) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collaboration_is_recorded_shown_verified_and_replayed() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let stack = stack(&redis, &dir).await;
    let client = reqwest::Client::new();
    let context_id = new_context(&stack, &client).await;
    let answer: Value = client
        .post(format!("{}/v1/invoke", stack.router))
        .bearer_auth(token(&stack, "demo_user"))
        .json(&json!({
            "capability": "intent.parse", "session_id": "s-trail-1", "context_id": context_id,
            "payload": {"user_id": "u_42", "text": "Can SO-2024001 ship today?", "api_key": "sk-live-1234"},
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["output"]["ships_today"], true, "{answer:#}");

    // Four hops, one record each, every field of DESIGN §9.
    let page = recorded(&stack, &client, "s-trail-1", 4).await;
    let records = page["records"].as_array().unwrap();
    let top = &records[0];
    assert_eq!(
        (top["capability"].as_str(), top["caller"].as_str()),
        (Some("intent.parse"), Some("demo_user"))
    );
    for field in [
        "seq",
        "at_ms",
        "request_id",
        "trace_id",
        "tenant",
        "capability_version",
        "agent_id",
        "attempts",
        "duration_ms",
        "status",
        "prev_hash",
        "hash",
    ] {
        assert!(!top[field].is_null(), "{field} missing: {top:#}");
    }
    // The credential was redacted before it was recorded; the rest of the input is there.
    assert_eq!(top["input"]["api_key"], "[redacted]");
    assert_eq!(top["input"]["user_id"], "u_42");
    assert!(!page.to_string().contains("sk-live-1234"));
    let reply_before = records
        .iter()
        .find(|record| record["capability"] == "reply.write")
        .unwrap()["output"]["reply"]
        .clone();

    // `trail show`: the chain of hops as a tree.
    let shown = trail(&stack, "auditor", &["show", "--session", "s-trail-1"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let text = stdout(&shown);
    let depth = |capability: &str| {
        text.lines()
            .find(|line| line.contains(&format!("{capability}@")))
            .map(|line| line.find(capability).unwrap())
            .unwrap_or_else(|| panic!("{capability} not shown:\n{text}"))
    };
    assert!(depth("intent.parse") < depth("order.query"), "{text}");
    assert!(depth("order.query") < depth("shipping.rules"), "{text}");
    assert!(depth("shipping.rules") < depth("reply.write"), "{text}");
    assert!(text.contains("from order_query"), "{text}");
    // Not a trail reader: refused.
    let refused = trail(&stack, "demo_user", &["show", "--session", "s-trail-1"]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("FORBIDDEN"), "{}", stderr(&refused));
    let missing = trail(&stack, "auditor", &["show", "--session", "no-such-session"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        stderr(&missing).contains("error[TRAIL_NOT_FOUND]"),
        "{}",
        stderr(&missing)
    );

    // `trail verify`: intact.
    let verified = trail(&stack, "auditor", &["verify"]);
    assert!(
        verified.status.success(),
        "{}\n{}",
        stdout(&verified),
        stderr(&verified)
    );
    assert!(stdout(&verified).contains("intact"), "{}", stdout(&verified));

    // A changed v2 of `reply.write`, replayed against before any live traffic.
    let v2 = Agent::builder("reply_writer", "reply_writer-v2")
        .registry(&stack.registry)
        .router(&stack.router)
        .token(token(&stack, "reply_writer"))
        .handler(Handler::new(
            "reply.write",
            "2.0.0",
            |_ctx: Ctx, input: ReplyRequest| async move {
                Ok::<_, HandlerError>(Reply {
                    reply: format!("v2: {}", if input.ships_today { "yes" } else { "no" }),
                    trace_id: "v2".to_string(),
                })
            },
        ))
        .start()
        .await
        .unwrap();
    v2.mark_ready();
    let context_before = context(&stack, &client, &context_id).await;
    let replayed = trail(
        &stack,
        "auditor",
        &[
            "replay",
            "s-trail-1",
            "--capability",
            "reply.write",
            "--version",
            "2.0.0",
            "--json",
        ],
    );
    assert!(
        replayed.status.success(),
        "{}\n{}",
        stdout(&replayed),
        stderr(&replayed)
    );
    let report: Value = serde_json::from_str(&stdout(&replayed)).unwrap();
    let steps = report["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 4, "{report:#}");
    let reply_step = steps.iter().find(|step| step["capability"] == "reply.write").unwrap();
    assert_eq!(reply_step["replayed_version"], "2.0.0");
    assert_eq!(reply_step["status"], "changed", "{reply_step:#}");
    let change = reply_step["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|change| change["pointer"] == "/reply")
        .unwrap();
    assert_eq!(change["recorded"], reply_before);
    assert_eq!(change["replayed"], "v2: yes");
    // The real context is untouched: same version, same fields.
    let context_after = context(&stack, &client, &context_id).await;
    assert_eq!(context_after["version"], context_before["version"], "{context_after:#}");
    assert_eq!(context_after["fields"], context_before["fields"]);
    // The replays are in the trail, marked as such.
    let replays: Value = client
        .get(format!(
            "{}/v1/trail?request_id={}",
            stack.router,
            reply_step["request_id"].as_str().unwrap()
        ))
        .bearer_auth(token(&stack, "auditor"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        replays["records"].as_array().unwrap().len(),
        1,
        "the original, not the replay: {replays:#}"
    );

    // Bad replays, each with its code.
    let unknown = trail(&stack, "auditor", &["replay", "no-such-session"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        stderr(&unknown).contains("error[TRAIL_NOT_FOUND]"),
        "{}",
        stderr(&unknown)
    );
    let no_version = trail(
        &stack,
        "auditor",
        &[
            "replay",
            "s-trail-1",
            "--capability",
            "reply.write",
            "--version",
            "9.9.9",
        ],
    );
    assert_eq!(no_version.status.code(), Some(2));
    assert!(
        stderr(&no_version).contains("error[VERSION_NOT_FOUND]"),
        "{}",
        stderr(&no_version)
    );

    v2.shutdown().await;

    // Editing one record in Redis is detected, and named. A segment's
    // records are its text's lines, `{seq} {hash} {body}`, stored
    // compressed (`z`); the edited segments are written back as plain text
    // (`s`, as segments were stored before), which reads the same.
    let mut redis_connection = redis_connection(&redis).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("agent-reach:default:trail:*:segments")
        .query_async(&mut redis_connection)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let stored: Vec<StreamEntry> = redis::cmd("XRANGE")
        .arg(&keys[0])
        .arg("-")
        .arg("+")
        .query_async(&mut redis_connection)
        .await
        .unwrap();
    let segments: Vec<(String, String)> = stored
        .into_iter()
        .map(|(id, fields)| {
            assert_eq!(fields[0].0, "z", "{id}");
            (id, agent_reach_trail::segment::decompress(&fields[0].1).unwrap())
        })
        .collect();
    let records: usize = segments.iter().map(|(_, text)| text.lines().count()).sum();
    assert!(records >= 3, "{segments:?}");
    let target = records / 2 + 1;
    // Rewrites the chain's segments with `edit` applied to each record's line.
    let rewrite = |edit: &dyn Fn(&str) -> Option<String>| {
        let segments = segments.clone();
        let key = keys[0].clone();
        let mut connection = redis_connection.clone();
        let edited: Vec<(String, String)> = segments
            .iter()
            .map(|(id, text)| {
                let text: String = text.lines().filter_map(edit).map(|line| line + "\n").collect();
                (id.clone(), text)
            })
            .collect();
        async move {
            let _: () = redis::cmd("DEL").arg(&key).query_async(&mut connection).await.unwrap();
            for (id, text) in edited {
                let _: String = redis::cmd("XADD")
                    .arg(&key)
                    .arg(id)
                    .arg("s")
                    .arg(text)
                    .query_async(&mut connection)
                    .await
                    .unwrap();
            }
        }
    };
    let prefix = format!("{target} ");
    rewrite(&|line: &str| {
        Some(if line.starts_with(&prefix) {
            line.replace("\"attempts\":1", "\"attempts\":2")
        } else {
            line.to_string()
        })
    })
    .await;
    let caught = trail(&stack, "auditor", &["verify"]);
    assert_eq!(caught.status.code(), Some(1), "{}", stdout(&caught));
    assert!(stdout(&caught).contains("BROKEN"), "{}", stdout(&caught));
    assert!(
        stdout(&caught).contains(&format!("record {target} was changed")),
        "{}",
        stdout(&caught)
    );
    assert!(stderr(&caught).contains("TRAIL_BROKEN"), "{}", stderr(&caught));

    // Put it back, then delete one record: named as missing.
    rewrite(&|line: &str| Some(line.to_string())).await;
    assert!(trail(&stack, "auditor", &["verify"]).status.success());
    rewrite(&|line: &str| (!line.starts_with("2 ")).then(|| line.to_string())).await;
    let caught = trail(&stack, "auditor", &["verify"]);
    assert_eq!(caught.status.code(), Some(1), "{}", stdout(&caught));
    assert!(stdout(&caught).contains("record 2 is missing"), "{}", stdout(&caught));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_without_recorded_payloads_cannot_be_replayed() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    // The trail on, no payloads recorded.
    let acl_path = dir.path().join("acl.yaml");
    std::fs::write(
        &acl_path,
        format!("{}\nauditors: [auditor]\n", agent_reach_examples::EXAMPLE_ACL),
    )
    .unwrap();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let stack = Stack::start_with(
        StackOptions {
            registry_listen: any,
            router_listen: any,
            context_listen: any,
            etcd: Vec::new(),
            redis: Some(redis.url()),
            acl: Some(acl_path),
            agents: scenario_instances(),
        },
        with_trail(redis.url()),
    )
    .await
    .unwrap();
    stack
        .wait_until_routable(&CAPABILITIES, Duration::from_secs(20))
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let context_id = new_context(&stack, &client).await;
    let answer: Value = client
        .post(format!("{}/v1/invoke", stack.router))
        .bearer_auth(token(&stack, "demo_user"))
        .json(
            &json!({"capability": "intent.parse", "session_id": "s-plain", "context_id": context_id,
                       "payload": {"user_id": "u_1", "text": "Can SO-2024003 ship today?"}}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["output"]["ships_today"], false, "{answer:#}");
    let page = recorded(&stack, &client, "s-plain", 4).await;
    assert!(page["records"]
        .as_array()
        .unwrap()
        .iter()
        .all(|record| record["input"].is_null()));
    let refused = trail(&stack, "auditor", &["replay", "s-plain"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("error[NOTHING_TO_REPLAY]"),
        "{}",
        stderr(&refused)
    );
    assert!(stderr(&refused).contains("trail: {payloads"), "{}", stderr(&refused));
}
