//! Signed A2A agent cards (A2A §8.4): a detached JWS over the card's
//! canonical form, in the card's `signatures` as `{protected, signature}`.
//!
//! The signed payload is the card without `signatures`, without its empty
//! values (`null`, `""`, `[]`, `{}`, removed from the leaves up, as the
//! official SDK does before it canonicalises: the spec's "default values
//! omitted"), serialised by RFC 8785 ([`crate::jcs`]). The protected header
//! is `{"alg":"EdDSA","typ":"JOSE","kid":…,"jku":…}`: the router's assertion
//! key (its RFC 7638 thumbprint) and the router's published key set
//! (`/.well-known/jwks.json`), so one JWKS verifies hop assertions, trail
//! heads and cards.
//!
//! A card must therefore not carry a default-valued scalar of a field
//! without presence (`"required": false` on an extension): a verifier that
//! reads the card into the protocol's types drops it, and would sign other
//! bytes than these.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::assertion::{AssertionError, AssertionKey, AssertionVerifier};

/// The one algorithm cards are signed and verified with.
pub const ALGORITHM: &str = "EdDSA";

/// Why a card does not verify; each has a stable code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CardError {
    #[error("the card has no `signatures`: it is not signed")]
    Unsigned,
    #[error("the card is not a JSON object")]
    NotACard,
    #[error("no signature is by a key of the key set (the card names {0})")]
    KeyNotFound(String),
    #[error("the card's signature does not verify: {0}")]
    SignatureInvalid(String),
}

impl CardError {
    /// The stable code printed by `agent-reach cards verify`.
    pub fn code(&self) -> &'static str {
        match self {
            CardError::Unsigned => "CARD_UNSIGNED",
            CardError::NotACard => "CARD_MALFORMED",
            CardError::KeyNotFound(_) => "KEY_NOT_FOUND",
            CardError::SignatureInvalid(_) => "CARD_SIGNATURE_INVALID",
        }
    }
}

/// A signature's protected header (RFC 7515 §4.1, the members A2A names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProtectedHeader {
    pub alg: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub typ: Option<String>,
    #[serde(default)]
    pub kid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jku: Option<String>,
}

impl ProtectedHeader {
    /// The header the router signs with: its key's `kid`, its key set at `jku`.
    pub fn for_key(key: &AssertionKey, jku: Option<&str>) -> Self {
        Self {
            alg: ALGORITHM.to_string(),
            typ: Some("JOSE".to_string()),
            kid: Some(key.kid().to_string()),
            jku: jku.map(str::to_string),
        }
    }

    /// The base64url of the header's JSON, as `protected` carries it.
    pub fn encoded(&self) -> String {
        // Serialising four optional strings cannot fail.
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }
}

/// The bytes a card's signatures cover: the card without `signatures` and
/// without empty values, canonicalised (RFC 8785).
pub fn payload(card: &Value) -> Result<Vec<u8>, CardError> {
    let Value::Object(members) = card else {
        return Err(CardError::NotACard);
    };
    let mut members = members.clone();
    members.remove("signatures");
    let cleaned = without_empty(Value::Object(members)).unwrap_or_else(|| json!({}));
    Ok(crate::jcs::canonical(&cleaned))
}

/// `value` without `null`, `""`, `[]` and `{}`, from the leaves up; `None`
/// when nothing is left of it.
fn without_empty(value: Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::String(text) if text.is_empty() => None,
        Value::Array(items) => {
            let kept: Vec<Value> = items.into_iter().filter_map(without_empty).collect();
            (!kept.is_empty()).then_some(Value::Array(kept))
        }
        Value::Object(members) => {
            let kept: Map<String, Value> = members
                .into_iter()
                .filter_map(|(name, value)| without_empty(value).map(|value| (name, value)))
                .collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        other => Some(other),
    }
}

/// The JWS signing input of a payload under an encoded protected header.
fn signing_input(protected: &str, payload: &[u8]) -> Vec<u8> {
    let mut input = Vec::with_capacity(protected.len() + 1 + payload.len() * 4 / 3 + 4);
    input.extend_from_slice(protected.as_bytes());
    input.push(b'.');
    input.extend_from_slice(URL_SAFE_NO_PAD.encode(payload).as_bytes());
    input
}

/// The `AgentCardSignature` of `payload` (from [`payload`]) by `key`.
pub fn sign(key: &AssertionKey, header: &ProtectedHeader, payload: &[u8]) -> Result<Value, String> {
    let protected = header.encoded();
    let signature = key.sign_bytes(&signing_input(&protected, payload))?;
    Ok(json!({ "protected": protected, "signature": signature }))
}

/// `card` with its signature by `key` (any earlier `signatures` replaced).
pub fn signed(key: &AssertionKey, card: &Value, jku: Option<&str>) -> Result<Value, String> {
    let payload = payload(card).map_err(|error| error.to_string())?;
    let signature = sign(key, &ProtectedHeader::for_key(key, jku), &payload)?;
    let mut card = card.clone();
    if let Value::Object(members) = &mut card {
        members.insert("signatures".to_string(), json!([signature]));
    }
    Ok(card)
}

/// The decoded protected headers of a card's signatures, in order (to find
/// the key set before verifying); an unreadable one is an error.
pub fn headers(card: &Value) -> Result<Vec<ProtectedHeader>, CardError> {
    signatures(card)?
        .iter()
        .map(|signature| decode_header(signature).map(|(header, _, _)| header))
        .collect()
}

fn signatures(card: &Value) -> Result<&Vec<Value>, CardError> {
    let Value::Object(members) = card else {
        return Err(CardError::NotACard);
    };
    match members.get("signatures") {
        None | Some(Value::Null) => Err(CardError::Unsigned),
        Some(Value::Array(items)) if items.is_empty() => Err(CardError::Unsigned),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(CardError::SignatureInvalid("`signatures` is not an array".to_string())),
    }
}

/// A signature's header, `protected` and `signature` strings.
fn decode_header(signature: &Value) -> Result<(ProtectedHeader, &str, &str), CardError> {
    let invalid = |why: &str| CardError::SignatureInvalid(why.to_string());
    let protected = signature["protected"]
        .as_str()
        .ok_or_else(|| invalid("a signature without `protected`"))?;
    let value = signature["signature"]
        .as_str()
        .ok_or_else(|| invalid("a signature without `signature`"))?;
    let bytes = URL_SAFE_NO_PAD
        .decode(protected.trim_end_matches('='))
        .map_err(|_| invalid("`protected` is not base64url"))?;
    let header: ProtectedHeader = serde_json::from_slice(&bytes)
        .map_err(|error| invalid(&format!("`protected` is not a JWS header: {error}")))?;
    Ok((header, protected, value))
}

/// Verifies `card` against the keys of `keys`: the kid of the first
/// signature that verifies. A signature by a key not in the set is passed
/// over (a card may carry several, during a rotation); a signature by a
/// known key that does not verify fails the card.
pub fn verify(card: &Value, keys: &AssertionVerifier) -> Result<String, CardError> {
    let signatures = signatures(card)?;
    let payload = payload(card)?;
    let mut unknown = Vec::new();
    for signature in signatures {
        let (header, protected, value) = decode_header(signature)?;
        if header.alg != ALGORITHM {
            return Err(CardError::SignatureInvalid(format!(
                "the signature's algorithm is `{}`; cards are verified with `{ALGORITHM}` only",
                header.alg
            )));
        }
        let kid = header
            .kid
            .ok_or_else(|| CardError::SignatureInvalid("the signature names no key (`kid`)".to_string()))?;
        match keys.verify_bytes(&kid, &signing_input(protected, &payload), value) {
            Ok(()) => return Ok(kid),
            Err(AssertionError::UnknownKey(kid)) => unknown.push(format!("`{kid}`")),
            Err(_) => {
                return Err(CardError::SignatureInvalid(format!(
                    "the signature by key `{kid}` does not cover this card: it was changed after signing"
                )))
            }
        }
    }
    Err(CardError::KeyNotFound(unknown.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card() -> Value {
        json!({
            "name": "order.query",
            "description": "Orders by id — €",
            "version": "1.2.0",
            "supportedInterfaces": [{ "url": "http://h/a2a/order.query", "protocolBinding": "JSONRPC", "protocolVersion": "1.0" }],
            "capabilities": { "streaming": true, "pushNotifications": false, "extensions": [] },
            "securityRequirements": [{ "schemes": { "bearer": { "list": [] } } }],
            "defaultInputModes": ["application/json"],
            "defaultOutputModes": ["application/json"],
            "skills": [{ "id": "order.query", "name": "order.query", "description": "", "tags": ["x"], "examples": [] }],
            "params": { "minimum": 1.5, "maximum": 10, "nothing": null },
        })
    }

    fn key_set(keys: &[&AssertionKey]) -> AssertionVerifier {
        let document = crate::assertion::jwks(keys.iter().copied());
        AssertionVerifier::from_jwks(document.to_string().as_bytes(), "any").unwrap()
    }

    #[test]
    fn the_payload_omits_signatures_and_empty_values_and_is_canonical() {
        let mut with = card();
        with["signatures"] = json!([{ "protected": "x", "signature": "y" }]);
        let payload = String::from_utf8(payload(&with).unwrap()).unwrap();
        assert_eq!(payload, String::from_utf8(super::payload(&card()).unwrap()).unwrap());
        assert!(!payload.contains("signatures"), "{payload}");
        assert!(!payload.contains("securityRequirements"), "{payload}");
        assert!(
            !payload.contains("extensions") && !payload.contains("examples"),
            "{payload}"
        );
        assert!(
            !payload.contains("nothing") && !payload.contains(r#""description":"""#),
            "{payload}"
        );
        assert!(
            payload.contains(r#""pushNotifications":false"#),
            "false is a value: {payload}"
        );
        assert!(
            payload.starts_with(r#"{"capabilities":{"pushNotifications":false,"streaming":true},"#),
            "{payload}"
        );
        assert!(
            payload.contains(r#""params":{"maximum":10,"minimum":1.5}"#),
            "{payload}"
        );
        assert!(payload.contains("— €"), "literal UTF-8: {payload}");
    }

    #[test]
    fn a_signed_card_verifies_and_an_edited_one_does_not() {
        let (key, _) = AssertionKey::generate().unwrap();
        let signed = signed(&key, &card(), Some("http://h/.well-known/jwks.json")).unwrap();
        let keys = key_set(&[&key]);
        assert_eq!(verify(&signed, &keys), Ok(key.kid().to_string()));
        let header = &headers(&signed).unwrap()[0];
        assert_eq!(header.alg, "EdDSA");
        assert_eq!(header.typ.as_deref(), Some("JOSE"));
        assert_eq!(header.kid.as_deref(), Some(key.kid()));
        assert_eq!(header.jku.as_deref(), Some("http://h/.well-known/jwks.json"));
        // Ed25519 is deterministic: the same card, the same signature.
        assert_eq!(
            signed,
            super::signed(&key, &card(), Some("http://h/.well-known/jwks.json")).unwrap()
        );
        // Key order and whitespace are not part of what is signed.
        let reread: Value = serde_json::from_str(&serde_json::to_string_pretty(&signed).unwrap()).unwrap();
        assert_eq!(verify(&reread, &keys), Ok(key.kid().to_string()));

        let mut edited = signed.clone();
        edited["supportedInterfaces"][0]["url"] = json!("http://evil/a2a/order.query");
        let error = verify(&edited, &keys).unwrap_err();
        assert_eq!(error.code(), "CARD_SIGNATURE_INVALID", "{error}");
        let mut added = signed.clone();
        added["iconUrl"] = json!("http://evil/icon.png");
        assert_eq!(verify(&added, &keys).unwrap_err().code(), "CARD_SIGNATURE_INVALID");
    }

    #[test]
    fn each_refusal_has_its_code() {
        let (key, _) = AssertionKey::generate().unwrap();
        let (other, _) = AssertionKey::generate().unwrap();
        let keys = key_set(&[&key]);
        assert_eq!(verify(&card(), &keys), Err(CardError::Unsigned));
        let mut empty = card();
        empty["signatures"] = json!([]);
        assert_eq!(verify(&empty, &keys), Err(CardError::Unsigned));
        assert_eq!(verify(&json!([1]), &keys), Err(CardError::NotACard));
        let by_other = signed(&other, &card(), None).unwrap();
        let error = verify(&by_other, &keys).unwrap_err();
        assert_eq!(error.code(), "KEY_NOT_FOUND");
        assert!(error.to_string().contains(other.kid()), "{error}");
        // A rotation: signed by both, verified by whichever key is known.
        let mut both = by_other.clone();
        let mine = sign(&key, &ProtectedHeader::for_key(&key, None), &payload(&card()).unwrap()).unwrap();
        both["signatures"].as_array_mut().unwrap().push(mine);
        assert_eq!(verify(&both, &keys), Ok(key.kid().to_string()));
        // Another algorithm named in the header is refused, whatever the bytes.
        let mut hs = signed(&key, &card(), None).unwrap();
        let header = ProtectedHeader {
            alg: "HS256".to_string(),
            ..ProtectedHeader::for_key(&key, None)
        };
        hs["signatures"][0]["protected"] = json!(header.encoded());
        assert_eq!(verify(&hs, &keys).unwrap_err().code(), "CARD_SIGNATURE_INVALID");
        let mut garbage = signed(&key, &card(), None).unwrap();
        garbage["signatures"][0]["protected"] = json!("%%%");
        assert_eq!(verify(&garbage, &keys).unwrap_err().code(), "CARD_SIGNATURE_INVALID");
        garbage["signatures"] = json!("nope");
        assert_eq!(verify(&garbage, &keys).unwrap_err().code(), "CARD_SIGNATURE_INVALID");
    }
}
