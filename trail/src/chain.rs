//! A router's chain for one tenant: records numbered from 1, each holding
//! the hash of the one before; each written batch is a segment whose head
//! (its last record's sequence number and hash, and the previous head's
//! hash) is signed with the router's assertion key.

use serde::{Deserialize, Serialize};

use crate::record::{hash_of, push_decimal, Rendered, Stored, GENESIS};

/// What a segment head says; signed as a JWS (EdDSA) with the router's key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadClaims {
    /// The signer, as in hop assertions.
    pub iss: String,
    /// The chain: the router replica's id.
    pub router: String,
    pub tenant: String,
    /// Segments of the chain, numbered from 1.
    pub segment: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    /// The hash of the record `last_seq`.
    pub last_hash: String,
    /// The hash of the previous head's JWS ([`GENESIS`] for the first).
    pub prev_head: String,
    pub iat: u64,
}

/// A sealed segment head as stored: its stream id and its JWS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredHead {
    pub id: String,
    pub jws: String,
}

/// One record of a batch ready to be written, with what its indexes need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub seq: u64,
    pub stored: Stored,
    pub request_id: String,
    pub session_id: Option<String>,
    pub run_id: Option<String>,
    /// The capability, for a record holding its recorded input (replays sample those).
    pub input_of: Option<String>,
}

/// A batch: records of one chain and their segment's head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub router: String,
    pub records: Vec<Sealed>,
    pub head: StoredHead,
    /// When the batch was sealed (epoch ms): stream ids start with it.
    pub at_ms: u64,
}

impl Batch {
    /// The id the store keeps the segment under: its last record's
    /// (`{ms}-{last seq}`), so that the segment holding record `{ms}-{seq}`
    /// is the first whose id is not below it.
    pub fn segment_id(&self) -> String {
        let last = self.records.last().map_or(0, |sealed| sealed.seq);
        format!("{}-{last}", self.at_ms)
    }
}

/// Signs a segment head: the router's assertion key, or a test's.
pub trait HeadSigner: Send + Sync {
    fn sign(&self, claims: &HeadClaims) -> Result<String, String>;
    fn issuer(&self) -> &str;
}

/// The state of one chain between batches.
#[derive(Debug, Clone)]
pub struct Chain {
    router: String,
    tenant: String,
    next_seq: u64,
    last_hash: String,
    segment: u64,
    prev_head: String,
    /// The last stream id's millisecond part: ids never go backwards.
    last_ms: u64,
}

impl Chain {
    /// A new chain of `router` for `tenant` (a router starts one each time it starts).
    pub fn new(router: &str, tenant: &str) -> Self {
        Self {
            router: router.to_string(),
            tenant: tenant.to_string(),
            next_seq: 1,
            last_hash: GENESIS.to_string(),
            segment: 0,
            prev_head: GENESIS.to_string(),
            last_ms: 0,
        }
    }

    pub fn router(&self) -> &str {
        &self.router
    }

    /// Seals `entries` as the next segment at `now_ms`: numbers and links
    /// them, and signs the head. The chain advances only here; a batch that
    /// then cannot be written is retried as it is.
    pub fn seal<R: Into<Rendered>>(
        &mut self,
        entries: impl IntoIterator<Item = R>,
        now_ms: u64,
        signer: &dyn HeadSigner,
    ) -> Result<Batch, String> {
        let ms = now_ms.max(self.last_ms);
        let first_seq = self.next_seq;
        let entries = entries.into_iter();
        let mut records = Vec::with_capacity(entries.size_hint().0);
        let mut seq = self.next_seq;
        for entry in entries {
            let entry: Rendered = entry.into();
            let prev_hash = records
                .last()
                .map_or(self.last_hash.as_str(), |sealed: &Sealed| &sealed.stored.hash);
            let body = entry.body(seq, &self.router, &self.tenant, prev_hash);
            let hash = hash_of(body.as_bytes());
            let mut id = String::with_capacity(32);
            push_decimal(&mut id, ms);
            id.push('-');
            push_decimal(&mut id, seq);
            records.push(Sealed {
                seq,
                stored: Stored { id, body, hash },
                request_id: entry.request_id().to_string(),
                input_of: entry.input_of,
                session_id: entry.session_id,
                run_id: entry.run_id,
            });
            seq += 1;
        }
        let last_hash = records
            .last()
            .map_or_else(|| self.last_hash.clone(), |sealed| sealed.stored.hash.clone());
        let claims = HeadClaims {
            iss: signer.issuer().to_string(),
            router: self.router.clone(),
            tenant: self.tenant.clone(),
            segment: self.segment + 1,
            first_seq,
            last_seq: seq - 1,
            last_hash: last_hash.clone(),
            prev_head: self.prev_head.clone(),
            iat: now_ms / 1000,
        };
        let jws = signer.sign(&claims)?;
        // Only a fully sealed batch moves the chain.
        self.segment += 1;
        self.prev_head = hash_of(jws.as_bytes());
        self.next_seq = seq;
        self.last_hash = last_hash;
        self.last_ms = ms;
        Ok(Batch {
            router: self.router.clone(),
            records,
            head: StoredHead {
                id: format!("{ms}-{}", self.segment),
                jws,
            },
            at_ms: ms,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::Entry;

    /// Signs with a fresh Ed25519 key (the router's kind).
    pub(crate) struct TestSigner(pub agent_reach_access::AssertionKey);

    impl TestSigner {
        pub(crate) fn new() -> Self {
            Self(agent_reach_access::AssertionKey::generate().unwrap().0)
        }
    }

    impl HeadSigner for TestSigner {
        fn sign(&self, claims: &HeadClaims) -> Result<String, String> {
            self.0.sign_document(claims)
        }
        fn issuer(&self) -> &str {
            "agent-reach-router"
        }
    }

    pub(crate) fn entry(request_id: &str) -> Entry<'static> {
        Entry {
            at_ms: 1_700_000_000_000,
            request_id: request_id.to_string().into(),
            trace_id: "t".into(),
            caller: "caller".into(),
            door: "invoke",
            capability: "order.query".into(),
            attempts: 1,
            status: "succeeded",
            ..Entry::default()
        }
    }

    #[test]
    fn records_are_numbered_and_linked_across_batches() {
        let signer = TestSigner::new();
        let mut chain = Chain::new("r-a", "default");
        let first = chain.seal([entry("a"), entry("b")], 1000, &signer).unwrap();
        let second = chain.seal([entry("c")], 900, &signer).unwrap();
        let bodies: Vec<crate::Record> = first
            .records
            .iter()
            .chain(&second.records)
            .map(|sealed| crate::Record::read(&sealed.stored).unwrap())
            .collect();
        assert_eq!(bodies.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(bodies[0].prev_hash, GENESIS);
        assert_eq!(bodies[1].prev_hash, bodies[0].hash);
        assert_eq!(bodies[2].prev_hash, bodies[1].hash);
        // Stream ids never go backwards, even when the clock does.
        assert_eq!(second.records[0].stored.id, "1000-3");
        assert_eq!(second.head.id, "1000-2");
    }
}
