//! Hop assertions (DESIGN §8): the router vouches for every call it
//! forwards with a short-lived JWT signed with Ed25519 (`EdDSA`) naming the
//! verified caller (`sub`), the target instance (`aud`: its `agent_id`), the
//! capability (`cap`), the tenant, `iat` and `exp` (never past the call's
//! deadline). Agents verify it against the router's published public keys, a
//! JWKS document (RFC 7517, `GET /.well-known/jwks.json`), so an agent
//! reached straight over the network, or called with another agent's
//! assertion, or with an expired one, refuses the call.
//!
//! Keys are identified by their RFC 7638 thumbprint (`kid`), so a router, a
//! key file and an agent's cache agree on a key's name without naming it.

use std::collections::HashMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

/// The issuer the router signs as unless configured otherwise.
pub const DEFAULT_ISSUER: &str = "agent-reach-router";

/// Seconds of clock skew tolerated between router and agent on `exp`.
pub const LEEWAY_S: u64 = 5;

/// What an assertion says.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AssertionClaims {
    pub iss: String,
    /// The verified caller; empty only when the router runs without authentication.
    pub sub: String,
    /// The `agent_id` of the instance the call was forwarded to.
    pub aud: String,
    /// The capability called.
    pub cap: String,
    pub tenant: String,
    pub iat: u64,
    pub exp: u64,
    /// The workflow run the call is a step of (DESIGN §9); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// The delegation chain before this hop (RFC 8693 `act`): the call the
    /// caller was serving, outermost first, nested down to the original
    /// subject's. Absent on a call made by its original subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub act: Option<Actor>,
    /// Hops in the chain, this one included (absent: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    /// The chain's budget, when the call carries one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetClaim>,
    /// The caller's groups, on a call made by its original subject (a
    /// chained call carries them on its innermost `act`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

/// One earlier hop of a delegation chain (RFC 8693 `act` nesting): `sub`
/// called `cap` on the instance `agent_id`; `act` is the hop before it. The
/// innermost is the original subject's own call.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Actor {
    pub sub: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The original subject's groups (on the innermost hop only, when its token named them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub act: Option<Box<Actor>>,
}

/// A delegation chain's budget as the router last knew it (`id` names the
/// chain's ledger; the router holding it enforces what is exactly left).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetClaim {
    pub id: String,
    /// Absent: no limit on calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_left: Option<i64>,
    /// Absent: no limit on cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_left: Option<f64>,
}

// === Signing ===

/// An Ed25519 key pair that signs assertions and publishes its public half.
pub struct AssertionKey {
    kid: String,
    public: [u8; 32],
    /// The signing key, parsed once: `jsonwebtoken` parses its PKCS#8
    /// document again on every signature (deriving the public key, a scalar
    /// multiplication), about as much work as the signature itself; the
    /// profile of `workflows-bench` showed it as 5.7 % of the process.
    /// `ed25519-dalek` signs (the same deterministic signatures as ring's,
    /// a third faster here); ring reads and checks the PKCS#8 document.
    pair: ed25519_dalek::SigningKey,
    /// `base64url({"typ":"JWT","alg":"EdDSA","kid":KID})`, every JWS's header.
    header: String,
}

impl std::fmt::Debug for AssertionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("AssertionKey").field("kid", &self.kid).finish()
    }
}

impl AssertionKey {
    /// A key from an Ed25519 private key in PKCS#8 PEM (`-----BEGIN PRIVATE
    /// KEY-----`, as `openssl genpkey -algorithm ed25519` and
    /// `agent-reach keys generate` write it).
    pub fn from_pkcs8_pem(pem: &[u8]) -> Result<Self, String> {
        let parsed = pem::parse(pem).map_err(|error| format!("not a PEM file: {error}"))?;
        if parsed.tag() != "PRIVATE KEY" {
            return Err(format!(
                "expected an Ed25519 `PRIVATE KEY` (PKCS#8) PEM block, found `{}`",
                parsed.tag()
            ));
        }
        Self::from_pkcs8_der(parsed.contents())
    }

    fn from_pkcs8_der(der: &[u8]) -> Result<Self, String> {
        use ring::signature::KeyPair as _;
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(der)
            .map_err(|error| format!("not an Ed25519 private key (PKCS#8): {error}"))?;
        let public: [u8; 32] = pair
            .public_key()
            .as_ref()
            .try_into()
            .map_err(|_| "an Ed25519 public key is not 32 bytes".to_string())?;
        let pair = ed25519_dalek::SigningKey::from_bytes(&pkcs8_seed(der)?);
        if pair.verifying_key().as_bytes() != &public {
            return Err("the PKCS#8 document's public key is not its private key's".to_string());
        }
        let kid = thumbprint(&public);
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.clone());
        let header = serde_json::to_vec(&header).map_err(|error| format!("cannot write a JWS header: {error}"))?;
        Ok(Self {
            kid,
            public,
            pair,
            header: URL_SAFE_NO_PAD.encode(header),
        })
    }

    /// A fresh key and its PKCS#8 PEM (development, `agent-reach keys generate`).
    pub fn generate() -> Result<(Self, String), String> {
        let rng = ring::rand::SystemRandom::new();
        let document = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|error| format!("cannot generate an Ed25519 key: {error}"))?;
        let pem = pem::encode(&pem::Pem::new("PRIVATE KEY", document.as_ref().to_vec()));
        Ok((Self::from_pkcs8_der(document.as_ref())?, pem))
    }

    /// The key's id: its RFC 7638 JWK thumbprint.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key as a JWK (`kty` `OKP`, `crv` `Ed25519`).
    pub fn jwk(&self) -> serde_json::Value {
        serde_json::json!({
            "kty": "OKP",
            "crv": "Ed25519",
            "x": URL_SAFE_NO_PAD.encode(self.public),
            "kid": self.kid,
            "alg": "EdDSA",
            "use": "sig",
        })
    }

    /// The signed JWT for `claims`.
    pub fn sign(&self, claims: &AssertionClaims) -> Result<String, String> {
        self.sign_document(claims)
    }

    /// Any document signed as a compact JWS (EdDSA, this key's `kid`): the
    /// trail's segment heads, beside the assertions.
    pub fn sign_document<T: Serialize>(&self, claims: &T) -> Result<String, String> {
        let payload = serde_json::to_vec(claims).map_err(|error| format!("cannot sign: {error}"))?;
        let signature_len = 86; // base64url of 64 bytes, unpadded
        let mut jws = String::with_capacity(self.header.len() + payload.len() * 4 / 3 + signature_len + 4);
        jws.push_str(&self.header);
        jws.push('.');
        URL_SAFE_NO_PAD.encode_string(&payload, &mut jws);
        let signature = ed25519_dalek::Signer::sign(&self.pair, jws.as_bytes()).to_bytes();
        jws.push('.');
        URL_SAFE_NO_PAD.encode_string(signature, &mut jws);
        Ok(jws)
    }

    /// The base64url EdDSA signature of a JWS signing input (a detached JWS:
    /// the A2A card signatures of [`crate::card_signature`]).
    pub fn sign_bytes(&self, signing_input: &[u8]) -> Result<String, String> {
        Ok(URL_SAFE_NO_PAD.encode(ed25519_dalek::Signer::sign(&self.pair, signing_input).to_bytes()))
    }
}

/// The 32-byte seed of an Ed25519 PKCS#8 document (RFC 8410, v1 or v2, as
/// ring has just read it): the `CurvePrivateKey` octet string (`04 20`)
/// inside the `privateKey` octet string (`04 22`), after the algorithm's
/// identifier (`06 03 2B 65 70`, id-Ed25519).
fn pkcs8_seed(der: &[u8]) -> Result<[u8; 32], String> {
    const ED25519: [u8; 5] = [0x06, 0x03, 0x2b, 0x65, 0x70];
    const PRIVATE_KEY: [u8; 4] = [0x04, 0x22, 0x04, 0x20];
    let not_found = || "an Ed25519 PKCS#8 document without its private key".to_string();
    let after_oid = der
        .windows(ED25519.len())
        .position(|window| window == ED25519)
        .map(|at| at + ED25519.len())
        .ok_or_else(not_found)?;
    let rest = &der[after_oid..];
    let start = rest
        .windows(PRIVATE_KEY.len())
        .position(|window| window == PRIVATE_KEY)
        .map(|at| at + PRIVATE_KEY.len())
        .ok_or_else(not_found)?;
    rest.get(start..start + 32)
        .and_then(|seed| <[u8; 32]>::try_from(seed).ok())
        .ok_or_else(not_found)
}

/// RFC 7638: base64url(SHA-256 of the JWK's required members, in order).
fn thumbprint(public: &[u8; 32]) -> String {
    let canonical = format!(
        r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#,
        URL_SAFE_NO_PAD.encode(public)
    );
    URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(canonical.as_bytes()))
}

/// The JWKS document publishing `keys` (signing key first).
pub fn jwks<'a>(keys: impl IntoIterator<Item = &'a AssertionKey>) -> serde_json::Value {
    serde_json::json!({ "keys": keys.into_iter().map(AssertionKey::jwk).collect::<Vec<_>>() })
}

// === Verifying ===

/// Why an assertion was refused: each is 401 `UNAUTHENTICATED` with this reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssertionError {
    #[error("no router assertion: calls must come through the router (`Authorization: Bearer <assertion>`)")]
    Missing,
    #[error("malformed assertion: {0}")]
    Malformed(String),
    #[error("the assertion is signed with key `{0}`, which the router does not publish")]
    UnknownKey(String),
    #[error("the assertion's signature does not verify")]
    BadSignature,
    #[error("the assertion is for `{got}`, not for this agent (`{expected}`)")]
    WrongAudience { expected: String, got: String },
    #[error("the assertion was issued by `{got}`, not by `{expected}`")]
    WrongIssuer { expected: String, got: String },
    #[error("the assertion has expired")]
    Expired,
    #[error("the envelope's `source` (`{source_field}`) is not the asserted caller (`{asserted}`)")]
    SourceMismatch { source_field: String, asserted: String },
    #[error("the envelope calls `{envelope}`, but the assertion is for `{asserted}`")]
    CapabilityMismatch { envelope: String, asserted: String },
}

impl AssertionError {
    /// A short label for the error's `details.reason`, metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            AssertionError::Missing => "missing",
            AssertionError::Malformed(_) => "malformed",
            AssertionError::UnknownKey(_) => "unknown_key",
            AssertionError::BadSignature => "bad_signature",
            AssertionError::WrongAudience { .. } => "wrong_audience",
            AssertionError::WrongIssuer { .. } => "wrong_issuer",
            AssertionError::Expired => "expired",
            AssertionError::SourceMismatch { .. } => "source_mismatch",
            AssertionError::CapabilityMismatch { .. } => "capability_mismatch",
        }
    }
}

/// A JWKS document as served (only the members we read).
#[derive(Debug, Deserialize)]
struct JwkSet {
    keys: Vec<Jwk>,
}

#[derive(Debug, Deserialize)]
struct Jwk {
    kty: String,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    kid: Option<String>,
}

/// Verifies assertions against a set of published keys. Immutable: a
/// refreshed JWKS builds a new verifier.
pub struct AssertionVerifier {
    /// By `kid`: the key as `ed25519-dalek` checks signatures with it (its
    /// point decompressed once; ring's check decompresses it every time).
    keys: HashMap<String, ed25519_dalek::VerifyingKey>,
    issuer: String,
    /// What `jsonwebtoken` reads the claims with once the signature is
    /// checked here (it is handed no key it could use: any).
    claims_only: DecodingKey,
}

impl std::fmt::Debug for AssertionVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut kids: Vec<&String> = self.keys.keys().collect();
        kids.sort();
        f.debug_struct("AssertionVerifier")
            .field("kids", &kids)
            .field("issuer", &self.issuer)
            .finish()
    }
}

impl AssertionVerifier {
    /// A verifier for the Ed25519 keys of a JWKS document (other key types
    /// are skipped); a document without one is an error.
    pub fn from_jwks(document: &[u8], issuer: &str) -> Result<Self, String> {
        let set: JwkSet = serde_json::from_slice(document).map_err(|error| format!("not a JWKS document: {error}"))?;
        let mut keys = HashMap::new();
        for jwk in set.keys {
            if jwk.kty != "OKP" || jwk.crv.as_deref() != Some("Ed25519") {
                continue;
            }
            let x = jwk.x.ok_or("an Ed25519 JWK without `x`")?;
            let public: [u8; 32] = URL_SAFE_NO_PAD
                .decode(x.as_bytes())
                .map_err(|error| format!("JWK `x` is not base64url: {error}"))?
                .try_into()
                .map_err(|_| "JWK `x` is not a 32-byte Ed25519 public key".to_string())?;
            let kid = jwk.kid.unwrap_or_else(|| thumbprint(&public));
            let key = ed25519_dalek::VerifyingKey::from_bytes(&public)
                .map_err(|_| "JWK `x` is not an Ed25519 public key (not a curve point)".to_string())?;
            keys.insert(kid, key);
        }
        if keys.is_empty() {
            return Err("the JWKS document holds no Ed25519 key".to_string());
        }
        Ok(Self {
            keys,
            issuer: issuer.to_string(),
            claims_only: DecodingKey::from_ed_der(&[]),
        })
    }

    /// Checks `token`'s signature (a compact JWS, `EdDSA`, strictly: no
    /// weak key or non-canonical encoding) by the key its header names;
    /// `jsonwebtoken` then reads and validates the claims without
    /// checking the signature again.
    fn check_signature(&self, token: &str) -> Result<(), AssertionError> {
        let malformed = |what: &str| AssertionError::Malformed(what.to_string());
        let (message, signature) = token.rsplit_once('.').ok_or_else(|| malformed("not a compact JWS"))?;
        let (header, _) = message.rsplit_once('.').ok_or_else(|| malformed("not a compact JWS"))?;
        let header = URL_SAFE_NO_PAD
            .decode(header)
            .map_err(|_| malformed("the JWS header is not base64url"))?;
        let header: Header =
            serde_json::from_slice(&header).map_err(|error| AssertionError::Malformed(error.to_string()))?;
        if header.alg != Algorithm::EdDSA {
            return Err(AssertionError::Malformed(format!(
                "the assertion is signed with {:?}; only EdDSA is accepted",
                header.alg
            )));
        }
        let kid = header
            .kid
            .ok_or_else(|| malformed("the assertion names no key (`kid`)"))?;
        let key = self.keys.get(&kid).ok_or(AssertionError::UnknownKey(kid))?;
        self.check_bytes(key, message.as_bytes(), signature)
    }

    fn check_bytes(
        &self,
        key: &ed25519_dalek::VerifyingKey,
        signing_input: &[u8],
        signature: &str,
    ) -> Result<(), AssertionError> {
        let signature: [u8; 64] = URL_SAFE_NO_PAD
            .decode(signature)
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or(AssertionError::BadSignature)?;
        key.verify_strict(signing_input, &ed25519_dalek::Signature::from_bytes(&signature))
            .map_err(|_| AssertionError::BadSignature)
    }

    /// `validation` for claims whose signature [`Self::check_signature`] checked.
    fn claims_of<T: serde::de::DeserializeOwned>(
        &self,
        token: &str,
        mut validation: Validation,
    ) -> Result<T, jsonwebtoken::errors::Error> {
        validation.insecure_disable_signature_validation();
        jsonwebtoken::decode::<T>(token, &self.claims_only, &validation).map(|data| data.claims)
    }

    /// Whether the verifier knows the key `kid`.
    pub fn knows(&self, kid: &str) -> bool {
        self.keys.contains_key(kid)
    }

    /// The `kid` an assertion names, without verifying anything (to decide
    /// whether to refresh the keys first).
    pub fn key_id(token: &str) -> Result<String, AssertionError> {
        jsonwebtoken::decode_header(token)
            .map_err(|error| AssertionError::Malformed(error.to_string()))?
            .kid
            .ok_or_else(|| AssertionError::Malformed("the assertion names no key (`kid`)".to_string()))
    }

    /// Verifies a document signed with [`AssertionKey::sign_document`]: its
    /// signature by a key of this set, nothing else (a document says itself
    /// what it is about, and has no audience or expiry).
    pub fn verify_document<T: serde::de::DeserializeOwned>(&self, token: &str) -> Result<T, AssertionError> {
        self.check_signature(token)?;
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_required_spec_claims::<&str>(&[]);
        validation.validate_exp = false;
        validation.validate_aud = false;
        self.claims_of::<T>(token, validation)
            .map_err(|error| AssertionError::Malformed(error.to_string()))
    }

    /// Verifies an assertion of these keys' issuer for any audience, its
    /// expiry left to the caller (the router, checking its own assertion an
    /// agent presents upstream, allows a grace).
    pub fn verify_own(&self, token: &str) -> Result<AssertionClaims, AssertionError> {
        self.check_signature(token)?;
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_required_spec_claims(&["exp", "iat", "sub", "aud", "iss"]);
        validation.validate_exp = false;
        validation.validate_aud = false;
        let claims = self
            .claims_of::<AssertionClaims>(token, validation)
            .map_err(|error| AssertionError::Malformed(error.to_string()))?;
        if claims.iss != self.issuer {
            return Err(AssertionError::WrongIssuer {
                expected: self.issuer.clone(),
                got: claims.iss,
            });
        }
        Ok(claims)
    }

    /// Verifies a detached EdDSA signature (base64url) of `signing_input` by
    /// the key `kid`: `UnknownKey` when the set has no such key, `BadSignature`
    /// when it does not verify.
    pub fn verify_bytes(&self, kid: &str, signing_input: &[u8], signature: &str) -> Result<(), AssertionError> {
        let key = self
            .keys
            .get(kid)
            .ok_or_else(|| AssertionError::UnknownKey(kid.to_string()))?;
        self.check_bytes(key, signing_input, signature)
    }

    /// Verifies an `Authorization` header value for the agent `audience`.
    pub fn verify_header(&self, header: Option<&[u8]>, audience: &str) -> Result<AssertionClaims, AssertionError> {
        self.verify(bearer(header)?, audience)
    }

    /// Verifies `token` for the agent `audience`.
    pub fn verify(&self, token: &str, audience: &str) -> Result<AssertionClaims, AssertionError> {
        use jsonwebtoken::errors::ErrorKind;
        self.check_signature(token)?;
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.leeway = LEEWAY_S;
        validation.set_required_spec_claims(&["exp", "iat", "sub", "aud", "iss"]);
        // Audience and issuer are compared below, to say what was expected.
        validation.validate_aud = false;
        let claims = match self.claims_of::<AssertionClaims>(token, validation) {
            Ok(claims) => claims,
            Err(error) => {
                return Err(match error.kind() {
                    ErrorKind::ExpiredSignature => AssertionError::Expired,
                    _ => AssertionError::Malformed(error.to_string()),
                })
            }
        };
        if claims.aud != audience {
            return Err(AssertionError::WrongAudience {
                expected: audience.to_string(),
                got: claims.aud,
            });
        }
        if claims.iss != self.issuer {
            return Err(AssertionError::WrongIssuer {
                expected: self.issuer.clone(),
                got: claims.iss,
            });
        }
        Ok(claims)
    }
}

/// The token of an `Authorization: Bearer <token>` value.
pub fn bearer(header: Option<&[u8]>) -> Result<&str, AssertionError> {
    let header = header.ok_or(AssertionError::Missing)?;
    let value = std::str::from_utf8(header)
        .ok()
        .filter(|value| value.is_ascii())
        .ok_or_else(|| AssertionError::Malformed("the authorization header is not ASCII".to_string()))?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .ok_or_else(|| AssertionError::Malformed("expected `Bearer <assertion>`".to_string()))?
        .trim();
    if token.is_empty() {
        return Err(AssertionError::Missing);
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn claims(aud: &str, exp: u64) -> AssertionClaims {
        AssertionClaims {
            iss: DEFAULT_ISSUER.into(),
            sub: "intent_parser".into(),
            aud: aud.into(),
            cap: "order.query".into(),
            tenant: "default".into(),
            iat: now(),
            exp,
            ..Default::default()
        }
    }

    #[test]
    fn a_signed_assertion_verifies_for_its_audience_only() {
        let (key, pem) = AssertionKey::generate().unwrap();
        let reloaded = AssertionKey::from_pkcs8_pem(pem.as_bytes()).unwrap();
        assert_eq!(reloaded.kid(), key.kid(), "the kid is the key's thumbprint");
        let document = serde_json::to_vec(&jwks([&key])).unwrap();
        let verifier = AssertionVerifier::from_jwks(&document, DEFAULT_ISSUER).unwrap();
        let token = key.sign(&claims("order_query-1", now() + 60)).unwrap();
        let header = format!("Bearer {token}");
        let verified = verifier
            .verify_header(Some(header.as_bytes()), "order_query-1")
            .unwrap();
        assert_eq!(verified, claims("order_query-1", verified.exp));
        assert_eq!(
            verifier.verify(&token, "order_query-2").unwrap_err().reason(),
            "wrong_audience"
        );
    }

    #[test]
    fn each_refusal_has_its_reason() {
        let (key, _) = AssertionKey::generate().unwrap();
        let (other, _) = AssertionKey::generate().unwrap();
        let verifier =
            AssertionVerifier::from_jwks(&serde_json::to_vec(&jwks([&key])).unwrap(), DEFAULT_ISSUER).unwrap();
        assert_eq!(verifier.verify_header(None, "a").unwrap_err().reason(), "missing");
        assert_eq!(
            verifier.verify_header(Some(b"Basic x"), "a").unwrap_err().reason(),
            "malformed"
        );
        assert_eq!(verifier.verify("not.a.jwt", "a").unwrap_err().reason(), "malformed");
        let expired = key.sign(&claims("a", now() - 3600)).unwrap();
        assert_eq!(verifier.verify(&expired, "a").unwrap_err().reason(), "expired");
        let unknown = other.sign(&claims("a", now() + 60)).unwrap();
        assert_eq!(verifier.verify(&unknown, "a").unwrap_err().reason(), "unknown_key");
        // A signature by another key under this key's id.
        let mut forged_claims = claims("a", now() + 60);
        forged_claims.sub = "admin".into();
        let input = format!(
            "{}.{}",
            key.header,
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged_claims).unwrap())
        );
        let forged = format!("{input}.{}", other.sign_bytes(input.as_bytes()).unwrap());
        assert_eq!(verifier.verify(&forged, "a").unwrap_err().reason(), "bad_signature");
        let mut foreign = claims("a", now() + 60);
        foreign.iss = "someone-else".into();
        let foreign = key.sign(&foreign).unwrap();
        assert_eq!(verifier.verify(&foreign, "a").unwrap_err().reason(), "wrong_issuer");
    }

    #[test]
    fn two_published_keys_both_verify_during_a_rotation() {
        let (old, _) = AssertionKey::generate().unwrap();
        let (new, _) = AssertionKey::generate().unwrap();
        let verifier =
            AssertionVerifier::from_jwks(&serde_json::to_vec(&jwks([&new, &old])).unwrap(), DEFAULT_ISSUER).unwrap();
        for key in [&old, &new] {
            let token = key.sign(&claims("a", now() + 60)).unwrap();
            assert!(verifier.verify(&token, "a").is_ok());
            assert!(verifier.knows(&AssertionVerifier::key_id(&token).unwrap()));
        }
    }

    #[test]
    fn bad_key_material_is_refused_with_a_reason() {
        assert!(AssertionKey::from_pkcs8_pem(b"nonsense").is_err());
        let rsa_like = pem::encode(&pem::Pem::new("PUBLIC KEY", vec![1, 2, 3]));
        assert!(AssertionKey::from_pkcs8_pem(rsa_like.as_bytes())
            .unwrap_err()
            .contains("PRIVATE KEY"));
        assert!(AssertionVerifier::from_jwks(br#"{"keys":[]}"#, DEFAULT_ISSUER).is_err());
        assert!(AssertionVerifier::from_jwks(br#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"AAAA"}]}"#, "i").is_err());
        assert!(AssertionVerifier::from_jwks(b"[]", DEFAULT_ISSUER).is_err());
    }

    #[test]
    fn signatures_are_standard_ed25519_from_either_pkcs8_version() {
        // ring's v2 document (with the public key) and the same seed as an
        // RFC 8410 v1 document (as `openssl genpkey` writes it).
        let document = ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
        let v2 = document.as_ref();
        let mut v1 = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
        ];
        v1.extend_from_slice(&pkcs8_seed(v2).unwrap());
        let (from_v2, from_v1) = (
            AssertionKey::from_pkcs8_der(v2).unwrap(),
            AssertionKey::from_pkcs8_der(&v1).unwrap(),
        );
        assert_eq!(from_v1.kid(), from_v2.kid());
        let signature = from_v2.sign_bytes(b"input").unwrap();
        assert_eq!(from_v1.sign_bytes(b"input").unwrap(), signature);
        // Any Ed25519 implementation checks it (ring's here).
        let public = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, from_v2.public);
        assert!(public
            .verify(b"input", &URL_SAFE_NO_PAD.decode(&signature).unwrap())
            .is_ok());
        assert!(AssertionKey::from_pkcs8_der(&v1[..40]).is_err(), "a truncated document");
    }

    #[test]
    fn another_algorithm_or_a_broken_signature_never_verifies() {
        let (key, _) = AssertionKey::generate().unwrap();
        let verifier =
            AssertionVerifier::from_jwks(&serde_json::to_vec(&jwks([&key])).unwrap(), DEFAULT_ISSUER).unwrap();
        let token = key.sign(&claims("a", now() + 60)).unwrap();
        let (_, rest) = token.split_once('.').unwrap();
        for alg in ["HS256", "none", "ES256"] {
            let header = URL_SAFE_NO_PAD.encode(format!(r#"{{"typ":"JWT","alg":"{alg}","kid":"{}"}}"#, key.kid()));
            let reason = verifier.verify(&format!("{header}.{rest}"), "a").unwrap_err().reason();
            assert_eq!(reason, "malformed", "{alg}");
        }
        let (signed, signature) = token.rsplit_once('.').unwrap();
        for broken in [
            &signature[..40],
            "",
            "AAAA",
            &signature.replace(&signature[..4], "AAAA"),
        ] {
            let reason = verifier
                .verify(&format!("{signed}.{broken}"), "a")
                .unwrap_err()
                .reason();
            assert_eq!(reason, "bad_signature", "{broken}");
        }
        assert_eq!(
            verifier.verify_own(&format!("{signed}.AAAA")).unwrap_err().reason(),
            "bad_signature"
        );
        assert_eq!(
            verifier
                .verify_document::<serde_json::Value>(&format!("{signed}."))
                .unwrap_err()
                .reason(),
            "bad_signature"
        );
        assert!(verifier.verify_document::<serde_json::Value>(&token).is_ok());
        // A JWK whose `x` is not a point of the curve (about half of all
        // y coordinates have no x).
        let not_a_point = (2_u8..=255)
            .map(|y| {
                let mut bytes = [0_u8; 32];
                bytes[0] = y;
                bytes
            })
            .find(|bytes| ed25519_dalek::VerifyingKey::from_bytes(bytes).is_err())
            .unwrap();
        let not_a_point = URL_SAFE_NO_PAD.encode(not_a_point);
        let document = format!(r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","x":"{not_a_point}"}}]}}"#);
        assert!(AssertionVerifier::from_jwks(document.as_bytes(), DEFAULT_ISSUER).is_err());
    }

    #[test]
    fn key_debug_output_holds_no_secret() {
        let (key, pem) = AssertionKey::generate().unwrap();
        let printed = format!("{key:?}");
        assert!(printed.contains(key.kid()));
        let body: String = pem.lines().filter(|line| !line.starts_with("-----")).collect();
        assert!(!printed.contains(&body));
    }
}
