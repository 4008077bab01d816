//! The trail through every door (issue 37): one record per call admitted
//! through `/v1/invoke` (whole and streamed), `/v1/broadcast` (each member),
//! `/v1/tasks` (the delivery), A2A and MCP, and one for a call refused at
//! admission; calls go on while the trail's Redis is down, the records that
//! could not wait counted as dropped; a tenant's trail is its own.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

/// The slow path and the trail on `redis`, segments every 20 ms, a buffer of `buffer` records.
fn with_trail(redis: String, buffer: usize) -> agent_reach_router::TasksSettings {
    agent_reach_router::TasksSettings {
        trail: Some(agent_reach_router::TrailConfig {
            settings: agent_reach_router::TrailSettings {
                flush_every: Duration::from_millis(20),
                buffer,
                ..Default::default()
            },
            credentials: Default::default(),
            otlp: None,
        }),
        ..tasks_settings(redis)
    }
}

/// Every record of this router's chains (an operator's read of what is stored).
async fn stored_records(client: &reqwest::Client, router: std::net::SocketAddr, operator: &str) -> Vec<Value> {
    let chains: Value = client
        .get(format!("http://{router}/v1/trail/chains"))
        .bearer_auth(operator)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut records = Vec::new();
    for chain in chains["chains"].as_array().into_iter().flatten() {
        let page: Value = client
            .get(format!(
                "http://{router}/v1/trail/chains/{}/records?limit=10000",
                chain["router"].as_str().unwrap()
            ))
            .bearer_auth(operator)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for stored in page["records"].as_array().into_iter().flatten() {
            records.push(serde_json::from_str::<Value>(stored["body"].as_str().unwrap()).unwrap());
        }
    }
    records
}

fn doors(records: &[Value]) -> BTreeMap<String, usize> {
    let mut doors = BTreeMap::new();
    for record in records {
        *doors
            .entry(record["door"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    doors
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_door_leaves_its_record() {
    let redis = agent_reach_testkit::Redis::start();
    let url = redis.url();
    let cluster = Cluster::start_with(|settings| settings.tasks = Some(with_trail(url, 65_536))).await;
    let _first = cluster.agent(AgentSpec::new("trail-1", 1, Behaviour::Stream));
    let _second = cluster.agent(AgentSpec::new("trail-2", 1, Behaviour::Stream));
    cluster.wait_for_instances(&["trail-1", "trail-2"]).await;
    let client = &cluster.client;
    let caller = token(CALLER);

    assert_eq!(cluster.invoke(order("SO-invoke")).await.0, 200);
    let streamed = client
        .post(cluster.url("/v1/invoke"))
        .bearer_auth(&caller)
        .header("accept", "text/event-stream")
        .json(&order("SO-stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 200);
    assert!(streamed.text().await.unwrap().contains("event: result"));
    assert_eq!(post(&cluster, "/v1/broadcast", order("SO-broadcast")).await.0, 200);
    let (status, task) = post(&cluster, "/v1/tasks", order("SO-task")).await;
    assert_eq!(status, 202, "{task}");
    let a2a = client
        .post(cluster.url(&format!("/a2a/{CAPABILITY}")))
        .bearer_auth(&caller)
        .header("a2a-version", "1.0")
        .json(&json!({
            "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": {"messageId": "m-trail", "role": "ROLE_USER",
                                   "parts": [{"data": {"order_id": "SO-a2a"}}]}}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(a2a.status(), 200);
    let mcp = client
        .post(cluster.url("/mcp"))
        .bearer_auth(&caller)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": CAPABILITY, "arguments": {"order_id": "SO-mcp"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(mcp.status(), 200);
    // Refused at admission (the input fails the schema): recorded too, failed with its code.
    assert_eq!(
        cluster.invoke(json!({"capability": CAPABILITY, "payload": {}})).await.0,
        422
    );

    let operator = token("ops");
    let wanted = BTreeMap::from([
        ("a2a".to_string(), 1),
        ("broadcast".to_string(), 2),
        ("delivery".to_string(), 1),
        ("invoke".to_string(), 2),
        ("mcp".to_string(), 1),
        ("stream".to_string(), 1),
    ]);
    let complete = eventually(Duration::from_secs(10), || async {
        doors(&stored_records(client, cluster.router_addr, &operator).await) == wanted
    })
    .await;
    let records = stored_records(client, cluster.router_addr, &operator).await;
    assert!(complete, "{:?} of {records:#?}", doors(&records));
    let refused = records
        .iter()
        .find(|record| record["code"] == "SCHEMA_MISMATCH")
        .unwrap();
    assert_eq!(refused["status"], "failed");
    assert_eq!(refused["attempts"], 0);
    let delivery = records.iter().find(|record| record["door"] == "delivery").unwrap();
    assert_eq!(delivery["task_id"], task["task_id"]);
    // Payloads are off by default: nothing of the inputs or outputs is kept.
    assert!(records
        .iter()
        .all(|record| record["input"].is_null() && record["output"].is_null()));
    // Every broadcast member's own record, one per instance.
    let members: Vec<&str> = records
        .iter()
        .filter(|record| record["door"] == "broadcast")
        .map(|record| record["agent_id"].as_str().unwrap())
        .collect();
    assert!(
        members.contains(&"trail-1") && members.contains(&"trail-2"),
        "{members:?}"
    );
    // Only operators and auditors read the trail.
    let (status, body) = get(&cluster, "/v1/trail?session_id=x").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["details"]["reason"], "not_an_auditor", "{body}");
    // Bad queries are refused with their code.
    for query in [
        "",
        "?session_id=a&run_id=b",
        "?request_id=a&view=graph",
        "?request_id=a&cursor=x",
    ] {
        let response = client
            .get(cluster.url(&format!("/v1/trail{query}")))
            .bearer_auth(&operator)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{query}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "INVALID_QUERY", "{query}: {body}");
    }
    let response = client
        .get(cluster.url("/v1/trail/chains/not%2Fa%2Fchain/records"))
        .bearer_auth(&operator)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_go_on_while_the_trails_redis_is_down_and_dropped_records_are_counted() {
    let mut redis = agent_reach_testkit::Redis::start();
    let url = redis.url();
    // A buffer of 4 records: an outage fills it at once.
    let cluster = Cluster::start_with(|settings| settings.tasks = Some(with_trail(url, 4))).await;
    let _agent = cluster.agent(AgentSpec::new("down-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["down-1"]).await;
    let dropped = |metrics: &str| -> u64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix("agent_reach_trail_dropped_total "))
            .and_then(|value| value.parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(cluster.invoke(order("SO-before")).await.0, 200);
    let operator = token("ops");
    assert!(
        eventually(Duration::from_secs(10), || async {
            stored_records(&cluster.client, cluster.router_addr, &operator)
                .await
                .len()
                == 1
        })
        .await
    );
    assert_eq!(dropped(&cluster.metrics().await), 0);

    redis.kill();
    for n in 0..40 {
        let (status, body) = cluster.invoke(order(&format!("SO-down-{n}"))).await;
        assert_eq!(status, 200, "a call failed while the trail's Redis was down: {body}");
    }
    let metrics = cluster.metrics().await;
    assert!(dropped(&metrics) > 0, "{metrics}");
    assert!(metrics.contains("agent_reach_trail_write_failures_total"), "{metrics}");

    // Back: what was kept is written, and calls are recorded again.
    redis.restart();
    assert_eq!(cluster.invoke(order("SO-after")).await.0, 200);
    assert!(
        eventually(Duration::from_secs(20), || async {
            let records = stored_records(&cluster.client, cluster.router_addr, &operator).await;
            records.iter().any(|record| {
                record["request_id"].as_str().is_some()
                    && record["status"] == "succeeded"
                    && record["seq"].as_u64() > Some(1)
            })
        })
        .await,
        "nothing was recorded after Redis came back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_trail_is_its_own() {
    let shared = agent_reach_testkit::Redis::start();
    let cluster = Cluster::start().await;
    let map_path = cluster.dir.path().join("tenants.yaml");
    std::fs::write(
        &map_path,
        "version: 1\ntenants:\n  default: {}\n  team-a: {}\n  team-b: {}\n",
    )
    .unwrap();
    let registry = start_mapped_registry(
        &cluster.etcd.endpoint(),
        &cluster.secret_path,
        &cluster.acl_path,
        &map_path,
    );
    let url = shared.url();
    let (_router, router) = cluster
        .another_router(|settings| {
            settings.registry = vec![registry.url()];
            settings.tenant_map = Some(map_path.clone());
            settings.tasks = Some(with_trail(url, 65_536));
        })
        .await;
    let client = reqwest::Client::new();
    let _agent = Agent::start(
        &registry.url(),
        AgentSpec {
            tenant: Some("team-a".to_string()),
            ..AgentSpec::new("tenant-a-1", 1, Behaviour::Echo)
        },
    );
    let a = tenant_token(CALLER, Some("team-a"));
    let call = json!({"capability": CAPABILITY, "request_id": "only-a", "payload": {"order_id": "SO-1"}});
    assert!(
        eventually(Duration::from_secs(20), || async {
            invoke_at(&client, router, Some(&a), &call).await.0 == 200
        })
        .await
    );
    let read = |tenant: &'static str| {
        let client = client.clone();
        async move {
            let response = client
                .get(format!("http://{router}/v1/trail?request_id=only-a"))
                .bearer_auth(tenant_token("ops", Some(tenant)))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            response.json::<Value>().await.unwrap()["records"]
                .as_array()
                .unwrap()
                .len()
        }
    };
    // At least the call answered 200; the polls before the tenant's part could
    // route may have left refused calls under the same request id.
    assert!(eventually(Duration::from_secs(10), || async { read("team-a").await >= 1 }).await);
    // team-b's operator, on the same router and the same Redis, sees none of it.
    assert_eq!(read("team-b").await, 0);
    let chains: Value = client
        .get(format!("http://{router}/v1/trail/chains"))
        .bearer_auth(tenant_token("ops", Some("team-b")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(chains["chains"], json!([]), "{chains}");
}

/// `GET path` on `router` as the operator `ops`: (status, JSON answer).
async fn read_as_ops(client: &reqwest::Client, router: std::net::SocketAddr, path: &str) -> (u16, Value) {
    let response = client
        .get(format!("http://{router}{path}"))
        .bearer_auth(token("ops"))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// Issue 37, point 3: two routers on one Redis. Router B's console finds a
/// request only router A served (its request page reads the trail, not
/// only B's recent calls), and B's figures are the installation's: both
/// routers' calls, per capability and in buckets of the last hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_router_shows_a_request_another_served_and_the_installations_figures() {
    let redis = agent_reach_testkit::Redis::start();
    let url = redis.url();
    let second = url.clone();
    let cluster = Cluster::start_with(|settings| settings.tasks = Some(with_trail(url, 65_536))).await;
    let (router_b, b) = cluster
        .another_router(|settings| settings.tasks = Some(with_trail(second, 65_536)))
        .await;
    let _agent = cluster.agent(AgentSpec::new("both-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["both-1"]).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            router_b.routed_agent_ids() == ["both-1"]
        })
        .await,
        "router B never saw the agent"
    );
    let client = &cluster.client;
    let caller = token(CALLER);
    let through_b =
        |request_id: &str| json!({"capability": CAPABILITY, "request_id": request_id, "payload": {"order_id": "SO-b"}});
    assert_eq!(invoke_at(client, b, Some(&caller), &through_b("via-b-1")).await.0, 200);
    assert_eq!(invoke_at(client, b, Some(&caller), &through_b("via-b-2")).await.0, 200);
    let served_by_a = json!({"capability": CAPABILITY, "request_id": "served-by-a", "session_id": "s-two",
                             "payload": {"order_id": "SO-a"}});
    assert_eq!(cluster.invoke(served_by_a).await.0, 200);
    // A request id the router made (its time in front): found by its time's
    // bucket, not by a field of the hour's hash.
    let (status, generated) = cluster.invoke(order("SO-a-2")).await;
    assert_eq!(status, 200, "{generated}");
    let generated = generated["request_id"].as_str().unwrap().to_string();
    assert_eq!(generated.len(), 28, "{generated}");
    // Refused at admission by router A: a failed call of the capability.
    assert_eq!(
        cluster.invoke(json!({"capability": CAPABILITY, "payload": {}})).await.0,
        422
    );

    // B never saw the call: its recent calls do not hold it, its trail does.
    let (status, body) = read_as_ops(client, b, "/v1/requests/served-by-a").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("NOT_FOUND")),
        "{body}"
    );
    let found = eventually(Duration::from_secs(10), || async {
        read_as_ops(client, b, "/v1/trail?request_id=served-by-a&view=tree")
            .await
            .1["records"]
            .as_array()
            .is_some_and(|records| records.len() == 1)
    })
    .await;
    let (_, answer) = read_as_ops(client, b, "/v1/trail?request_id=served-by-a&view=tree").await;
    assert!(found, "{answer}");
    let record = &answer["records"][0];
    assert_eq!(
        (
            record["status"].as_str(),
            record["agent_id"].as_str(),
            record["session_id"].as_str()
        ),
        (Some("succeeded"), Some("both-1"), Some("s-two"))
    );
    assert_eq!(answer["tree"][0]["request_id"], "served-by-a", "{answer}");
    let found = eventually(Duration::from_secs(10), || async {
        let (_, answer) = read_as_ops(client, b, &format!("/v1/trail?request_id={generated}")).await;
        answer["records"]
            .as_array()
            .is_some_and(|records| records.len() == 1 && records[0]["request_id"] == generated.as_str())
    })
    .await;
    assert!(found, "router B finds the generated request id {generated}");
    // The trail names its chain: router A's, not B's (B's chain holds only its own two).
    let (_, chains) = read_as_ops(client, b, "/v1/trail/chains").await;
    assert_eq!(chains["chains"].as_array().unwrap().len(), 2, "{chains}");

    // B's figures count all five calls, from both routers' chains.
    let figures_complete = eventually(Duration::from_secs(10), || async {
        let (_, stats) = read_as_ops(client, b, "/v1/trail/stats").await;
        stats["capabilities"][0]["calls"] == 5
    })
    .await;
    let (status, stats) = read_as_ops(client, b, "/v1/trail/stats").await;
    assert!(figures_complete && status == 200, "{stats}");
    assert_eq!(
        (stats["source"].as_str(), stats["routers"].as_u64()),
        (Some("trail"), Some(2)),
        "{stats}"
    );
    assert_eq!(stats["capped"], false, "{stats}");
    let figures = &stats["capabilities"][0];
    assert_eq!(figures["name"], CAPABILITY);
    assert_eq!(
        (figures["failed"].as_u64(), figures["routers"].as_u64()),
        (Some(1), Some(2)),
        "{figures}"
    );
    assert!(
        (figures["failure_rate"].as_f64().unwrap() - 0.2).abs() < 1e-9,
        "{figures}"
    );
    assert!(figures["p99_ms"].as_f64().is_some(), "{figures}");
    let buckets = figures["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 12);
    let bucketed: u64 = buckets.iter().map(|bucket| bucket["calls"].as_u64().unwrap()).sum();
    assert_eq!(bucketed, 5, "{figures}");
    assert_eq!(
        buckets[11]["calls"], 5,
        "the calls just made are in the last bucket: {figures}"
    );
    // B's own recent calls hold two of them: the figures above are not B's.
    let (_, own) = read_as_ops(client, b, "/v1/requests?limit=100").await;
    assert_eq!(own["calls"].as_array().unwrap().len(), 2, "{own}");

    // A cap says so: one record read per chain.
    let (_, capped) = read_as_ops(client, b, "/v1/trail/stats?limit=2").await;
    assert_eq!(
        (capped["capped"].as_bool(), capped["records_read"].as_u64()),
        (Some(true), Some(2)),
        "{capped}"
    );
    assert!(capped["oldest_read_ms"].as_u64().is_some(), "{capped}");

    // Bad input: a clear message and a stable code, never a 500.
    let now = epoch_ms();
    for query in [
        "?since_ms=0".to_string(),
        format!("?since_ms={}", now + 60_000),
        "?buckets=0".to_string(),
        "?buckets=61".to_string(),
        "?since_ms=yesterday".to_string(),
        "?capability=order.query".to_string(),
    ] {
        let (status, body) = read_as_ops(client, b, &format!("/v1/trail/stats{query}")).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("INVALID_QUERY")),
            "{query}: {body}"
        );
    }
    // Not an operator or auditor: refused.
    let response = client
        .get(format!("http://{b}/v1/trail/stats"))
        .bearer_auth(&caller)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_trail_the_figures_say_it_is_off() {
    let cluster = Cluster::start().await;
    let (status, body) = get(&cluster, "/v1/trail/stats").await;
    // `tester` is no operator: refused before anything else.
    assert_eq!(status, 403, "{body}");
    let response = cluster
        .client
        .get(cluster.url("/v1/trail/stats"))
        .bearer_auth(token("ops"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 501);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "TRAIL_DISABLED", "{body}");
}

/// A router with the trail on `redis` exported to the OTLP collector at
/// `endpoint`, and an echo agent `agent` it routes to.
async fn exporting_to(
    redis: String,
    endpoint: String,
    headers: Vec<(String, String)>,
    agent: &str,
) -> (Cluster, Agent) {
    let mut tasks = with_trail(redis, 1024);
    if let Some(trail) = tasks.trail.as_mut() {
        trail.otlp = Some(agent_reach_router::TrailOtlp { endpoint, headers });
    }
    let cluster = Cluster::start_with(|settings| settings.tasks = Some(tasks)).await;
    let handle = cluster.agent(AgentSpec::new(agent, 1, Behaviour::Echo));
    cluster.wait_for_instances(&[agent]).await;
    (cluster, handle)
}

/// A counter's value on the router's `/metrics` (0 when absent).
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_also_exported_as_otlp_logs_when_asked() {
    let redis = agent_reach_testkit::Redis::start();
    let receiver = agent_reach_testkit::otlp::Receiver::start().await;
    let (cluster, _agent) = exporting_to(
        redis.url(),
        receiver.endpoint().to_string(),
        vec![("x-collector-key".to_string(), "k-1".to_string())],
        "logs-1",
    )
    .await;
    let (status, answer) = cluster.invoke(order("SO-logs")).await;
    assert_eq!(status, 200, "{answer}");
    let request_id = answer["request_id"].as_str().unwrap().to_string();
    // Refused at admission: recorded as failed, exported at ERROR.
    let (status, _) = cluster
        .invoke(json!({ "capability": "nothing.here", "payload": {} }))
        .await;
    assert!(status >= 400);
    assert!(
        eventually(Duration::from_secs(20), || async { receiver.logs().len() >= 2 }).await,
        "the collector received {:?}",
        receiver.logs()
    );
    let logs = receiver.logs();
    let served = logs
        .iter()
        .find(|log| log.attributes.get("agent_reach.request_id") == Some(&request_id))
        .expect("the served call's record");
    assert_eq!(served.scope, "agent-reach.trail");
    assert_eq!(served.severity_text, "INFO");
    assert_eq!(served.attributes["agent_reach.capability"], CAPABILITY);
    assert_eq!(served.attributes["agent_reach.status"], "succeeded");
    assert_eq!(served.resource["service.name"], "agent-reach-router");
    assert_eq!(served.trace_id.len(), 32);
    // The body is the stored record, the hash the one the chain holds.
    let body: Value = serde_json::from_str(&served.body).unwrap();
    assert_eq!(body["request_id"], request_id.as_str());
    assert_eq!(
        served.attributes["agent_reach.trail.hash"],
        agent_reach_trail::hash_of(served.body.as_bytes())
    );
    let stored = stored_records(&cluster.client, cluster.router_addr, &token("ops")).await;
    assert!(stored.iter().any(|record| record["request_id"] == request_id.as_str()));
    let refused = logs
        .iter()
        .find(|log| log.attributes.get("agent_reach.capability").map(String::as_str) == Some("nothing.here"))
        .expect("the refused call's record");
    assert_eq!(refused.severity_text, "ERROR");
    assert!(refused.attributes.contains_key("agent_reach.code"), "{refused:?}");
    // The configured headers go with every export, and the exports are counted.
    assert!(receiver.log_calls().iter().all(|call| call
        .metadata
        .get("x-collector-key")
        .and_then(|value| value.to_str().ok())
        == Some("k-1")));
    // Counted once the collector has answered (a moment after it stored them).
    assert!(
        eventually(Duration::from_secs(10), || async {
            counter(&cluster.metrics().await, "agent_reach_trail_otlp_exported_total") >= 2
        })
        .await,
        "{}",
        cluster.metrics().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_no_record_and_is_counted() {
    let redis = agent_reach_testkit::Redis::start();
    // A loopback port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (cluster, _agent) = exporting_to(redis.url(), format!("http://{closed}"), Vec::new(), "nolog-1").await;
    let (status, answer) = cluster.invoke(order("SO-nolog")).await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        eventually(Duration::from_secs(20), || async {
            counter(&cluster.metrics().await, "agent_reach_trail_otlp_failures_total") >= 1
        })
        .await,
        "{}",
        cluster.metrics().await
    );
    // Redis holds the record all the same.
    let stored = stored_records(&cluster.client, cluster.router_addr, &token("ops")).await;
    assert!(
        stored.iter().any(|record| record["request_id"] == answer["request_id"]),
        "{stored:?}"
    );
}
