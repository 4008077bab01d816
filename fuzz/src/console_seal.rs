//! `console_seal`: text through the console's opening of a sign-in link's
//! code and a session cookie (`console/src/seal.rs`: `Sealer::open`
//! for each kind), as the input is and spliced into a genuine sealed value
//! (so mutations reach past the hex decoding and the AES-GCM tag).
//!
//! Holds, for every input:
//! - nothing panics;
//! - only what the router sealed opens: an input opens only when it is (up to
//!   hex case and surrounding blanks) a value sealed here, only as the kind
//!   it was sealed as, and to the token sealed in it;
//! - a genuine value past its expiry is `Expired`, with its expiry.

use std::sync::OnceLock;

use agent_reach_console::seal::{Kind as SealKind, Sealer, Unsealed};

use crate::support::assertion_key;

/// The token the fixtures seal, and when they expire.
const TOKEN: &str = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvcHMifQ.c2lnbmF0dXJl";
const EXPIRES_MS: u64 = 2_000_000_000_000;
const NOW_MS: u64 = 1_800_000_000_000;

struct Fixtures {
    sealer: Sealer,
    link: String,
    session: String,
}

fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let sealer = Sealer::new(&assertion_key()).expect("a sealer from the fuzzing key");
        let link = sealer.seal(SealKind::Link, TOKEN, EXPIRES_MS).expect("sealed");
        let session = sealer.seal(SealKind::Session, TOKEN, EXPIRES_MS).expect("sealed");
        Fixtures { sealer, link, session }
    })
}

/// `text` opened as each kind must keep the promises above.
fn check(fixtures: &Fixtures, text: &str) {
    let normal = text.trim().to_ascii_lowercase();
    for (kind, genuine) in [(SealKind::Link, &fixtures.link), (SealKind::Session, &fixtures.session)] {
        match fixtures.sealer.open(kind, text, NOW_MS) {
            Ok(token) => {
                assert_eq!(&normal, genuine, "only a value sealed as {kind:?} opens as it");
                assert_eq!(token, TOKEN, "it opens to the token sealed in it");
            }
            Err(Unsealed::Expired(at)) => panic!("nothing sealed here expires before {EXPIRES_MS}, yet {at}"),
            Err(Unsealed::Invalid) => assert_ne!(&normal, genuine, "a genuine value opens"),
        }
    }
    if normal == fixtures.link {
        assert_eq!(
            fixtures.sealer.open(SealKind::Link, text, EXPIRES_MS),
            Err(Unsealed::Expired(EXPIRES_MS)),
            "a genuine value past its expiry is expired"
        );
    }
}

pub fn run(data: &[u8]) {
    let fixtures = fixtures();
    check(fixtures, &String::from_utf8_lossy(data));
    // The input laid over the genuine link's hex: a changed byte anywhere past
    // the decoding must be caught by the tag.
    let mut spliced = fixtures.link.clone().into_bytes();
    let offset = data
        .first()
        .map_or(0, |first| usize::from(*first) % spliced.len().max(1));
    for (at, byte) in data.iter().skip(1).enumerate() {
        if let Some(slot) = spliced.get_mut(offset + at) {
            *slot = *byte;
        }
    }
    check(fixtures, &String::from_utf8_lossy(&spliced));
}
