//! Bearer JWT verification. `sub` is the caller's agent name, `tenant` (DESIGN
//! §8) the tenant it belongs to: absent means `default`, so tokens issued
//! before tenants existed keep working; `groups`, when present, the groups
//! it belongs to.
//!
//! Development uses a shared HS256 secret file; production uses an Ed25519 or
//! RSA public key (PEM), or the tokens of OpenID Connect issuers
//! ([`crate::oidc`], alone or beside one of the keys: a token whose `iss`
//! is a configured issuer is verified with that issuer's keys, any other
//! with the service's own key). `--insecure-no-auth` turns verification off
//! and says so loudly at start-up.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

pub use crate::config::{AuthArgs, AuthConfig, KeyFile, OidcAuth};

/// Seconds of clock skew tolerated on `exp`.
const LEEWAY_S: u64 = 5;

pub use crate::caller::{check_tenant_name, Caller, Groups, DEFAULT_TENANT};

/// Why a request was not authenticated. All map to `UNAUTHENTICATED` / 401.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("missing bearer token: send `Authorization: Bearer <jwt>`")]
    Missing,
    #[error("malformed authorization header or token: {0}")]
    Malformed(String),
    #[error("token signature is invalid for this service's key")]
    BadSignature,
    #[error("token has expired; issue a new one")]
    Expired,
    #[error("token is not valid yet (`nbf`); check the clocks of the issuer and this service")]
    NotYetValid,
    #[error("token is not valid: {0}")]
    Invalid(String),
    #[error(
        "the token is for tenant `{0}`, which this service does not serve; use a token of this installation's tenant"
    )]
    OtherTenant(String),
    #[error("the token's issuer `{0}` is not one this service trusts (see --auth-oidc-issuer)")]
    UnknownIssuer(String),
    #[error(
        "the token is for audience {named:?}, not this service's {expected:?}: ask the issuer for a token for this service (RFC 8707 `resource`)"
    )]
    WrongAudience { named: Vec<String>, expected: Vec<String> },
    #[error(
        "the token's algorithm `{0}` is refused: OIDC tokens are accepted signed with {accepted} only",
        accepted = crate::oidc::ACCEPTED_ALGORITHMS
    )]
    UnsupportedAlgorithm(String),
    #[error("{0}")]
    UnknownKey(String),
}

impl AuthError {
    pub const CODE: &'static str = "UNAUTHENTICATED";

    /// A short label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing",
            AuthError::Malformed(_) => "malformed",
            AuthError::BadSignature => "bad_signature",
            AuthError::Expired => "expired",
            AuthError::NotYetValid => "not_yet_valid",
            AuthError::Invalid(_) => "invalid",
            AuthError::OtherTenant(_) => "other_tenant",
            AuthError::UnknownIssuer(_) => "unknown_issuer",
            AuthError::WrongAudience { .. } => "wrong_audience",
            AuthError::UnsupportedAlgorithm(_) => "unsupported_algorithm",
            AuthError::UnknownKey(_) => "unknown_key",
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iat: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
    /// The caller's groups (read from any token; `issue_hs256_groups` writes them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    groups: Option<serde_json::Value>,
}

/// How long a verified token is trusted without checking it again.
const CACHE_TTL_MS: u64 = 1000;
/// Entries per thread before the cache is cleared (bounds memory under token churn).
const CACHE_CAPACITY: usize = 4096;

static NEXT_AUTHENTICATOR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

struct Verified {
    authenticator: usize,
    caller: Caller,
    valid_until_ms: u64,
}

thread_local! {
    /// Recently verified tokens: a caller sends the same token on every
    /// request, and re-checking its signature, base64 and claims each time is
    /// repeated work. Per thread, so lookups take no lock; failures are never
    /// cached; an entry never outlives its token's expiry. Keyed with aHash
    /// (randomly seeded, as SipHash is, and several times faster on a token's
    /// ~150 bytes).
    static VERIFIED: std::cell::RefCell<ahash::AHashMap<String, Verified>> =
        std::cell::RefCell::new(ahash::AHashMap::new());
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}

/// Verifies bearer tokens. Cheap to clone-share behind an `Arc`; verification
/// takes no lock and never waits on the network (an OIDC issuer's keys are
/// fetched in the background, [`crate::oidc`]).
pub struct Authenticator {
    mode: Mode,
    /// The one tenant this service serves (DESIGN §8): a verified token of any
    /// other tenant is refused. `None`: every tenant (a tenant-aware service).
    tenant: Option<Arc<str>>,
    /// Tells apart authenticators sharing a thread (tests run several services in one process).
    id: usize,
}

// One per service part, behind an `Arc`: its size costs nothing, and a box
// would cost a pointer chase on every request.
#[allow(clippy::large_enum_variant)]
enum Mode {
    /// `--insecure-no-auth`.
    Off,
    /// At least one of the two.
    On {
        /// The service's own key (HS256 secret or public key).
        key: Option<(DecodingKey, Validation)>,
        /// OIDC issuers.
        oidc: Option<crate::oidc::Issuers>,
    },
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("Authenticator")
            .field("enabled", &self.is_enabled())
            .field("oidc_issuers", &self.oidc_issuers().collect::<Vec<_>>())
            .finish()
    }
}

impl Authenticator {
    /// Loads the key the config names, and starts fetching its OIDC issuers'
    /// keys (on the current tokio runtime; the authenticators loaded from one
    /// config share them). Errors name the file and the problem.
    pub fn load(config: &AuthConfig) -> Result<Self, String> {
        match config {
            AuthConfig::InsecureNoAuth => {
                tracing::warn!(
                    message = "AUTHENTICATION IS DISABLED (--insecure-no-auth): every request is trusted \
                               and the ACL is not enforced. Never run this in production."
                );
                Ok(Self::with_mode(Mode::Off))
            }
            AuthConfig::Hs256SecretFile(path) => Ok(Self::with_key(load_key(&KeyFile::Hs256SecretFile(path.clone()))?)),
            AuthConfig::PublicKeyFile(path) => Ok(Self::with_key(load_key(&KeyFile::PublicKeyFile(path.clone()))?)),
            AuthConfig::Oidc(oidc) => {
                let key = oidc.beside.as_ref().map(load_key).transpose()?;
                let issuers = crate::oidc::Issuers::load(&oidc.settings, &oidc.shared)?;
                Ok(Self::with_mode(Mode::On {
                    key,
                    oidc: Some(issuers),
                }))
            }
        }
    }

    /// An authenticator for an HS256 secret held in memory (tests, `agent-reach dev`).
    pub fn hs256(secret: &[u8]) -> Self {
        Self::with_key(key_with(DecodingKey::from_secret(secret), Algorithm::HS256))
    }

    fn with_key(key: (DecodingKey, Validation)) -> Self {
        Self::with_mode(Mode::On {
            key: Some(key),
            oidc: None,
        })
    }

    /// An authenticator with the service's own `key` beside OIDC `issuers` (unit tests).
    #[cfg(test)]
    pub(crate) fn with_oidc(key: Option<&[u8]>, issuers: crate::oidc::Issuers) -> Self {
        Self::with_mode(Mode::On {
            key: key.map(|secret| key_with(DecodingKey::from_secret(secret), Algorithm::HS256)),
            oidc: Some(issuers),
        })
    }

    fn with_mode(mode: Mode) -> Self {
        let tenant = match mode {
            Mode::Off => None,
            Mode::On { .. } => Some(DEFAULT_TENANT.into()),
        };
        Self {
            mode,
            tenant,
            id: NEXT_AUTHENTICATOR.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Serves `tenant` only (the default: `default`): tokens of other tenants
    /// are refused with [`AuthError::OtherTenant`].
    pub fn serving(mut self, tenant: &str) -> Self {
        if self.is_enabled() {
            self.tenant = Some(tenant.into());
        }
        self
    }

    /// Serves every tenant: the caller's tenant picks its keys and policy.
    pub fn serving_every_tenant(mut self) -> Self {
        self.tenant = None;
        self
    }

    /// Whether tokens are checked at all.
    pub fn is_enabled(&self) -> bool {
        matches!(self.mode, Mode::On { .. })
    }

    /// The OIDC issuers whose tokens are accepted (the router's
    /// `/.well-known/oauth-protected-resource` names them).
    pub fn oidc_issuers(&self) -> impl Iterator<Item = &str> {
        let issuers = match &self.mode {
            Mode::On {
                oidc: Some(issuers), ..
            } => Some(issuers.iter()),
            _ => None,
        };
        issuers.into_iter().flatten()
    }

    /// Verifies an `Authorization` header value.
    pub fn verify_header(&self, header: Option<&http::HeaderValue>) -> Result<Caller, AuthError> {
        self.verify_value(header.map(http::HeaderValue::as_bytes))
    }

    /// Verifies an `Authorization` header value given as its bytes (as HTTP
    /// allows them: no control characters but tab, which `HeaderValue` and the
    /// front door's parser both guarantee).
    pub fn verify_value(&self, header: Option<&[u8]>) -> Result<Caller, AuthError> {
        self.verify_value_at(header, now_ms())
    }

    /// [`Authenticator::verify_value`] at `now_ms` (epoch milliseconds), for a
    /// caller that has read the clock for the request already.
    pub fn verify_value_at(&self, header: Option<&[u8]>, now_ms: u64) -> Result<Caller, AuthError> {
        let Mode::On { key, oidc } = &self.mode else {
            return Ok(Caller::Unauthenticated);
        };
        let header = header.ok_or(AuthError::Missing)?;
        // ASCII only, as `HeaderValue::to_str` requires (a control character
        // would fail the token's own decoding as malformed anyway).
        let value = std::str::from_utf8(header)
            .ok()
            .filter(|value| value.is_ascii())
            .ok_or_else(|| AuthError::Malformed("header is not ASCII".to_string()))?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or_else(|| AuthError::Malformed("expected `Bearer <jwt>`".to_string()))?
            .trim();
        if token.is_empty() {
            return Err(AuthError::Missing);
        }
        let now = now_ms;
        let cached = VERIFIED.with(|cache| {
            cache.borrow().get(token).and_then(|entry| {
                (entry.authenticator == self.id && entry.valid_until_ms > now).then(|| entry.caller.clone())
            })
        });
        if let Some(caller) = cached {
            return Ok(caller);
        }
        let (caller, expires_at_s, leeway_s) = match oidc {
            None => verify_own(token, key.as_ref(), None)?,
            Some(issuers) => {
                // The mode the token's (unverified) `iss` names: one of the
                // issuers, else the service's own key.
                let iss = crate::oidc::peek_issuer(token);
                match iss.as_deref().filter(|iss| issuers.names(iss)) {
                    Some(iss) => {
                        let (caller, exp) = issuers.verify(iss, token, now / 1000)?;
                        (caller, exp, issuers.skew_s())
                    }
                    None => verify_own(token, key.as_ref(), iss.as_deref()).map_err(|error| match (error, iss) {
                        // Not the service's own token either: say whose it was.
                        (AuthError::BadSignature | AuthError::Invalid(_), Some(iss)) => {
                            AuthError::UnknownIssuer(crate::oidc::shown(&iss))
                        }
                        (error, _) => error,
                    })?,
                }
            }
        };
        if let Some(served) = &self.tenant {
            if caller.tenant() != &**served {
                // Not cached: refusals never are.
                return Err(AuthError::OtherTenant(caller.tenant().to_string()));
            }
        }
        let valid_until_ms = (now + CACHE_TTL_MS).min(expires_at_s.saturating_add(leeway_s).saturating_mul(1000));
        VERIFIED.with(|cache| {
            let mut cache = cache.borrow_mut();
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
            cache.insert(
                token.to_string(),
                Verified {
                    authenticator: self.id,
                    caller: caller.clone(),
                    valid_until_ms,
                },
            );
        });
        Ok(caller)
    }
}

/// A token (of the unverified issuer `iss`) verified with the service's own
/// key: the caller, its `exp` and the leeway on it.
fn verify_own(
    token: &str,
    key: Option<&(DecodingKey, Validation)>,
    iss: Option<&str>,
) -> Result<(Caller, u64, u64), AuthError> {
    let (key, validation) = key.ok_or_else(|| {
        AuthError::UnknownIssuer(iss.map_or_else(|| "(none: the token names no `iss`)".to_string(), crate::oidc::shown))
    })?;
    let (caller, exp) = verify_token(token, key, validation)?;
    Ok((caller, exp, LEEWAY_S))
}

/// The key a key file holds, with the validation of its algorithm.
fn load_key(file: &KeyFile) -> Result<(DecodingKey, Validation), String> {
    match file {
        KeyFile::Hs256SecretFile(path) => {
            let secret = read_key_file(path)?;
            let secret = trim_secret(&secret);
            if secret.len() < 32 {
                return Err(format!(
                    "HS256 secret in {} is {} bytes; use at least 32 random bytes",
                    path.display(),
                    secret.len()
                ));
            }
            Ok(key_with(DecodingKey::from_secret(secret), Algorithm::HS256))
        }
        KeyFile::PublicKeyFile(path) => {
            let pem = read_key_file(path)?;
            if let Ok(key) = DecodingKey::from_ed_pem(&pem) {
                return Ok(key_with(key, Algorithm::EdDSA));
            }
            if let Ok(key) = DecodingKey::from_rsa_pem(&pem) {
                return Ok(key_with(key, Algorithm::RS256));
            }
            Err(format!(
                "{} is not an Ed25519 or RSA public key in PEM format",
                path.display()
            ))
        }
    }
}

fn key_with(key: DecodingKey, algorithm: Algorithm) -> (DecodingKey, Validation) {
    let mut validation = Validation::new(algorithm);
    validation.leeway = LEEWAY_S;
    validation.set_required_spec_claims(&["exp", "sub"]);
    (key, validation)
}

/// The `tenant` claim of a bearer token, read WITHOUT verifying anything: it
/// only picks which tenant's part of a process verifies the token (DESIGN §8),
/// and that part refuses a token whose claim was not signed, or of another
/// tenant. `None`: no bearer token, no payload, or no claim (the `default`
/// tenant), so the caller picks the home part.
pub fn peek_tenant(header: Option<&[u8]>) -> Option<String> {
    peek_tenant_claim(header, "tenant")
}

/// [`peek_tenant`] for a service whose OIDC tenant claim is `claim`
/// (`--auth-claim-tenant`): that claim when the token has it, else `tenant`
/// (the service's own tokens' claim).
pub fn peek_tenant_claim(header: Option<&[u8]>, claim: &str) -> Option<String> {
    use base64::Engine as _;
    let value = header?;
    let token = value
        .strip_prefix(b"Bearer ")
        .or_else(|| value.strip_prefix(b"bearer "))?;
    let mut parts = token.split(|byte| *byte == b'.');
    let payload = parts.nth(1)?;
    // A token's payload is small; a huge one is not worth decoding to route it.
    if payload.len() > 8192 {
        return None;
    }
    let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).ok()?;
    if claim == "tenant" {
        // The common case, without building a map of every claim.
        #[derive(Deserialize)]
        struct TenantOnly {
            tenant: Option<String>,
        }
        return serde_json::from_slice::<TenantOnly>(&decoded).ok()?.tenant;
    }
    let claims: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&decoded).ok()?;
    crate::oidc::claim(&claims, claim)
        .or_else(|| claims.get("tenant"))
        .and_then(serde_json::Value::as_str)
        .map(str::to_string)
}

/// The verified caller and the token's `exp` (epoch seconds).
fn verify_token(token: &str, key: &DecodingKey, validation: &Validation) -> Result<(Caller, u64), AuthError> {
    use jsonwebtoken::errors::ErrorKind;
    match jsonwebtoken::decode::<Claims>(token, key, validation) {
        Ok(data) if data.claims.sub.is_empty() => Err(AuthError::Invalid("empty `sub`".to_string())),
        Ok(data) => {
            let tenant = match data.claims.tenant {
                None => DEFAULT_TENANT.into(),
                Some(tenant) => {
                    check_tenant_name(&tenant).map_err(|why| AuthError::Invalid(format!("`tenant` claim: {why}")))?;
                    tenant.into()
                }
            };
            let groups = crate::oidc::groups_of(data.claims.groups.as_ref(), "groups")?;
            let caller = Caller::Agent {
                name: data.claims.sub.into(),
                tenant,
                groups,
            };
            Ok((caller, data.claims.exp))
        }
        Err(error) => Err(match error.kind() {
            ErrorKind::InvalidSignature => AuthError::BadSignature,
            ErrorKind::ExpiredSignature => AuthError::Expired,
            ErrorKind::InvalidToken | ErrorKind::Base64(_) | ErrorKind::Json(_) | ErrorKind::Utf8(_) => {
                AuthError::Malformed(error.to_string())
            }
            _ => AuthError::Invalid(error.to_string()),
        }),
    }
}

fn read_key_file(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|error| format!("cannot read key file {}: {error}", path.display()))
}

/// Secret files usually end with a newline; it is not part of the secret.
fn trim_secret(secret: &[u8]) -> &[u8] {
    let end = secret
        .iter()
        .rposition(|byte| !byte.is_ascii_whitespace())
        .map_or(0, |index| index + 1);
    &secret[..end]
}

/// Issues an HS256 token for `name`, valid for `ttl` (`agent-reach token issue`, tests).
pub fn issue_hs256(name: &str, secret: &[u8], ttl: Duration) -> Result<String, String> {
    issue_hs256_for(name, None, secret, ttl)
}

/// [`issue_hs256`] with a `tenant` claim (`None`: the `default` tenant, no claim).
pub fn issue_hs256_for(name: &str, tenant: Option<&str>, secret: &[u8], ttl: Duration) -> Result<String, String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|error| format!("system clock before 1970: {error}"))?
        .as_secs();
    issue_hs256_claims(
        name,
        tenant,
        &[],
        trim_secret(secret),
        now,
        now.saturating_add(ttl.as_secs()),
    )
}

/// Issues an HS256 token with explicit `iat`/`exp` (tests of expiry).
pub fn issue_hs256_at(name: &str, secret: &[u8], iat: u64, exp: u64) -> Result<String, String> {
    issue_hs256_claims(name, None, &[], secret, iat, exp)
}

/// [`issue_hs256_for`] with a `groups` claim listing `groups` (tests of
/// group rules; `agent-reach token issue --group`).
pub fn issue_hs256_groups(
    name: &str,
    tenant: Option<&str>,
    groups: &[&str],
    secret: &[u8],
    ttl: Duration,
) -> Result<String, String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|error| format!("system clock before 1970: {error}"))?
        .as_secs();
    issue_hs256_claims(
        name,
        tenant,
        groups,
        trim_secret(secret),
        now,
        now.saturating_add(ttl.as_secs()),
    )
}

fn issue_hs256_claims(
    name: &str,
    tenant: Option<&str>,
    groups: &[&str],
    secret: &[u8],
    iat: u64,
    exp: u64,
) -> Result<String, String> {
    if let Some(tenant) = tenant {
        check_tenant_name(tenant)?;
    }
    if let Some(group) = groups
        .iter()
        .find(|group| group.is_empty() || group.contains(char::is_whitespace))
    {
        return Err(format!("group `{group}` must be a non-empty name without spaces"));
    }
    let claims = Claims {
        sub: name.to_string(),
        exp,
        iat: Some(iat),
        tenant: tenant.map(str::to_string),
        groups: (!groups.is_empty()).then(|| serde_json::json!(groups)),
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )
    .map_err(|error| format!("cannot sign token: {error}"))
}

/// Reads an HS256 secret file for issuing tokens.
pub fn read_hs256_secret(path: &Path) -> Result<Vec<u8>, String> {
    read_key_file(path).map(|secret| trim_secret(&secret).to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn bearer(token: &str) -> http::HeaderValue {
        http::HeaderValue::from_str(&format!("Bearer {token}")).unwrap()
    }

    #[test]
    fn peeking_reads_the_unverified_claim_only_to_route() {
        let token = issue_hs256_for("billing", Some("team-a"), SECRET, Duration::from_secs(60)).unwrap();
        assert_eq!(
            peek_tenant(Some(format!("Bearer {token}").as_bytes())).as_deref(),
            Some("team-a")
        );
        // A forged claim is peeked as well: the tenant's part refuses its signature.
        let forged = issue_hs256_for(
            "billing",
            Some("team-b"),
            b"another secret of thirty-two bytes!",
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(
            peek_tenant(Some(format!("Bearer {forged}").as_bytes())).as_deref(),
            Some("team-b")
        );
        let auth = Authenticator::hs256(SECRET).serving("team-b");
        assert!(matches!(
            auth.verify_header(Some(&bearer(&forged))),
            Err(AuthError::BadSignature)
        ));
        let plain = issue_hs256("billing", SECRET, Duration::from_secs(60)).unwrap();
        assert_eq!(peek_tenant(Some(format!("Bearer {plain}").as_bytes())), None);
        for junk in [&b""[..], b"Bearer", b"Bearer a.%%%.c", b"Basic abc", b"Bearer a.e30.c"] {
            assert_eq!(peek_tenant(Some(junk)), None, "{}", String::from_utf8_lossy(junk));
        }
        assert_eq!(peek_tenant(None), None);
    }

    #[test]
    fn valid_token_yields_its_subject() {
        let auth = Authenticator::hs256(SECRET);
        let token = issue_hs256("order_query", SECRET, Duration::from_secs(60)).unwrap();
        assert_eq!(
            auth.verify_header(Some(&bearer(&token))),
            Ok(Caller::agent("order_query"))
        );
    }

    #[test]
    fn each_failure_has_its_reason() {
        let auth = Authenticator::hs256(SECRET);
        assert_eq!(auth.verify_header(None), Err(AuthError::Missing));
        let not_bearer = http::HeaderValue::from_static("Basic abc");
        assert!(matches!(
            auth.verify_header(Some(&not_bearer)),
            Err(AuthError::Malformed(_))
        ));
        // Raw bytes (the front door's) outside visible ASCII are refused as `to_str` refuses them.
        let token = issue_hs256("order_query", SECRET, Duration::from_secs(60)).unwrap();
        assert_eq!(
            auth.verify_value(Some(format!("Bearer {token}").as_bytes())),
            Ok(Caller::agent("order_query"))
        );
        assert!(matches!(
            auth.verify_value(Some(b"Bearer \xff\xfe")),
            Err(AuthError::Malformed(_))
        ));
        assert!(matches!(
            auth.verify_header(Some(&bearer("not.a.jwt"))),
            Err(AuthError::Malformed(_))
        ));
        let other = issue_hs256("x", b"another-secret-another-secret-xx", Duration::from_secs(60)).unwrap();
        assert_eq!(auth.verify_header(Some(&bearer(&other))), Err(AuthError::BadSignature));
        let expired = issue_hs256_at("x", SECRET, 1_000, 2_000).unwrap();
        assert_eq!(auth.verify_header(Some(&bearer(&expired))), Err(AuthError::Expired));
    }

    #[test]
    fn verified_tokens_are_cached_per_authenticator_and_failures_never() {
        let auth = Authenticator::hs256(SECRET);
        let other = Authenticator::hs256(b"another-secret-another-secret-xx");
        let token = issue_hs256("order_query", SECRET, Duration::from_secs(60)).unwrap();
        assert!(auth.verify_header(Some(&bearer(&token))).is_ok());
        assert!(
            auth.verify_header(Some(&bearer(&token))).is_ok(),
            "served from the cache"
        );
        assert_eq!(
            other.verify_header(Some(&bearer(&token))),
            Err(AuthError::BadSignature),
            "another authenticator's cache entry is not reused"
        );
        let forged = issue_hs256(
            "order_query",
            b"another-secret-another-secret-xx",
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(auth.verify_header(Some(&bearer(&forged))), Err(AuthError::BadSignature));
        assert_eq!(auth.verify_header(Some(&bearer(&forged))), Err(AuthError::BadSignature));
    }

    #[test]
    fn the_tenant_claim_is_verified_and_a_service_serves_its_own_tenant() {
        let ttl = Duration::from_secs(60);
        // No claim: the `default` tenant, served by default.
        let plain = issue_hs256("order_query", SECRET, ttl).unwrap();
        let default_service = Authenticator::hs256(SECRET);
        let caller = default_service.verify_header(Some(&bearer(&plain))).unwrap();
        assert_eq!(caller.tenant(), "default");
        // A claim names the tenant; another tenant's service refuses it (twice: never cached).
        let acme = issue_hs256_for("order_query", Some("acme"), SECRET, ttl).unwrap();
        for _ in 0..2 {
            let error = default_service.verify_header(Some(&bearer(&acme))).unwrap_err();
            assert_eq!(error, AuthError::OtherTenant("acme".to_string()));
            assert_eq!(error.reason(), "other_tenant");
            assert!(error.to_string().contains("tenant `acme`"), "{error}");
        }
        let acme_service = Authenticator::hs256(SECRET).serving("acme");
        assert_eq!(
            acme_service.verify_header(Some(&bearer(&acme))),
            Ok(Caller::in_tenant("order_query", "acme"))
        );
        assert!(matches!(
            acme_service.verify_header(Some(&bearer(&plain))),
            Err(AuthError::OtherTenant(tenant)) if tenant == "default"
        ));
        let every = Authenticator::hs256(SECRET).serving_every_tenant();
        assert_eq!(every.verify_header(Some(&bearer(&acme))).unwrap().tenant(), "acme");
        assert_eq!(every.verify_header(Some(&bearer(&plain))).unwrap().tenant(), "default");
        // A claim that is not a tenant name is refused at issue and at verification.
        assert!(issue_hs256_for("x", Some("Bad Tenant"), SECRET, ttl).is_err());
        let forged = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &serde_json::json!({"sub": "x", "exp": u64::MAX / 2, "tenant": "../other"}),
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap();
        assert!(matches!(
            every.verify_header(Some(&bearer(&forged))),
            Err(AuthError::Invalid(why)) if why.contains("`tenant` claim")
        ));
        for bad in ["", "A", "1a", "a b", &"a".repeat(64)] {
            assert!(check_tenant_name(bad).is_err(), "{bad}");
        }
        for good in ["default", "acme", "team-7_eu", &"a".repeat(63)] {
            assert!(check_tenant_name(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn insecure_mode_trusts_everyone() {
        let auth = Authenticator::load(&AuthConfig::InsecureNoAuth).unwrap();
        assert_eq!(auth.verify_header(None), Ok(Caller::Unauthenticated));
    }

    #[test]
    fn short_secrets_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "short\n").unwrap();
        let error = Authenticator::load(&AuthConfig::Hs256SecretFile(path)).unwrap_err();
        assert!(error.contains("at least 32"), "{error}");
    }
}
