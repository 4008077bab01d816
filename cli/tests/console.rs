//! `agent-reach console` and `agent-reach requests` against a real router:
//! the sign-in link opens a session, a refused call is found by its request
//! id, and a non-operator, an unknown id and a bad id each fail clearly with
//! a non-zero exit.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

const SECRET: &[u8] = b"cli-console-tests-0123456789abcdef-0123456789";
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

/// A router whose registry is not running: the console's API needs none.
fn router() -> Router {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    std::fs::write(path("hs256.secret"), SECRET).unwrap();
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
        .args(["--assertion-key", &path("assertion.pem")])
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

fn as_caller(router: &Router, caller: &str, args: &[&str]) -> Output {
    let token = token(caller);
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--router", &router.url, "--token", &token]);
    agent_reach(&all)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_links_and_request_lookups() {
    let router = router();
    let client = reqwest::Client::new();

    // The link opens a session on the router that printed it.
    let printed = as_caller(&router, "ops", &["console", "--ttl", "60"]);
    assert!(printed.status.success(), "{}", stderr(&printed));
    let text = stdout(&printed);
    let link = text
        .lines()
        .find(|line| line.starts_with("http"))
        .expect("a link")
        .to_string();
    assert!(link.starts_with(&format!("{}/console#code=", router.url)), "{text}");
    let code = link.split_once("#code=").unwrap().1;
    let session = client
        .post(format!("{}/v1/console/session", router.url))
        .header("x-agent-reach-console", "1")
        .json(&json!({ "code": code }))
        .send()
        .await
        .unwrap();
    assert_eq!(session.status(), 200);
    let refused = as_caller(&router, "tester", &["console"]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("FORBIDDEN"), "{}", stderr(&refused));
    let bad_ttl = as_caller(&router, "ops", &["console", "--ttl", "0"]);
    assert!(!bad_ttl.status.success());

    // A call refused at admission (no such capability: the registry is down) is in the ring.
    let answer: Value = client
        .post(format!("{}/v1/invoke", router.url))
        .bearer_auth(token("tester"))
        .json(&json!({ "capability": "order.query", "request_id": "cli-lookup-1", "payload": {} }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["status"], "failed", "{answer}");
    let shown = as_caller(&router, "ops", &["requests", "show", "cli-lookup-1"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let text = stdout(&shown);
    assert!(text.contains("cli-lookup-1") && text.contains("failed"), "{text}");
    let json_shown = as_caller(&router, "ops", &["requests", "show", "cli-lookup-1", "--json"]);
    let parsed: Value = serde_json::from_slice(&json_shown.stdout).unwrap();
    assert_eq!(parsed["calls"][0]["caller"], "tester");
    let listed = as_caller(&router, "ops", &["requests", "list", "--failed"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(stdout(&listed).contains("cli-lookup-1"));

    let unknown = as_caller(&router, "ops", &["requests", "show", "no-such-request"]);
    assert!(!unknown.status.success());
    assert!(stderr(&unknown).contains("NOT_FOUND"), "{}", stderr(&unknown));
    let bad = as_caller(&router, "ops", &["requests", "show", "a/b"]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("not a request id"), "{}", stderr(&bad));
    let stranger = as_caller(&router, "tester", &["requests", "list"]);
    assert!(!stranger.status.success());
    assert!(stderr(&stranger).contains("FORBIDDEN"), "{}", stderr(&stranger));
}
