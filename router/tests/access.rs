//! Access requests through the routers (issue 39, point 3; DESIGN §2.11):
//! two routers on one registry and a real etcd. A request approved by an
//! owner lets its caller through both routers within a second of the
//! approval; a revocation stops it on both within a second; an expired
//! grant is refused by the routers' clock even while the registry still
//! publishes it; a non-owner's approval is refused; bad input has its code;
//! a grant of another tenant does not apply.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use agent_reach_registry::store::{EtcdStore, Store};
use serde_json::{json, Value};
use support::{eventually, invoke_at, order, token, AgentSpec, Behaviour, Cluster};

/// `tester` may call anything (the support's policy); `order_owner`
/// approves access to `order.*` (and operates, for the console); `ops` operates.
const ACL: &str = r#"version: 1
operators: [ops, order_owner]
permissions:
  - caller: tester
    allow: ["*"]
providers:
  - agent: "*"
    provides: ["*"]
owners:
  - capability: order.*
    approvers: [order_owner]
"#;

/// The bound the issue sets: a decision reaches every router within a second.
const WITHIN: Duration = Duration::from_secs(1);

struct Routers {
    cluster: Cluster,
    second: (agent_reach_router::Router, SocketAddr),
    http: reqwest::Client,
}

impl Routers {
    /// Two routers on one registry, `order-1` routable through both.
    async fn start() -> (Self, support::Agent) {
        let cluster = Cluster::start_with_acl(ACL, |_| {}).await;
        let agent = cluster.agent(AgentSpec::new("order-1", 1, Behaviour::Echo));
        let second = cluster.another_router(|_| {}).await;
        cluster.wait_for_instances(&["order-1"]).await;
        let routed = eventually(Duration::from_secs(20), || async {
            second.0.routed_agent_ids() == ["order-1"]
        })
        .await;
        assert!(routed, "the second router never routed order-1");
        let http = reqwest::Client::new();
        (Self { cluster, second, http }, agent)
    }

    fn addrs(&self) -> [SocketAddr; 2] {
        [self.cluster.router_addr, self.second.1]
    }

    /// The status of `caller`'s call to `order.query` through each router.
    async fn statuses(&self, caller: &str) -> Vec<u16> {
        let mut statuses = Vec::new();
        for addr in self.addrs() {
            let (status, body) = invoke_at(&self.cluster.client, addr, Some(&token(caller)), &order("SO-1")).await;
            if status == 403 {
                assert_eq!(body["error"]["code"], "FORBIDDEN", "{body}");
            }
            statuses.push(status);
        }
        statuses
    }

    /// Waits at most `bound` until every router answers `caller` with `status`; how long it took.
    async fn until_every_router(&self, caller: &str, status: u16, bound: Duration) -> Option<Duration> {
        let start = Instant::now();
        let reached = eventually(bound, || async { self.statuses(caller).await == [status, status] }).await;
        reached.then(|| start.elapsed())
    }

    async fn registry(&self, method: reqwest::Method, path: &str, caller: &str, body: Value) -> (u16, Value) {
        let url = format!("{}{path}", self.cluster.registry.url());
        let mut request = self.http.request(method.clone(), url).bearer_auth(token(caller));
        if method != reqwest::Method::DELETE {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn post(&self, path: &str, caller: &str, body: Value) -> (u16, Value) {
        self.registry(reqwest::Method::POST, path, caller, body).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_approved_request_reaches_every_router_within_a_second_and_a_revocation_too() {
    let (routers, _agent) = Routers::start().await;
    assert_eq!(routers.statuses("intent_parser").await, [403, 403], "not in acl.yaml");
    let (_, refused) = invoke_at(
        &routers.cluster.client,
        routers.cluster.router_addr,
        Some(&token("intent_parser")),
        &order("SO-1"),
    )
    .await;
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("agent-reach access request --capability order.query"),
        "{message}"
    );

    let ask = json!({ "capability": "order.query", "reason": "intents need order status" });
    let (status, filed) = routers.post("/v1/access-requests", "intent_parser", ask).await;
    assert_eq!(status, 201, "{filed}");
    let id = filed["id"].as_str().unwrap().to_string();

    // Neither a caller the file lets call it nor an operator may approve: only its owner.
    for outsider in ["tester", "ops"] {
        let (status, body) = routers
            .post(&format!("/v1/access-requests/{id}/approve"), outsider, json!({}))
            .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (403, Some("FORBIDDEN")),
            "{body}"
        );
    }
    assert_eq!(routers.statuses("intent_parser").await, [403, 403], "still pending");

    let (status, approved) = routers
        .post(&format!("/v1/access-requests/{id}/approve"), "order_owner", json!({}))
        .await;
    assert_eq!(status, 200, "{approved}");
    assert_eq!(approved["status"], "approved");
    let took = routers.until_every_router("intent_parser", 200, WITHIN).await;
    assert!(
        took.is_some(),
        "the approval did not reach both routers within {WITHIN:?}"
    );
    eprintln!("approval to a call through both routers: {took:?}");
    // The grant is for its caller only.
    assert_eq!(routers.statuses("billing").await, [403, 403]);

    // Revoked: refused on both within a second.
    let grant_id = approved["grant_id"].as_str().unwrap();
    let (status, body) = routers
        .registry(
            reqwest::Method::DELETE,
            &format!("/v1/grants/{grant_id}"),
            "order_owner",
            Value::Null,
        )
        .await;
    assert_eq!(status, 204, "{body}");
    let took = routers.until_every_router("intent_parser", 403, WITHIN).await;
    assert!(
        took.is_some(),
        "the revocation did not reach both routers within {WITHIN:?}"
    );
    eprintln!("revocation to a refusal on both routers: {took:?}");

    // Bad input: a capability nobody offers, one the caller already may call, a decided request.
    let (status, body) = routers
        .post(
            "/v1/access-requests",
            "intent_parser",
            json!({ "capability": "order.cancel", "reason": "r" }),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("CAPABILITY_NOT_FOUND")),
        "{body}"
    );
    let (status, body) = routers
        .post(
            "/v1/access-requests",
            "tester",
            json!({ "capability": "order.query", "reason": "r" }),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("ALREADY_ALLOWED")),
        "{body}"
    );
    let (status, body) = routers
        .post(&format!("/v1/access-requests/{id}/approve"), "order_owner", json!({}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("ALREADY_DECIDED")),
        "{body}"
    );
}

/// A grant past its expiry is refused by the routers' clock while the
/// registry still publishes it (here written to etcd without a lease, as
/// one whose lease etcd has not ended yet), and a grant under another
/// tenant's prefix never applies. A grant written beside them with no
/// expiry shows both routers have the other two.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_grants_and_other_tenants_grants_are_refused() {
    let (routers, _agent) = Routers::start().await;
    let store = EtcdStore::connect(&[routers.cluster.etcd.endpoint()]).unwrap();
    let now = support::epoch_ms();
    let grant = |id: &str, caller: &str, expires_at_ms: Option<u64>| {
        json!({
            "id": id, "caller": caller, "capability": "order.query", "request_id": "ar-test",
            "granted_by": "order_owner", "granted_at_ms": now, "expires_at_ms": expires_at_ms,
        })
    };
    let put = |key: String, value: Value| agent_reach_registry::store::Put {
        key,
        value: serde_json::to_vec(&value).unwrap(),
        lease: 0,
    };
    let puts = vec![
        put(
            "/agent-reach/v1/default/grants/gr-expired".into(),
            grant("gr-expired", "lapsed", Some(now - 1)),
        ),
        put(
            "/agent-reach/v1/other/grants/gr-other".into(),
            grant("gr-other", "outsider", None),
        ),
    ];
    store.txn(Vec::new(), puts, Vec::new()).await.unwrap();
    let control = vec![put(
        "/agent-reach/v1/default/grants/gr-control".into(),
        grant("gr-control", "allowed", None),
    )];
    store.txn(Vec::new(), control, Vec::new()).await.unwrap();

    // The Watch is ordered: once the control grant applies on both routers, so have the others.
    let took = routers.until_every_router("allowed", 200, Duration::from_secs(5)).await;
    assert!(took.is_some(), "the control grant never reached both routers");
    assert_eq!(routers.statuses("lapsed").await, [403, 403], "expired by the clock");
    assert_eq!(routers.statuses("outsider").await, [403, 403], "another tenant's grant");
    let (_, grants) = routers
        .registry(reqwest::Method::GET, "/v1/grants", "ops", Value::Null)
        .await;
    let listed: Vec<&str> = grants["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|grant| grant["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["gr-control"], "the registry lists live grants only: {grants}");

    // A real request with a short ttl: allowed, then refused once it expires.
    let ask = json!({ "capability": "order.query", "reason": "a short job", "ttl_s": 2 });
    let (_, filed) = routers.post("/v1/access-requests", "batch_job", ask).await;
    let id = filed["id"].as_str().unwrap();
    let (status, approved) = routers
        .post(&format!("/v1/access-requests/{id}/approve"), "order_owner", json!({}))
        .await;
    assert_eq!(status, 200, "{approved}");
    let expires_at_ms = approved["expires_at_ms"].as_u64().unwrap();
    let took = routers.until_every_router("batch_job", 200, WITHIN).await;
    assert!(
        took.is_some(),
        "the approval did not reach both routers within {WITHIN:?}"
    );
    let refused = eventually(Duration::from_secs(5), || async {
        routers.statuses("batch_job").await == [403, 403]
    })
    .await;
    assert!(refused, "the expired grant is refused on both routers");
    assert!(support::epoch_ms() >= expires_at_ms, "refused only once expired");
}

/// The console's access routes on a router: its view of the file's rules
/// beside the grants it applies, and the registry's access routes relayed
/// with the operator's own token, the registry deciding who may.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_shows_rules_beside_grants_and_relays_decisions() {
    let (routers, _agent) = Routers::start().await;
    let router = |path: &str| routers.cluster.url(path);
    let http = &routers.http;
    let send = |request: reqwest::RequestBuilder, caller: &str| {
        let request = request.bearer_auth(token(caller));
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let text = response.text().await.unwrap();
            (
                status,
                serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text)),
            )
        }
    };
    let ask = json!({ "capability": "order.query", "reason": "from the console test" });
    let (_, filed) = routers.post("/v1/access-requests", "intent_parser", ask).await;
    let id = filed["id"].as_str().unwrap().to_string();

    let (status, pending) = send(http.get(router("/v1/access-requests?status=pending")), "ops").await;
    assert_eq!(status, 200, "{pending}");
    assert_eq!(pending["requests"][0]["id"], id.as_str());
    let (status, body) = send(http.get(router("/v1/access-requests")), "intent_parser").await;
    assert_eq!(
        (status, body["error"]["details"]["reason"].as_str()),
        (403, Some("not_an_operator")),
        "{body}"
    );
    // An operator the file does not name an approver is refused by the registry.
    let approve = router(&format!("/v1/access-requests/{id}/approve"));
    let (status, body) = send(http.post(&approve).json(&json!({})), "ops").await;
    assert_eq!(
        (status, body["error"]["details"]["reason"].as_str()),
        (403, Some("not_an_owner")),
        "{body}"
    );
    let (status, approved) = send(http.post(&approve).json(&json!({ "note": "console" })), "order_owner").await;
    assert_eq!(
        (status, approved["decided_by"].as_str()),
        (200, Some("order_owner")),
        "{approved}"
    );
    let grant_id = approved["grant_id"].as_str().unwrap().to_string();

    // The router's view: the file's rules and owners beside the grant it now applies.
    let shown = eventually(WITHIN, || async {
        let (_, view) = send(http.get(router("/v1/routing/access")), "ops").await;
        view["grants"].as_array().is_some_and(|grants| grants.len() == 1)
    })
    .await;
    assert!(shown, "the grant reached the router's view");
    let (_, view) = send(http.get(router("/v1/routing/access")), "ops").await;
    assert_eq!(
        view["permissions"],
        json!([{ "caller": "tester", "allow": ["*"] }]),
        "{view}"
    );
    assert_eq!(
        view["owners"],
        json!([{ "capability": "order.*", "approvers": ["order_owner"] }])
    );
    let grant = &view["grants"][0];
    assert_eq!(
        (grant["id"].as_str(), grant["caller"].as_str()),
        (Some(grant_id.as_str()), Some("intent_parser"))
    );
    assert_eq!(
        (grant["live"].as_bool(), grant["granted_by"].as_str()),
        (Some(true), Some("order_owner"))
    );
    let (status, _) = send(http.get(router("/v1/routing/access")), "tester").await;
    assert_eq!(status, 403, "operators only");

    let (status, body) = send(http.delete(router(&format!("/v1/grants/{grant_id}"))), "order_owner").await;
    assert_eq!(status, 204, "{body}");
    assert!(routers.until_every_router("intent_parser", 403, WITHIN).await.is_some());
    let (status, body) = send(http.post(router("/v1/access-requests/ar-none/deny")), "order_owner").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("ACCESS_REQUEST_NOT_FOUND")),
        "{body}"
    );

    // The page's section is served with the page's headers.
    let script = http.get(router("/console/access.js")).send().await.unwrap();
    assert_eq!(script.status(), 200);
    assert!(script.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("default-src 'self'"));
    assert!(script.text().await.unwrap().contains("/v1/routing/access"));
    let page = http.get(router("/console")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("/console/access.js") && page.contains("id=\"access-requests\""));
}
