//! Verification of OIDC tokens against fixed key sets (the fetching, with a
//! real provider, is tested in `router/tests/oidc.rs`).

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use super::fetch::IssuerKeys;
use super::keys::KeySet;
use super::{ClaimNames, Issuers};
use crate::token::{issue_hs256, issue_hs256_groups, AuthError, Authenticator, Caller};

const ISS: &str = "https://idp.example.com/realms/acme";
const AUD: &str = "https://router.example.com";
const NOW: u64 = 1_800_000_000;
const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

struct Signer {
    kid: &'static str,
    alg: Algorithm,
    key: EncodingKey,
    jwk: Value,
}

fn ed25519(kid: &'static str) -> Signer {
    use ring::signature::KeyPair as _;
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    Signer {
        kid,
        alg: Algorithm::EdDSA,
        key: EncodingKey::from_ed_der(pkcs8.as_ref()),
        jwk: json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": URL_SAFE_NO_PAD.encode(pair.public_key())}),
    }
}

fn p256(kid: &'static str) -> Signer {
    use ring::signature::{KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        ring::signature::EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = pair.public_key().as_ref();
    Signer {
        kid,
        alg: Algorithm::ES256,
        key: EncodingKey::from_ec_der(pkcs8.as_ref()),
        jwk: json!({
            "kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..]),
        }),
    }
}

impl Signer {
    fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.to_string());
        jsonwebtoken::encode(&header, claims, &self.key).unwrap()
    }
}

fn claims() -> Value {
    json!({"iss": ISS, "aud": AUD, "sub": "intent_parser", "iat": NOW - 10, "exp": NOW + 300})
}

fn keys_of(signers: &[&Signer]) -> Arc<IssuerKeys> {
    let jwks = json!({"keys": signers.iter().map(|signer| signer.jwk.clone()).collect::<Vec<_>>()});
    IssuerKeys::fixed(ISS, KeySet::from_jwks(jwks.to_string().as_bytes()).unwrap().0)
}

fn issuers(keys: Arc<IssuerKeys>) -> Issuers {
    Issuers::one(keys, &[AUD, "agent-reach"], ClaimNames::default(), 60)
}

/// A token with any header and claims, signed with `signature` (raw bytes).
fn forged(header: &Value, claims: &Value, signature: &[u8]) -> String {
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        URL_SAFE_NO_PAD.encode(signature)
    )
}

#[test]
fn tokens_signed_by_the_issuer_name_their_caller() {
    let (ed, ec) = (ed25519("d1"), p256("e1"));
    let issuers = issuers(keys_of(&[&ed, &ec]));
    for signer in [&ed, &ec] {
        let (caller, exp) = issuers.verify(ISS, &signer.sign(&claims()), NOW).unwrap();
        assert_eq!(caller, Caller::agent("intent_parser"));
        assert_eq!(exp, NOW + 300);
    }
    // `aud` as a list naming one audience of the issuer's; `EdDSA` under its RFC 9864 name.
    let mut listed = claims();
    listed["aud"] = json!(["other", "agent-reach"]);
    assert!(issuers.verify(ISS, &ec.sign(&listed), NOW).is_ok());
    let (message, _) = ed
        .sign(&claims())
        .rsplit_once('.')
        .map(|(m, s)| (m.to_string(), s.to_string()))
        .unwrap();
    let renamed_header = json!({"alg": "Ed25519", "kid": "d1"});
    let payload = message.split('.').nth(1).unwrap();
    let signing_input = format!("{}.{payload}", URL_SAFE_NO_PAD.encode(renamed_header.to_string()));
    let signature = jsonwebtoken::crypto::sign(signing_input.as_bytes(), &ed.key, Algorithm::EdDSA).unwrap();
    assert!(issuers
        .verify(ISS, &format!("{signing_input}.{signature}"), NOW)
        .is_ok());
}

#[test]
fn claims_are_mapped_as_configured() {
    let ed = ed25519("d1");
    let mapped = Issuers::one(
        keys_of(&[&ed]),
        &[AUD],
        ClaimNames {
            name: "client_id".into(),
            tenant: "org.tenant".into(),
            groups: "realm_access.roles".into(),
        },
        60,
    );
    let mut token = claims();
    token["client_id"] = json!("billing");
    token["org"] = json!({"tenant": "acme"});
    token["realm_access"] = json!({"roles": ["finance", "ops"]});
    let (caller, _) = mapped.verify(ISS, &ed.sign(&token), NOW).unwrap();
    assert_eq!(caller.name(), Some("billing"));
    assert_eq!(caller.tenant(), "acme");
    assert_eq!(caller.groups(), [Arc::from("finance"), Arc::from("ops")]);
    assert!(caller.in_group("ops") && !caller.in_group("admin"));
    // A claim whose whole name has dots wins over the path.
    token["org.tenant"] = json!("globex");
    assert_eq!(mapped.verify(ISS, &ed.sign(&token), NOW).unwrap().0.tenant(), "globex");
    // Default names: `sub`, `tenant`, `groups` (a space-separated string works as `scope` does).
    let plain = issuers(keys_of(&[&ed]));
    let mut token = claims();
    token["groups"] = json!("finance  ops");
    let (caller, _) = plain.verify(ISS, &ed.sign(&token), NOW).unwrap();
    assert_eq!((caller.tenant(), caller.groups().len()), ("default", 2));
    // Claims that cannot be read are refused, saying which.
    for (claim, value, expected) in [
        ("sub", json!(""), "`sub`"),
        ("sub", json!(7), "`sub`"),
        ("tenant", json!("Not A Tenant"), "`tenant` claim"),
        ("tenant", json!(["acme"]), "must be a string"),
        ("groups", json!([1, 2]), "must list strings"),
        ("groups", json!({"a": 1}), "array of strings"),
    ] {
        let mut token = claims();
        token[claim] = value;
        let error = plain.verify(ISS, &ed.sign(&token), NOW).unwrap_err();
        assert_eq!(error.reason(), "invalid", "{claim}: {error}");
        assert!(error.to_string().contains(expected), "{claim}: {error}");
    }
}

#[test]
fn expiry_nbf_issuer_and_audience_are_checked_with_the_skew() {
    let ed = ed25519("d1");
    let issuers = issuers(keys_of(&[&ed]));
    let mut token = claims();
    token["exp"] = json!(NOW - 30);
    assert!(issuers.verify(ISS, &ed.sign(&token), NOW).is_ok(), "within the skew");
    token["exp"] = json!(NOW - 61);
    assert_eq!(
        issuers.verify(ISS, &ed.sign(&token), NOW).unwrap_err(),
        AuthError::Expired
    );
    let mut token = claims();
    token.as_object_mut().unwrap().remove("exp");
    assert_eq!(
        issuers.verify(ISS, &ed.sign(&token), NOW).unwrap_err().reason(),
        "invalid"
    );
    let mut token = claims();
    token["nbf"] = json!(NOW + 61);
    assert_eq!(
        issuers.verify(ISS, &ed.sign(&token), NOW).unwrap_err(),
        AuthError::NotYetValid
    );
    token["nbf"] = json!(NOW + 30);
    assert!(issuers.verify(ISS, &ed.sign(&token), NOW).is_ok());
    for aud in [
        json!("https://other.example.com"),
        json!([]),
        json!(null),
        json!(["a", "b"]),
    ] {
        let mut token = claims();
        token["aud"] = aud.clone();
        let error = issuers.verify(ISS, &ed.sign(&token), NOW).unwrap_err();
        assert_eq!(error.reason(), "wrong_audience", "{aud}");
        assert!(error.to_string().contains(AUD), "{error}");
    }
    // Signed by the issuer's key, naming another issuer in its verified claims.
    let mut token = claims();
    token["iss"] = json!("https://evil.example.com");
    assert_eq!(
        issuers.verify(ISS, &ed.sign(&token), NOW).unwrap_err().reason(),
        "unknown_issuer"
    );
}

#[test]
fn none_and_hmac_are_refused_whatever_the_key() {
    let ed = ed25519("d1");
    let issuers = issuers(keys_of(&[&ed]));
    // `alg: none`, unsigned, in any spelling.
    for alg in ["none", "None", "NONE"] {
        let token = forged(&json!({"alg": alg, "kid": "d1"}), &claims(), b"");
        let error = issuers.verify(ISS, &token, NOW).unwrap_err();
        assert_eq!(error, AuthError::UnsupportedAlgorithm(alg.to_string()));
        assert!(error.to_string().contains("RS256"), "{error}");
    }
    // The confusion attack: HS256 "signed" with the issuer's published public key as the secret.
    let public_x = ed.jwk["x"].as_str().unwrap().to_string();
    for secret in [public_x.as_bytes().to_vec(), ed.jwk.to_string().into_bytes()] {
        for alg in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512] {
            let mut header = Header::new(alg);
            header.kid = Some("d1".to_string());
            let token = jsonwebtoken::encode(&header, &claims(), &EncodingKey::from_secret(&secret)).unwrap();
            assert_eq!(
                issuers.verify(ISS, &token, NOW).unwrap_err().reason(),
                "unsupported_algorithm"
            );
        }
    }
    // A known key with an algorithm of another kind; `crit` extensions; a bad signature.
    let token = forged(&json!({"alg": "ES256", "kid": "d1"}), &claims(), &[0; 64]);
    assert_eq!(issuers.verify(ISS, &token, NOW).unwrap_err().reason(), "unknown_key");
    let token = forged(
        &json!({"alg": "EdDSA", "kid": "d1", "crit": ["exp"]}),
        &claims(),
        &[0; 64],
    );
    assert_eq!(issuers.verify(ISS, &token, NOW).unwrap_err().reason(), "invalid");
    let impostor = ed25519("d1");
    assert_eq!(
        issuers.verify(ISS, &impostor.sign(&claims()), NOW).unwrap_err(),
        AuthError::BadSignature
    );
    for junk in ["", "a", "a.b", "a.b.c", "%%.e30.x"] {
        assert_eq!(
            issuers.verify(ISS, junk, NOW).unwrap_err().reason(),
            "malformed",
            "{junk}"
        );
    }
}

#[test]
fn an_unknown_kid_asks_for_the_keys_again_without_waiting() {
    let (ed, next) = (ed25519("d1"), ed25519("d2"));
    let keys = keys_of(&[&ed]);
    let issuers = issuers(keys.clone());
    assert!(!keys.refetch_asked());
    let error = issuers.verify(ISS, &next.sign(&claims()), NOW).unwrap_err();
    assert_eq!(error.reason(), "unknown_key");
    assert!(error.to_string().contains("`d2`"), "{error}");
    assert!(keys.refetch_asked(), "the refresher is asked for the issuer's keys");
    // Before the first fetch every token is refused so, and asks as well.
    let unfetched = IssuerKeys::fixed(ISS, KeySet::default());
    let error = super::Issuers::one(unfetched.clone(), &[AUD], ClaimNames::default(), 0)
        .verify(ISS, &ed.sign(&claims()), NOW)
        .unwrap_err();
    assert!(error.to_string().contains("not been fetched yet"), "{error}");
    assert!(unfetched.refetch_asked());
    // No kid, and more than one key of the algorithm: which one is not guessed.
    let both = issuers_of(&[&ed, &next]);
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = None;
    let token = jsonwebtoken::encode(&header, &claims(), &ed.key).unwrap();
    assert_eq!(both.verify(ISS, &token, NOW).unwrap_err().reason(), "unknown_key");
    assert!(
        issuers_of(&[&ed]).verify(ISS, &token, NOW).is_ok(),
        "the one key of its kind"
    );
}

fn issuers_of(signers: &[&Signer]) -> Issuers {
    issuers(keys_of(signers))
}

#[test]
fn a_token_goes_to_the_mode_its_issuer_names() {
    let ed = ed25519("d1");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let now_s = now_ms / 1000;
    let bearer = |token: &str| format!("Bearer {token}");
    let mut live = claims();
    live["iat"] = json!(now_s);
    live["exp"] = json!(now_s + 300);
    let beside = Authenticator::with_oidc(Some(SECRET), issuers_of(&[&ed]));
    let alone = Authenticator::with_oidc(None, issuers_of(&[&ed]));
    assert_eq!(beside.oidc_issuers().collect::<Vec<_>>(), vec![ISS]);
    // The issuer's token: verified with its keys, by both.
    for auth in [&beside, &alone] {
        let caller = auth.verify_value_at(Some(bearer(&ed.sign(&live)).as_bytes()), now_ms);
        assert_eq!(caller, Ok(Caller::agent("intent_parser")));
    }
    // The service's own HS256 token (no `iss`), with groups: only beside its key.
    let own = issue_hs256_groups(
        "order_query",
        None,
        &["finance"],
        SECRET,
        std::time::Duration::from_secs(60),
    )
    .unwrap();
    let caller = beside.verify_value_at(Some(bearer(&own).as_bytes()), now_ms).unwrap();
    assert_eq!(caller, Caller::agent("order_query").with_groups(&["finance"]));
    let error = alone
        .verify_value_at(Some(bearer(&own).as_bytes()), now_ms)
        .unwrap_err();
    assert_eq!(error.reason(), "unknown_issuer");
    // Another issuer's token (signed with some other key): refused as such by both.
    let stranger = ed25519("s1");
    let mut theirs = live.clone();
    theirs["iss"] = json!("https://login.example.org");
    for auth in [&beside, &alone] {
        let error = auth
            .verify_value_at(Some(bearer(&stranger.sign(&theirs)).as_bytes()), now_ms)
            .unwrap_err();
        assert_eq!(error, AuthError::UnknownIssuer("https://login.example.org".to_string()));
    }
    // A token claiming the configured issuer but signed with the HS256 secret: the issuer's
    // rules apply (no HMAC), not the service's key.
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("d1".to_string());
    let confused = jsonwebtoken::encode(&header, &live, &EncodingKey::from_secret(SECRET)).unwrap();
    let error = beside
        .verify_value_at(Some(bearer(&confused).as_bytes()), now_ms)
        .unwrap_err();
    assert_eq!(error.reason(), "unsupported_algorithm");
    // A plain HS256 token without groups has none.
    let plain = issue_hs256("x", SECRET, std::time::Duration::from_secs(60)).unwrap();
    assert!(beside
        .verify_value_at(Some(bearer(&plain).as_bytes()), now_ms)
        .unwrap()
        .groups()
        .is_empty());
}
