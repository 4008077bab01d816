//! The console's pictures of the trail in headless Chromium (issue 37,
//! point 3): two routers on one Redis; a three-hop session (and a call
//! refused within it) goes through router A, and router B's console draws
//! it, looked up by one of its request ids, as a graph of hops; B's
//! capabilities page charts the capability's last hour from the trail.
//! Screenshots go to `target/console-screenshots` (printed).

use crate::browser;
use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use browser::Browser;
use serde_json::{json, Value};
use support::*;

/// `tester` calls anything; the agents `intent` and `order` call onwards.
const ACL: &str = "version: 1\noperators: [ops]\npermissions:\n  - caller: tester\n    allow: [\"*\"]\n  \
                   - caller: intent\n    allow: [\"*\"]\n  - caller: order\n    allow: [\"*\"]\n\
                   providers:\n  - agent: \"*\"\n    provides: [\"*\"]\n";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn with_trail(redis: String) -> agent_reach_router::TasksSettings {
    agent_reach_router::TasksSettings {
        trail: Some(agent_reach_router::TrailConfig {
            settings: agent_reach_router::TrailSettings {
                flush_every: Duration::from_millis(20),
                ..Default::default()
            },
            credentials: Default::default(),
            otlp: None,
        }),
        ..tasks_settings(redis)
    }
}

/// One hop of the session: `caller` calls order.query at `version` through `router`.
async fn hop(router: SocketAddr, caller: &str, request_id: &str, version: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("http://{router}/v1/invoke"))
        .bearer_auth(token(caller))
        .header("traceparent", TRACEPARENT)
        .json(
            &json!({"capability": CAPABILITY, "capability_version": version, "request_id": request_id,
                      "session_id": "s-graph", "payload": {"order_id": request_id}}),
        )
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn wait_for_hits(agent: &Agent, what: &str) {
    assert!(
        eventually(Duration::from_secs(10), || async { agent.hits() >= 1 }).await,
        "{what} never got its call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_routers_console_draws_the_sessions_hops_and_the_capabilitys_hour() {
    let redis = agent_reach_testkit::Redis::start();
    let url = redis.url();
    let second = url.clone();
    let cluster = Cluster::start_with_acl(ACL, |settings| settings.tasks = Some(with_trail(url))).await;
    let (router_b, b) = cluster
        .another_router(|settings| settings.tasks = Some(with_trail(second)))
        .await;
    let spec = |id: &str, version: &str, behaviour| AgentSpec {
        version: version.to_string(),
        ..AgentSpec::new(id, 1, behaviour)
    };
    let intent = cluster.agent(spec("intent-1", "1.0.0", Behaviour::Slow(Duration::from_secs(4))));
    let order_agent = cluster.agent(spec("order-1", "2.0.0", Behaviour::Slow(Duration::from_secs(2))));
    let _pay = cluster.agent(spec("pay-1", "3.0.0", Behaviour::Echo));
    cluster.wait_for_instances(&["intent-1", "order-1", "pay-1"]).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            router_b.routed_agent_ids() == ["intent-1", "order-1", "pay-1"]
        })
        .await
    );

    // Through router A: tester → intent-1 (still working when) intent → order-1
    // (still working when) order → pay-1; and intent's call of a version
    // that does not exist, refused.
    let a = cluster.router_addr;
    let first = tokio::spawn(hop(a, CALLER, "hop-1", "1.0.0"));
    wait_for_hits(&intent, "intent-1").await;
    let second = tokio::spawn(hop(a, "intent", "hop-2", "2.0.0"));
    wait_for_hits(&order_agent, "order-1").await;
    assert_eq!(hop(a, "order", "hop-3", "3.0.0").await, 200);
    assert_eq!(hop(a, "intent", "hop-4", "9.9.9").await, 404);
    assert_eq!(second.await.unwrap(), 200);
    assert_eq!(first.await.unwrap(), 200);
    let recorded = eventually(Duration::from_secs(10), || async {
        let answer: Value = cluster
            .client
            .get(format!("http://{b}/v1/trail?session_id=s-graph"))
            .bearer_auth(token("ops"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        answer["records"].as_array().is_some_and(|records| records.len() == 4)
    })
    .await;
    assert!(recorded, "the session's four records never reached the trail");

    let browser = Browser::start().await;
    let link: Value = cluster
        .client
        .post(format!("http://{b}/v1/console/links"))
        .bearer_auth(token("ops"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    browser
        .open(&format!("http://{b}{}", link["path"].as_str().expect("a link")))
        .await;
    browser
        .until(
            Duration::from_secs(15),
            "signed in to router B",
            "return document.getElementById('operator').innerText === 'operator: ops';",
        )
        .await;

    // The request page, on B, of a call only A served: the session's graph of hops.
    browser.press("4").await;
    browser
        .until(
            Duration::from_secs(5),
            "the requests page",
            "return !document.getElementById('page-requests').hidden;",
        )
        .await;
    browser.type_into("#request-id", "hop-2").await;
    browser.click("#lookup button[type=\"submit\"]").await;
    browser
        .until(
            Duration::from_secs(10),
            "the session drawn as a graph of four hops",
            "const hops = document.querySelectorAll('#hops g.hop');
             const message = document.getElementById('request-message').innerText;
             return hops.length === 4 && document.querySelectorAll('#hops path.edge').length === 3
               && message.includes('in the trail (all routers)') && message.includes('do not hold it');",
        )
        .await;
    let graph = browser
        .run(
            "const hops = Array.from(document.querySelectorAll('#hops g.hop'));
             return {
               focus: Array.from(document.querySelectorAll('#hops g.hop.focus')).map(g => g.dataset.request),
               failed: Array.from(document.querySelectorAll('#hops g.hop.failed')).map(g => g.dataset.request),
               edges: Array.from(document.querySelectorAll('#hops path.edge')).map(e => e.dataset.from + '>' + e.dataset.to).sort(),
               rects: document.querySelectorAll('#hops g.hop rect').length,
               text: hops.map(g => g.textContent).join(' | '),
             };",
        )
        .await;
    assert_eq!(graph["focus"], json!(["hop-2"]), "{graph}");
    assert_eq!(graph["failed"], json!(["hop-4"]), "{graph}");
    assert_eq!(
        graph["edges"],
        json!(["hop-1>hop-2", "hop-1>hop-4", "hop-2>hop-3"]),
        "{graph}"
    );
    assert_eq!(graph["rects"], 4, "{graph}");
    let text = graph["text"].as_str().unwrap();
    assert!(text.contains("order.query@2.0.0") && text.contains("order-1"), "{text}");
    assert!(text.contains("VERSION_NOT_FOUND"), "{text}");
    assert!(browser.text("#hops-legend").await.contains("session s-graph: 4 hop(s)"));
    let summary = browser.text("#request-summary").await;
    assert!(
        summary.contains("order.query @ 2.0.0") && summary.contains("s-graph"),
        "{summary}"
    );
    browser.screenshot("request-hops").await;

    // The capabilities page: the installation's figures and the hour's chart, from the trail.
    browser.press("2").await;
    browser
        .until(
            Duration::from_secs(15),
            "the capability's chart from the trail",
            "const row = document.querySelector('#capabilities tbody tr[data-capability=\"order.query\"]');
             const chart = row && row.querySelector('svg.spark');
             return !!chart && row.dataset.source === 'trail' && row.cells[3].innerText === '4'
               && chart.querySelectorAll('g.calls rect').length === 12
               && !!chart.querySelector('polyline.p99') && !!chart.querySelector('polyline.failures')
               && document.getElementById('capabilities-source').innerText.includes('from the trail, all routers, last hour');",
        )
        .await;
    let failure_rate = browser
        .run("return document.querySelector('#capabilities tbody tr[data-capability=\"order.query\"]').cells[4].innerText;")
        .await;
    assert_eq!(failure_rate, json!("25.0 %"));
    browser.screenshot("capability-chart").await;
}
