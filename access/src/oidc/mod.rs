//! Tokens of OpenID Connect issuers (DESIGN §5.3.1): the company's own
//! identity provider (Keycloak, Okta, Entra, Dex, ...) issues the callers'
//! access tokens, and every service verifies them against the issuer's
//! published keys ([`fetch`]: discovery and JWKS, refreshed as keys rotate;
//! [`keys`]: which key verifies which algorithm).
//!
//! A token is checked, in this order: its header's algorithm is an
//! asymmetric one ([`keys::Alg`]: never `none`, never HS*), its `kid` names
//! a key the issuer published, its signature, then its claims: `iss` is the
//! issuer, `exp` has not passed and `nbf` has (both with the configured clock
//! skew), `aud` names one of the audiences configured for that issuer. The
//! caller's name, tenant and groups are read from the claims [`ClaimNames`]
//! names.

mod fetch;
mod keys;

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

use crate::token::{check_tenant_name, AuthError, Caller, DEFAULT_TENANT};
use fetch::IssuerKeys;
use keys::Alg;
pub use keys::ACCEPTED_ALGORITHMS;

/// Seconds of clock skew allowed on `exp` and `nbf` unless configured.
pub const DEFAULT_CLOCK_SKEW_S: u64 = 60;
/// The most skew that may be configured.
pub const MAX_CLOCK_SKEW_S: u64 = 600;
/// The most groups a token may list.
const MAX_GROUPS: usize = 1024;

/// The issuers a service accepts and how their claims are read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OidcSettings {
    pub issuers: Vec<OidcIssuer>,
    pub claims: ClaimNames,
    pub clock_skew_s: u64,
}

/// One issuer: its identifier (exactly as its tokens' `iss` and its
/// discovery document name it) and the audiences its tokens may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcIssuer {
    pub issuer: String,
    pub audiences: Vec<String>,
}

/// Which claims name the caller, its tenant and its groups. A name with dots
/// that is not itself a claim is read as a path into nested objects
/// (`realm_access.roles`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimNames {
    pub name: String,
    pub tenant: String,
    pub groups: String,
}

impl Default for ClaimNames {
    fn default() -> Self {
        Self {
            name: "sub".to_string(),
            tenant: "tenant".to_string(),
            groups: "groups".to_string(),
        }
    }
}

/// An issuer URL (`--auth-oidc-issuer`, a discovered `jwks_uri`):
/// `https://`, or `http://` only on a loopback address (a provider on the
/// same machine, tests), with a host and no query or fragment.
pub fn check_issuer_url(value: &str) -> Result<(), String> {
    let url = url::Url::parse(value).map_err(|error| format!("`{}` is not a URL: {error}", value.escape_debug()))?;
    let loopback = match url.host() {
        Some(url::Host::Domain(domain)) => domain == "localhost",
        Some(url::Host::Ipv4(address)) => address.is_loopback(),
        Some(url::Host::Ipv6(address)) => address.is_loopback(),
        None => return Err(format!("`{value}` names no host")),
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        _ => {
            return Err(format!(
                "`{value}` must be https:// (http:// only on a loopback address)"
            ))
        }
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("`{value}` must have no query or fragment"));
    }
    Ok(())
}

/// The key caches of a config's issuers, in the config's order (made once,
/// shared by every authenticator loaded from the config).
#[derive(Clone)]
pub(crate) struct SharedKeys(Vec<Arc<IssuerKeys>>);

impl std::fmt::Debug for SharedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|keys| keys.issuer())).finish()
    }
}

/// A service's OIDC issuers, ready to verify.
pub(crate) struct Issuers {
    issuers: Vec<Issuer>,
    claims: ClaimNames,
    skew_s: u64,
}

struct Issuer {
    audiences: Vec<String>,
    keys: Arc<IssuerKeys>,
}

impl Issuers {
    /// One issuer with `keys` and `audiences` (unit tests).
    #[cfg(test)]
    pub(crate) fn one(keys: Arc<IssuerKeys>, audiences: &[&str], claims: ClaimNames, skew_s: u64) -> Self {
        Self {
            issuers: vec![Issuer {
                audiences: audiences.iter().map(|aud| aud.to_string()).collect(),
                keys,
            }],
            claims,
            skew_s,
        }
    }

    /// The issuers of `settings`, with the key caches `shared` holds (made
    /// now, their refreshers started, the first time).
    pub(crate) fn load(settings: &OidcSettings, shared: &std::sync::OnceLock<SharedKeys>) -> Result<Self, String> {
        let keys = match shared.get() {
            Some(keys) => keys.clone(),
            None => {
                let made = SharedKeys(
                    settings
                        .issuers
                        .iter()
                        .map(|issuer| IssuerKeys::start(&issuer.issuer))
                        .collect::<Result<_, _>>()?,
                );
                // Loads run one after another at start-up; should two race, both use the first.
                shared.get_or_init(|| made).clone()
            }
        };
        let issuers = settings
            .issuers
            .iter()
            .zip(keys.0)
            .map(|(issuer, keys)| Issuer {
                audiences: issuer.audiences.clone(),
                keys,
            })
            .collect();
        Ok(Self {
            issuers,
            claims: settings.claims.clone(),
            skew_s: settings.clock_skew_s,
        })
    }

    /// Whether `iss` is one of these issuers.
    pub(crate) fn names(&self, iss: &str) -> bool {
        self.issuer(iss).is_some()
    }

    /// The clock skew allowed on `exp` and `nbf`, seconds.
    pub(crate) fn skew_s(&self) -> u64 {
        self.skew_s
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> {
        self.issuers.iter().map(|issuer| issuer.keys.issuer())
    }

    fn issuer(&self, iss: &str) -> Option<&Issuer> {
        self.issuers.iter().find(|issuer| issuer.keys.issuer() == iss)
    }

    /// Verifies `token`, whose (unverified) `iss` is `iss`, at `now_s`:
    /// the caller and the token's `exp`.
    pub(crate) fn verify(&self, iss: &str, token: &str, now_s: u64) -> Result<(Caller, u64), AuthError> {
        let issuer = self.issuer(iss).ok_or_else(|| AuthError::UnknownIssuer(shown(iss)))?;
        let (message, signature) = token
            .rsplit_once('.')
            .ok_or_else(|| AuthError::Malformed("a JWT has three parts".to_string()))?;
        let header: Header = decode_part(message.split('.').next().unwrap_or_default(), "header")?;
        if header.crit.is_some() {
            return Err(AuthError::Invalid(
                "the token's header names critical extensions (`crit`) this service does not implement".to_string(),
            ));
        }
        let alg = Alg::parse(&header.alg).ok_or_else(|| AuthError::UnsupportedAlgorithm(shown(&header.alg)))?;
        let keys = issuer.keys.current();
        let Some(key) = keys.find(header.kid.as_deref(), alg) else {
            return Err(match header.kid.as_deref() {
                Some(kid) if keys.knows(kid) => AuthError::UnknownKey(format!(
                    "the key `{}` of issuer `{iss}` does not verify `{}`",
                    shown(kid),
                    header.alg
                )),
                _ if !keys.fetched => {
                    issuer.keys.ask_refetch();
                    AuthError::UnknownKey(format!(
                        "the keys of issuer `{iss}` have not been fetched yet; try again shortly"
                    ))
                }
                Some(kid) => {
                    // Perhaps a key the issuer has just begun to use: fetched again soon.
                    issuer.keys.ask_refetch();
                    AuthError::UnknownKey(format!(
                        "issuer `{iss}` has published no key `{}` (its keys are being fetched again; \
                         try again shortly if it has just rotated them)",
                        shown(kid)
                    ))
                }
                None => AuthError::UnknownKey(format!(
                    "the token names no `kid`, and issuer `{iss}` has not exactly one `{}` key",
                    header.alg
                )),
            });
        };
        match jsonwebtoken::crypto::verify(signature, message.as_bytes(), &key.decoding, alg.jwt()) {
            Ok(true) => {}
            Ok(false) => return Err(AuthError::BadSignature),
            Err(error) => return Err(AuthError::Malformed(format!("signature: {error}"))),
        }
        drop(keys);
        let payload = message.split('.').nth(1).unwrap_or_default();
        let claims: serde_json::Map<String, Value> = decode_part(payload, "claims")?;
        self.check_claims(issuer, iss, &claims, now_s)
    }

    fn check_claims(
        &self,
        issuer: &Issuer,
        iss: &str,
        claims: &serde_json::Map<String, Value>,
        now_s: u64,
    ) -> Result<(Caller, u64), AuthError> {
        if claims.get("iss").and_then(Value::as_str) != Some(iss) {
            return Err(AuthError::UnknownIssuer(shown(iss)));
        }
        let exp = time_claim(claims, "exp")?.ok_or_else(|| AuthError::Invalid("the token has no `exp`".to_string()))?;
        if now_s > exp.saturating_add(self.skew_s) {
            return Err(AuthError::Expired);
        }
        if let Some(nbf) = time_claim(claims, "nbf")? {
            if now_s.saturating_add(self.skew_s) < nbf {
                return Err(AuthError::NotYetValid);
            }
        }
        let audiences: Vec<&str> = match claims.get("aud") {
            Some(Value::String(one)) => vec![one.as_str()],
            Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !audiences
            .iter()
            .any(|aud| issuer.audiences.iter().any(|want| want == aud))
        {
            return Err(AuthError::WrongAudience {
                named: audiences.iter().take(4).map(|aud| shown(aud)).collect(),
                expected: issuer.audiences.clone(),
            });
        }
        let name = match claim(claims, &self.claims.name) {
            Some(Value::String(name)) if !name.is_empty() => name.as_str(),
            _ => {
                return Err(AuthError::Invalid(format!(
                    "the token has no string claim `{}` to name the caller (--auth-claim-name)",
                    self.claims.name
                )))
            }
        };
        let tenant: Arc<str> = match claim(claims, &self.claims.tenant) {
            None | Some(Value::Null) => DEFAULT_TENANT.into(),
            Some(Value::String(tenant)) => {
                check_tenant_name(tenant)
                    .map_err(|why| AuthError::Invalid(format!("`{}` claim: {why}", self.claims.tenant)))?;
                tenant.as_str().into()
            }
            Some(_) => {
                return Err(AuthError::Invalid(format!(
                    "the `{}` claim (--auth-claim-tenant) must be a string",
                    self.claims.tenant
                )))
            }
        };
        let groups = groups_of(claim(claims, &self.claims.groups), &self.claims.groups)?;
        Ok((
            Caller::Agent {
                name: name.into(),
                tenant,
                groups,
            },
            exp,
        ))
    }
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
    crit: Option<Value>,
}

fn decode_part<T: serde::de::DeserializeOwned>(part: &str, what: &str) -> Result<T, AuthError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| AuthError::Malformed(format!("the token's {what} is not base64url")))?;
    serde_json::from_slice(&bytes).map_err(|_| AuthError::Malformed(format!("the token's {what} is not a JSON object")))
}

/// The claim `name`, or, when there is none and the name has dots, the
/// value at that path through nested objects.
pub(crate) fn claim<'a>(claims: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a Value> {
    if let Some(value) = claims.get(name) {
        return Some(value);
    }
    let mut segments = name.split('.');
    let mut value = claims.get(segments.next()?)?;
    for segment in segments {
        value = value.as_object()?.get(segment)?;
    }
    Some(value)
}

/// A NumericDate claim (RFC 7519 §2), whole seconds.
fn time_claim(claims: &serde_json::Map<String, Value>, name: &str) -> Result<Option<u64>, AuthError> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::Number(number)) => number
            .as_u64()
            .or_else(|| {
                number
                    .as_f64()
                    .filter(|seconds| *seconds >= 0.0)
                    .map(|seconds| seconds as u64)
            })
            .map(Some)
            .ok_or_else(|| AuthError::Invalid(format!("`{name}` is not a time"))),
        Some(_) => Err(AuthError::Invalid(format!("`{name}` is not a number"))),
    }
}

/// The caller's groups: an array of strings, or one space-separated string.
pub(crate) fn groups_of(value: Option<&Value>, claim: &str) -> Result<Arc<[Arc<str>]>, AuthError> {
    let groups: Vec<Arc<str>> = match value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(list)) => list.split_whitespace().map(Arc::from).collect(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(Arc::from))
            .collect::<Option<_>>()
            .ok_or_else(|| AuthError::Invalid(format!("the `{claim}` claim must list strings")))?,
        Some(_) => {
            return Err(AuthError::Invalid(format!(
                "the `{claim}` claim must be an array of strings or a space-separated string"
            )))
        }
    };
    if groups.len() > MAX_GROUPS {
        return Err(AuthError::Invalid(format!(
            "the `{claim}` claim lists {} groups; at most {MAX_GROUPS} are accepted",
            groups.len()
        )));
    }
    Ok(groups.into())
}

/// A value from an unverified token, as a refusal may quote it: escaped, and cut short.
pub(crate) fn shown(value: &str) -> String {
    let mut shown: String = value.escape_debug().take(120).collect();
    if shown.len() < value.escape_debug().count() {
        shown.push('…');
    }
    shown
}

/// The `iss` of a token's payload, read WITHOUT verifying anything: it only
/// picks which issuer's keys (or the service's own key) verify the token.
pub(crate) fn peek_issuer(token: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct IssuerOnly {
        iss: Option<String>,
    }
    let payload = token.split('.').nth(1)?;
    if payload.len() > 16 * 1024 {
        return None;
    }
    let decoded = URL_SAFE_NO_PAD.decode(payload).ok()?;
    serde_json::from_slice::<IssuerOnly>(&decoded).ok()?.iss
}

#[cfg(test)]
mod tests;
