//! OIDC issuers (issue 39, DESIGN §5.3.1) against a real OpenID provider
//! (Node's `oidc-provider`, started by testkit on a loopback port): its
//! access tokens verified by the router with the keys it publishes, the
//! caller named by the mapped claim, a key rotation followed without a
//! restart; another issuer's token, another audience's, an expired one,
//! `alg: none` and HS256 "signed" with the issuer's public key refused with
//! their reasons; `/.well-known/oauth-protected-resource` and the
//! `WWW-Authenticate` pointer on a 401; the registry taking the same flags.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use agent_reach_access::oidc::{ClaimNames, OidcIssuer, OidcSettings};
use agent_reach_access::{AuthConfig, KeyFile, OidcAuth};
use agent_reach_testkit::oidc::{OidcClient, OidcProvider};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::{json, Value};
use support::*;

/// The provider's clients: each names its agent in `agent_name` (the router
/// maps that claim to the caller); `svc-7f3a` is not a name the ACL knows.
fn clients() -> Vec<OidcClient> {
    let tester = json!({"agent_name": CALLER, "groups": ["support", "nlp"]});
    vec![
        OidcClient::new("svc-7f3a", "RS256").claims(tester.clone()),
        OidcClient::new("svc-es", "ES256").claims(tester.clone()),
        OidcClient::new("svc-ed", "EdDSA").claims(tester.clone()),
        OidcClient::new("svc-short", "RS256").claims(tester).ttl_s(1),
        OidcClient::new("svc-nameless", "RS256"),
    ]
}

/// A router of `cluster` accepting `provider`'s tokens for its own URL
/// (beside the cluster's HS256 secret), with the clock skew `skew_s`.
struct OidcRouter {
    addr: SocketAddr,
    resource: String,
    _router: agent_reach_router::Router,
}

impl OidcRouter {
    async fn start(cluster: &Cluster, provider: &OidcProvider, skew_s: u64) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let resource = format!("http://{addr}");
        let settings = OidcSettings {
            issuers: vec![OidcIssuer {
                issuer: provider.issuer(),
                audiences: vec![resource.clone()],
            }],
            claims: ClaimNames {
                name: "agent_name".into(),
                ..ClaimNames::default()
            },
            clock_skew_s: skew_s,
        };
        let auth = AuthConfig::Oidc(OidcAuth::new(
            settings,
            Some(KeyFile::Hs256SecretFile(cluster.secret_path.clone())),
        ));
        let router_settings = agent_reach_router::Settings::new(
            "127.0.0.1:0".parse().expect("addr"),
            cluster.registry.url(),
            auth,
            cluster.acl_path.clone(),
        );
        let router = agent_reach_router::build(&router_settings).await.expect("router build");
        tokio::spawn(agent_reach_router::serve(
            listener,
            router.clone(),
            std::future::pending(),
        ));
        let routed = router.clone();
        let ready = eventually(Duration::from_secs(20), || {
            let routed = routed.clone();
            async move { !routed.routed_agent_ids().is_empty() }
        })
        .await;
        assert!(ready, "the OIDC router never saw the agent");
        Self {
            addr,
            resource,
            _router: router,
        }
    }

    async fn invoke(&self, cluster: &Cluster, token: Option<&str>) -> (u16, Value) {
        invoke_at(&cluster.client, self.addr, token, &order("SO-1")).await
    }

    /// The refusal's reason, asserting it is a 401 `UNAUTHENTICATED`.
    async fn refusal(&self, cluster: &Cluster, token: &str) -> String {
        let (status, body) = self.invoke(cluster, Some(token)).await;
        assert_eq!(status, 401, "{body}");
        assert_eq!(body["error"]["code"], "UNAUTHENTICATED", "{body}");
        body["error"]["details"]["reason"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Invokes with `token` until it succeeds (the keys are fetched in the background).
    async fn eventually_accepted(&self, cluster: &Cluster, token: &str) -> bool {
        eventually(Duration::from_secs(15), || async {
            let (status, body) = self.invoke(cluster, Some(token)).await;
            // Until then, only "I do not have that key yet".
            assert!(
                status == 200 || body["error"]["details"]["reason"] == "unknown_key",
                "{status}: {body}"
            );
            status == 200
        })
        .await
    }
}

fn header_of(token: &str) -> Value {
    let header = token.split('.').next().expect("a JWT");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).expect("base64url")).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_providers_tokens_are_verified_and_its_key_rotation_followed_without_a_restart() {
    let provider = OidcProvider::start(&clients());
    let cluster = Cluster::start().await;
    let _agent = cluster.agent(AgentSpec::new("order_query-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["order_query-1"]).await;
    let router = OidcRouter::start(&cluster, &provider, 0).await;

    // RS256, ES256 and EdDSA tokens, the caller named by `agent_name`: the ACL lets `tester`
    // call, and knows nothing of the client ids.
    for client in ["svc-7f3a", "svc-es", "svc-ed"] {
        let token = provider.token(client, &router.resource);
        assert!(router.eventually_accepted(&cluster, &token).await, "{client}'s token");
        let (status, body) = router.invoke(&cluster, Some(&token)).await;
        assert_eq!(
            (status, body["agent_id"].as_str()),
            (200, Some("order_query-1")),
            "{body}"
        );
    }
    let before = provider.token("svc-7f3a", &router.resource);
    assert_eq!(header_of(&before)["kid"], "rsa-1");
    // The service's own HS256 tokens still work beside the issuer.
    assert_eq!(router.invoke(&cluster, Some(&token(CALLER))).await.0, 200);
    // A token without the mapped claim names no caller.
    let nameless = provider.token("svc-nameless", &router.resource);
    assert_eq!(router.refusal(&cluster, &nameless).await, "invalid");

    // Rotation: new keys sign from now on, the old stay published for a while. The router
    // learns the new `kid` from the issuer's JWKS without a restart; the old token still passes.
    assert_eq!(
        provider.rotate(false),
        ["rsa-2", "ec-2", "ed-2", "rsa-1", "ec-1", "ed-1"]
    );
    let rotated = provider.token("svc-7f3a", &router.resource);
    assert_eq!(header_of(&rotated)["kid"], "rsa-2");
    assert!(
        router.eventually_accepted(&cluster, &rotated).await,
        "the rotated key is followed"
    );
    assert_eq!(router.invoke(&cluster, Some(&before)).await.0, 200);
    // The old keys retired: a new token of the third generation is followed the same way.
    assert_eq!(provider.rotate(true), ["rsa-3", "ec-3", "ed-3"]);
    let third = provider.token("svc-ed", &router.resource);
    assert!(router.eventually_accepted(&cluster, &third).await);
    // A token naming a kid the issuer never published: refused, and the refetch it asks
    // for does not let it in.
    let forged_kid = {
        let mut parts: Vec<String> = third.split('.').map(str::to_string).collect();
        parts[0] = URL_SAFE_NO_PAD.encode(json!({"alg": "EdDSA", "kid": "ed-99"}).to_string());
        parts.join(".")
    };
    assert_eq!(router.refusal(&cluster, &forged_kid).await, "unknown_key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_issuers_audiences_expired_tokens_and_algorithm_confusion_are_refused() {
    let provider = OidcProvider::start(&clients());
    let stranger = OidcProvider::start(&clients());
    let cluster = Cluster::start().await;
    let _agent = cluster.agent(AgentSpec::new("order_query-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["order_query-1"]).await;
    let router = OidcRouter::start(&cluster, &provider, 0).await;
    let good = provider.token("svc-7f3a", &router.resource);
    assert!(router.eventually_accepted(&cluster, &good).await);

    // Another issuer (the same software, its own keys), for this very router.
    let theirs = stranger.token("svc-7f3a", &router.resource);
    assert_eq!(router.refusal(&cluster, &theirs).await, "unknown_issuer");
    // This issuer, another audience.
    let elsewhere = provider.token("svc-7f3a", "https://billing.example.com");
    assert_eq!(router.refusal(&cluster, &elsewhere).await, "wrong_audience");
    // Expired: a one-second token, no skew allowed.
    let short = provider.token("svc-short", &router.resource);
    let expired = eventually(Duration::from_secs(10), || async {
        let (status, body) = router.invoke(&cluster, Some(&short)).await;
        status == 401 && body["error"]["details"]["reason"] == "expired"
    })
    .await;
    assert!(expired, "the short-lived token expires");

    // `alg: none`: the issuer's token, unsigned.
    let parts: Vec<&str> = good.split('.').collect();
    let kid = header_of(&good)["kid"].as_str().expect("kid").to_string();
    let unsigned = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(json!({"alg": "none", "typ": "at+jwt", "kid": kid}).to_string()),
        parts[1]
    );
    assert_eq!(router.refusal(&cluster, &unsigned).await, "unsupported_algorithm");
    // HS256 "signed" with the issuer's own RSA public key (its JWK, and its modulus) as the secret.
    let jwks = provider.jwks();
    let rsa = jwks["keys"]
        .as_array()
        .and_then(|keys| keys.iter().find(|key| key["kid"] == kid))
        .expect("the RSA key");
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    for secret in [
        rsa.to_string().into_bytes(),
        URL_SAFE_NO_PAD.decode(rsa["n"].as_str().unwrap()).unwrap(),
    ] {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some(kid.clone());
        let confused =
            jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_secret(&secret)).unwrap();
        assert_eq!(router.refusal(&cluster, &confused).await, "unsupported_algorithm");
    }
    // The issuer's token with its claims edited: the signature no longer holds.
    let mut edited = claims.clone();
    edited["agent_name"] = json!("ops");
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(edited.to_string()),
        parts[2]
    );
    assert_eq!(router.refusal(&cluster, &tampered).await, "bad_signature");
    // Refusals are never cached: the good token still passes.
    assert_eq!(router.invoke(&cluster, Some(&good)).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_protected_resource_metadata_names_the_issuer_and_every_401_points_at_it() {
    let provider = OidcProvider::start(&clients());
    let cluster = Cluster::start().await;
    let _agent = cluster.agent(AgentSpec::new("order_query-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["order_query-1"]).await;
    let router = OidcRouter::start(&cluster, &provider, 0).await;
    let metadata_url = format!("{}/.well-known/oauth-protected-resource", router.resource);

    let response = cluster.client.get(&metadata_url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let metadata: Value = response.json().await.unwrap();
    assert_eq!(metadata["resource"], router.resource.as_str());
    assert_eq!(metadata["authorization_servers"], json!([provider.issuer()]));
    assert_eq!(metadata["bearer_methods_supported"], json!(["header"]));
    // The issuer it names is a real one: its discovery document says so.
    let discovery: Value = cluster
        .client
        .get(format!("{}/.well-known/openid-configuration", provider.issuer()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(discovery["issuer"], provider.issuer().as_str());

    // No token: the challenge without an error; a bad one: `invalid_token`. On the front
    // door's hot route (POST /v1/invoke) and on the axum routes (MCP, broadcast) alike.
    let pointer = format!("resource_metadata=\"{metadata_url}\"");
    let challenges = [
        cluster
            .client
            .post(format!("{}/v1/invoke", router.resource))
            .json(&order("SO-1")),
        cluster
            .client
            .post(format!("{}/mcp", router.resource))
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})),
        cluster
            .client
            .post(format!("{}/v1/broadcast", router.resource))
            .json(&order("SO-1")),
    ];
    for request in challenges {
        let without = request.try_clone().unwrap().send().await.unwrap();
        assert_eq!(without.status(), 401);
        let value = without.headers()["www-authenticate"].to_str().unwrap().to_string();
        assert!(value.starts_with("Bearer ") && value.contains(&pointer), "{value}");
        assert!(!value.contains("error="), "{value}");
        let with = request.bearer_auth("not.a.token").send().await.unwrap();
        assert_eq!(with.status(), 401);
        let value = with.headers()["www-authenticate"].to_str().unwrap().to_string();
        assert!(
            value.contains("error=\"invalid_token\"") && value.contains(&pointer),
            "{value}"
        );
    }

    // A router without an issuer serves no metadata, and its 401s carry the bare challenge.
    let plain = cluster
        .client
        .get(cluster.url("/.well-known/oauth-protected-resource"))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 404);
    let refused = cluster
        .client
        .post(cluster.url("/v1/invoke"))
        .json(&order("SO-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    assert_eq!(refused.headers()["www-authenticate"], "Bearer realm=\"agent-reach\"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_takes_the_same_flags_and_an_agent_registers_with_its_providers_token() {
    let provider = OidcProvider::start(&[OidcClient::new("order_query", "ES256")]);
    let etcd = agent_reach_testkit::Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    let acl = dir.path().join("acl.yaml");
    std::fs::write(&acl, ACL).unwrap();
    let issuer = provider.issuer();
    let registry = start_registry_with(
        &etcd.endpoint(),
        &secret,
        &acl,
        &[
            "--listen",
            "127.0.0.1:0",
            "--auth-oidc-issuer",
            &issuer,
            "--auth-oidc-audience",
            "urn:agent-reach:registry",
        ],
    );
    let client = reqwest::Client::new();
    let register = |token: String| {
        client
            .post(format!("{}/v1/agents", registry.url()))
            .bearer_auth(token)
            .json(&json!({
                "agent_id": "order_query-1", "name": "order_query", "endpoint": "http://127.0.0.1:9",
                "capabilities": [{"name": "order.query", "version": "1.0.0"}]
            }))
            .send()
    };
    // `sub` (the default name claim) is the client id, `order_query`: it registers as itself.
    let token = provider.token("order_query", "urn:agent-reach:registry");
    let registered = eventually(Duration::from_secs(15), || async {
        register(token.clone()).await.unwrap().status() == 201
    })
    .await;
    assert!(registered, "the registry accepts the provider's token");
    let wrong = register(provider.token("order_query", "https://router.example.com"))
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let body: Value = wrong.json().await.unwrap();
    assert_eq!(body["error"]["details"]["reason"], "wrong_audience", "{body}");
}
