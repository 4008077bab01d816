//! `agent-reach cards verify`: checks the signature of an A2A agent card
//! (A2A §8.4; the router signs every card it serves, docs/design.md "Signed
//! agent cards").
//!
//! The card is fetched from its URL (or read from `--file`); the key set is
//! `--key FILE` (a JWKS or one JWK, as `agent-reach keys jwks` prints), or
//! `--jwks URL`, or else the `jku` the signature names, followed only when
//! it is on the card's own origin: a card cannot vouch for itself with a key
//! set from anywhere. Exit status 0 when a signature verifies, 1 when the
//! card is unsigned or its signature does not verify (edited, or by a key
//! the set does not hold), 2 when the card or the keys could not be read.

use std::path::PathBuf;
use std::time::Duration;

use agent_reach_access::card_signature::{self, CardError};
use agent_reach_access::{jcs, AssertionVerifier};
use serde_json::{json, Value};

#[derive(Debug, clap::Subcommand)]
pub enum CardsCommand {
    /// Verify an agent card's signature: exit 0 (OK, with the key id), 1 (unsigned, edited, unknown key), 2 (unreadable).
    Verify(VerifyArgs),
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("card").required(true).args(["url", "file"])))]
#[command(group(clap::ArgGroup::new("keys").args(["key", "jwks"])))]
pub struct VerifyArgs {
    /// The card's URL, e.g. http://127.0.0.1:7500/a2a/order.query/.well-known/agent-card.json.
    pub url: Option<String>,
    /// Read the card from a file instead of a URL (then the keys must be given: --key or --jwks).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// The public keys: a JWKS document or one JWK (`agent-reach keys jwks` prints one).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// The URL of the key set, e.g. the router's http://127.0.0.1:7500/.well-known/jwks.json.
    #[arg(long)]
    pub jwks: Option<String>,
    /// Print the outcome as JSON (`{ok, kid, keys}` or `{ok, code, message}`).
    #[arg(long)]
    pub json: bool,
}

/// A failure with its stable code and exit status.
#[derive(Debug)]
pub struct Failure {
    pub code: &'static str,
    pub message: String,
    pub status: i32,
}

/// Exit status of a card that does not verify.
const NOT_VERIFIED: i32 = 1;
/// Exit status when the card or its keys could not be read.
const UNREADABLE: i32 = 2;

fn unreadable(code: &'static str, message: impl Into<String>) -> Failure {
    Failure {
        code,
        message: message.into(),
        status: UNREADABLE,
    }
}

impl From<CardError> for Failure {
    fn from(error: CardError) -> Self {
        let status = match error {
            CardError::NotACard => UNREADABLE,
            CardError::Unsigned | CardError::KeyNotFound(_) | CardError::SignatureInvalid(_) => NOT_VERIFIED,
        };
        Failure {
            code: error.code(),
            message: error.to_string(),
            status,
        }
    }
}

/// Runs a `cards` command; returns the process's exit status.
pub async fn cards(command: CardsCommand) -> i32 {
    match command {
        CardsCommand::Verify(args) => {
            let outcome = verify(&args).await;
            match (&outcome, args.json) {
                (Ok((kid, keys)), true) => outln!("{}", json!({ "ok": true, "kid": kid, "keys": keys })),
                (Ok((kid, keys)), false) => outln!("OK: the card is signed by key {kid} (EdDSA; keys from {keys})"),
                (Err(failure), true) => {
                    outln!(
                        "{}",
                        json!({ "ok": false, "code": failure.code, "message": failure.message })
                    )
                }
                (Err(failure), false) => eprintln!("error[{}]: {}", failure.code, failure.message),
            }
            outcome.map_or_else(|failure| failure.status, |_| 0)
        }
    }
}

/// The key id that verified the card, and where the keys came from.
async fn verify(args: &VerifyArgs) -> Result<(String, String), Failure> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|error| unreadable("CARD_FETCH_FAILED", format!("cannot build an HTTP client: {error}")))?;
    let (card, origin) = match (&args.url, &args.file) {
        (Some(url), _) => {
            let parsed = reqwest::Url::parse(url)
                .map_err(|error| unreadable("CARD_FETCH_FAILED", format!("`{url}` is not a URL: {error}")))?;
            let bytes = fetch(&client, url, "CARD_FETCH_FAILED", "the card").await?;
            (read_card(&bytes, url)?, Some(parsed))
        }
        (None, Some(path)) => {
            let bytes = std::fs::read(path)
                .map_err(|error| unreadable("CARD_FETCH_FAILED", format!("cannot read {}: {error}", path.display())))?;
            (read_card(&bytes, &path.display().to_string())?, None)
        }
        (None, None) => return Err(unreadable("USAGE", "give the card's URL or --file PATH")),
    };
    // Unsigned or unreadable signatures are told before any key is looked for.
    let headers = card_signature::headers(&card)?;
    let (document, source) = if let Some(path) = &args.key {
        let bytes = std::fs::read(path).map_err(|error| {
            unreadable(
                "KEY_SET_UNAVAILABLE",
                format!("cannot read {}: {error}", path.display()),
            )
        })?;
        (bytes, path.display().to_string())
    } else if let Some(url) = &args.jwks {
        (
            fetch(&client, url, "KEY_SET_UNAVAILABLE", "the key set").await?,
            url.clone(),
        )
    } else {
        let jku = trusted_jku(&headers, origin.as_ref())?;
        (fetch(&client, &jku, "KEY_SET_UNAVAILABLE", "the key set").await?, jku)
    };
    let keys = key_set(&document, &source)?;
    let kid = card_signature::verify(&card, &keys)?;
    Ok((kid, source))
}

/// The `jku` of the card's first signature that names one, if it is on the
/// card's own origin.
fn trusted_jku(headers: &[card_signature::ProtectedHeader], origin: Option<&reqwest::Url>) -> Result<String, Failure> {
    let Some(jku) = headers.iter().find_map(|header| header.jku.clone()) else {
        return Err(unreadable(
            "KEY_SET_UNAVAILABLE",
            "the card's signature names no key set (`jku`): pass --jwks URL or --key FILE",
        ));
    };
    let Some(origin) = origin else {
        return Err(unreadable(
            "KEY_SET_UNTRUSTED",
            format!("a card read from a file does not choose its keys (it names {jku}): pass --jwks URL or --key FILE"),
        ));
    };
    let same = reqwest::Url::parse(&jku).is_ok_and(|url| url.origin() == origin.origin());
    if !same {
        return Err(unreadable(
            "KEY_SET_UNTRUSTED",
            format!(
                "the card names its keys at {jku}, not on its own origin ({}): pass --jwks URL to trust a key set",
                origin.origin().ascii_serialization()
            ),
        ));
    }
    Ok(jku)
}

async fn fetch(client: &reqwest::Client, url: &str, code: &'static str, what: &str) -> Result<Vec<u8>, Failure> {
    let response = client
        .get(url)
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|error| unreadable(code, format!("cannot fetch {what} from {url}: {error}")))?;
    let status = response.status();
    if !status.is_success() {
        return Err(unreadable(code, format!("{url} answered {status} for {what}")));
    }
    let bytes = response
        .bytes()
        .await
        .map_err(|error| unreadable(code, format!("cannot read {what} from {url}: {error}")))?;
    Ok(bytes.to_vec())
}

/// The card, with its numbers read exactly (RFC 8785: as the signer canonicalised them).
fn read_card(bytes: &[u8], from: &str) -> Result<Value, Failure> {
    let card = jcs::parse(bytes)
        .map_err(|error| unreadable("CARD_MALFORMED", format!("{from} is not a JSON card: {error}")))?;
    if !card.is_object() {
        return Err(CardError::NotACard.into());
    }
    Ok(card)
}

/// A JWKS document, or one JWK made a set of one.
fn key_set(document: &[u8], source: &str) -> Result<AssertionVerifier, Failure> {
    let invalid = |why: String| unreadable("KEY_SET_INVALID", format!("{source}: {why}"));
    let value: Value = serde_json::from_slice(document).map_err(|error| invalid(format!("not JSON: {error}")))?;
    let set = if value.get("keys").is_some() {
        value
    } else if value.get("kty").is_some() {
        json!({ "keys": [value] })
    } else {
        return Err(invalid("neither a JWKS (`keys`) nor a JWK (`kty`)".to_string()));
    };
    // Cards say nothing of an issuer: the verifier's issuer is not used.
    AssertionVerifier::from_jwks(set.to_string().as_bytes(), "").map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_reach_access::card_signature::ProtectedHeader;

    fn header(jku: Option<&str>) -> ProtectedHeader {
        ProtectedHeader {
            alg: "EdDSA".into(),
            typ: None,
            kid: Some("k".into()),
            jku: jku.map(str::to_string),
        }
    }

    #[test]
    fn a_jku_is_followed_on_the_cards_origin_only() {
        let card = reqwest::Url::parse("http://127.0.0.1:7500/a2a/x/.well-known/agent-card.json").unwrap();
        let same = [header(Some("http://127.0.0.1:7500/.well-known/jwks.json"))];
        assert_eq!(
            trusted_jku(&same, Some(&card)).unwrap(),
            "http://127.0.0.1:7500/.well-known/jwks.json"
        );
        for elsewhere in [
            "http://127.0.0.1:7501/.well-known/jwks.json",
            "https://127.0.0.1:7500/.well-known/jwks.json",
            "http://evil.example/.well-known/jwks.json",
            "not a url",
        ] {
            let failure = trusted_jku(&[header(Some(elsewhere))], Some(&card)).unwrap_err();
            assert_eq!((failure.code, failure.status), ("KEY_SET_UNTRUSTED", 2), "{elsewhere}");
        }
        assert_eq!(
            trusted_jku(&[header(None)], Some(&card)).unwrap_err().code,
            "KEY_SET_UNAVAILABLE"
        );
        assert_eq!(trusted_jku(&same, None).unwrap_err().code, "KEY_SET_UNTRUSTED");
    }

    #[test]
    fn a_key_file_is_a_jwks_or_one_jwk() {
        let (key, _) = agent_reach_access::AssertionKey::generate().unwrap();
        let set = agent_reach_access::assertion::jwks([&key]).to_string();
        assert!(key_set(set.as_bytes(), "f").unwrap().knows(key.kid()));
        assert!(key_set(key.jwk().to_string().as_bytes(), "f").unwrap().knows(key.kid()));
        for bad in ["nope", "{}", r#"{"keys": []}"#] {
            assert_eq!(
                key_set(bad.as_bytes(), "f").err().unwrap().code,
                "KEY_SET_INVALID",
                "{bad}"
            );
        }
    }
}
