//! `agent-reach access request|ls|approve|deny|revoke|export` and `acl
//! check` with grants, driving the binary against `agent-reach dev` on a
//! real etcd: a caller asks, an owner approves, the call goes through, the
//! grant exports as acl.yaml permissions, a revocation stops it; every
//! refusal exits non-zero with its code.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

/// The example's policy, with an operator and an owner of `order.*`.
fn policy() -> String {
    let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/acl.yaml")).unwrap();
    format!("{example}\noperators: [ops]\nowners:\n  - capability: order.*\n    approvers: [order_owner]\n")
}

struct Dev {
    child: Child,
    registry: String,
    router: String,
    /// A context for `demo_user`'s calls (the example agents write to it).
    context_id: String,
    secret: Vec<u8>,
    acl: String,
    _etcd: agent_reach_testkit::Etcd,
    _dir: tempfile::TempDir,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dev() -> Dev {
    let etcd = agent_reach_testkit::Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.yaml").to_str().unwrap().to_string();
    std::fs::write(&acl, policy()).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .args([
            "dev",
            "--registry-listen",
            "127.0.0.1:0",
            "--router-listen",
            "127.0.0.1:0",
        ])
        .args([
            "--context-listen",
            "127.0.0.1:0",
            "--acl",
            &acl,
            "--etcd",
            &etcd.endpoint(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let (mut registry, mut router, mut secret, mut context) =
        (String::new(), String::new(), String::new(), String::new());
    loop {
        let line = lines_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("dev did not start");
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("registry"), Some(value)) => registry = value.to_string(),
            (Some("router"), Some(value)) => router = value.to_string(),
            (Some("secret"), Some(value)) => secret = value.to_string(),
            (Some("context"), Some(value)) => context = value.to_string(),
            _ => {}
        }
        if line.trim().starts_with("export TOKEN=") {
            break;
        }
    }
    let secret = std::fs::read(&secret).unwrap();
    let token = agent_reach_access::token::issue_hs256("demo_user", &secret, Duration::from_secs(600)).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let created: Value = runtime.block_on(async {
        let response = reqwest::Client::new()
            .post(format!("{context}/v1/contexts"))
            .bearer_auth(token)
            .json(&serde_json::json!({}))
            .send()
            .await
            .unwrap();
        response.json().await.unwrap()
    });
    Dev {
        child,
        registry,
        router,
        context_id: created["context_id"].as_str().unwrap().to_string(),
        secret,
        acl,
        _etcd: etcd,
        _dir: dir,
    }
}

/// `agent-reach ARGS` as `caller`, against the dev stack.
fn run(dev: &Dev, caller: &str, args: &[&str]) -> Output {
    let token = agent_reach_access::token::issue_hs256(caller, &dev.secret, Duration::from_secs(600)).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .args(args)
        .env("AGENT_REACH_REGISTRY", &dev.registry)
        .env("AGENT_REACH_ROUTER", &dev.router)
        .env("AGENT_REACH_TOKEN", token)
        .output()
        .unwrap();
    assert!(!stderr(&output).contains("panicked"), "{args:?}: {}", stderr(&output));
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("not JSON ({error}): {}", stdout(output)))
}

/// Refused with exit status 1 and `code` on standard error.
fn refused(output: &Output, code: &str) {
    assert_eq!(output.status.code(), Some(1), "{}{}", stdout(output), stderr(output));
    assert!(stderr(output).contains(code), "expected {code}: {}", stderr(output));
}

const ORDER: &str = r#"{"order_id":"SO-2024001"}"#;

/// Polls (bounded) until `demo_user`'s call to `order.query` succeeds (`true`) or is refused.
fn until_call(dev: &Dev, succeeds: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let called = run(
            dev,
            "demo_user",
            &[
                "invoke",
                "order.query",
                "--data",
                ORDER,
                "--context-id",
                &dev.context_id,
            ],
        );
        if called.status.success() == succeeds {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{}", stdout(&called));
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn access_is_requested_approved_exported_and_revoked_from_the_command_line() {
    let dev = dev();
    // The example agents register with the stack; wait until order.query can be asked for.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let filed = loop {
        let output = run(
            &dev,
            "demo_user",
            &[
                "access",
                "request",
                "--capability",
                "order.query",
                "--reason",
                "check orders myself",
                "--json",
            ],
        );
        if output.status.success() {
            break json(&output);
        }
        assert!(stderr(&output).contains("CAPABILITY_NOT_FOUND"), "{}", stderr(&output));
        assert!(std::time::Instant::now() < deadline, "order.query never registered");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(filed["status"], "pending");
    let id = filed["id"].as_str().unwrap().to_string();
    let invoked = run(&dev, "demo_user", &["invoke", "order.query", "--data", ORDER]);
    assert!(stdout(&invoked).contains("FORBIDDEN"), "{}", stdout(&invoked));
    let again = run(
        &dev,
        "demo_user",
        &["access", "request", "--capability", "order.query", "--reason", "still"],
    );
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stdout(&again).starts_with(&format!("already pending {id}")),
        "{}",
        stdout(&again)
    );

    // The owner sees it; the file alone says no.
    let listed = run(&dev, "order_owner", &["access", "ls", "--status", "pending"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let table = stdout(&listed);
    assert!(
        table.contains(&id) && table.contains("demo_user") && table.contains("check orders myself"),
        "{table}"
    );
    let check = [
        "acl",
        "check",
        "--acl",
        &dev.acl,
        "--caller",
        "demo_user",
        "--capability",
        "order.query",
    ];
    let offline = Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .args(check)
        .env_remove("AGENT_REACH_TOKEN")
        .output()
        .unwrap();
    assert_eq!(offline.status.code(), Some(1), "{}", stdout(&offline));
    assert!(stdout(&offline).starts_with("denied"), "{}", stdout(&offline));

    // Only an owner decides.
    refused(&run(&dev, "demo_user", &["access", "approve", &id]), "FORBIDDEN");
    refused(&run(&dev, "ops", &["access", "approve", &id]), "FORBIDDEN");
    let approved = run(&dev, "order_owner", &["access", "approve", &id, "--note", "ok for Q3"]);
    assert!(approved.status.success(), "{}", stderr(&approved));
    assert!(stdout(&approved).starts_with(&format!("approved {id}: `demo_user` may call `order.query` (grant gr-")));
    refused(&run(&dev, "order_owner", &["access", "deny", &id]), "ALREADY_DECIDED");
    until_call(&dev, true);

    // `acl check` shows the grant beside the file's verdict.
    let online = run(&dev, "order_owner", &check);
    assert!(online.status.success(), "{}", stdout(&online));
    assert!(stdout(&online).contains("by a live grant"), "{}", stdout(&online));
    let mut check_json = check.to_vec();
    check_json.push("--json");
    let verdict = json(&run(&dev, "order_owner", &check_json));
    assert_eq!(
        (verdict["allowed"].as_bool(), verdict["by_file"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(verdict["grants"][0]["granted_by"], "order_owner");

    // Exported as permissions that parse as acl.yaml and allow the call.
    let exported = run(&dev, "order_owner", &["access", "export"]);
    assert!(exported.status.success(), "{}", stderr(&exported));
    let yaml = stdout(&exported);
    let folded = agent_reach_access::Acl::parse(&format!("version: 1\n{yaml}")).unwrap();
    assert!(folded.may_call("demo_user", "order.query"), "{yaml}");
    let listed = json(&run(&dev, "demo_user", &["access", "ls", "--json"]));
    assert_eq!(listed["grants"].as_array().unwrap().len(), 1, "{listed}");

    // Revoked by its request's id: the call stops.
    let revoked = run(&dev, "order_owner", &["access", "revoke", &id]);
    assert!(revoked.status.success(), "{}", stderr(&revoked));
    assert!(stdout(&revoked).starts_with("revoked gr-"), "{}", stdout(&revoked));
    until_call(&dev, false);
    refused(&run(&dev, "order_owner", &["access", "revoke", &id]), "GRANT_NOT_FOUND");

    // Denied, with an operator asking for someone else.
    let for_billing = run(
        &dev,
        "ops",
        &[
            "access",
            "request",
            "--capability",
            "order.query",
            "--as",
            "billing",
            "--reason",
            "invoices",
            "--ttl",
            "1h",
            "--json",
        ],
    );
    assert!(for_billing.status.success(), "{}", stderr(&for_billing));
    let billing = json(&for_billing);
    assert_eq!(
        (billing["caller"].as_str(), billing["ttl_s"].as_u64()),
        (Some("billing"), Some(3600))
    );
    let denied = run(
        &dev,
        "order_owner",
        &[
            "access",
            "deny",
            billing["id"].as_str().unwrap(),
            "--note",
            "use the export",
        ],
    );
    assert!(stdout(&denied).starts_with("denied"), "{}", stdout(&denied));

    // Bad input: its code, exit 1; bad arguments: usage, exit 2.
    let ask = |caller: &str, extra: &[&str]| {
        let mut args = vec!["access", "request", "--reason", "r"];
        args.extend_from_slice(extra);
        run(&dev, caller, &args)
    };
    refused(
        &ask("demo_user", &["--capability", "order.nothing"]),
        "CAPABILITY_NOT_FOUND",
    );
    refused(&ask("demo_user", &["--capability", "intent.parse"]), "ALREADY_ALLOWED");
    refused(
        &ask("demo_user", &["--capability", "order.query", "--as", "billing"]),
        "FORBIDDEN",
    );
    refused(&ask("demo_user", &["--capability", "shipping.rules"]), "NO_OWNER");
    refused(
        &run(&dev, "order_owner", &["access", "approve", "ar-0000000000000000"]),
        "ACCESS_REQUEST_NOT_FOUND",
    );
    refused(
        &run(&dev, "order_owner", &["access", "revoke", "gr-0000000000000000"]),
        "GRANT_NOT_FOUND",
    );
    refused(
        &run(&dev, "order_owner", &["access", "approve", "../agents"]),
        "not an access request",
    );
    let usage = ask("demo_user", &["--capability", "order.query", "--ttl", "3y"]);
    assert_eq!(usage.status.code(), Some(2), "{}", stderr(&usage));
    let usage = run(&dev, "order_owner", &["access", "ls", "--status", "sleeping"]);
    assert_eq!(usage.status.code(), Some(2), "{}", stderr(&usage));
}
