//! The Compose stack's commands, run as written, without Docker.
//!
//! Docker's engine is not available to the tests, so this runs what
//! `deploy/compose/docker-compose.yml` would run in its containers as
//! processes on loopback: the `secrets` service's script, then the registry,
//! router, context service and the six example agents with exactly the
//! command lines of the file. Only addresses and paths are translated: a
//! service name becomes `127.0.0.1:<free port>`, a container's `0.0.0.0:PORT`
//! its loopback port, the secrets volume and the ACL mount temp and repository
//! directories; etcd and Redis are real ones from `testkit` instead of their
//! images. Then it asks the question of deploy/README.md the way that page
//! does (a token from `agent-reach token issue`, a context, the invoke) and
//! runs every health check of the file.
//!
//! What this cannot show: that the images build and that Docker wires the
//! network and volumes as the file says (`docker compose config` and the
//! schema check in deploy/tests/ cover the file itself).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent_reach_testkit::{free_port, Etcd, Redis};
use serde_json::{json, Value};
use serde_yaml::Value as Yaml;

const COMPOSE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/compose/docker-compose.yml");
const COMPOSE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/compose");
/// Where the file mounts the secrets volume and the ACL directory.
const SECRETS_MOUNT: &str = "/run/agent-reach/secrets/";
const ACL_MOUNT: &str = "/etc/agent-reach/acl/";
/// Start-up order: the file's `depends_on`, flattened.
const SERVICES: [&str; 3] = ["registry", "context", "router"];
const AGENTS: [&str; 6] = [
    "reply-writer-1",
    "shipping-rules-1",
    "order-query-1",
    "order-query-2",
    "order-query-3",
    "intent-parser-1",
];

/// `agent-reach`, built beside `example-agent` by the workspace's build.
fn agent_reach() -> PathBuf {
    let binary = Path::new(env!("CARGO_BIN_EXE_example-agent")).with_file_name("agent-reach");
    assert!(
        binary.is_file(),
        "{} not built: `cargo build -p agent-reach-cli` (the workspace test run builds it)",
        binary.display()
    );
    binary
}

/// Processes of the stack, killed (and reaped) on drop.
#[derive(Default)]
struct Processes(Vec<(String, Child)>);

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Container addresses and paths → this host's.
struct Translation {
    /// `registry:7400` → `127.0.0.1:40123`, one per service.
    hosts: BTreeMap<String, String>,
    /// Each service's own port in its container → its loopback port.
    own_port: BTreeMap<String, (String, u16)>,
    secrets: PathBuf,
    acl: PathBuf,
}

impl Translation {
    fn arg(&self, service: &str, arg: &str) -> String {
        let mut arg = arg.replace(SECRETS_MOUNT, &format!("{}/", self.secrets.display()));
        arg = arg.replace(ACL_MOUNT, &format!("{}/", self.acl.display()));
        if let Some((container_port, port)) = self.own_port.get(service) {
            arg = arg.replace(&format!("0.0.0.0:{container_port}"), &format!("127.0.0.1:{port}"));
            arg = arg.replace(&format!("127.0.0.1:{container_port}/"), &format!("127.0.0.1:{port}/"));
        }
        for (from, to) in &self.hosts {
            arg = arg.replace(&format!("//{from}"), &format!("//{to}"));
        }
        arg
    }
}

fn strings(value: &Yaml) -> Vec<String> {
    value
        .as_sequence()
        .unwrap()
        .iter()
        .map(|item| item.as_str().unwrap().to_string())
        .collect()
}

fn listen_port(command: &[String]) -> String {
    command
        .iter()
        .find_map(|arg| arg.strip_prefix("--listen=0.0.0.0:"))
        .expect("every service listens on 0.0.0.0:PORT")
        .to_string()
}

fn run_init_secrets(secrets: &Path) -> std::process::Output {
    let bin_dir = agent_reach().parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    Command::new("sh")
        .arg(Path::new(COMPOSE_DIR).join("init-secrets.sh"))
        .env("SECRETS_DIR", secrets)
        .env("PATH", path)
        .output()
        .unwrap()
}

fn healthcheck(url: &str) -> bool {
    Command::new(agent_reach())
        .args(["healthcheck", url, "--timeout-ms", "1000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

fn wait_healthy(url: &str, processes: &mut Processes) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !healthcheck(url) {
        for (name, child) in &mut processes.0 {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{name} exited ({status}) before {url} was healthy");
            }
        }
        assert!(Instant::now() < deadline, "{url} not healthy within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_stack_answers_the_readme_question() {
    let mut file: Yaml = serde_yaml::from_str(&std::fs::read_to_string(COMPOSE).unwrap()).unwrap();
    file.apply_merge().unwrap();
    let services = &file["services"];
    let (etcd, redis) = (Etcd::start(), Redis::start());
    let work = tempfile::tempdir().unwrap();
    let logs = work.path().join("logs");
    std::fs::create_dir(&logs).unwrap();

    // The `secrets` service: first run generates, a second run keeps the
    // secrets and refreshes the tokens.
    let secrets = work.path().join("secrets");
    let first = run_init_secrets(&secrets);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let secret = std::fs::read_to_string(secrets.join("hs256.secret")).unwrap();
    assert_eq!(secret.len(), 64, "32 random bytes, hex");
    let second = run_init_secrets(&secrets);
    assert!(second.status.success());
    assert!(String::from_utf8_lossy(&second.stdout).contains("keeping hs256.secret"));
    assert_eq!(std::fs::read_to_string(secrets.join("hs256.secret")).unwrap(), secret);
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&second.stdout),
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(!printed.contains(&secret), "the script prints no secret");

    let mut hosts = BTreeMap::new();
    let mut own_port = BTreeMap::new();
    hosts.insert(
        "etcd:2379".to_string(),
        etcd.endpoint().trim_start_matches("http://").to_string(),
    );
    hosts.insert(
        "redis:6379".to_string(),
        redis.url().trim_start_matches("redis://").to_string(),
    );
    for name in SERVICES.iter().chain(AGENTS.iter()) {
        let container_port = listen_port(&strings(&services[*name]["command"]));
        let port = free_port();
        hosts.insert(format!("{name}:{container_port}"), format!("127.0.0.1:{port}"));
        own_port.insert(name.to_string(), (container_port, port));
    }
    let translation = Translation {
        hosts,
        own_port,
        secrets: secrets.clone(),
        acl: Path::new(COMPOSE_DIR).join("acl"),
    };

    let mut processes = Processes::default();
    let spawn = |name: &str, program: PathBuf, processes: &mut Processes| {
        let args: Vec<String> = strings(&services[name]["command"])
            .iter()
            .map(|arg| translation.arg(name, arg))
            .collect();
        let log = std::fs::File::create(logs.join(format!("{name}.log"))).unwrap();
        let child = Command::new(program)
            .args(&args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        processes.0.push((name.to_string(), child));
    };
    for name in SERVICES {
        spawn(name, agent_reach(), &mut processes);
        let url = translation.arg(
            name,
            services[name]["environment"]["AGENT_REACH_HEALTHCHECK_URL"]
                .as_str()
                .unwrap(),
        );
        wait_healthy(&url, &mut processes);
    }
    let example_agent = PathBuf::from(env!("CARGO_BIN_EXE_example-agent"));
    for name in AGENTS {
        spawn(name, example_agent.clone(), &mut processes);
    }
    // The agents' own health checks, as the file states them.
    for name in AGENTS {
        let test = strings(&services[name]["healthcheck"]["test"]);
        assert_eq!(test[..3], ["CMD", "/usr/local/bin/agent-reach", "healthcheck"]);
        wait_healthy(&translation.arg(name, &test[3]), &mut processes);
    }

    // deploy/README.md: a token for demo_user from the generated secret ...
    let issued = Command::new(agent_reach())
        .args(["token", "issue", "--name", "demo_user", "--secret-file"])
        .arg(secrets.join("hs256.secret"))
        .output()
        .unwrap();
    assert!(issued.status.success());
    let token = String::from_utf8(issued.stdout).unwrap().trim().to_string();
    let router = format!("http://{}", translation.hosts["router:7500"]);
    let context = format!("http://{}", translation.hosts["context:7600"]);
    let client = reqwest::Client::new();

    // ... then a context and the question, retried until the agents are routable.
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        let created: Value = client
            .post(format!("{context}/v1/contexts"))
            .bearer_auth(&token)
            .json(&json!({}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let context_id = created["context_id"].as_str().expect("a context id").to_string();
        let answer: Value = client
            .post(format!("{router}/v1/invoke"))
            .bearer_auth(&token)
            .json(&json!({"capability": "intent.parse", "context_id": context_id,
                          "payload": {"user_id": "u_123", "text": "Can my order SO-2024001 ship today?"}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if answer["status"] == "succeeded" {
            break answer;
        }
        assert!(
            Instant::now() < deadline,
            "no answer within 30 s; last: {answer}; logs in {}",
            logs.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let reply = answer["output"]["reply"].as_str().unwrap();
    assert!(reply.contains("ships today"), "{answer}");
    assert_eq!(answer["output"]["trace"].as_array().unwrap().len(), 3, "{answer}");
    // The agents registered the endpoints the file gives them.
    let agents: Value = client
        .get(format!("http://{}/v1/agents", translation.hosts["registry:7400"]))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let endpoints: Vec<&str> = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|agent| agent["endpoint"].as_str().unwrap())
        .collect();
    assert_eq!(endpoints.len(), 6, "{agents}");
    for name in AGENTS {
        let expected = format!("http://{}/invoke", translation.hosts[&format!("{name}:9100")]);
        assert!(
            endpoints.contains(&expected.as_str()),
            "{expected} not in {endpoints:?}"
        );
    }
    drop(processes);
}
