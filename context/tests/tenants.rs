//! One context service serving several tenants (issue 25, DESIGN §8
//! "Tenants") against real Redis: `team-a` on its own Redis, `team-b` and the
//! home tenant `default` on the shared one. Contexts are separate per tenant,
//! a tenant mapped to its own Redis writes nothing to the shared one (checked
//! in Redis itself), and the map is followed while the service runs.

use crate::support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_reach_access::AuthConfig;
use agent_reach_context::store::Namespace;
use agent_reach_context::{ContextConfig, Settings, StoreChoice, Tenants};
use agent_reach_proto::context as pb;
use agent_reach_proto::context::contexts_client::ContextsClient;
use agent_reach_tenancy::TenantMapHandle;
use agent_reach_testkit::Redis;
use reqwest::Method;
use serde_json::{json, Value};
use support::{eventually, ACL, SECRET};

const PREFIX: &str = "agent-reach-test";
/// Long enough for a loaded machine, short enough to fail fast.
const BOUND: Duration = Duration::from_secs(15);

struct MultiTenant {
    addr: std::net::SocketAddr,
    /// A connection per request: a plain `GET`/`PATCH /v1/contexts/{id}`
    /// opening a connection takes the front door's hot route (a connection
    /// once handed to hyper stays there, so a pooled one would not).
    http: reqwest::Client,
    shared: Redis,
    own: Redis,
    tenants: Arc<Tenants>,
    map: TenantMapHandle,
    map_path: PathBuf,
    _dir: tempfile::TempDir,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

/// A token of `tenant` (`None`: no claim, the `default` tenant) for `agent`.
fn token(agent: &str, tenant: Option<&str>) -> String {
    agent_reach_access::token::issue_hs256_for(agent, tenant, SECRET.as_bytes(), Duration::from_secs(3600)).unwrap()
}

impl MultiTenant {
    async fn start() -> Self {
        let (shared, own) = (Redis::start(), Redis::start());
        let dir = tempfile::tempdir().unwrap();
        let secret_path = dir.path().join("secret");
        std::fs::write(&secret_path, SECRET).unwrap();
        let acl_path = dir.path().join("acl.yaml");
        std::fs::write(&acl_path, ACL).unwrap();
        let map_path = dir.path().join("tenants.yaml");
        // team-p's own policy: intent_parser may write `intent` only.
        std::fs::write(
            dir.path().join("acl-p.yaml"),
            "version: 1\ncontext:\n  - agent: intent_parser\n    read: [\"*\"]\n    write: [intent]\n",
        )
        .unwrap();
        std::fs::write(&map_path, Self::map_text(&own, &map_path, "")).unwrap();
        let settings = Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            threads: 1,
            store: StoreChoice::redis(
                &shared.url(),
                Namespace {
                    prefix: PREFIX.into(),
                    tenant: "default".into(),
                },
                Duration::from_millis(500),
            )
            .unwrap(),
            acl: acl_path,
            auth: AuthConfig::Hs256SecretFile(secret_path),
            listener_tls: None,
            service: ContextConfig::default(),
        };
        let map = TenantMapHandle::load_and_watch(&map_path).unwrap();
        let tenants = agent_reach_context::build_tenants(&settings, map.clone())
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(agent_reach_context::serve_tenants(
            listener,
            tenants.clone(),
            None,
            async {
                let _ = stop.await;
            },
        ));
        Self {
            addr,
            http: reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap(),
            shared,
            own,
            tenants,
            map,
            map_path,
            _dir: dir,
            _shutdown: shutdown,
        }
    }

    /// The map: `default` and `team-b` shared, `team-a` on `own`, `team-p`
    /// shared with its own ACL (beside the map), and `more` appended.
    fn map_text(own: &Redis, map_path: &std::path::Path, more: &str) -> String {
        format!(
            "version: 1\ntenants:\n  default: {{}}\n  team-a:\n    redis: {}\n  team-b: {{}}\n  team-p:\n    acl: {}\n{more}",
            own.url(),
            map_path.with_file_name("acl-p.yaml").display()
        )
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `method path` with `bearer` (if any) and an optional JSON body: status and JSON body.
    async fn call(&self, bearer: Option<&str>, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method, self.url(path));
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// `intent_parser` of `tenant` creates `id` with `fields`.
    async fn create(&self, tenant: Option<&str>, id: &str, fields: Value) -> (u16, Value) {
        let token = token("intent_parser", tenant);
        self.call(
            Some(&token),
            Method::POST,
            "/v1/contexts",
            Some(json!({"context_id": id, "fields": fields})),
        )
        .await
    }

    async fn get(&self, tenant: Option<&str>, id: &str) -> (u16, Value) {
        let token = token("intent_parser", tenant);
        self.call(Some(&token), Method::GET, &format!("/v1/contexts/{id}"), None)
            .await
    }

    async fn metrics(&self) -> String {
        self.call(None, Method::GET, "/metrics", None)
            .await
            .1
            .as_str()
            .unwrap()
            .to_string()
    }
}

/// Every key in `redis` (`KEYS *`: a test database holds a handful).
/// Where a tenant's contexts are (DESIGN §4.7 names their keys).
fn namespace(prefix: &str, tenant: &str) -> agent_reach_context::store::Namespace {
    agent_reach_context::store::Namespace {
        prefix: prefix.to_string(),
        tenant: tenant.to_string(),
    }
}

async fn keys(redis: &Redis) -> Vec<String> {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut connection).await.unwrap();
    keys.sort();
    keys
}

fn code_and_reason(body: &Value) -> (&str, &str) {
    (
        body["error"]["code"].as_str().unwrap_or_default(),
        body["error"]["details"]["reason"].as_str().unwrap_or_default(),
    )
}

#[tokio::test]
async fn each_tenant_has_its_own_contexts_on_its_own_placement() {
    let h = MultiTenant::start().await;
    let (a, b) = (Some("team-a"), Some("team-b"));

    // The same id and fields in each tenant are separate contexts.
    assert_eq!(h.create(a, "ctx-1", json!({"user_id": "a-1"})).await.0, 201);
    assert_eq!(h.create(b, "ctx-1", json!({"user_id": "b-1"})).await.0, 201);
    assert_eq!(h.create(None, "ctx-1", json!({"user_id": "home-1"})).await.0, 201);
    for (tenant, expected) in [(a, "a-1"), (b, "b-1"), (None, "home-1")] {
        let (status, view) = h.get(tenant, "ctx-1").await;
        assert_eq!(status, 200, "{tenant:?}: {view}");
        assert_eq!(view["fields"]["user_id"], expected, "{tenant:?}");
        assert_eq!(view["version"], 1, "{tenant:?}");
    }
    // A patch in one tenant leaves the other's context as it was (the hot
    // PATCH route, and a GET with a query, which axum's routes answer).
    let token_a = token("intent_parser", a);
    let (status, patched) = h
        .call(
            Some(&token_a),
            Method::PATCH,
            "/v1/contexts/ctx-1",
            Some(json!({"set": {"intent": "refund"}})),
        )
        .await;
    assert_eq!((status, patched["version"].as_u64()), (200, Some(2)), "{patched}");
    let token_b = token("intent_parser", b);
    let (status, view) = h
        .call(
            Some(&token_b),
            Method::GET,
            "/v1/contexts/ctx-1?fields=intent,user_id",
            None,
        )
        .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["fields"], json!({"user_id": "b-1"}));
    assert_eq!(view["version"], 1);

    // On a kept-alive connection hyper serves every request after a create:
    // axum's routes dispatch them by tenant the same way.
    let pooled = reqwest::Client::new();
    for (bearer, expected) in [(&token_a, "a-1"), (&token_b, "b-1")] {
        let created = pooled
            .post(h.url("/v1/contexts"))
            .bearer_auth(bearer)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), 201);
        let view: Value = pooled
            .get(h.url("/v1/contexts/ctx-1"))
            .bearer_auth(bearer)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(view["fields"]["user_id"], expected, "{view}");
    }

    // Another tenant's context is not there for this one: read, patch and close are 404.
    assert_eq!(h.create(a, "only-a", json!({"user_id": "a-2"})).await.0, 201);
    let (status, body) = h.get(b, "only-a").await;
    assert_eq!((status, code_and_reason(&body).0), (404, "CONTEXT_NOT_FOUND"), "{body}");
    let (status, body) = h
        .call(
            Some(&token_b),
            Method::PATCH,
            "/v1/contexts/only-a",
            Some(json!({"set": {"intent": "steal"}})),
        )
        .await;
    assert_eq!((status, code_and_reason(&body).0), (404, "CONTEXT_NOT_FOUND"), "{body}");
    let (status, body) = h
        .call(Some(&token_b), Method::DELETE, "/v1/contexts/only-a", None)
        .await;
    assert_eq!((status, code_and_reason(&body).0), (404, "CONTEXT_NOT_FOUND"), "{body}");
    let (status, view) = h.get(a, "only-a").await;
    assert_eq!((status, view["version"].as_u64()), (200, Some(1)), "{view}");
    assert_eq!(view["fields"]["user_id"], "a-2");

    // In Redis itself: team-a's keys on its own Redis only, the others' on the shared one.
    let shared = keys(&h.shared).await;
    let own = keys(&h.own).await;
    assert!(
        !shared.iter().any(|key| key.contains("team-a")),
        "shared Redis: {shared:?}"
    );
    let team_a = namespace(PREFIX, "team-a");
    for key in [
        team_a.context_key("ctx-1"),
        team_a.context_key("only-a"),
        team_a.deadlines_key("ctx-1"),
        team_a.deadlines_key("only-a"),
    ] {
        assert!(own.contains(&key), "own Redis lacks {key}: {own:?}");
    }
    assert!(
        own.iter().all(|key| key.starts_with(&format!("{PREFIX}:team-a:"))),
        "own Redis: {own:?}"
    );
    for tenant in ["team-b", "default"] {
        let namespace = namespace(PREFIX, tenant);
        for key in [namespace.context_key("ctx-1"), namespace.deadlines_key("ctx-1")] {
            assert!(shared.contains(&key), "shared Redis lacks {key}: {shared:?}");
        }
    }

    // gRPC goes to the token's tenant too.
    let mut grpc = ContextsClient::connect(format!("http://{}", h.addr)).await.unwrap();
    for (bearer, expected) in [(&token_a, "a-1"), (&token_b, "b-1")] {
        let mut request = tonic::Request::new(pb::GetRequest {
            context_id: "ctx-1".into(),
            fields: vec![],
        });
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {bearer}").parse().unwrap());
        let answer = grpc.get(request).await.unwrap().into_inner();
        assert_eq!(answer.fields_json["user_id"], format!("\"{expected}\""));
    }

    // A tenant not in the map is refused by the home part; a forged claim by its tenant's part.
    let stranger = token("intent_parser", Some("team-z"));
    let (status, body) = h.call(Some(&stranger), Method::GET, "/v1/contexts/ctx-1", None).await;
    assert_eq!(
        (status, code_and_reason(&body)),
        (401, ("UNAUTHENTICATED", "other_tenant")),
        "{body}"
    );
    let (status, body) = h
        .call(
            Some(&stranger),
            Method::POST,
            "/v1/contexts",
            Some(json!({"context_id": "z"})),
        )
        .await;
    assert_eq!(
        (status, code_and_reason(&body)),
        (401, ("UNAUTHENTICATED", "other_tenant")),
        "{body}"
    );
    let forged = agent_reach_access::token::issue_hs256_for(
        "intent_parser",
        Some("team-a"),
        b"not the secret, but thirty-two bytes long",
        Duration::from_secs(60),
    )
    .unwrap();
    let (status, body) = h.call(Some(&forged), Method::GET, "/v1/contexts/ctx-1", None).await;
    assert_eq!(
        (status, code_and_reason(&body)),
        (401, ("UNAUTHENTICATED", "bad_signature")),
        "{body}"
    );
    let (status, body) = h.call(None, Method::GET, "/v1/contexts/ctx-1", None).await;
    assert_eq!((status, code_and_reason(&body).0), (401, "UNAUTHENTICATED"), "{body}");

    // One process's /metrics: every tenant's series in one family, each labelled.
    let metrics = h.metrics().await;
    assert_eq!(
        metrics
            .matches("# TYPE agent_reach_context_operations_total counter")
            .count(),
        1,
        "{metrics}"
    );
    for tenant in ["default", "team-a", "team-b"] {
        let series = format!(r#"agent_reach_context_operations_total{{op="create",outcome="ok",tenant="{tenant}"}}"#);
        assert!(metrics.contains(&series), "{series} missing from:\n{metrics}");
    }
    let (status, ready) = h.call(None, Method::GET, "/readyz", None).await;
    assert_eq!(status, 200, "{ready}");
    let (status, _) = h.call(None, Method::POST, "/metrics", None).await;
    assert_eq!(status, 405);
    assert_eq!(h.tenants.served(), ["default", "team-a", "team-b", "team-p"]);
}

#[tokio::test]
async fn a_tenant_with_its_own_acl_is_held_to_it() {
    let h = MultiTenant::start().await;
    // The process's --acl lets intent_parser write user_id; team-p's does not.
    assert_eq!(h.create(Some("team-b"), "p-1", json!({"user_id": "u"})).await.0, 201);
    let (status, body) = h.create(Some("team-p"), "p-1", json!({"user_id": "u"})).await;
    assert_eq!((status, code_and_reason(&body).0), (403, "FORBIDDEN"), "{body}");
    assert_eq!(h.create(Some("team-p"), "p-1", json!({"intent": "x"})).await.0, 201);

    // Its `acl` removed from the map: the part is rebuilt on the process's --acl.
    let text = MultiTenant::map_text(&h.own, &h.map_path, "");
    let (kept, _) = text.split_once("  team-p:").unwrap();
    std::fs::write(&h.map_path, format!("{kept}  team-p: {{}}\n")).unwrap();
    assert!(
        eventually(BOUND, || async {
            h.create(Some("team-p"), "p-2", json!({"user_id": "u"})).await.0 == 201
        })
        .await,
        "team-p is still held to its own ACL"
    );
}

#[tokio::test]
async fn the_tenant_map_is_followed_while_serving() {
    let mut h = MultiTenant::start().await;
    let c = Some("team-c");
    let (status, body) = h.create(c, "c-1", json!({"user_id": "c"})).await;
    assert_eq!((status, code_and_reason(&body).1), (401, "other_tenant"), "{body}");

    // A tenant added to the file is served within a bounded poll.
    std::fs::write(
        &h.map_path,
        MultiTenant::map_text(&h.own, &h.map_path, "  team-c: {}\n"),
    )
    .unwrap();
    assert!(
        eventually(BOUND, || async {
            h.create(c, "c-1", json!({"user_id": "c"})).await.0 == 201
        })
        .await,
        "team-c was not served after it was added to the map"
    );
    assert!(keys(&h.shared)
        .await
        .contains(&namespace(PREFIX, "team-c").context_key("c-1")));
    assert!(h.metrics().await.contains(r#"tenant="team-c""#));

    // A broken edit is refused; the last good map keeps serving.
    let rejected = h.map.rejected_edits();
    std::fs::write(
        &h.map_path,
        "version: 1\ntenants:\n  default: {}\n  team-c: {quota: 1}\n",
    )
    .unwrap();
    assert!(
        eventually(BOUND, || async { h.map.rejected_edits() > rejected }).await,
        "the broken edit was not looked at"
    );
    assert_eq!(h.get(c, "c-1").await.0, 200);
    assert_eq!(h.get(Some("team-a"), "c-1").await.0, 404);
    assert_eq!(h.tenants.served(), ["default", "team-a", "team-b", "team-c", "team-p"]);

    // Removed: refused as not served, and its part (store, sweeper, ACL watch) is dropped.
    let part = Arc::downgrade(&h.tenants.get("team-c").unwrap());
    std::fs::write(&h.map_path, MultiTenant::map_text(&h.own, &h.map_path, "")).unwrap();
    assert!(
        eventually(BOUND, || async { h.get(c, "c-1").await.0 == 401 }).await,
        "team-c is still served after it was removed"
    );
    let (_, body) = h.get(c, "c-1").await;
    assert_eq!(code_and_reason(&body).1, "other_tenant", "{body}");
    assert!(
        eventually(BOUND, || async { part.upgrade().is_none() }).await,
        "the removed tenant's part is still alive"
    );
    assert!(!h.metrics().await.contains(r#"tenant="team-c""#));

    // A changed placement rebuilds the part: team-b moves to a Redis of its
    // own and writes there from then on (its data is not moved); team-a's
    // part is left as it is.
    let moved = Redis::start();
    let team_a = h.tenants.get("team-a").unwrap();
    let before = Arc::downgrade(&h.tenants.get("team-b").unwrap());
    let edit = format!("  team-b:\n    redis: {}\n", moved.url());
    let text = MultiTenant::map_text(&h.own, &h.map_path, "").replace("  team-b: {}\n", &edit);
    std::fs::write(&h.map_path, text).unwrap();
    assert!(
        eventually(BOUND, || async { before.upgrade().is_none() }).await,
        "team-b's part was not rebuilt"
    );
    assert_eq!(h.create(Some("team-b"), "b-moved", json!({})).await.0, 201);
    assert!(keys(&moved)
        .await
        .contains(&namespace(PREFIX, "team-b").context_key("b-moved")));
    assert!(!keys(&h.shared).await.iter().any(|key| key.contains("b-moved")));
    assert!(Arc::ptr_eq(&team_a, &h.tenants.get("team-a").unwrap()));

    // An edit that drops the home tenant is not applied: once it is read,
    // a later edit (adding team-d) shows the follower got past it.
    std::fs::write(&h.map_path, "version: 1\ntenants:\n  team-a: {}\n").unwrap();
    let map = h.map.subscribe();
    assert!(
        eventually(BOUND, || async { !map.borrow().contains("default") }).await,
        "the edit was not read"
    );
    std::fs::write(
        &h.map_path,
        MultiTenant::map_text(&h.own, &h.map_path, "  team-d: {}\n"),
    )
    .unwrap();
    assert!(
        eventually(BOUND, || async { h.tenants.get("team-d").is_some() }).await,
        "team-d was not served"
    );
    assert_eq!(h.get(None, "ctx-none").await.0, 404);

    // Ready only when every part's store answers.
    h.shared.kill();
    let (status, ready) = h.call(None, Method::GET, "/readyz", None).await;
    assert_eq!(status, 503, "{ready}");
    let ready = ready.as_str().unwrap();
    assert!(
        ready.contains("tenant `default`") && ready.contains("tenant `team-d`"),
        "{ready}"
    );
    assert!(!ready.contains("tenant `team-a`"), "{ready}");
}

#[tokio::test]
async fn a_tenants_own_redis_is_trusted_as_the_shared_one_is() {
    // Both speak TLS only and require client certificates from one CA: the
    // --redis-ca-file and client identity given for --redis serve team-a's too.
    let pki = agent_reach_testkit::pki::Pki::new("context-tenants");
    let (shared, own) = (Redis::start_tls(&pki), Redis::start_tls(&pki));
    let dir = tempfile::tempdir().unwrap();
    let secret_path = dir.path().join("secret");
    std::fs::write(&secret_path, SECRET).unwrap();
    let acl_path = dir.path().join("acl.yaml");
    std::fs::write(&acl_path, ACL).unwrap();
    let map_path = dir.path().join("tenants.yaml");
    std::fs::write(
        &map_path,
        format!(
            "version: 1\ntenants:\n  default: {{}}\n  team-a:\n    redis: {}\n",
            own.url()
        ),
    )
    .unwrap();
    let client = pki.client("context");
    let mut problems = Vec::new();
    let files = agent_reach_stores::TlsFiles::read(
        "--redis",
        Some(pki.ca_file.as_path()),
        Some(&client.cert),
        Some(&client.key),
        &mut problems,
    );
    assert!(problems.is_empty(), "{problems:?}");
    let settings = Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: 1,
        store: StoreChoice::Redis {
            link: Box::new(
                agent_reach_stores::RedisLink::parse(&shared.url())
                    .unwrap()
                    .with_tls(files),
            ),
            namespace: Namespace {
                prefix: PREFIX.into(),
                tenant: "default".into(),
            },
            timeout: Duration::from_secs(2),
        },
        acl: acl_path,
        auth: AuthConfig::Hs256SecretFile(secret_path),
        listener_tls: None,
        service: ContextConfig::default(),
    };
    let map = TenantMapHandle::load_and_watch(&map_path).unwrap();
    let tenants = agent_reach_context::build_tenants(&settings, map).await.unwrap();
    for tenant in ["default", "team-a"] {
        let part = tenants.get(tenant).unwrap();
        part.store()
            .ping()
            .await
            .unwrap_or_else(|error| panic!("{tenant}: {error}"));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(agent_reach_context::serve_tenants(
        listener,
        tenants.clone(),
        None,
        std::future::pending(),
    ));
    let http = reqwest::Client::new();
    let created = http
        .post(format!("http://{addr}/v1/contexts"))
        .bearer_auth(token("intent_parser", Some("team-a")))
        .json(&json!({"context_id": "over-tls"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
    let ready = http.get(format!("http://{addr}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let home = http
        .get(format!("http://{addr}/v1/contexts/over-tls"))
        .bearer_auth(token("intent_parser", None))
        .send()
        .await
        .unwrap();
    assert_eq!(home.status(), 404, "the home tenant sees team-a's context");
}

#[tokio::test]
async fn run_serves_the_tenant_map_from_its_flags() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: agent_reach_context::ContextArgs,
    }
    use clap::Parser as _;

    let (shared, own) = (Redis::start(), Redis::start());
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    std::fs::write(path("secret"), SECRET).unwrap();
    std::fs::write(path("acl.yaml"), ACL).unwrap();
    std::fs::write(
        path("tenants.yaml"),
        format!(
            "version: 1\ntenants:\n  team-a:\n    redis: {}\n  team-b: {{}}\n",
            own.url()
        ),
    )
    .unwrap();
    let addr = format!("127.0.0.1:{}", agent_reach_testkit::free_port());
    let cli = Cli::try_parse_from([
        "context",
        "--listen",
        &addr,
        "--threads",
        "1",
        "--redis",
        &shared.url(),
        "--tenant",
        "team-b",
        "--tenant-map",
        &path("tenants.yaml"),
        "--acl",
        &path("acl.yaml"),
        "--auth-hs256-secret-file",
        &path("secret"),
    ])
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(agent_reach_context::run(cli.args, async {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let url = |path: &str| format!("http://{addr}{path}");
    assert!(
        eventually(BOUND, || async {
            http.get(url("/readyz"))
                .send()
                .await
                .is_ok_and(|answer| answer.status() == 200)
        })
        .await,
        "the context service did not become ready"
    );
    for tenant in ["team-a", "team-b"] {
        let created = http
            .post(url("/v1/contexts"))
            .bearer_auth(token("intent_parser", Some(tenant)))
            .json(&json!({"context_id": "from-run", "fields": {"user_id": tenant}}))
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), 201, "{tenant}");
        let view: Value = http
            .get(url("/v1/contexts/from-run"))
            .bearer_auth(token("intent_parser", Some(tenant)))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(view["fields"]["user_id"], tenant, "{view}");
    }
    // The home tenant is team-b: a token without a claim (`default`) is not served.
    let refused = http
        .get(url("/v1/contexts/from-run"))
        .bearer_auth(token("intent_parser", None))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    // The default --key-prefix, on team-a's own Redis.
    let team_a = namespace("agent-reach", "team-a");
    let mut expected = vec![team_a.context_key("from-run"), team_a.deadlines_key("from-run")];
    expected.sort();
    assert_eq!(keys(&own).await, expected);
    stop.send(()).unwrap();
    tokio::time::timeout(BOUND, served).await.unwrap().unwrap().unwrap();
}
