//! `agent-reach tasks dead-letters` against a real router with the slow path
//! on real Redis: list (table and `--json`), `--show`, `--replay`, and a
//! clear error with a non-zero exit for every bad id, a non-operator and a
//! bad flag. The dead letter is parked by the task store's own code.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use agent_reach_task_store::{NewTask, State, StoreConfig, TaskStore};
use serde_json::{json, Value};

const SECRET: &[u8] = b"cli-tasks-tests-0123456789abcdef-0123456789";
const ACL: &str = "version: 1\npermissions:\n  - caller: tester\n    allow: [\"*\"]\noperators: [ops]\n";

struct Router {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent_reach(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .args(args)
        .output()
        .unwrap()
}

/// A router with `--redis`; no registry is needed for the operator API.
fn router(redis: &str) -> Router {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    std::fs::write(path("hs256.secret"), SECRET).unwrap();
    std::fs::write(path("callback.secret"), SECRET).unwrap();
    std::fs::write(path("acl.yaml"), ACL).unwrap();
    assert!(agent_reach(&["keys", "generate", "--out", &path("assertion.pem")])
        .status
        .success());
    let port = agent_reach_testkit::free_port();
    let unused_registry = format!("http://127.0.0.1:{}", agent_reach_testkit::free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .args([
            "router",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--registry",
            &unused_registry,
        ])
        .args([
            "--acl",
            &path("acl.yaml"),
            "--auth-hs256-secret-file",
            &path("hs256.secret"),
        ])
        .args(["--assertion-key", &path("assertion.pem"), "--redis", redis])
        .args(["--callback-secret-file", &path("callback.secret")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert!(
        agent_reach_testkit::wait_until(Duration::from_secs(30), || std::net::TcpStream::connect(addr).is_ok()),
        "the router never listened"
    );
    Router {
        child,
        url: format!("http://{addr}"),
        _dir: dir,
    }
}

fn token(name: &str) -> String {
    agent_reach_access::token::issue_hs256(name, SECRET, Duration::from_secs(600)).unwrap()
}

fn tasks(router: &Router, caller: &str, args: &[&str]) -> Output {
    let mut all = vec!["tasks", "dead-letters", "--router", &router.url];
    let token = token(caller);
    all.extend(["--token", &token]);
    all.extend(args);
    agent_reach(&all)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_shown_and_replayed() {
    let redis = agent_reach_testkit::Redis::start();
    let router = router(&redis.url());
    let store = TaskStore::new(&redis.url(), &StoreConfig::default()).unwrap();
    store.prepare().await.unwrap();
    let submitted = store
        .submit(NewTask {
            request_id: "cli-dl-1".into(),
            caller: "tester".into(),
            capability: "order.query".into(),
            envelope: json!({"capability": "order.query", "payload": {}}),
            hold: true,
            ..NewTask::default()
        })
        .await
        .unwrap();
    let task_id = submitted.task_id().to_string();
    store.transition(&task_id, State::Running).await.unwrap();
    let result = json!({"version": "1.0", "request_id": "cli-dl-1", "status": "succeeded", "output": {"ok": true}});
    store.complete(&task_id, State::Succeeded, &result).await.unwrap();
    let task = store.get(&task_id).await.unwrap();
    store
        .dead_letter(
            &task,
            None,
            "https://hooks.example.com/done",
            "https://hooks.example.com/done answered 503",
        )
        .await
        .unwrap();

    let listed = tasks(&router, "ops", &[]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let table = stdout(&listed);
    assert!(table.starts_with("ID "), "{table}");
    assert!(table.contains(&task_id) && table.contains("answered 503"), "{table}");
    assert!(table.contains("1 shown of 1 parked"), "{table}");

    let as_json = tasks(&router, "ops", &["--json"]);
    let list: Value = serde_json::from_slice(&as_json.stdout).unwrap();
    let id = list["dead_letters"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(list["total"], 1);

    let shown = tasks(&router, "ops", &["--show", &id]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let letter: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(letter["result"]["output"], json!({"ok": true}));

    // Who may, and what is a dead letter id.
    let refused = tasks(&router, "tester", &[]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("FORBIDDEN"), "{}", stderr(&refused));
    let unknown = tasks(&router, "ops", &["--replay", "1-0"]);
    assert!(!unknown.status.success());
    assert!(
        stderr(&unknown).contains("DEAD_LETTER_NOT_FOUND"),
        "{}",
        stderr(&unknown)
    );
    let malformed = tasks(&router, "ops", &["--show", "../../v1/tasks"]);
    assert!(!malformed.status.success());
    assert!(
        stderr(&malformed).contains("is not a dead letter id"),
        "{}",
        stderr(&malformed)
    );
    let zero = tasks(&router, "ops", &["--limit", "0"]);
    assert_eq!(zero.status.code(), Some(2), "a usage error: {}", stderr(&zero));
    let both = tasks(&router, "ops", &["--show", &id, "--replay", &id]);
    assert_eq!(both.status.code(), Some(2), "a usage error: {}", stderr(&both));

    let replayed = tasks(&router, "ops", &["--replay", &id]);
    assert!(replayed.status.success(), "{}", stderr(&replayed));
    assert!(
        stdout(&replayed).contains(&format!("dead letter {id} replayed")),
        "{}",
        stdout(&replayed)
    );
    let after: Value = serde_json::from_slice(&tasks(&router, "ops", &["--json"]).stdout).unwrap();
    assert_eq!(after["total"], 0, "{after}");
    let again = tasks(&router, "ops", &["--replay", &id]);
    assert!(!again.status.success(), "replayed once");
}
