//! Observability contract (issue 7): the metrics every service serves match
//! `docs/metrics.md`; the alert rules pass `promtool`; and a real Prometheus
//! scraping the running stack after traffic (successes, failures, retries, an
//! ACL reload) answers every PromQL expression of the dashboards and alerts.
//! A second router runs the slow path on real Redis and is given task
//! traffic (successes, failures, a callback that ends as a dead letter), so
//! the task metrics and their dashboard are held to the same contract.
//!
//! Rule for alert expressions: the whole expression must be valid, and the
//! expression without its final threshold comparison (`< 0.99`, `> 0.5`, `== 0`)
//! must return data — a healthy stack does not fire, but what the rule compares
//! must exist.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_reach_examples::stack::{Stack, StackOptions};
use agent_reach_examples::{scenario_instances, EXAMPLE_ACL};
use agent_reach_testkit::{promtool, Prometheus, Redis};
use clap::Parser;
use serde_json::{json, Value};

const CAPABILITIES: [&str; 4] = ["intent.parse", "order.query", "shipping.rules", "reply.write"];
/// Grafana's `$__rate_interval` evaluated against a 1 s scrape interval.
const RATE_INTERVAL: &str = "1m";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

// === docs/metrics.md ===

/// One documented (or scraped) metric family: type and label names.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Family {
    kind: String,
    labels: BTreeSet<String>,
}

/// The doc's tables by section: `every`, `registry`, `router`, `context`, `tasks`, `runs`.
fn documented() -> BTreeMap<String, BTreeMap<String, Family>> {
    let text = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    let mut sections: BTreeMap<String, BTreeMap<String, Family>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            section = match title.trim() {
                "Every service" => "every",
                "Registry" => "registry",
                "Router" => "router",
                "Context service" => "context",
                "Tasks" => "tasks",
                "Workflow runs" => "runs",
                _ => "",
            }
            .to_string();
            continue;
        }
        let Some(row) = line.strip_prefix("| `agent_reach_") else {
            continue;
        };
        assert!(!section.is_empty(), "metric row outside a service section: {line}");
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let name = format!("agent_reach_{}", cells[0].trim_end_matches('`'));
        let labels = cells[2]
            .split(',')
            .map(|label| label.trim().trim_matches('`').to_string())
            .filter(|label| !label.is_empty() && label != "—")
            .collect();
        let family = Family {
            kind: cells[1].to_string(),
            labels,
        };
        sections.entry(section.clone()).or_default().insert(name, family);
    }
    sections
}

/// Families in a Prometheus text exposition, with the label names of their samples.
fn scraped(text: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            families.insert(
                name.to_string(),
                Family {
                    kind: kind.to_string(),
                    labels: BTreeSet::new(),
                },
            );
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let series = line.split_whitespace().next().unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix).filter(|base| families.contains_key(*base)))
            .unwrap_or(name);
        let entry = families
            .get_mut(family)
            .unwrap_or_else(|| panic!("sample without TYPE: {line}"));
        for pair in labels.split(',').filter(|pair| !pair.is_empty()) {
            let label = pair.split('=').next().unwrap();
            if label != "le" {
                entry.labels.insert(label.to_string());
            }
        }
    }
    families
}

// === PromQL in deploy/ ===

/// Every `expr` in the Grafana dashboards, with `$__rate_interval` and `$tenant` (All) substituted.
fn dashboard_expressions() -> Vec<(String, String)> {
    let mut found = Vec::new();
    let dir = repo().join("deploy/grafana");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 4,
        "router, registry, context and tasks dashboards expected in {dir:?}"
    );
    for file in files {
        let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        // Every dashboard selects a tenant (docs/tenants.md); its All value matches
        // series without the label too, which is what this one-tenant stack serves.
        let tenant = dashboard["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .find(|variable| variable["name"] == "tenant")
            .unwrap_or_else(|| panic!("{file:?} has no `tenant` variable"));
        assert_eq!(tenant["allValue"], ".*", "{file:?}");
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                assert!(
                    expr.matches("agent_reach_").count() == expr.matches("tenant=~\"$tenant\"").count(),
                    "{file:?}: every series of `{expr}` must select the tenant"
                );
                let expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$tenant", ".*");
                let place = format!(
                    "{} / {}",
                    file.file_name().unwrap().to_string_lossy(),
                    panel["title"].as_str().unwrap()
                );
                found.push((place, expr));
            }
        }
    }
    found
}

/// Every alert: (name, whole expression, expression without the threshold).
fn alert_expressions() -> Vec<(String, String, String)> {
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yml")).unwrap()).unwrap();
    let mut found = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().unwrap().to_string();
            let expr = rule["expr"].as_str().unwrap().trim().to_string();
            let body =
                without_threshold(&expr).unwrap_or_else(|| panic!("{name}: no final threshold comparison in `{expr}`"));
            found.push((name, expr.clone(), body));
        }
    }
    found
}

/// `EXPR OP NUMBER` → `EXPR`, for OP in `<`, `>`, `==`.
fn without_threshold(expr: &str) -> Option<String> {
    let trimmed = expr.trim_end();
    let number_start = trimmed.rfind(|c: char| !(c.is_ascii_digit() || c == '.'))? + 1;
    trimmed[number_start..].parse::<f64>().ok()?;
    let rest = trimmed[..number_start].trim_end();
    let body = ["==", "<", ">"].iter().find_map(|op| rest.strip_suffix(op))?.trim_end();
    Some(body.to_string())
}

/// `agent_reach_*` names an expression refers to, histogram suffixes removed.
fn referenced_metrics(expr: &str, histograms: &BTreeSet<String>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(start) = rest.find("agent_reach_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix).filter(|base| histograms.contains(*base)))
            .unwrap_or(name);
        names.insert(family.to_string());
        rest = &tail[end..];
    }
    names
}

// === promtool ===

fn run_promtool(args: &[&str]) {
    let output = Command::new(promtool())
        .args(args)
        .current_dir(repo().join("deploy/prometheus"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "promtool {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn alert_rules_pass_promtool_and_every_alert_is_tested_firing_and_silent() {
    run_promtool(&["check", "rules", "alerts.yml"]);
    run_promtool(&["check", "config", "prometheus.yml"]);
    run_promtool(&["test", "rules", "alerts_test.yml"]);

    // Each alert has a case where it fires and one where it stays silent.
    let tests: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo().join("deploy/prometheus/alerts_test.yml")).unwrap())
            .unwrap();
    let mut fires = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for case in tests["tests"].as_sequence().unwrap() {
        for check in case["alert_rule_test"].as_sequence().unwrap() {
            let name = check["alertname"].as_str().unwrap().to_string();
            if check["exp_alerts"]
                .as_sequence()
                .is_some_and(|alerts| !alerts.is_empty())
            {
                fires.insert(name);
            } else {
                silent.insert(name);
            }
        }
    }
    for (name, _, _) in alert_expressions() {
        assert!(fires.contains(&name), "alerts_test.yml never expects {name} to fire");
        assert!(
            silent.contains(&name),
            "alerts_test.yml never expects {name} to stay silent"
        );
    }
}

// === The running stack ===

/// Traffic until stopped: the worked example's chain, plus failures the
/// dashboards must show (forbidden call, schema mismatch, bad token).
async fn traffic(stack: Arc<Stack>, stop: Arc<AtomicBool>) {
    let client = reqwest::Client::new();
    let user = stack.token("demo_user", Duration::from_secs(600)).unwrap();
    let mut pace = tokio::time::interval(Duration::from_millis(50));
    while !stop.load(Ordering::Relaxed) {
        pace.tick().await;
        let created: Value = client
            .post(format!("{}/v1/contexts", stack.context))
            .bearer_auth(&user)
            .json(&json!({}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let context_id = created["context_id"].as_str().unwrap();
        let calls = [
            (
                json!({"capability": "intent.parse", "context_id": context_id, "timeout_ms": 10_000,
                    "payload": {"user_id": "u_42", "text": "Can my order SO-2024001 ship today?"}}),
                &user,
            ),
            (
                json!({"capability": "order.query", "payload": {"order_id": "SO-2024001"}}),
                &user,
            ),
            (json!({"capability": "intent.parse", "payload": {"text": 42}}), &user),
        ];
        for (envelope, token) in calls {
            let _ = client
                .post(format!("{}/v1/invoke", stack.router))
                .bearer_auth(token)
                .json(&envelope)
                .send()
                .await
                .unwrap()
                .bytes()
                .await;
        }
        // A streamed invoke (the stream metrics); the demo agent answers JSON: one event, then the result.
        let _ = client
            .post(format!("{}/v1/invoke", stack.router))
            .bearer_auth(&user)
            .header("accept", "text/event-stream")
            .json(
                &json!({"capability": "intent.parse", "context_id": context_id, "timeout_ms": 10_000,
                "payload": {"user_id": "u_42", "text": "Can my order SO-2024001 ship today?"}}),
            )
            .send()
            .await
            .unwrap()
            .bytes()
            .await;
        let _ = client
            .post(format!("{}/v1/invoke", stack.router))
            .bearer_auth("not-a-token")
            .json(&json!({"capability": "intent.parse", "payload": {}}))
            .send()
            .await
            .unwrap()
            .bytes()
            .await;
    }
}

/// An `order.query` instance nobody listens for: the router's attempts on it
/// fail to connect and are retried on a live instance. No heartbeats: its lease expires.
async fn register_ghost(stack: &Stack) {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let response = reqwest::Client::new()
        .post(format!("{}/v1/agents", stack.registry))
        .bearer_auth(stack.token("order_query", Duration::from_secs(600)).unwrap())
        .json(&json!({
            "agent_id": "order_query-ghost", "name": "order_query", "endpoint": format!("http://{closed}"),
            "weight": 10, "ttl_s": 10, "status": "ready",
            "capabilities": [{"name": "order.query", "version": "1.2.0"}]
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201, "{}", response.text().await.unwrap());
}

// === The slow path ===

/// Signs the callbacks of the router with the slow path (at least 32 bytes).
const CALLBACK_SECRET: &str = "observability-callback-secret-0123456789abcdef";

/// `agent-reach router`'s flags, parsed as the binary parses them.
#[derive(Parser)]
struct RouterFlags {
    #[command(flatten)]
    router: agent_reach_router::RouterArgs,
}

/// A second router, configured like `agent-reach router --redis …` on the
/// stack's registry, secret and policy: only a router with the slow path
/// serves the task metrics. Returns its URL and its server.
async fn start_tasks_router(stack: &Stack, redis: &Redis, dir: &Path) -> (String, tokio::task::JoinHandle<()>) {
    let secret = dir.join("callback.secret");
    std::fs::write(&secret, CALLBACK_SECRET).unwrap();
    // The stack's own key: the agents verify against the stack router's published keys.
    let assertion_key = stack.assertion_key_file.clone();
    let path = |path: &Path| path.display().to_string();
    let flags = RouterFlags::try_parse_from([
        "router".to_string(),
        "--registry".to_string(),
        stack.registry.clone(),
        "--acl".to_string(),
        path(&stack.acl),
        "--auth-hs256-secret-file".to_string(),
        path(&stack.secret_file),
        "--redis".to_string(),
        redis.url(),
        "--callback-secret-file".to_string(),
        path(&secret),
        // The test's callback target is on loopback.
        "--allow-private-callbacks".to_string(),
        "--assertion-key".to_string(),
        path(&assertion_key),
    ])
    .unwrap();
    let mut settings = flags
        .router
        .validate()
        .unwrap_or_else(|problems| panic!("router flags refused: {problems:?}"));
    // The flags keep the production 2/4/8/16 s schedule; a short one dead-letters within the test.
    settings.tasks.as_mut().unwrap().callbacks.schedule = vec![Duration::from_millis(100), Duration::from_millis(200)];
    let router = agent_reach_router::build(&settings).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        agent_reach_router::serve(listener, router, std::future::pending())
            .await
            .unwrap();
    });
    (url, server)
}

async fn submit_task(client: &reqwest::Client, router: &str, token: &str, task: &Value) {
    let response = client
        .post(format!("{router}/v1/tasks"))
        .bearer_auth(token)
        .json(task)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    assert_eq!(status, 202, "{task} → {}", response.text().await.unwrap());
}

/// Tasks until stopped, at every priority: the worked example's question
/// (succeeds) and a payload its schema refuses (a task's payload is checked
/// when it is delivered, so the task fails).
async fn task_traffic(stack: Arc<Stack>, router: String, stop: Arc<AtomicBool>) {
    let client = reqwest::Client::new();
    let user = stack.token("demo_user", Duration::from_secs(600)).unwrap();
    let mut pace = tokio::time::interval(Duration::from_millis(200));
    for priority in ["high", "normal", "low"].into_iter().cycle() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        pace.tick().await;
        let created: Value = client
            .post(format!("{}/v1/contexts", stack.context))
            .bearer_auth(&user)
            .json(&json!({}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let tasks = [
            json!({"capability": "intent.parse", "context_id": created["context_id"], "priority": priority,
                "timeout_ms": 10_000, "payload": {"user_id": "u_42", "text": "Can my order SO-2024001 ship today?"}}),
            json!({"capability": "intent.parse", "priority": priority, "payload": {"text": 42}}),
        ];
        for task in &tasks {
            submit_task(&client, &router, &user, task).await;
        }
    }
}

/// A task whose callback target refuses connections: each attempt counts as a
/// callback failure and, after the last, the result is dead-lettered.
async fn submit_doomed_callback(stack: &Stack, router: &str) {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let user = stack.token("demo_user", Duration::from_secs(600)).unwrap();
    let task = json!({"capability": "intent.parse", "payload": {"text": 42},
        "callback": {"url": format!("http://{closed}/hook")}});
    submit_task(&reqwest::Client::new(), router, &user, &task).await;
}

async fn get_text(url: &str) -> String {
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

async fn query(prometheus: &str, expr: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{prometheus}/api/v1/query"))
        .query(&[("query", expr)])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Samples of a successful instant query (panics on a query error).
fn samples<'a>(answer: &'a Value, what: &str) -> &'a Vec<Value> {
    assert_eq!(answer["status"], "success", "{what}: {answer}");
    answer["data"]["result"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: not a vector: {answer}"))
}

async fn wait_for(what: &str, timeout: Duration, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_doc_and_prometheus_answers_every_dashboard_and_alert_query() {
    let workdir = tempfile::tempdir().unwrap();
    let acl = workdir.path().join("acl.yaml");
    std::fs::write(&acl, EXAMPLE_ACL).unwrap();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let stack = Stack::start(StackOptions {
        registry_listen: any,
        router_listen: any,
        context_listen: any,
        etcd: Vec::new(),
        redis: None,
        acl: Some(acl.clone()),
        agents: scenario_instances(),
    })
    .await
    .unwrap();
    stack
        .wait_until_routable(&CAPABILITIES, Duration::from_secs(20))
        .await
        .unwrap();
    let redis = Redis::start();
    let (tasks_router, tasks_server) = start_tasks_router(&stack, &redis, workdir.path()).await;
    let stack = Arc::new(stack);
    let host = |url: &str| url.trim_start_matches("http://").to_string();
    // Both routers are replicas of one job, as in production.
    let mut prometheus = Prometheus::start(
        &[
            ("agent-reach-registry", vec![host(&stack.registry)]),
            ("agent-reach-router", vec![host(&stack.router), host(&tasks_router)]),
            ("agent-reach-context", vec![host(&stack.context)]),
        ],
        Duration::from_secs(1),
    );
    let prom = prometheus.url();

    register_ghost(&stack).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(traffic(stack.clone(), stop.clone()));
    submit_doomed_callback(&stack, &tasks_router).await;
    let task_load = tokio::spawn(task_traffic(stack.clone(), tasks_router.clone(), stop.clone()));
    // A harmless edit, written atomically (a reader never sees half a file): every service reloads its policy.
    let edited = workdir.path().join("acl.yaml.new");
    std::fs::write(&edited, format!("{EXAMPLE_ACL}\n# reviewed\n")).unwrap();
    std::fs::rename(&edited, &acl).unwrap();

    // Everything the doc lists has appeared (retries and reloads come a moment later).
    // Each service: the doc sections it must serve in full, and those it may serve
    // part of. The tasks router sees only task traffic and never retries, so it
    // need not serve every family of the router's table; what it serves must match.
    let doc = documented();
    let services = [
        ("registry", stack.registry.clone(), vec!["every", "registry"], vec![]),
        ("router", stack.router.clone(), vec!["every", "router"], vec![]),
        ("context", stack.context.clone(), vec!["every", "context"], vec![]),
        (
            "router with tasks",
            tasks_router.clone(),
            vec!["every", "tasks"],
            // The runs' series appear with a run (checked in runs/tests).
            vec!["router", "runs"],
        ),
    ];
    for (service, url, required, partial) in &services {
        let section = |name: &&str| doc[*name].clone();
        let expected: BTreeMap<String, Family> = required.iter().flat_map(section).collect();
        let mut allowed = expected.clone();
        allowed.extend(partial.iter().flat_map(section));
        let metrics_url = format!("{url}/metrics");
        wait_for(
            &format!("every documented {service} metric"),
            Duration::from_secs(30),
            async || {
                let families = scraped(&get_text(&metrics_url).await);
                expected.keys().all(|name| families.contains_key(name))
            },
        )
        .await;
        let families = scraped(&get_text(&metrics_url).await);
        for (name, family) in &families {
            assert!(
                name.starts_with("agent_reach_"),
                "{service}: `{name}` lacks the agent_reach_ prefix"
            );
            let documented = allowed
                .get(name)
                .unwrap_or_else(|| panic!("{service} serves `{name}`, which docs/metrics.md does not list for it"));
            assert_eq!(documented, family, "{service}: `{name}` differs from docs/metrics.md");
        }
        for name in expected.keys() {
            assert!(
                families.contains_key(name),
                "docs/metrics.md lists `{name}`, {service} does not serve it"
            );
        }
    }

    // Prometheus has scraped all four after the traffic started.
    wait_for("four healthy scrape targets", Duration::from_secs(30), async || {
        let answer = query(&prom, "up == 1").await;
        samples(&answer, "up").len() == 4
    })
    .await;
    wait_for(
        "routed traffic, retries, ACL reloads and tasks in Prometheus",
        Duration::from_secs(60),
        async || {
            let checks = [
                // rate() and increase() need a few samples of every target.
                "min(count_over_time(up[1m])) >= 5",
                "sum(rate(agent_reach_router_requests_total{outcome=\"succeeded\"}[1m])) > 0",
                "sum(rate(agent_reach_router_requests_total{outcome=\"FORBIDDEN\"}[1m])) > 0",
                "agent_reach_router_retries_total{reason=\"connect\"} > 0",
                "count(agent_reach_acl_reloads_total{outcome=\"ok\"}) == 4",
                "sum(rate(agent_reach_context_operations_total[1m])) > 0",
                "sum(rate(agent_reach_tasks_finished_total{outcome=\"succeeded\"}[1m])) > 0",
                "sum(rate(agent_reach_tasks_finished_total{outcome=\"failed\"}[1m])) > 0",
                "sum(rate(agent_reach_tasks_state_seconds_count[1m])) > 0",
                "count(agent_reach_tasks_backlog) > 0",
                "agent_reach_tasks_callback_failures_total > 0",
                "agent_reach_tasks_dead_letters > 0",
                // The usage `reply.write` reports in its answers (DESIGN §3.5), by model and type.
                "sum(rate(agent_reach_model_tokens_total{capability=\"reply.write\",model=\"reply-template-1\",type=\"input\"}[1m])) > 0",
                "sum(rate(agent_reach_model_tokens_total{capability=\"reply.write\",model=\"reply-template-1\",type=\"output\"}[1m])) > 0",
            ];
            for check in checks {
                if samples(&query(&prom, check).await, check).is_empty() {
                    return false;
                }
            }
            true
        },
    )
    .await;

    // Every expression answers, and every metric it names exists.
    let histograms: BTreeSet<String> = doc
        .values()
        .flat_map(|section| section.iter())
        .filter(|(_, family)| family.kind == "histogram")
        .map(|(name, _)| name.clone())
        .collect();
    let known: BTreeSet<String> = doc.values().flat_map(|section| section.keys().cloned()).collect();
    let names: Value = reqwest::get(format!("{prom}/api/v1/label/__name__/values"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let stored: BTreeSet<String> = names["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| name.as_str().unwrap().to_string())
        .collect();
    let mut checked = Vec::new();
    assert!(
        dashboard_expressions()
            .iter()
            .any(|(_, expr)| expr.contains("agent_reach_model_tokens_total")),
        "a dashboard panel shows the model tokens agents report"
    );
    for (place, expr) in dashboard_expressions() {
        checked.push((place, expr.clone(), expr));
    }
    for (name, expr, body) in alert_expressions() {
        samples(&query(&prom, &expr).await, &format!("alert {name}"));
        checked.push((format!("alert {name}"), expr, body));
    }
    for (place, expr, evaluated) in &checked {
        for metric in referenced_metrics(expr, &histograms) {
            assert!(known.contains(&metric), "{place}: `{metric}` is not in docs/metrics.md");
            let stored_name = if histograms.contains(&metric) {
                format!("{metric}_count")
            } else {
                metric.clone()
            };
            assert!(
                stored.contains(&stored_name),
                "{place}: Prometheus has no `{stored_name}`"
            );
        }
        let answer = query(&prom, evaluated).await;
        let result = samples(&answer, place);
        assert!(!result.is_empty(), "{place}: `{evaluated}` returned no data");
        let finite = result.iter().any(|sample| {
            sample["value"][1]
                .as_str()
                .and_then(|value| value.parse::<f64>().ok())
                .is_some_and(f64::is_finite)
        });
        assert!(finite, "{place}: `{evaluated}` returned only NaN/Inf: {result:?}");
    }
    assert!(
        checked.len() > 40,
        "expected every panel and alert, got {}",
        checked.len()
    );

    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    task_load.await.unwrap();
    tasks_server.abort();
    prometheus.kill();
    if let Ok(stack) = Arc::try_unwrap(stack) {
        stack.shutdown().await;
    }
}
