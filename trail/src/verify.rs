//! Checks a chain as read back: every record hashes to the hash beside it,
//! holds its predecessor's hash and the next sequence number; every segment
//! head is signed by a key the router publishes, follows the head before it,
//! and names a record that is there with that hash. The first broken link is
//! named.
//!
//! Records and heads are fed in stream order (a head after the records of
//! its segment); a head naming a record not yet read waits for it, and one
//! still waiting at the end means records were removed from the end.

use std::collections::VecDeque;

use crate::chain::{HeadClaims, StoredHead};
use crate::record::{hash_of, Record, Stored, GENESIS};

/// Verifies heads' signatures: the router's published keys.
pub trait HeadKeys {
    fn verify(&self, jws: &str) -> Result<HeadClaims, String>;
}

/// What went wrong, at the first broken link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// The record (or head) where the chain breaks: its stream id.
    pub at: String,
    pub seq: Option<u64>,
    pub why: String,
}

/// The outcome of a chain's check.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    pub records: u64,
    pub heads: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// The first record does not start the chain (earlier ones trimmed by
    /// retention, or outside the range asked for).
    pub starts_mid_chain: bool,
    pub broken: Option<Broken>,
}

/// Feeds a chain through, in stream order.
pub struct Verifier<'k> {
    keys: &'k dyn HeadKeys,
    report: Report,
    last_hash: Option<String>,
    /// Hashes of the records since the oldest head still waiting.
    recent: VecDeque<(u64, String)>,
    waiting: VecDeque<(String, HeadClaims)>,
    last_head: Option<(u64, String)>,
}

/// How many recent record hashes a verifier keeps for heads to check
/// against (a head names the last record of its batch, at most a batch behind).
const RECENT: usize = 65_536;

impl<'k> Verifier<'k> {
    pub fn new(keys: &'k dyn HeadKeys) -> Self {
        Self {
            keys,
            report: Report::default(),
            last_hash: None,
            recent: VecDeque::new(),
            waiting: VecDeque::new(),
            last_head: None,
        }
    }

    /// Whether a link is already broken (nothing more is checked).
    pub fn is_broken(&self) -> bool {
        self.report.broken.is_some()
    }

    fn break_at(&mut self, at: &str, seq: Option<u64>, why: String) {
        if self.report.broken.is_none() {
            self.report.broken = Some(Broken {
                at: at.to_string(),
                seq,
                why,
            });
        }
    }

    /// The next record of the chain.
    pub fn record(&mut self, stored: &Stored) {
        if self.is_broken() {
            return;
        }
        let record = match Record::read(stored) {
            Ok(record) => record,
            Err(why) => return self.break_at(&stored.id, None, why),
        };
        let seq = record.seq;
        let actual = hash_of(stored.body.as_bytes());
        if actual != stored.hash {
            return self.break_at(
                &stored.id,
                Some(seq),
                format!(
                    "record {seq} was changed: its body hashes to {actual}, not to the {} stored beside it",
                    stored.hash
                ),
            );
        }
        match (&self.last_hash, self.report.last_seq) {
            (None, _) => {
                self.report.first_seq = Some(seq);
                self.report.starts_mid_chain = seq != 1 || record.prev_hash != GENESIS;
            }
            (Some(last_hash), Some(last_seq)) => {
                if seq != last_seq + 1 {
                    return self.break_at(
                        &stored.id,
                        Some(seq),
                        format!(
                            "record {} is missing: record {last_seq} is followed by {seq}",
                            last_seq + 1
                        ),
                    );
                }
                if &record.prev_hash != last_hash {
                    return self.break_at(
                        &stored.id,
                        Some(seq),
                        format!(
                            "record {seq} does not follow record {last_seq}: its prev_hash is not {last_seq}'s hash"
                        ),
                    );
                }
            }
            (Some(_), None) => {}
        }
        self.report.records += 1;
        self.report.last_seq = Some(seq);
        self.last_hash = Some(stored.hash.clone());
        self.recent.push_back((seq, stored.hash.clone()));
        if self.recent.len() > RECENT {
            self.recent.pop_front();
        }
        self.settle();
    }

    /// The next segment head.
    pub fn head(&mut self, head: &StoredHead) {
        if self.is_broken() {
            return;
        }
        let claims = match self.keys.verify(&head.jws) {
            Ok(claims) => claims,
            Err(why) => return self.break_at(&head.id, None, format!("segment head {}: {why}", head.id)),
        };
        if let Some((segment, hash)) = &self.last_head {
            if claims.segment != segment + 1 {
                return self.break_at(
                    &head.id,
                    Some(claims.first_seq),
                    format!(
                        "segment head {} is missing: head {segment} is followed by {}",
                        segment + 1,
                        claims.segment
                    ),
                );
            }
            if &claims.prev_head != hash {
                return self.break_at(
                    &head.id,
                    Some(claims.first_seq),
                    format!("segment head {} does not follow head {segment}", claims.segment),
                );
            }
        }
        self.report.heads += 1;
        self.last_head = Some((claims.segment, hash_of(head.jws.as_bytes())));
        self.waiting.push_back((head.id.clone(), claims));
        self.settle();
    }

    /// Checks the waiting heads whose last record has been read.
    fn settle(&mut self) {
        let Some(last_seq) = self.report.last_seq else {
            return;
        };
        while let Some((id, claims)) = self.waiting.front().cloned() {
            if claims.last_seq > last_seq {
                return;
            }
            self.waiting.pop_front();
            if self.report.first_seq.is_some_and(|first| claims.last_seq < first) {
                // A segment before the records read (trimmed, or outside the range).
                continue;
            }
            let held = self
                .recent
                .iter()
                .rev()
                .find(|(seq, _)| *seq == claims.last_seq)
                .map(|(_, hash)| hash.clone());
            match held {
                Some(hash) if hash == claims.last_hash => {}
                Some(_) => {
                    return self.break_at(
                        &id,
                        Some(claims.last_seq),
                        format!(
                            "record {} is not the one segment {} sealed: its hash differs from the signed head's",
                            claims.last_seq, claims.segment
                        ),
                    )
                }
                None => {
                    return self.break_at(
                        &id,
                        Some(claims.last_seq),
                        format!(
                            "segment {} names record {}, which was not read",
                            claims.segment, claims.last_seq
                        ),
                    )
                }
            }
        }
    }

    /// The report, once everything was fed. `complete`: the whole chain
    /// up to its end was fed (so a head naming records past the last one
    /// read means records were removed from the end).
    pub fn finish(mut self, complete: bool) -> Report {
        if complete && !self.is_broken() {
            if let Some((id, claims)) = self.waiting.front().cloned() {
                let last = self.report.last_seq.unwrap_or(0);
                self.break_at(
                    &id,
                    Some(last + 1),
                    format!(
                        "records {}..={} are missing from the end: segment {} sealed them, the chain ends at {last}",
                        last + 1,
                        claims.last_seq,
                        claims.segment
                    ),
                );
            }
        }
        self.report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::tests::{entry, TestSigner};
    use crate::chain::{Batch, Chain, HeadSigner};

    struct Keys(agent_reach_access::AssertionVerifier);

    impl HeadKeys for Keys {
        fn verify(&self, jws: &str) -> Result<HeadClaims, String> {
            self.0.verify_document(jws).map_err(|error| error.to_string())
        }
    }

    fn keys(signer: &TestSigner) -> Keys {
        let jwks = agent_reach_access::assertion::jwks([&signer.0]).to_string();
        Keys(agent_reach_access::AssertionVerifier::from_jwks(jwks.as_bytes(), "agent-reach-router").unwrap())
    }

    fn batches(signer: &TestSigner) -> Vec<Batch> {
        let mut chain = Chain::new("r-a", "default");
        (0..3)
            .map(|batch| {
                let entries: Vec<_> = (0..4).map(|n| entry(&format!("q-{batch}-{n}"))).collect();
                chain.seal(entries, 1000 + batch, signer).unwrap()
            })
            .collect()
    }

    fn check(keys: &Keys, batches: &[Batch], complete: bool) -> Report {
        let mut verifier = Verifier::new(keys);
        for batch in batches {
            for sealed in &batch.records {
                verifier.record(&sealed.stored);
            }
            verifier.head(&batch.head);
        }
        verifier.finish(complete)
    }

    #[test]
    fn an_untouched_chain_verifies() {
        let signer = TestSigner::new();
        let report = check(&keys(&signer), &batches(&signer), true);
        assert_eq!(report.broken, None, "{report:?}");
        assert_eq!((report.records, report.heads), (12, 3));
        assert_eq!((report.first_seq, report.last_seq), (Some(1), Some(12)));
        assert!(!report.starts_mid_chain);
    }

    #[test]
    fn an_edited_record_is_named() {
        let signer = TestSigner::new();
        let keys = keys(&signer);
        let mut edited = batches(&signer);
        let stored = &mut edited[1].records[2].stored;
        stored.body = stored.body.replace("\"succeeded\"", "\"failed\"");
        let broken = check(&keys, &edited, true).broken.unwrap();
        assert_eq!(broken.seq, Some(7));
        assert!(broken.why.contains("record 7 was changed"), "{broken:?}");
        // Rehashing the edit moves the break to the next link.
        let stored = &mut edited[1].records[2].stored;
        stored.hash = hash_of(stored.body.as_bytes());
        let broken = check(&keys, &edited, true).broken.unwrap();
        assert_eq!(broken.seq, Some(8), "{broken:?}");
        // And rehashing every record after it too is caught by the signed head.
        let mut rewritten = batches(&signer);
        let mut chain_hash = rewritten[1].records[1].stored.hash.clone();
        let (middle, last) = rewritten.split_at_mut(2);
        for sealed in middle[1].records[2..].iter_mut().chain(last[0].records.iter_mut()) {
            let mut record = Record::read(&sealed.stored).unwrap();
            record.prev_hash = chain_hash.clone();
            record.hash = String::new();
            if record.seq == 7 {
                record.status = "failed".into();
            }
            let mut value = serde_json::to_value(&record).unwrap();
            value.as_object_mut().unwrap().remove("hash");
            sealed.stored.body = value.to_string();
            sealed.stored.hash = hash_of(sealed.stored.body.as_bytes());
            chain_hash = sealed.stored.hash.clone();
        }
        let broken = check(&keys, &rewritten, true).broken.unwrap();
        assert!(broken.why.contains("segment 2"), "{broken:?}");
    }

    #[test]
    fn a_deleted_record_is_named() {
        let signer = TestSigner::new();
        let keys = keys(&signer);
        let mut gapped = batches(&signer);
        gapped[0].records.remove(1);
        let broken = check(&keys, &gapped, true).broken.unwrap();
        assert_eq!(broken.seq, Some(3));
        assert!(broken.why.contains("record 2 is missing"), "{broken:?}");
        // Records removed from the end are caught by the head that sealed them.
        let mut cut = batches(&signer);
        cut[2].records.truncate(1);
        let broken = check(&keys, &cut, true).broken.unwrap();
        assert!(broken.why.contains("records 10..=12 are missing"), "{broken:?}");
    }

    #[test]
    fn a_head_signed_with_another_key_is_refused() {
        let signer = TestSigner::new();
        let keys = keys(&signer);
        let mut forged = batches(&signer);
        let other = TestSigner::new();
        let claims = keys.verify(&forged[2].head.jws).unwrap();
        forged[2].head.jws = HeadSigner::sign(&other, &claims).unwrap();
        let broken = check(&keys, &forged, true).broken.unwrap();
        assert!(broken.why.contains("segment head"), "{broken:?}");
    }

    #[test]
    fn a_chain_read_from_the_middle_verifies_from_there() {
        let signer = TestSigner::new();
        let mut trimmed = batches(&signer);
        trimmed.remove(0);
        let report = check(&keys(&signer), &trimmed, true);
        assert_eq!(report.broken, None, "{report:?}");
        assert!(report.starts_mid_chain);
        assert_eq!(report.first_seq, Some(5));
    }
}
