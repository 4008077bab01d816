//! One process, many tenants (DESIGN §8 "Tenants"): each tenant has its own
//! part of a service (the registry's catalog, the router's snapshot and
//! policy, the context service's store), and every request is handed to the
//! part of the tenant its bearer token names.
//!
//! The token is only *peeked* here ([`agent_reach_access::token::peek_tenant`]):
//! the part it picks verifies it in full and serves its own tenant only, so a
//! forged claim is refused there (`bad_signature`), and a token of a tenant
//! this process does not serve goes to the home part, which refuses it
//! (`other_tenant`). A request without a token (health, metrics, public
//! cards) goes to the home part, the process's `--tenant`.
//!
//! A process serving one tenant never peeks: the lookup is one load.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::extract::Request;
use axum::response::Response;

/// Each tenant's part, and the home tenant's (always present).
pub struct Parts<T> {
    table: ArcSwap<Table<T>>,
    /// The claim naming a token's tenant (`--auth-claim-tenant` with OIDC issuers).
    tenant_claim: Arc<str>,
}

struct Table<T> {
    by_name: HashMap<Arc<str>, T>,
    home: Arc<str>,
    home_part: T,
}

impl<T: Clone> Parts<T> {
    /// One tenant, `home`, served alone.
    pub fn single(home: &str, part: T) -> Self {
        let home: Arc<str> = home.into();
        Self {
            table: ArcSwap::from_pointee(Table {
                by_name: HashMap::from([(home.clone(), part.clone())]),
                home,
                home_part: part,
            }),
            tenant_claim: "tenant".into(),
        }
    }

    /// The parts of every tenant served; `home`'s must be among them.
    pub fn new(home: &str, parts: impl IntoIterator<Item = (String, T)>) -> Result<Self, String> {
        Ok(Self {
            table: ArcSwap::from_pointee(Table::new(home, parts)?),
            tenant_claim: "tenant".into(),
        })
    }

    /// Reads a token's tenant from `claim` (`AuthConfig::tenant_claim`), then `tenant`.
    pub fn with_tenant_claim(mut self, claim: &str) -> Self {
        self.tenant_claim = claim.into();
        self
    }

    /// Replaces every part at once (the tenant map changed); in-flight
    /// requests finish on the parts they picked.
    pub fn replace(&self, parts: impl IntoIterator<Item = (String, T)>) -> Result<(), String> {
        let home = self.table.load().home.clone();
        self.table.store(Arc::new(Table::new(&home, parts)?));
        Ok(())
    }

    /// The home tenant's name.
    pub fn home_name(&self) -> Arc<str> {
        self.table.load().home.clone()
    }

    /// The home tenant's part.
    pub fn home(&self) -> T {
        self.table.load().home_part.clone()
    }

    /// `tenant`'s part, if served.
    pub fn get(&self, tenant: &str) -> Option<T> {
        self.table.load().by_name.get(tenant).cloned()
    }

    /// Every tenant served with its part, by name.
    pub fn all(&self) -> Vec<(Arc<str>, T)> {
        let table = self.table.load();
        let mut all: Vec<_> = table
            .by_name
            .iter()
            .map(|(name, part)| (name.clone(), part.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// How many tenants are served.
    pub fn len(&self) -> usize {
        self.table.load().by_name.len()
    }

    /// Never: the home tenant is always served.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The part for a request with this `Authorization` value: its token's
    /// tenant's if served, else the home part (which refuses other tenants).
    pub fn for_authorization(&self, authorization: Option<&[u8]>) -> T {
        let table = self.table.load();
        if table.by_name.len() == 1 {
            return table.home_part.clone();
        }
        agent_reach_access::token::peek_tenant_claim(authorization, &self.tenant_claim)
            .and_then(|tenant| table.by_name.get(tenant.as_str()).cloned())
            .unwrap_or_else(|| table.home_part.clone())
    }
}

impl<T: Clone> Table<T> {
    fn new(home: &str, parts: impl IntoIterator<Item = (String, T)>) -> Result<Self, String> {
        let by_name: HashMap<Arc<str>, T> = parts.into_iter().map(|(name, part)| (name.into(), part)).collect();
        let home_part = by_name
            .get(home)
            .cloned()
            .ok_or_else(|| format!("the home tenant `{home}` (--tenant) must be in the tenant map"))?;
        Ok(Self {
            by_name,
            home: home.into(),
            home_part,
        })
    }
}

/// Routes that hand each request to its tenant's routes (see the module doc).
pub fn dispatch(parts: Arc<Parts<axum::Router>>) -> axum::Router {
    fn itself(routes: &axum::Router) -> axum::Router {
        routes.clone()
    }
    dispatch_with(parts, itself)
}

/// [`dispatch`] for parts that hold their routes among other things.
pub fn dispatch_with<T: Clone + Send + Sync + 'static>(
    parts: Arc<Parts<T>>,
    routes: fn(&T) -> axum::Router,
) -> axum::Router {
    axum::Router::new().fallback_service(Dispatch { parts, routes })
}

struct Dispatch<T> {
    parts: Arc<Parts<T>>,
    routes: fn(&T) -> axum::Router,
}

impl<T> Clone for Dispatch<T> {
    fn clone(&self) -> Self {
        Self {
            parts: self.parts.clone(),
            routes: self.routes,
        }
    }
}

impl<T: Clone + Send + Sync + 'static> tower_service::Service<Request> for Dispatch<T> {
    type Response = Response;
    type Error = Infallible;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let authorization = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(|value| value.as_bytes());
        let mut routes = (self.routes)(&self.parts.for_authorization(authorization));
        Box::pin(async move { tower_service::Service::call(&mut routes, request).await })
    }
}

/// A metrics registry for one tenant's part: every series it holds carries
/// the label `tenant` (DESIGN §8; the map's names bound the cardinality).
pub fn metrics_registry(tenant: &str) -> prometheus::Registry {
    let labels = HashMap::from([("tenant".to_string(), tenant.to_string())]);
    // Only an invalid label name fails, and `tenant` is valid.
    prometheus::Registry::new_custom(None, Some(labels)).unwrap_or_default()
}

/// `/metrics` for several registries (the process's and each tenant's): one
/// family per name, its series from every registry, so the exposition stays
/// valid (a name's `# TYPE` appears once).
pub fn render_metrics<'a>(registries: impl IntoIterator<Item = &'a prometheus::Registry>) -> String {
    let mut families: std::collections::BTreeMap<String, prometheus::proto::MetricFamily> =
        std::collections::BTreeMap::new();
    for registry in registries {
        for mut family in registry.gather() {
            match families.entry(family.get_name().to_string()) {
                std::collections::btree_map::Entry::Vacant(slot) => {
                    slot.insert(family);
                }
                std::collections::btree_map::Entry::Occupied(mut slot) => {
                    let more = family.take_metric();
                    slot.get_mut().mut_metric().extend(more);
                }
            }
        }
    }
    let families: Vec<_> = families.into_values().collect();
    prometheus::TextEncoder::new()
        .encode_to_string(&families)
        .unwrap_or_else(|error| format!("# metrics encoding failed: {error}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(tenant: Option<&str>) -> String {
        let token = agent_reach_access::token::issue_hs256_for(
            "caller",
            tenant,
            b"0123456789abcdef0123456789abcdef",
            std::time::Duration::from_secs(60),
        )
        .unwrap();
        format!("Bearer {token}")
    }

    #[test]
    fn an_oidc_tenant_claim_routes_as_configured_and_the_own_tokens_claim_still_does() {
        use base64::Engine as _;
        let unsigned = |claims: serde_json::Value| {
            let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims.to_string());
            format!("Bearer e30.{payload}.c2ln")
        };
        let parts = Parts::new("default", [("default".to_string(), 0), ("team-a".to_string(), 1)])
            .unwrap()
            .with_tenant_claim("org.id");
        let nested = unsigned(serde_json::json!({"sub": "x", "org": {"id": "team-a"}}));
        assert_eq!(parts.for_authorization(Some(nested.as_bytes())), 1);
        let dotted = unsigned(serde_json::json!({"sub": "x", "org.id": "team-a"}));
        assert_eq!(parts.for_authorization(Some(dotted.as_bytes())), 1);
        assert_eq!(parts.for_authorization(Some(bearer(Some("team-a")).as_bytes())), 1);
        let other = unsigned(serde_json::json!({"sub": "x", "org": {"id": 7}}));
        assert_eq!(parts.for_authorization(Some(other.as_bytes())), 0);
    }

    #[test]
    fn a_request_reaches_its_tenants_part_or_the_home_one() {
        let parts = Parts::new("default", [("default".to_string(), 0), ("team-a".to_string(), 1)]).unwrap();
        assert_eq!(parts.for_authorization(Some(bearer(Some("team-a")).as_bytes())), 1);
        assert_eq!(parts.for_authorization(Some(bearer(None).as_bytes())), 0);
        assert_eq!(parts.for_authorization(Some(bearer(Some("team-z")).as_bytes())), 0);
        assert_eq!(parts.for_authorization(None), 0);
        assert_eq!(parts.get("team-a"), Some(1));
        parts.replace([("default".to_string(), 0)]).unwrap();
        assert_eq!(parts.for_authorization(Some(bearer(Some("team-a")).as_bytes())), 0);
        assert!(parts
            .replace([("team-a".to_string(), 1)])
            .unwrap_err()
            .contains("home tenant"));
        assert_eq!(parts.all().len(), 1);
        assert!(Parts::new("x", [("y".to_string(), 0)]).is_err());
    }

    #[test]
    fn each_tenants_series_carry_its_label_in_one_family() {
        let registries: Vec<_> = ["team-a", "team-b"]
            .iter()
            .map(|tenant| metrics_registry(tenant))
            .collect();
        for (registry, count) in registries.iter().zip([3, 5]) {
            let counter =
                prometheus::IntCounterVec::new(prometheus::Opts::new("calls_total", "Calls."), &["outcome"]).unwrap();
            registry.register(Box::new(counter.clone())).unwrap();
            counter.with_label_values(&["ok"]).inc_by(count);
        }
        let text = render_metrics(&registries);
        assert_eq!(text.matches("# TYPE calls_total counter").count(), 1, "{text}");
        assert!(
            text.contains(r#"calls_total{outcome="ok",tenant="team-a"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"calls_total{outcome="ok",tenant="team-b"} 5"#),
            "{text}"
        );
    }
}
