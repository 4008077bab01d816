//! The console end to end in headless Chromium (issue 26), driven over
//! WebDriver (Debian's `chromium` and `chromium-driver`, installed by
//! `scripts/setup.sh`) against a real stack: etcd, Redis, the registry, the
//! router and HTTP agents. An operator signs in, sees three instances with
//! their health and last heartbeat age, watches a killed one turn red and leave, drains one,
//! replays a dead letter (and is told when it replays it twice), looks up a failed request
//! and an unknown one; an expired link and a non-operator are refused on
//! the page. Screenshots of each page go to `target/console-screenshots`
//! (printed). Every wait polls a condition with a bound.

use crate::browser;
use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach_testkit::ProcessGroup;
use browser::Browser;
use serde_json::{json, Value};
use support::*;

/// A callback receiver that fails its first `failures` calls.
async fn flaky_receiver(failures: usize) -> (String, Arc<Mutex<usize>>) {
    let calls: Arc<Mutex<usize>> = Arc::default();
    let seen = calls.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let seen = seen.clone();
            async move {
                let mut seen = seen.lock().unwrap();
                *seen += 1;
                if *seen <= failures {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                } else {
                    axum::http::StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, calls)
}

async fn sign_in_link(cluster: &Cluster, ttl_s: u64) -> String {
    let made: Value = cluster
        .client
        .post(cluster.url("/v1/console/links"))
        .bearer_auth(token("ops"))
        .json(&json!({ "ttl_s": ttl_s }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    cluster.url(made["path"].as_str().expect("a link"))
}

fn rows_script(table: &str, attribute: &str) -> String {
    format!(
        "return Array.from(document.querySelectorAll('#{table} tbody tr')).map(r => [r.dataset.{attribute}, r.dataset.health || '']);"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_watches_agents_replays_a_dead_letter_and_looks_up_a_failed_call() {
    let redis = agent_reach_testkit::Redis::start();
    let cluster = cluster_with_tasks(&redis).await;
    let _one = cluster.agent(AgentSpec::new("echo-1", 10, Behaviour::Echo));
    let _two = cluster.agent(AgentSpec::new("echo-2", 10, Behaviour::Echo));
    let mut third = AgentSpec::new("echo-3", 10, Behaviour::Echo);
    third.ttl_s = 4; // leaves soon after it is killed
    let mut three = cluster.agent(third);
    cluster.wait_for_instances(&["echo-1", "echo-2", "echo-3"]).await;
    let browser = Browser::start().await;

    // Sign in with the link `agent-reach console` prints; the code leaves the address bar.
    browser.open(&sign_in_link(&cluster, 120).await).await;
    browser
        .until(
            Duration::from_secs(15),
            "three healthy instances",
            "const rows = Array.from(document.querySelectorAll('#agents tbody tr'));
             return rows.length === 3 && rows.every(r => r.dataset.health === 'good')
               && document.getElementById('operator').innerText === 'operator: ops'
               && !location.hash.includes('code');",
        )
        .await;
    let health = browser
        .run("return Array.from(document.querySelectorAll('#agents tbody tr .pill')).map(p => p.innerText);")
        .await;
    assert_eq!(health, json!(["100", "100", "100"]));
    // Each instance's last heartbeat, from its lease in etcd (relayed to the registry).
    browser
        .until(
            Duration::from_secs(10),
            "a heartbeat age for each of the three instances",
            "const rows = Array.from(document.querySelectorAll('#agents tbody tr'));
             return rows.length === 3 && rows.every(r => {
               const age = r.querySelector('td.age');
               const m = age && /^(\\d+) s ago$/.exec(age.innerText.trim());
               return !!m && Number(m[1]) <= 10;
             });",
        )
        .await;

    // Live updates replace rows in place: nothing shifts while the page refreshes.
    browser
        .run(
            "window.shifted = 0; window.refreshes = 0;
             new PerformanceObserver(list => { for (const e of list.getEntries()) if (!e.hadRecentInput) window.shifted += e.value; })
               .observe({ type: 'layout-shift' });
             new MutationObserver(() => { window.refreshes += 1; })
               .observe(document.getElementById('agents-updated'), { childList: true, characterData: true, subtree: true });
             return true;",
        )
        .await;
    browser
        .until(
            Duration::from_secs(10),
            "three refreshes",
            "return window.refreshes >= 3;",
        )
        .await;
    assert_eq!(
        browser.run("return window.shifted;").await,
        json!(0),
        "layout shifted while updating"
    );
    browser.screenshot("agents").await;

    // Keyboard: 2 opens the capabilities page, 1 the agents page again.
    browser.press("2").await;
    browser
        .until(
            Duration::from_secs(10),
            "the capabilities page",
            "const row = document.querySelector('#capabilities tbody tr[data-capability=\"order.query\"]');
             return location.hash === '#/capabilities' && !!row && row.cells[1].innerText.includes('1.0.0 (3/3)');",
        )
        .await;
    browser.press("1").await;
    browser
        .until(
            Duration::from_secs(5),
            "the agents page",
            "return location.hash === '#/agents' && !document.getElementById('page-agents').hidden;",
        )
        .await;

    // One agent is killed: calls that reach it fail over, its health falls (red), then its lease ends and it leaves.
    three.kill();
    let red = eventually(Duration::from_secs(20), || async {
        for n in 0..6 {
            let _ = cluster.invoke(order(&format!("SO-{n}"))).await;
        }
        let rows = browser.run(&rows_script("agents", "agent")).await;
        rows.as_array()
            .unwrap()
            .iter()
            .any(|row| row[0] == "echo-3" && row[1] == "bad")
    })
    .await;
    assert!(
        red,
        "echo-3 never turned red: {}",
        browser.run(&rows_script("agents", "agent")).await
    );
    browser.screenshot("agents-one-red").await;
    browser
        .until(
            Duration::from_secs(30),
            "the killed instance to leave",
            "const ids = Array.from(document.querySelectorAll('#agents tbody tr')).map(r => r.dataset.agent).sort();
             return ids.join(',') === 'echo-1,echo-2';",
        )
        .await;
    browser.screenshot("agents-after-kill").await;

    browser.press("2").await;
    browser
        .until(
            Duration::from_secs(10),
            "calls counted on the capabilities page",
            "const row = document.querySelector('#capabilities tbody tr[data-capability=\"order.query\"]');
             return !!row && Number(row.cells[3].innerText) > 0 && row.cells[5].innerText !== '–'
               && document.getElementById('capabilities-source').innerText.includes(\"from this router's recent calls only\");",
        )
        .await;
    browser.screenshot("capabilities").await;

    // A callback fails five times and is dead-lettered; the operator inspects and replays it.
    let (hook, calls) = flaky_receiver(5).await;
    let (status, submitted) = post(
        &cluster,
        "/v1/tasks",
        json!({ "capability": CAPABILITY, "payload": { "order_id": "SO-9" }, "callback": { "url": hook } }),
    )
    .await;
    assert_eq!(status, 202, "{submitted}");
    browser.press("3").await;
    browser
        .until(
            Duration::from_secs(20),
            "a dead letter on the slow-path page",
            "return document.querySelectorAll('#letters tbody tr').length === 1 && document.getElementById('dead-count').innerText === '1';",
        )
        .await;
    let letter = browser
        .run("return document.querySelector('#letters tbody tr').dataset.letter;")
        .await;
    let letter = letter.as_str().unwrap().to_string();
    browser.click("#letters tbody tr button[data-name=\"inspect\"]").await;
    browser
        .until(
            Duration::from_secs(10),
            "the letter inspected",
            "return !document.getElementById('letter').hidden && document.getElementById('letter-body').innerText.includes('succeeded');",
        )
        .await;
    browser.screenshot("slow-path").await;
    browser.click("#letter-replay").await;
    browser
        .until(
            Duration::from_secs(5),
            "the confirmation",
            "return document.getElementById('confirm').open;",
        )
        .await;
    browser.screenshot("replay-confirm").await;
    browser.click("#confirm-ok").await;
    browser
        .until(
            Duration::from_secs(10),
            "the replay confirmed",
            "return document.getElementById('notice').innerText.includes('replayed: the callback of task');",
        )
        .await;
    assert!(
        eventually(Duration::from_secs(10), || async { *calls.lock().unwrap() == 6 }).await,
        "the replayed callback never arrived"
    );
    // The same letter again (the inspect panel still offers it): a clear message, a stable code.
    browser.click("#letter-replay").await;
    browser
        .until(
            Duration::from_secs(5),
            "the confirmation",
            "return document.getElementById('confirm').open;",
        )
        .await;
    browser.click("#confirm-ok").await;
    browser
        .until(
            Duration::from_secs(10),
            "the second replay refused",
            "const text = document.getElementById('notice').innerText;
             return text.includes('already replayed') && text.includes('DEAD_LETTER_NOT_FOUND');",
        )
        .await;
    browser.screenshot("replay-twice").await;
    let replayed_again = cluster
        .client
        .post(cluster.url(&format!("/v1/dead-letters/{letter}/replay")))
        .bearer_auth(token("ops"))
        .send()
        .await
        .unwrap();
    assert_eq!(replayed_again.status(), 404);
    let body: Value = replayed_again.json().await.unwrap();
    assert_eq!(body["error"]["code"], "DEAD_LETTER_NOT_FOUND");

    // A failed call, looked up by its id: route, attempt, instance, outcome, trace id.
    let mut failing = AgentSpec::new("fail-1", 10, Behaviour::BusinessError);
    failing.version = "2.0.0".to_string();
    let _failing = cluster.agent(failing);
    cluster.wait_for_instances(&["echo-1", "echo-2", "fail-1"]).await;
    let (status, failed) = cluster
        .invoke(
            json!({ "capability": CAPABILITY, "capability_version": "2.0.0", "request_id": "console-failed-1",
                        "payload": { "order_id": "SO-404" } }),
        )
        .await;
    assert_eq!(status, 422, "{failed}");
    browser.press("4").await;
    browser
        .until(
            Duration::from_secs(5),
            "the requests page",
            "return !document.getElementById('page-requests').hidden;",
        )
        .await;
    browser.type_into("#request-id", "console-failed-1").await;
    browser.click("#lookup button[type=\"submit\"]").await;
    browser
        .until(
            Duration::from_secs(10),
            "the failed call",
            "const outcome = document.querySelector('#request-summary dd[data-field=\"outcome\"]');
             const attempt = document.querySelector('#attempts tbody tr');
             const trace = document.querySelector('#request-summary dd[data-field=\"trace id\"]');
             return !!outcome && outcome.innerText.includes('AGENT_ERROR') && !!attempt
               && attempt.innerText.includes('fail-1') && /^[0-9a-f]{32}$/.test(trace.innerText);",
        )
        .await;
    assert!(browser.text("#request-summary").await.contains("order.query @ 2.0.0"));
    // This router keeps no trail: the page says it searched only its own recent calls.
    assert!(browser
        .text("#request-message")
        .await
        .contains("The trail is off on this router"));
    browser.screenshot("request").await;

    browser.type_into("#request-id", "no-such-request").await;
    browser.click("#lookup button[type=\"submit\"]").await;
    browser
        .until(
            Duration::from_secs(10),
            "the unknown id refused",
            "const text = document.getElementById('request-message').innerText;
             return text.includes('Unknown request id') && text.includes('NOT_FOUND');",
        )
        .await;
    browser.screenshot("request-unknown").await;

    // Drain an instance from the agents page, with confirmation.
    browser.press("1").await;
    browser
        .until(
            Duration::from_secs(10),
            "the agents page",
            "return !!document.querySelector('#agents tbody tr[data-agent=\"echo-2\"] button[data-name=\"drain\"]');",
        )
        .await;
    browser
        .click("#agents tbody tr[data-agent=\"echo-2\"] button[data-name=\"drain\"]")
        .await;
    browser
        .until(
            Duration::from_secs(5),
            "the confirmation",
            "return document.getElementById('confirm').open;",
        )
        .await;
    browser.click("#confirm-ok").await;
    browser
        .until(
            Duration::from_secs(10),
            "echo-2 draining",
            "const row = document.querySelector('#agents tbody tr[data-agent=\"echo-2\"]');
             return !!row && row.cells[3].innerText.startsWith('draining') && document.getElementById('notice').innerText.includes('is draining');",
        )
        .await;
    browser.screenshot("agents-drained").await;

    // Readable on a phone: nothing wider than the screen but the tables' own scroll areas.
    browser.resize(400, 860).await;
    browser
        .until(
            Duration::from_secs(10),
            "the agents page at phone width",
            "return document.querySelectorAll('#agents tbody tr').length === 3
               && document.documentElement.scrollWidth <= window.innerWidth + 1;",
        )
        .await;
    browser.screenshot("agents-phone").await;
    browser.resize(1280, 800).await;

    // An expired sign-in link says so on the page.
    let expired = sign_in_link(&cluster, 1).await;
    let code = expired.split_once("#code=").unwrap().1.to_string();
    assert!(
        eventually(Duration::from_secs(10), || async {
            let answer: Value = cluster
                .client
                .post(cluster.url("/v1/console/session"))
                .header("x-agent-reach-console", "1")
                .json(&json!({ "code": code }))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            answer["error"]["details"]["reason"] == "link_expired"
        })
        .await
    );
    browser.open(&expired).await;
    browser
        .until(
            Duration::from_secs(10),
            "the expired link refused",
            "const text = document.getElementById('signin-message').innerText;
             return !document.getElementById('signin').hidden && text.includes('expired') && text.includes('UNAUTHENTICATED');",
        )
        .await;
    browser.screenshot("signin-expired").await;

    // Once `ops` is no operator any more, the page refuses it.
    browser.open(&sign_in_link(&cluster, 120).await).await;
    browser
        .until(
            Duration::from_secs(10),
            "signed in again",
            "return !document.getElementById('nav').hidden;",
        )
        .await;
    let acl = std::fs::read_to_string(&cluster.acl_path).unwrap();
    std::fs::write(
        &cluster.acl_path,
        acl.replace("operators: [ops]", "operators: [someone-else]"),
    )
    .unwrap();
    browser
        .until(
            Duration::from_secs(20),
            "the non-operator refused",
            "const text = document.getElementById('signin-message').innerText;
             return !document.getElementById('signin').hidden && text.includes('Refused') && text.includes('not an operator');",
        )
        .await;
    browser.screenshot("non-operator").await;

    // Every process the browser started ends with it (chromedriver, Chromium and its helpers).
    let profile = browser.profile();
    assert!(
        !ProcessGroup::processes_marked(&profile).is_empty(),
        "Chromium runs with the profile {profile}"
    );
    drop(browser);
    let left = ProcessGroup::processes_marked(&profile);
    assert!(left.is_empty(), "processes of the browser left running: {left:?}");
}

/// The runs page (issue 36): an operator opens a workflow's run and watches
/// its DAG live — each step a box in its column after the steps it depends
/// on, coloured by its state as the run moves, then the output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_watches_a_runs_dag_live() {
    let redis = agent_reach_testkit::Redis::start();
    let cluster = cluster_with_tasks(&redis).await;
    let _one = cluster.agent(AgentSpec::new(
        "slow-1",
        10,
        Behaviour::Slow(Duration::from_millis(900)),
    ));
    let _two = cluster.agent(AgentSpec::new(
        "slow-2",
        10,
        Behaviour::Slow(Duration::from_millis(900)),
    ));
    cluster.wait_for_instances(&["slow-1", "slow-2"]).await;
    let definition = json!({
        "version": "1.0.0", "description": "A diamond of order lookups.", "input_schema": {},
        "steps": [
            {"id": "lookup", "capability": CAPABILITY, "input": {"order_id": "SO-1"}},
            {"id": "left", "capability": CAPABILITY, "input": {"order_id": "SO-2"}, "depends_on": ["lookup"]},
            {"id": "right", "capability": CAPABILITY, "input": {"order_id": "SO-3"}, "depends_on": ["lookup"]},
            {"id": "join", "capability": CAPABILITY, "input": {"order_id": "SO-4"}, "depends_on": ["left", "right"]}
        ],
        "output": {"joined": "${steps.join.output.agent_id}"}
    });
    let registered = cluster
        .client
        .put(format!("{}/v1/workflows/browser.diamond", cluster.registry.url()))
        .bearer_auth(token("ops"))
        .json(&definition)
        .send()
        .await
        .unwrap();
    assert_eq!(registered.status(), 200, "{}", registered.text().await.unwrap());
    let browser = Browser::start().await;
    browser.open(&sign_in_link(&cluster, 120).await).await;
    browser
        .until(
            Duration::from_secs(15),
            "signed in",
            "return document.getElementById('operator').innerText === 'operator: ops';",
        )
        .await;
    browser.press("5").await;
    browser
        .until(
            Duration::from_secs(10),
            "the runs page",
            "return location.hash === '#/runs';",
        )
        .await;
    // The run starts once the page is open, to be watched from its first step.
    let started = eventually(Duration::from_secs(10), || async {
        post(&cluster, "/v1/workflows/browser.diamond/runs", json!({"payload": {}}))
            .await
            .0
            == 202
    })
    .await;
    assert!(started, "the router never learned of the workflow");
    browser
        .until(
            Duration::from_secs(10),
            "the run listed",
            "const row = document.querySelector('#runs tbody tr');
             return location.hash === '#/runs' && !!row && row.cells[1].innerText === 'browser.diamond';",
        )
        .await;
    browser.click("#runs tbody tr td a").await;
    // The DAG: four boxes in three columns, four edges; a step seen running, live.
    browser
        .until(
            Duration::from_secs(10),
            "the DAG drawn",
            "return document.querySelectorAll('#dag g.node').length === 4 && document.querySelectorAll('#dag path.edge').length === 4;",
        )
        .await;
    browser
        .until(
            Duration::from_secs(10),
            "a step running",
            "return !!document.querySelector('#dag g.node[data-status=\"running\"]');",
        )
        .await;
    browser.screenshot("run-running").await;
    let columns = browser
        .run(
            "const x = id => document.querySelector('#dag g.node[data-step=\"' + id + '\"]').transform.baseVal[0].matrix.e;
             return [x('lookup'), x('left'), x('right'), x('join')];",
        )
        .await;
    let columns: Vec<f64> = serde_json::from_value(columns).unwrap();
    assert!(
        columns[0] < columns[1] && columns[1] == columns[2] && columns[2] < columns[3],
        "{columns:?}"
    );
    browser
        .until(
            Duration::from_secs(20),
            "every step succeeded, live",
            "const nodes = Array.from(document.querySelectorAll('#dag g.node'));
             return nodes.length === 4 && nodes.every(n => n.dataset.status === 'succeeded')
               && document.getElementById('run').dataset.status === 'succeeded'
               && document.getElementById('run-output').innerText.includes('joined');",
        )
        .await;
    assert!(browser.text("#run-steps").await.contains("slow-"));
    browser.screenshot("run-succeeded").await;
}

/// Issue 39, point 3: an operator whom `owners:` names an approver sees a
/// pending access request on the capabilities page, approves it there (the
/// caller's call then goes through), sees the grant beside the file's
/// rules, and revokes it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_approves_and_revokes_access_on_the_page() {
    const ACL: &str = "version: 1\noperators: [ops]\npermissions:\n  - caller: tester\n    allow: [\"*\"]\n\
                       providers:\n  - agent: \"*\"\n    provides: [\"*\"]\nowners:\n  - capability: order.*\n    approvers: [ops]\n";
    let cluster = Cluster::start_with_acl(ACL, |_| {}).await;
    let _agent = cluster.agent(AgentSpec::new("echo-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["echo-1"]).await;
    let filed: Value = cluster
        .client
        .post(format!("{}/v1/access-requests", cluster.registry.url()))
        .bearer_auth(token("intent_parser"))
        .json(&json!({ "capability": CAPABILITY, "reason": "intents need order status" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = filed["id"].as_str().expect("a request id").to_string();
    let calls = |expected: u16| {
        let cluster = &cluster;
        async move {
            eventually(Duration::from_secs(5), || async {
                cluster.invoke_as(Some(&token("intent_parser")), order("SO-1")).await.0 == expected
            })
            .await
        }
    };
    assert!(calls(403).await);

    let browser = Browser::start().await;
    browser.open(&sign_in_link(&cluster, 120).await).await;
    browser
        .until(
            Duration::from_secs(15),
            "signed in",
            "return document.getElementById('operator').innerText === 'operator: ops';",
        )
        .await;
    browser.press("2").await;
    let pending = format!("#access-requests tbody tr[data-key=\"{id}\"]");
    browser
        .until(
            Duration::from_secs(10),
            "the pending request",
            &format!("const row = document.querySelector('{pending}'); return !!row && row.innerText.includes('intent_parser');"),
        )
        .await;
    browser.screenshot("access-pending").await;
    browser.click(&format!("{pending} button[data-name=\"approve\"]")).await;
    browser.type_into("#field-note", "approved on the page").await;
    browser.click("#confirm-ok").await;
    let granted = "#access-rules tbody tr[data-key=\"intent_parser\"]";
    browser
        .until(
            Duration::from_secs(10),
            "the grant beside the file's rules",
            &format!(
                "const row = document.querySelector('{granted}');
                 const tester = document.querySelector('#access-rules tbody tr[data-key=\"tester\"]');
                 return !!row && row.cells[2].innerText.includes('order.query') && !!tester && tester.cells[1].innerText === '*'
                   && !document.querySelector('{pending}');"
            ),
        )
        .await;
    assert!(calls(200).await, "the approved caller's call goes through");
    let decided: Value = cluster
        .client
        .get(format!("{}/v1/access-requests/{id}", cluster.registry.url()))
        .bearer_auth(token("ops"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (decided["decided_by"].as_str(), decided["note"].as_str()),
        (Some("ops"), Some("approved on the page"))
    );
    browser.screenshot("access-granted").await;

    browser
        .click(&format!("{granted} button[data-name^=\"revoke-\"]"))
        .await;
    browser.click("#confirm-ok").await;
    browser
        .until(
            Duration::from_secs(10),
            "the grant gone",
            &format!("return !document.querySelector('{granted}');"),
        )
        .await;
    assert!(calls(403).await, "the revoked caller is refused");
}
