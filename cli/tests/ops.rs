//! Every operator command against a running `agent-reach dev`: table output,
//! `--json`, exit codes, and usage errors (never a panic) for bad arguments.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

/// The example stack's policy, and a check it allows.
const POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/acl.yaml");
const ALLOWED_CHECK: [&str; 8] = [
    "acl",
    "check",
    "--acl",
    POLICY,
    "--caller",
    "intent_parser",
    "--capability",
    "order.query",
];

struct Dev {
    child: std::process::Child,
    registry: String,
    router: String,
    context: String,
    secret: String,
    token: String,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dev() -> Dev {
    dev_with(&[])
}

/// `agent-reach dev` with extra flags (e.g. `--acl PATH`).
fn dev_with(extra: &[&str]) -> Dev {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .args([
            "dev",
            "--registry-listen",
            "127.0.0.1:0",
            "--router-listen",
            "127.0.0.1:0",
        ])
        .args(["--context-listen", "127.0.0.1:0"])
        .args(extra)
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
    let mut dev = Dev {
        child,
        registry: String::new(),
        router: String::new(),
        context: String::new(),
        secret: String::new(),
        token: String::new(),
    };
    while dev.token.is_empty() {
        let line = lines_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("dev did not start");
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("registry"), Some(value)) => dev.registry = value.to_string(),
            (Some("router"), Some(value)) => dev.router = value.to_string(),
            (Some("context"), Some(value)) => dev.context = value.to_string(),
            (Some("secret"), Some(value)) => dev.secret = value.to_string(),
            _ => {}
        }
        if let Some(token) = line.trim().strip_prefix("export TOKEN=") {
            dev.token = token.to_string();
        }
    }
    dev
}

fn run(dev: Option<&Dev>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agent-reach"));
    command
        .args(args)
        .env_remove("AGENT_REACH_TOKEN")
        .env_remove("AGENT_REACH_HEALTHCHECK_URL");
    if let Some(dev) = dev {
        command
            .env("AGENT_REACH_REGISTRY", &dev.registry)
            .env("AGENT_REACH_ROUTER", &dev.router)
            .env("AGENT_REACH_TOKEN", &dev.token);
    }
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
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

fn wait_for_agents(dev: &Dev) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let output = run(Some(dev), &["agents", "ls", "--json"]);
        if output.status.success()
            && json(&output)["agents"]
                .as_array()
                .is_some_and(|agents| agents.len() == 6)
        {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "example agents did not register");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn agents_and_capabilities_commands() {
    let dev = dev();
    wait_for_agents(&dev);

    let table = run(Some(&dev), &["agents", "ls"]);
    assert!(table.status.success());
    let text = stdout(&table);
    assert!(text.starts_with("AGENT_ID"), "{text}");
    assert!(
        text.contains("order_query-1") && text.contains("order.query@1.2.0"),
        "{text}"
    );

    let shown = run(Some(&dev), &["agents", "show", "order_query-2"]);
    assert!(shown.status.success());
    assert_eq!(json(&shown)["weight"], 2);
    let missing = run(Some(&dev), &["agents", "show", "nobody-1"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("AGENT_NOT_FOUND"));

    let capabilities = run(Some(&dev), &["capabilities", "ls"]);
    assert!(capabilities.status.success());
    assert!(stdout(&capabilities).contains("order.query"));
    let listed = json(&run(Some(&dev), &["capabilities", "ls", "--json"]));
    assert_eq!(listed["capabilities"].as_array().unwrap().len(), 4);

    let order = run(
        Some(&dev),
        &["capabilities", "show", "order.query", "--version", "^1.2"],
    );
    assert!(order.status.success());
    assert!(stdout(&order).contains("order_query-3"), "{}", stdout(&order));
    let order = json(&run(Some(&dev), &["capabilities", "show", "order.query", "--json"]));
    assert_eq!(order["instances"].as_array().unwrap().len(), 3);
    let unmatched = run(Some(&dev), &["capabilities", "show", "order.query", "--version", "^9"]);
    assert_eq!(unmatched.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unmatched.stderr).contains("VERSION_NOT_FOUND"));

    // The container health check: 2xx is healthy, anything else exits 1 and says why.
    let healthz = format!("{}/healthz", dev.router);
    let healthy = run(None, &["healthcheck", &healthz]);
    assert!(healthy.status.success(), "{}", String::from_utf8_lossy(&healthy.stderr));
    assert!(stdout(&healthy).starts_with("healthy:"), "{}", stdout(&healthy));
    let from_env = Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .arg("healthcheck")
        .env("AGENT_REACH_HEALTHCHECK_URL", format!("{}/healthz", dev.registry))
        .output()
        .unwrap();
    assert!(
        from_env.status.success(),
        "{}",
        String::from_utf8_lossy(&from_env.stderr)
    );
    let not_found = run(None, &["healthcheck", &format!("{}/no-such-path", dev.router)]);
    assert_eq!(not_found.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&not_found.stderr).contains("404"));
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let closed = format!("http://127.0.0.1:{port}/healthz");
    let unreachable = run(None, &["healthcheck", &closed, "--timeout-ms", "500"]);
    assert_eq!(unreachable.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unreachable.stderr).contains("cannot reach"));
    let no_scheme = run(None, &["healthcheck", "127.0.0.1:7500/healthz"]);
    assert_eq!(no_scheme.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&no_scheme.stderr).contains("must start with http://"));

    // Without a token: a clear error, not a panic.
    let anonymous = run(None, &["agents", "ls", "--registry", &dev.registry]);
    assert_eq!(anonymous.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&anonymous.stderr).contains("no token"));
}

#[test]
fn invoke_token_and_acl_commands() {
    let dev = dev();
    wait_for_agents(&dev);
    let context = create_context(&dev.context, &dev.token);
    let context_id = context["context_id"].as_str().unwrap();
    let data = r#"{"user_id":"u_1","text":"Can my order SO-2024001 ship today?"}"#;

    let invoked = run(
        Some(&dev),
        &["invoke", "intent.parse", "--data", data, "--context-id", context_id],
    );
    assert!(invoked.status.success(), "{}", String::from_utf8_lossy(&invoked.stderr));
    let text = stdout(&invoked);
    assert!(
        text.starts_with("succeeded: intent.parse 1.0.0 on intent_parser-1"),
        "{text}"
    );
    let invoked = run(
        Some(&dev),
        &[
            "invoke",
            "intent.parse",
            "--data",
            data,
            "--context-id",
            context_id,
            "--json",
        ],
    );
    assert_eq!(json(&invoked)["status"], "succeeded");
    let refused = run(
        Some(&dev),
        &["invoke", "order.query", "--data", r#"{"order_id":"SO-2024001"}"#],
    );
    assert_eq!(refused.status.code(), Some(1));
    assert!(stdout(&refused).contains("FORBIDDEN"), "{}", stdout(&refused));
    let bad_json = run(Some(&dev), &["invoke", "intent.parse", "--data", "{oops"]);
    assert_eq!(bad_json.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad_json.stderr).contains("not valid JSON"));

    let issued = run(
        None,
        &[
            "token",
            "issue",
            "--name",
            "ops_user",
            "--secret-file",
            &dev.secret,
            "--ttl",
            "1h",
        ],
    );
    assert!(issued.status.success());
    assert_eq!(stdout(&issued).trim().split('.').count(), 3, "a JWT has three parts");
    let no_secret = run(
        None,
        &["token", "issue", "--name", "x", "--secret-file", "/nonexistent/secret"],
    );
    assert_eq!(no_secret.status.code(), Some(1));
    // A tenant's token carries the claim; a name that is not a tenant's is refused.
    let tenant = run(
        None,
        &[
            "token",
            "issue",
            "--name",
            "x",
            "--secret-file",
            &dev.secret,
            "--tenant",
            "acme",
            "--group",
            "finance",
            "--group",
            "ops",
        ],
    );
    assert!(tenant.status.success());
    let payload = stdout(&tenant).trim().split('.').nth(1).unwrap().to_string();
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, payload).unwrap(),
    )
    .unwrap();
    assert_eq!(claims["tenant"], "acme");
    assert_eq!(claims["groups"], serde_json::json!(["finance", "ops"]));
    let bad_tenant = run(
        None,
        &[
            "token",
            "issue",
            "--name",
            "x",
            "--secret-file",
            &dev.secret,
            "--tenant",
            "Not A Tenant",
        ],
    );
    assert_eq!(bad_tenant.status.code(), Some(1));
    assert!(
        stderr(&bad_tenant).contains("is not a tenant name"),
        "{}",
        stderr(&bad_tenant)
    );

    let allowed = run(None, &ALLOWED_CHECK);
    assert_eq!(allowed.status.code(), Some(0));
    assert!(stdout(&allowed).starts_with("allowed"));
    let denied = run(
        None,
        &[
            "acl",
            "check",
            "--acl",
            POLICY,
            "--caller",
            "demo_user",
            "--capability",
            "order.query",
        ],
    );
    assert_eq!(denied.status.code(), Some(1));
    assert!(stdout(&denied).starts_with("denied"));
    let as_json = run(
        None,
        &[
            "acl",
            "check",
            "--acl",
            POLICY,
            "--caller",
            "demo_user",
            "--capability",
            "intent.parse",
            "--json",
        ],
    );
    assert_eq!(json(&as_json)["allowed"], true);
}

#[test]
fn a_reader_that_goes_away_ends_a_command_quietly() {
    // `agent-reach acl check ... | head -0`: the pipe's reading end is closed
    // before the command writes its verdict.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let output = Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .args(ALLOWED_CHECK)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(output.status.code(), Some(0), "{stderr}");
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        vec![],
        vec!["frobnicate"],
        vec!["agents", "frobnicate"],
        vec!["invoke"],
        vec!["healthcheck"],
        vec!["acl", "check", "--caller", "x"],
        vec!["token", "issue", "--name", "x", "--secret-file", "s", "--ttl", "3y"],
        vec!["registry", "--listen", "not-an-address"],
        vec!["dev", "--registry-listen", "nowhere"],
    ] {
        let output = run(None, &args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("Usage") || stderr.contains("--help"),
            "{args:?}: {stderr}"
        );
    }
    // Valid flags, invalid configuration: all problems at once, exit 1.
    let output = run(None, &["registry", "--min-ttl-s", "0"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--etcd") && stderr.contains("--min-ttl-s") && stderr.contains("authentication"),
        "{stderr}"
    );
}

/// Creates a context over HTTP, as the printed `curl` would.
fn create_context(context: &str, token: &str) -> Value {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        reqwest::Client::new()
            .post(format!("{context}/v1/contexts"))
            .bearer_auth(token)
            .json(&serde_json::json!({}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    })
}

// Issue 21, point 2: the canary verbs, against a dev stack whose policy names `ops` an operator.
#[test]
fn split_and_weight_commands() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.yaml");
    let policy = std::fs::read_to_string(POLICY).unwrap();
    std::fs::write(&acl, format!("{policy}\noperators: [ops]\n")).unwrap();
    let dev = dev_with(&["--acl", acl.to_str().unwrap()]);
    wait_for_agents(&dev);
    let issued = run(None, &["token", "issue", "--name", "ops", "--secret-file", &dev.secret]);
    assert!(issued.status.success());
    let ops = stdout(&issued).trim().to_string();
    let as_ops = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--token", ops.as_str()]);
        run(Some(&dev), &all)
    };

    // No split yet; a caller who is not an operator is refused with the registry's code.
    let none = run(Some(&dev), &["capabilities", "split", "order.query"]);
    assert!(none.status.success(), "{}", String::from_utf8_lossy(&none.stderr));
    assert!(stdout(&none).contains("no split"), "{}", stdout(&none));
    let refused = run(
        Some(&dev),
        &["capabilities", "split", "order.query", "1.2.0=9", "2.0.0=1"],
    );
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("FORBIDDEN"));

    let set = as_ops(&["capabilities", "split", "order.query", "2.0.0=5", "1.2.0=95"]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let table = stdout(&set);
    assert!(
        table.contains("2.0.0") && table.contains("5.0%") && table.contains("95.0%"),
        "{table}"
    );
    let shown = json(&run(Some(&dev), &["capabilities", "split", "order.query", "--json"]));
    assert_eq!(shown["weights"], serde_json::json!({ "1.2.0": 95, "2.0.0": 5 }));
    assert_eq!(shown["updated_by"], "ops");

    // Bad pairs: a usage problem caught here, or the registry's code.
    let no_equals = as_ops(&["capabilities", "split", "order.query", "2.0.0"]);
    assert_eq!(no_equals.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&no_equals.stderr).contains("VERSION=WEIGHT"));
    let bad_version = as_ops(&["capabilities", "split", "order.query", "2.0=5"]);
    assert_eq!(bad_version.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad_version.stderr).contains("INVALID_VERSION"));
    let negative = as_ops(&["capabilities", "split", "order.query", "2.0.0=-5"]);
    assert_eq!(negative.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&negative.stderr).contains("INVALID_SPLIT"));
    let both = as_ops(&["capabilities", "split", "order.query", "2.0.0=5", "--clear"]);
    assert_eq!(both.status.code(), Some(2), "a usage error");

    let cleared = as_ops(&["capabilities", "split", "order.query", "--clear"]);
    assert!(cleared.status.success(), "{}", String::from_utf8_lossy(&cleared.stderr));
    assert!(stdout(&cleared).contains("cleared"));
    let none = json(&run(Some(&dev), &["capabilities", "split", "order.query", "--json"]));
    assert_eq!(none["split"], serde_json::Value::Null);

    // A capability's default policy (issue 38).
    let none = run(Some(&dev), &["capabilities", "policy", "order.query"]);
    assert!(stdout(&none).contains("no policy of its own"), "{}", stdout(&none));
    let set = as_ops(&["capabilities", "policy", "order.query", "adaptive"]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    assert!(stdout(&set).contains("use adaptive (set by ops)"), "{}", stdout(&set));
    let shown = json(&run(Some(&dev), &["capabilities", "policy", "order.query", "--json"]));
    assert_eq!(shown["policy"], "adaptive");
    let bad = as_ops(&["capabilities", "policy", "order.query", "random"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("INVALID_POLICY"));
    let refused = run(Some(&dev), &["capabilities", "policy", "order.query", "p2c_ewma"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("FORBIDDEN"));
    let cleared = as_ops(&["capabilities", "policy", "order.query", "--clear"]);
    assert!(cleared.status.success(), "{}", String::from_utf8_lossy(&cleared.stderr));
    let none = json(&run(Some(&dev), &["capabilities", "policy", "order.query", "--json"]));
    assert_eq!(none["policy"], serde_json::Value::Null);

    // A live weight: changed in place, visible at once.
    let weighed = as_ops(&["agents", "weight", "order_query-3", "7"]);
    assert!(weighed.status.success(), "{}", String::from_utf8_lossy(&weighed.stderr));
    assert!(stdout(&weighed).contains("weight 7"), "{}", stdout(&weighed));
    assert_eq!(
        json(&run(Some(&dev), &["agents", "show", "order_query-3"]))["weight"],
        7
    );
    let too_heavy = as_ops(&["agents", "weight", "order_query-3", "5000"]);
    assert_eq!(too_heavy.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&too_heavy.stderr).contains("INVALID_WEIGHT"));
    let not_operator = run(Some(&dev), &["agents", "weight", "order_query-3", "2"]);
    assert_eq!(not_operator.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&not_operator.stderr).contains("FORBIDDEN"));
}
