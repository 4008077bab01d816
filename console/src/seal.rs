//! Sealed console credentials: the sign-in link's code and the session
//! cookie each carry the operator's own bearer token, encrypted and
//! authenticated (AES-256-GCM) with its kind and expiry, so any router
//! replica holding the same assertion key opens them and no replica keeps
//! session state.
//!
//! The sealing key is derived from the router's assertion signing key: the
//! SHA-256 of its (deterministic, Ed25519) signature over fixed claims no
//! assertion ever carries (`iat` and `exp` 0). Replicas that share the key
//! files share the sealing key; rotating the signing key signs every
//! operator out, which is what a rotation should do.

use agent_reach_access::assertion::{AssertionClaims, AssertionKey};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

/// What a sealed credential is for; one kind never opens as the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The sign-in link's one code (short-lived).
    Link,
    /// The session cookie.
    Session,
}

/// Why a sealed credential did not open.
#[derive(Debug, PartialEq, Eq)]
pub enum Unsealed {
    /// Not ours, altered, of the other kind, or sealed under a rotated key.
    Invalid,
    /// Genuine, but past its expiry (epoch ms).
    Expired(u64),
}

#[derive(Serialize, Deserialize)]
struct Sealed {
    kind: Kind,
    /// The operator's bearer token (empty when the router runs without authentication).
    token: String,
    expires_ms: u64,
}

/// The key that seals and opens console credentials.
pub struct Sealer {
    key: LessSafeKey,
}

impl Sealer {
    /// The sealer of the router's current signing key.
    pub fn new(signing: &AssertionKey) -> Result<Self, String> {
        let claims = AssertionClaims {
            iss: "agent-reach-console".to_string(),
            sub: String::new(),
            aud: "agent-reach-console-sealing-key-v1".to_string(),
            cap: String::new(),
            tenant: String::new(),
            iat: 0,
            exp: 0,
            ..AssertionClaims::default()
        };
        let signature = signing.sign(&claims)?;
        let digest = ring::digest::digest(&ring::digest::SHA256, signature.as_bytes());
        let key = UnboundKey::new(&AES_256_GCM, digest.as_ref()).map_err(|_| "cannot make the sealing key")?;
        Ok(Self {
            key: LessSafeKey::new(key),
        })
    }

    /// `token` sealed as `kind` until `expires_ms`: lowercase hex of nonce ‖ ciphertext ‖ tag.
    pub fn seal(&self, kind: Kind, token: &str, expires_ms: u64) -> Result<String, String> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| "no randomness for the nonce")?;
        let mut data = serde_json::to_vec(&Sealed {
            kind,
            token: token.to_string(),
            expires_ms,
        })
        .map_err(|error| error.to_string())?;
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut data)
            .map_err(|_| "cannot seal")?;
        let mut out = String::with_capacity((NONCE_LEN + data.len()) * 2);
        for byte in nonce.iter().chain(data.iter()) {
            out.push_str(&format!("{byte:02x}"));
        }
        Ok(out)
    }

    /// The token `text` seals as `kind`, if it is still valid at `now_ms`.
    pub fn open(&self, kind: Kind, text: &str, now_ms: u64) -> Result<String, Unsealed> {
        let bytes = from_hex(text.trim()).ok_or(Unsealed::Invalid)?;
        if bytes.len() <= NONCE_LEN {
            return Err(Unsealed::Invalid);
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| Unsealed::Invalid)?;
        let mut sealed = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::empty(), &mut sealed)
            .map_err(|_| Unsealed::Invalid)?;
        let opened: Sealed = serde_json::from_slice(plain).map_err(|_| Unsealed::Invalid)?;
        if opened.kind != kind {
            return Err(Unsealed::Invalid);
        }
        if opened.expires_ms <= now_ms {
            return Err(Unsealed::Expired(opened.expires_ms));
        }
        Ok(opened.token)
    }
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 16 * 1024 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| text.get(at..at + 2).and_then(|pair| u8::from_str_radix(pair, 16).ok()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_tokens_open_only_as_their_kind_before_expiry_and_under_their_key() {
        let (key, _) = AssertionKey::generate().unwrap();
        let sealer = Sealer::new(&key).unwrap();
        let sealed = sealer.seal(Kind::Link, "the.jwt.token", 2_000).unwrap();
        assert_eq!(sealer.open(Kind::Link, &sealed, 1_999), Ok("the.jwt.token".to_string()));
        assert_eq!(sealer.open(Kind::Link, &sealed, 2_000), Err(Unsealed::Expired(2_000)));
        assert_eq!(sealer.open(Kind::Session, &sealed, 1_000), Err(Unsealed::Invalid));
        // The same key file on another replica derives the same sealer.
        assert_eq!(
            Sealer::new(&key).unwrap().open(Kind::Link, &sealed, 1_000),
            Ok("the.jwt.token".to_string())
        );
        let (other, _) = AssertionKey::generate().unwrap();
        assert_eq!(
            Sealer::new(&other).unwrap().open(Kind::Link, &sealed, 1_000),
            Err(Unsealed::Invalid)
        );
        let mut altered = sealed.clone().into_bytes();
        let last = altered.len() - 1;
        altered[last] = if altered[last] == b'0' { b'1' } else { b'0' };
        let altered = String::from_utf8(altered).unwrap();
        assert_eq!(sealer.open(Kind::Link, &altered, 1_000), Err(Unsealed::Invalid));
        assert_eq!(sealer.open(Kind::Link, "zz", 1_000), Err(Unsealed::Invalid));
    }
}
