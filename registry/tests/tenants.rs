//! One registry, many tenants (issue 25, DESIGN §8 "Tenants"), against a real
//! etcd: with a tenant map, each tenant's registrations, reads and `Watch`
//! streams live in its own part under its own key prefix; a token can only
//! ever reach its own tenant's records; the map is followed live.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent_reach_access::AuthConfig;
use agent_reach_proto::registry as pb;
use agent_reach_proto::registry::registry_client::RegistryClient;
use agent_reach_registry::store::{EtcdStore, Store};
use agent_reach_registry::{RegistryConfig, Settings, StoreChoice, TtlBounds};
use agent_reach_testkit::Etcd;
use futures::StreamExt;
use serde_json::{json, Value};
use support::{authed, registration, wait_for, ACL, SECRET};
use tonic::transport::Channel;

const TWO_TENANTS: &str = "version: 1\ntenants:\n  team-a: {}\n  team-b: {}\n";

/// A registry serving the tenant map at `map` (home tenant `team-a`), built
/// and served in this test's runtime on a free loopback port.
struct MultiRegistry {
    addr: std::net::SocketAddr,
    registry: agent_reach_registry::Registry,
    dir: Arc<tempfile::TempDir>,
    http: reqwest::Client,
}

impl MultiRegistry {
    async fn start(etcd: &Etcd, map: &str) -> Self {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        std::fs::write(dir.path().join("acl.yaml"), ACL).unwrap();
        std::fs::write(dir.path().join("secret"), SECRET).unwrap();
        std::fs::write(dir.path().join("tenants.yaml"), map).unwrap();
        let settings = Settings {
            listen: "127.0.0.1:0".parse().unwrap(),
            store: StoreChoice::Etcd(vec![etcd.endpoint()]),
            acl: dir.path().join("acl.yaml"),
            auth: AuthConfig::Hs256SecretFile(dir.path().join("secret")),
            listener_tls: None,
            service: RegistryConfig {
                tenant: "team-a".into(),
                tenant_map: Some(dir.path().join("tenants.yaml")),
                ttl: TtlBounds {
                    min_s: 1,
                    max_s: 300,
                    default_s: 15,
                },
                max_body_bytes: 1024 * 1024,
                ..Default::default()
            },
        };
        let registry = agent_reach_registry::build(&settings).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(agent_reach_registry::serve(
            listener,
            registry.clone(),
            std::future::pending(),
        ));
        let this = Self {
            addr,
            registry,
            dir,
            http: reqwest::Client::new(),
        };
        assert!(
            wait_for(Duration::from_secs(10), || async {
                this.http
                    .get(this.url("/readyz"))
                    .send()
                    .await
                    .is_ok_and(|response| response.status() == 200)
            })
            .await,
            "the registry never became ready"
        );
        this
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Rewrites the tenant map (the registry polls it every second) in one
    /// rename, so no poll reads it half written.
    fn write_map(&self, text: &str) {
        let next = self.path("tenants.yaml.next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, self.path("tenants.yaml")).unwrap();
    }

    async fn send(&self, request: reqwest::RequestBuilder, token: &str) -> (u16, Value) {
        let response = request.bearer_auth(token).send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn register(&self, token: &str, body: &Value) -> (u16, Value) {
        self.send(self.http.post(self.url("/v1/agents")).json(body), token)
            .await
    }

    async fn get(&self, path: &str, token: &str) -> (u16, Value) {
        self.send(self.http.get(self.url(path)), token).await
    }

    async fn delete(&self, path: &str, token: &str) -> (u16, Value) {
        self.send(self.http.delete(self.url(path)), token).await
    }

    async fn heartbeat(&self, agent_id: &str, lease_id: &Value, token: &str) -> (u16, Value) {
        let request = self
            .http
            .put(self.url(&format!("/v1/agents/{agent_id}/heartbeat")))
            .json(&json!({ "lease_id": lease_id }));
        self.send(request, token).await
    }

    async fn grpc(&self) -> RegistryClient<Channel> {
        RegistryClient::connect(format!("http://{}", self.addr)).await.unwrap()
    }

    async fn metrics(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

fn token_of(name: &str, tenant: Option<&str>) -> String {
    agent_reach_access::token::issue_hs256_for(name, tenant, SECRET.as_bytes(), Duration::from_secs(600)).unwrap()
}

/// `order_query`'s registration of `agent_id`, reachable at `endpoint`.
fn registration_at(agent_id: &str, endpoint: &str) -> Value {
    let mut body = registration(agent_id, 15);
    body["endpoint"] = json!(endpoint);
    body
}

fn endpoints_of(resolved: &Value) -> Vec<String> {
    resolved["instances"]
        .as_array()
        .unwrap_or_else(|| panic!("no instances in {resolved}"))
        .iter()
        .map(|instance| instance["endpoint"].as_str().unwrap().to_string())
        .collect()
}

async fn next_event(stream: &mut tonic::Streaming<pb::WatchEvent>) -> pb::watch_event::Kind {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("no watch event within 10 s")
        .expect("watch ended")
        .expect("watch failed")
        .kind
        .expect("an event kind")
}

async fn keys_under(etcd: &Etcd, prefix: &str) -> Vec<String> {
    let store = EtcdStore::connect(&[etcd.endpoint()]).unwrap();
    let (kvs, _) = store.list(prefix).await.unwrap();
    kvs.into_iter().map(|kv| kv.key).collect()
}

/// etcd's own count of open watchers (its `/metrics`).
async fn etcd_watchers(etcd: &Etcd) -> i64 {
    let text = reqwest::get(format!("{}/metrics", etcd.endpoint()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("etcd_debugging_mvcc_watcher_total "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map(|value| value as i64)
        .expect("etcd_debugging_mvcc_watcher_total in etcd's metrics")
}

fn assert_refused(answer: &(u16, Value), reason: &str) {
    assert_eq!(answer.0, 401, "{}", answer.1);
    assert_eq!(answer.1["error"]["code"], "UNAUTHENTICATED", "{}", answer.1);
    assert_eq!(answer.1["error"]["details"]["reason"], reason, "{}", answer.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_with_the_same_names_never_see_each_other() {
    let etcd = Etcd::start();
    let registry = MultiRegistry::start(&etcd, TWO_TENANTS).await;
    assert_eq!(registry.registry.tenants(), ["team-a", "team-b"]);
    let a = token_of("order_query", Some("team-a"));
    let b = token_of("order_query", Some("team-b"));
    let a_reader = token_of("reader", Some("team-a"));
    let b_reader = token_of("reader", Some("team-b"));

    // The same agent id, name and capability in each tenant: A over HTTP, B over gRPC.
    let (status, body) = registry
        .register(&a, &registration_at("oq-1", "http://127.0.0.1:9101/invoke"))
        .await;
    assert_eq!(status, 201, "{body}");
    let a_lease = body["lease_id"].clone();
    let mut grpc = registry.grpc().await;
    let registered = grpc
        .register(authed(
            pb::RegisterRequest {
                agent_id: "oq-1".into(),
                name: "order_query".into(),
                endpoint: "http://127.0.0.1:9202/invoke".into(),
                ttl_s: 15,
                status: "ready".into(),
                capabilities: vec![pb::CapabilityDescriptor {
                    name: "order.query".into(),
                    version: "1.2.0".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            &b,
        ))
        .await
        .unwrap()
        .into_inner();
    let b_lease = registered.lease_id;
    assert_ne!(json!(b_lease), a_lease);

    // Each tenant resolves, lists and gets its own instance only, over both transports.
    let (status, resolved) = registry.get("/v1/capabilities/order.query", &a_reader).await;
    assert_eq!(status, 200, "{resolved}");
    assert_eq!(endpoints_of(&resolved), ["http://127.0.0.1:9101/invoke"]);
    let (_, resolved) = registry.get("/v1/capabilities/order.query", &b_reader).await;
    assert_eq!(endpoints_of(&resolved), ["http://127.0.0.1:9202/invoke"]);
    for (reader, endpoint) in [
        (&a_reader, "http://127.0.0.1:9101/invoke"),
        (&b_reader, "http://127.0.0.1:9202/invoke"),
    ] {
        let (_, listed) = registry.get("/v1/agents", reader).await;
        let agents = listed["agents"].as_array().unwrap();
        assert_eq!(agents.len(), 1, "{listed}");
        assert_eq!(agents[0]["endpoint"], endpoint);
        let resolved = grpc
            .resolve_capability(authed(
                pb::ResolveCapabilityRequest {
                    name: "order.query".into(),
                    version_req: String::new(),
                },
                reader,
            ))
            .await
            .unwrap()
            .into_inner();
        let endpoints: Vec<_> = resolved
            .instances
            .iter()
            .map(|resolved| resolved.instance.as_ref().unwrap().endpoint.clone())
            .collect();
        assert_eq!(endpoints, [endpoint]);
        let listed = grpc
            .list_agents(authed(pb::ListAgentsRequest::default(), reader))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.agents.len(), 1);
        assert_eq!(listed.agents[0].endpoint, endpoint);
    }

    // Each tenant's Watch: its own snapshot, then its own changes only.
    let watch = |token: String| {
        let mut grpc = grpc.clone();
        async move {
            grpc.watch(authed(
                pb::WatchRequest {
                    start_revision: 0,
                    paged: false,
                },
                &token,
            ))
            .await
            .unwrap()
            .into_inner()
        }
    };
    let mut a_watch = watch(a_reader.clone()).await;
    let mut b_watch = watch(b_reader.clone()).await;
    for (stream, endpoint) in [
        (&mut a_watch, "http://127.0.0.1:9101/invoke"),
        (&mut b_watch, "http://127.0.0.1:9202/invoke"),
    ] {
        match next_event(stream).await {
            pb::watch_event::Kind::Snapshot(snapshot) => {
                let endpoints: Vec<_> = snapshot.instances.iter().map(|i| i.endpoint.as_str()).collect();
                assert_eq!(endpoints, [endpoint]);
            }
            other => panic!("expected a snapshot, got {other:?}"),
        }
    }
    let (status, body) = registry
        .register(&b, &registration_at("oq-2", "http://127.0.0.1:9203/invoke"))
        .await;
    assert_eq!(status, 201, "{body}");
    match next_event(&mut b_watch).await {
        pb::watch_event::Kind::Added(instance) => assert_eq!(instance.agent_id, "oq-2"),
        other => panic!("expected B's oq-2, got {other:?}"),
    }
    // A's next event is A's own registration: B's oq-2 never reached it.
    let (status, body) = registry
        .register(&a, &registration_at("oq-3", "http://127.0.0.1:9103/invoke"))
        .await;
    assert_eq!(status, 201, "{body}");
    match next_event(&mut a_watch).await {
        pb::watch_event::Kind::Added(instance) => assert_eq!(instance.agent_id, "oq-3"),
        other => panic!("expected A's oq-3, got {other:?}"),
    }

    // Keys live under each tenant's prefix.
    assert_eq!(
        keys_under(&etcd, "/agent-reach/v1/team-a/").await,
        [
            "/agent-reach/v1/team-a/agents/oq-1",
            "/agent-reach/v1/team-a/agents/oq-3"
        ]
    );
    assert_eq!(
        keys_under(&etcd, "/agent-reach/v1/team-b/").await,
        [
            "/agent-reach/v1/team-b/agents/oq-1",
            "/agent-reach/v1/team-b/agents/oq-2"
        ]
    );

    // A's token cannot touch B's record: there is no way to name it. Renewing
    // B's lease through A is LEASE_EXPIRED; deregistering oq-1 removes A's own.
    let (status, body) = registry.heartbeat("oq-1", &json!(b_lease), &a).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("LEASE_EXPIRED")),
        "{body}"
    );
    let (status, body) = registry.delete("/v1/agents/oq-1", &a).await;
    assert_eq!(status, 204, "{body}");
    let (status, _) = registry.get("/v1/agents/oq-1", &a_reader).await;
    assert_eq!(status, 404);
    let (status, body) = registry.get("/v1/agents/oq-1", &b_reader).await;
    assert_eq!(
        (status, body["endpoint"].as_str()),
        (200, Some("http://127.0.0.1:9202/invoke"))
    );
    let (status, body) = registry.heartbeat("oq-1", &json!(b_lease), &b).await;
    assert_eq!(status, 200, "B's lease survived A's deregistration: {body}");
    let (status, body) = registry.heartbeat("oq-1", &a_lease, &a).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("LEASE_EXPIRED")),
        "{body}"
    );
    assert_eq!(
        keys_under(&etcd, "/agent-reach/v1/team-b/").await,
        [
            "/agent-reach/v1/team-b/agents/oq-1",
            "/agent-reach/v1/team-b/agents/oq-2"
        ]
    );

    // A tenant not served, and no tenant (`default`, not in the map): the home
    // part refuses them; a forged claim is refused by the part it names.
    for token in [token_of("order_query", Some("team-z")), token_of("order_query", None)] {
        assert_refused(&registry.get("/v1/agents", &token).await, "other_tenant");
        let refused = grpc
            .list_agents(authed(pb::ListAgentsRequest::default(), &token))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
        assert!(refused.message().contains("does not serve"), "{refused:?}");
    }
    let forged = agent_reach_access::token::issue_hs256_for(
        "order_query",
        Some("team-b"),
        b"another-secret-another-secret-0123456789",
        Duration::from_secs(600),
    )
    .unwrap();
    assert_refused(
        &registry
            .register(&forged, &registration_at("oq-9", "http://127.0.0.1:9209/invoke"))
            .await,
        "bad_signature",
    );
    let refused = grpc
        .watch(authed(
            pb::WatchRequest {
                start_revision: 0,
                paged: false,
            },
            &forged,
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    // One process, one exposition: each tenant's series carry its label.
    let metrics = registry.metrics().await;
    assert_eq!(
        metrics
            .matches("# TYPE agent_reach_registry_registrations_total counter")
            .count(),
        1,
        "{metrics}"
    );
    for tenant in ["team-a", "team-b"] {
        let series = format!(r#"agent_reach_registry_registrations_total{{outcome="ok",tenant="{tenant}"}} 2"#);
        assert!(metrics.contains(&series), "{series} missing from:\n{metrics}");
        let instances = format!(r#"agent_reach_registry_instances{{status="ready",tenant="{tenant}"}}"#);
        assert!(metrics.contains(&instances), "{instances} missing");
    }
    assert!(metrics.contains("agent_reach_registry_tenants 2"), "{metrics}");
    // Health and readiness answer for the whole process, without a token.
    let health = registry.http.get(registry.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let refused = registry.http.post(registry.url("/readyz")).send().await.unwrap();
    assert_eq!(refused.status(), 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_map_is_followed_live() {
    let etcd = Etcd::start();
    let registry = MultiRegistry::start(&etcd, "version: 1\ntenants:\n  team-a: {}\n").await;
    let a = token_of("order_query", Some("team-a"));
    let b = token_of("order_query", Some("team-b"));
    let b_reader = token_of("reader", Some("team-b"));
    assert_refused(&registry.get("/v1/agents", &b).await, "other_tenant");
    let (status, body) = registry
        .register(&a, &registration_at("oq-a", "http://127.0.0.1:9101/invoke"))
        .await;
    assert_eq!(status, 201, "{body}");

    // Added: served within a bounded poll.
    registry.write_map(TWO_TENANTS);
    assert!(
        wait_for(Duration::from_secs(10), || async {
            registry
                .register(&b, &registration_at("oq-b", "http://127.0.0.1:9202/invoke"))
                .await
                .0
                == 201
        })
        .await,
        "team-b was never served after it was added to the map"
    );

    // Removed: refused, and its background work (catalog sync, Watch streams) stops.
    let mut b_watch = registry
        .grpc()
        .await
        .watch(authed(
            pb::WatchRequest {
                start_revision: 0,
                paged: false,
            },
            &b_reader,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        next_event(&mut b_watch).await,
        pb::watch_event::Kind::Snapshot(_)
    ));
    let (_, record) = registry.get("/v1/agents/oq-b", &b).await;
    let (beats, beats_in) = tokio::sync::mpsc::channel(4);
    let mut b_answers = registry
        .grpc()
        .await
        .keep_alive(authed(tokio_stream::wrappers::ReceiverStream::new(beats_in), &b))
        .await
        .unwrap()
        .into_inner();
    beats
        .send(pb::KeepAliveRequest {
            agent_id: "oq-b".into(),
            lease_id: record["lease_id"].as_i64().unwrap(),
            ..Default::default()
        })
        .await
        .unwrap();
    let answer = b_answers.next().await.unwrap().unwrap();
    assert!(answer.error.is_none(), "{answer:?}");
    let before = etcd_watchers(&etcd).await;
    registry.write_map("version: 1\ntenants:\n  team-a: {}\n");
    assert!(
        wait_for(Duration::from_secs(10), || async {
            registry.get("/v1/agents", &b_reader).await.0 == 401
        })
        .await,
        "team-b was still served after its removal"
    );
    assert_refused(&registry.get("/v1/agents", &b_reader).await, "other_tenant");
    let ended = tokio::time::timeout(Duration::from_secs(10), b_watch.next())
        .await
        .expect("team-b's Watch stream did not end within 10 s");
    assert!(!matches!(ended, Some(Ok(_))), "{ended:?}");
    let ended = tokio::time::timeout(Duration::from_secs(10), b_answers.next())
        .await
        .expect("team-b's KeepAlive stream did not end within 10 s");
    assert!(!matches!(ended, Some(Ok(_))), "{ended:?}");
    // team-b's catalog watch and its Watch stream's store watch are gone from etcd.
    assert!(
        wait_for(Duration::from_secs(10), || async {
            etcd_watchers(&etcd).await <= before - 2
        })
        .await,
        "etcd still has {} watchers (was {before})",
        etcd_watchers(&etcd).await
    );
    assert!(registry.registry.service("team-b").is_none());
    // Its records stay in etcd (their leases expire unless another registry renews them).
    assert_eq!(
        keys_under(&etcd, "/agent-reach/v1/team-b/").await,
        ["/agent-reach/v1/team-b/agents/oq-b"]
    );

    // A broken edit keeps the last good map; so does one whose part cannot be
    // built (an ACL file that is not there) and one dropping the home tenant.
    let refusals = |metrics: &str| -> u64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(r#"agent_reach_registry_tenant_map_reloads_total{outcome="error"} "#))
            .and_then(|value| value.parse().ok())
            .unwrap_or(0)
    };
    for (refused, edit) in [
        (1, "version: 1\ntenants:\n  Team-A: [not valid\n".to_string()),
        (
            2,
            format!(
                "version: 1\ntenants:\n  team-a: {{}}\n  team-b:\n    acl: {}\n",
                registry.path("missing-acl.yaml").display()
            ),
        ),
        (3, "version: 1\ntenants:\n  team-b: {}\n".to_string()),
    ] {
        registry.write_map(&edit);
        assert!(
            wait_for(Duration::from_secs(10), || async {
                refusals(&registry.metrics().await) >= refused
            })
            .await,
            "edit {refused} was not refused:\n{}",
            registry.metrics().await
        );
        assert_eq!(registry.registry.tenants(), ["team-a"], "after edit {refused}");
        assert_refused(&registry.get("/v1/agents", &b_reader).await, "other_tenant");
        let (status, body) = registry.get("/v1/agents/oq-a", &a).await;
        assert_eq!(status, 200, "{body}");
    }

    // A changed `acl` rebuilds the part: the new policy applies, and the
    // tenant's records are all still there (the new catalog lists etcd).
    let strict = registry.path("acl-a.yaml");
    std::fs::write(&strict, "version: 1\nproviders: []\n").unwrap();
    let home_before = registry.registry.home();
    registry.write_map(&format!(
        "version: 1\ntenants:\n  team-a:\n    acl: {}\n",
        strict.display()
    ));
    assert!(
        wait_for(Duration::from_secs(10), || async {
            registry
                .register(&a, &registration_at("oq-a2", "http://127.0.0.1:9102/invoke"))
                .await
                .0
                == 403
        })
        .await,
        "team-a's new ACL never applied"
    );
    assert!(!Arc::ptr_eq(&home_before, &registry.registry.home()));
    let (status, body) = registry.get("/v1/agents/oq-a", &a).await;
    assert_eq!(
        (status, body["endpoint"].as_str()),
        (200, Some("http://127.0.0.1:9101/invoke"))
    );
    // The rebuilt part's catalog comes into sync with etcd on its own task;
    // readiness follows within a bounded poll.
    assert!(
        wait_for(Duration::from_secs(10), || async {
            registry
                .http
                .get(registry.url("/readyz"))
                .send()
                .await
                .unwrap()
                .status()
                == 200
        })
        .await,
        "the registry never became ready again after team-a's part was rebuilt"
    );
}

#[test]
fn the_tenant_map_is_checked_at_start() {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: agent_reach_registry::RegistryArgs,
    }
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let problems = |tenant: &str, map: &Path| -> String {
        let cli = Cli::try_parse_from([
            "registry",
            "--embedded-store",
            "--insecure-no-auth",
            "--tenant",
            tenant,
            "--tenant-map",
            map.to_str().unwrap(),
        ])
        .unwrap();
        cli.args.validate().err().unwrap_or_default().join("\n")
    };
    let good = write("good.yaml", TWO_TENANTS);
    assert_eq!(problems("team-a", &good), "");
    assert!(problems("default", &good).contains("--tenant `default` (the home tenant) is not in the tenant map"));
    let broken = write("broken.yaml", "version: 1\ntenants:\n  a:\n    quota: {}\n");
    assert!(problems("a", &broken).contains("unknown field `quota`"));
    assert!(problems("a", &dir.path().join("absent.yaml")).contains("cannot read the tenant map"));
}
