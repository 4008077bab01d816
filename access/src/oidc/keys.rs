//! An issuer's signing keys, as its JWKS document (RFC 7517) publishes
//! them, and the algorithms a token may be signed with. Only asymmetric
//! algorithms are accepted from an OIDC issuer: `none` and the HMAC family
//! never are (the classic confusion is an HS256 token "signed" with the
//! issuer's public key), and a key is used only with an algorithm of its own
//! type and curve.

use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;

/// The algorithms accepted from an OIDC issuer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Alg {
    Rsa(Algorithm),
    Es256,
    Es384,
    /// `EdDSA`, or its fully specified name `Ed25519` (RFC 9864).
    Ed25519,
}

impl Alg {
    /// The algorithm a token's header names, if it is one accepted.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "RS256" => Alg::Rsa(Algorithm::RS256),
            "RS384" => Alg::Rsa(Algorithm::RS384),
            "RS512" => Alg::Rsa(Algorithm::RS512),
            "PS256" => Alg::Rsa(Algorithm::PS256),
            "PS384" => Alg::Rsa(Algorithm::PS384),
            "PS512" => Alg::Rsa(Algorithm::PS512),
            "ES256" => Alg::Es256,
            "ES384" => Alg::Es384,
            "EdDSA" | "Ed25519" => Alg::Ed25519,
            _ => return None,
        })
    }

    pub(crate) fn jwt(self) -> Algorithm {
        match self {
            Alg::Rsa(algorithm) => algorithm,
            Alg::Es256 => Algorithm::ES256,
            Alg::Es384 => Algorithm::ES384,
            Alg::Ed25519 => Algorithm::EdDSA,
        }
    }

    /// The kind of key this algorithm verifies with.
    fn kind(self) -> KeyKind {
        match self {
            Alg::Rsa(_) => KeyKind::Rsa,
            Alg::Es256 => KeyKind::P256,
            Alg::Es384 => KeyKind::P384,
            Alg::Ed25519 => KeyKind::Ed25519,
        }
    }
}

/// The names accepted, for refusals.
pub const ACCEPTED_ALGORITHMS: &str = "RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA";

/// A key's type and curve: which algorithms it may verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Rsa,
    P256,
    P384,
    Ed25519,
}

/// One verification key.
pub(crate) struct Key {
    kid: Option<String>,
    kind: KeyKind,
    /// The key's own `alg`, when the JWK names one: then only that one.
    alg: Option<Alg>,
    pub(crate) decoding: DecodingKey,
}

impl Key {
    fn fits(&self, alg: Alg) -> bool {
        self.kind == alg.kind() && self.alg.is_none_or(|own| own == alg)
    }
}

/// An issuer's keys as last fetched.
#[derive(Default)]
pub(crate) struct KeySet {
    keys: Vec<Key>,
    /// Whether a JWKS was ever fetched (an empty set before the first fetch).
    pub(crate) fetched: bool,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field("kids", &self.kids())
            .field("fetched", &self.fetched)
            .finish()
    }
}

impl KeySet {
    /// The key a token signed with `alg` under `kid` is verified with: the
    /// key of that `kid` when it fits the algorithm; without a `kid`, the one
    /// key that fits (none when several do).
    pub(crate) fn find(&self, kid: Option<&str>, alg: Alg) -> Option<&Key> {
        match kid {
            Some(kid) => self
                .keys
                .iter()
                .find(|key| key.kid.as_deref() == Some(kid) && key.fits(alg)),
            None => {
                let mut fitting = self.keys.iter().filter(|key| key.fits(alg));
                let first = fitting.next()?;
                fitting.next().is_none().then_some(first)
            }
        }
    }

    /// Whether a key of this `kid` is known (it may still not fit the algorithm).
    pub(crate) fn knows(&self, kid: &str) -> bool {
        self.keys.iter().any(|key| key.kid.as_deref() == Some(kid))
    }

    pub(crate) fn kids(&self) -> Vec<&str> {
        self.keys.iter().filter_map(|key| key.kid.as_deref()).collect()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// The signature keys of a JWKS document. Keys this service cannot use
    /// (encryption keys, symmetric keys, other curves, malformed members) are
    /// skipped, and counted in the second value; a document without one
    /// usable key is refused.
    pub(crate) fn from_jwks(document: &[u8]) -> Result<(Self, usize), String> {
        #[derive(Deserialize)]
        struct Document {
            keys: Vec<serde_json::Value>,
        }
        let document: Document =
            serde_json::from_slice(document).map_err(|error| format!("not a JWKS document: {error}"))?;
        let total = document.keys.len();
        let keys: Vec<Key> = document.keys.into_iter().filter_map(parse_key).collect();
        if keys.is_empty() {
            return Err(format!(
                "none of its {total} keys is a signature key this service can use"
            ));
        }
        let skipped = total - keys.len();
        Ok((Self { keys, fetched: true }, skipped))
    }
}

/// One JWK, or `None` when it is not a signature key of a supported kind.
fn parse_key(value: serde_json::Value) -> Option<Key> {
    #[derive(Deserialize)]
    struct Jwk {
        kty: String,
        kid: Option<String>,
        #[serde(rename = "use")]
        usage: Option<String>,
        alg: Option<String>,
        crv: Option<String>,
        n: Option<String>,
        e: Option<String>,
        x: Option<String>,
        y: Option<String>,
    }
    let jwk: Jwk = serde_json::from_value(value).ok()?;
    if jwk.usage.as_deref().is_some_and(|usage| usage != "sig") {
        return None;
    }
    let (kind, decoding) = match (jwk.kty.as_str(), jwk.crv.as_deref()) {
        ("RSA", _) => (
            KeyKind::Rsa,
            DecodingKey::from_rsa_components(jwk.n.as_deref()?, jwk.e.as_deref()?).ok()?,
        ),
        ("EC", Some(curve @ ("P-256" | "P-384"))) => {
            let (x, y) = (jwk.x.as_deref()?, jwk.y.as_deref()?);
            let size = if curve == "P-256" { 32 } else { 48 };
            // ring reads the point as `04 || x || y`: each coordinate must have the curve's size.
            if decoded_len(x)? != size || decoded_len(y)? != size {
                return None;
            }
            let kind = if curve == "P-256" { KeyKind::P256 } else { KeyKind::P384 };
            (kind, DecodingKey::from_ec_components(x, y).ok()?)
        }
        ("OKP", Some("Ed25519")) => {
            let x = jwk.x.as_deref()?;
            if decoded_len(x)? != 32 {
                return None;
            }
            (KeyKind::Ed25519, DecodingKey::from_ed_components(x).ok()?)
        }
        _ => return None,
    };
    // A key naming an algorithm that is not accepted (or not of its kind) is not used at all.
    let alg = match jwk.alg.as_deref() {
        None => None,
        Some(name) => Some(Alg::parse(name).filter(|alg| alg.kind() == kind)?),
    };
    Some(Key {
        kid: jwk.kid,
        kind,
        alg,
        decoding,
    })
}

fn decoded_len(base64url: &str) -> Option<usize> {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(base64url)
        .ok()
        .map(|bytes| bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const RSA_N: &str = "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw";
    const EC_X: &str = "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU";
    const EC_Y: &str = "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0";
    const ED_X: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";

    fn jwks(keys: serde_json::Value) -> Vec<u8> {
        serde_json::json!({ "keys": keys }).to_string().into_bytes()
    }

    #[test]
    fn algorithms_are_asymmetric_only() {
        for accepted in ACCEPTED_ALGORITHMS.split(", ").chain(["Ed25519"]) {
            assert!(Alg::parse(accepted).is_some(), "{accepted}");
        }
        for refused in ["none", "None", "HS256", "HS384", "HS512", "ES512", "", "rs256"] {
            assert_eq!(Alg::parse(refused), None, "{refused}");
        }
    }

    #[test]
    fn keys_are_found_by_kid_and_used_only_with_algorithms_of_their_kind() {
        let (set, skipped) = KeySet::from_jwks(&jwks(serde_json::json!([
            {"kty": "RSA", "kid": "r1", "use": "sig", "n": RSA_N, "e": "AQAB"},
            {"kty": "EC", "kid": "e1", "crv": "P-256", "x": EC_X, "y": EC_Y, "alg": "ES256"},
            {"kty": "OKP", "kid": "d1", "crv": "Ed25519", "x": ED_X},
            // Skipped: an encryption key, a symmetric key, another curve, a malformed key,
            // a key naming HS256, and one whose `alg` is not of its kind.
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": RSA_N, "e": "AQAB"},
            {"kty": "oct", "kid": "hs", "k": "c2VjcmV0"},
            {"kty": "EC", "kid": "p521", "crv": "P-521", "x": EC_X, "y": EC_Y},
            {"kty": "EC", "kid": "short", "crv": "P-256", "x": "AAAA", "y": EC_Y},
            {"kty": "RSA", "kid": "hs-alg", "alg": "HS256", "n": RSA_N, "e": "AQAB"},
            {"kty": "OKP", "kid": "mixed", "crv": "Ed25519", "x": ED_X, "alg": "ES256"},
            "not an object"
        ])))
        .unwrap();
        assert_eq!((set.len(), skipped), (3, 7));
        assert!(set.fetched);
        let rs256 = Alg::parse("RS256").unwrap();
        let es256 = Alg::parse("ES256").unwrap();
        let eddsa = Alg::parse("EdDSA").unwrap();
        assert!(set.find(Some("r1"), rs256).is_some());
        assert!(set.find(Some("r1"), Alg::parse("PS512").unwrap()).is_some());
        assert!(set.find(Some("e1"), es256).is_some());
        assert!(set.find(Some("d1"), eddsa).is_some());
        assert!(set.find(Some("d1"), Alg::parse("Ed25519").unwrap()).is_some());
        // A key with an algorithm of another kind: not used, though its kid is known.
        assert!(set.find(Some("r1"), es256).is_none());
        assert!(set.find(Some("e1"), Alg::parse("ES384").unwrap()).is_none());
        assert!(set.knows("r1") && !set.knows("enc") && !set.knows("zz"));
        assert!(set.find(Some("zz"), rs256).is_none());
        // No kid: the one key that fits, else none.
        assert!(set.find(None, eddsa).is_some());
        let (two, _) = KeySet::from_jwks(&jwks(serde_json::json!([
            {"kty": "RSA", "kid": "a", "n": RSA_N, "e": "AQAB"},
            {"kty": "RSA", "kid": "b", "n": RSA_N, "e": "AQAB"}
        ])))
        .unwrap();
        assert!(two.find(None, rs256).is_none());
        assert_eq!(two.kids(), vec!["a", "b"]);
    }

    #[test]
    fn documents_without_a_usable_key_are_refused() {
        assert!(KeySet::from_jwks(b"{}").unwrap_err().contains("not a JWKS"));
        assert!(KeySet::from_jwks(b"[1]").is_err());
        let error = KeySet::from_jwks(&jwks(serde_json::json!([{"kty": "oct", "k": "c2VjcmV0"}]))).unwrap_err();
        assert!(error.contains("none of its 1 keys"), "{error}");
        assert!(!KeySet::default().fetched);
    }
}
