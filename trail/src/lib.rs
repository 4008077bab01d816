//! The trail (issue 37, DESIGN §9): one record per admitted call, written off
//! the request path to the store, per tenant, in hash chains that show any
//! edit or removal; read back by request, session or run as a tree of hops;
//! checked link by link; the inputs it holds replayed against another version.
//!
//! - [`record`]: what a record holds, as stored and as read.
//! - [`chain`]: numbering, linking and signing segments (one chain per router replica and tenant).
//! - [`request_id`]: the request ids the router generates, which say when they were made.
//! - [`segment`]: a sealed batch as the one text the store keeps.
//! - [`writer`]: the [`Recorder`] the pipeline offers records to, the writer task, the store trait.
//! - [`sealer`]: where segments are sealed and written (an idle-priority thread by default).
//! - [`verify`]: checking a chain and naming its first broken link.
//! - [`tree`]: a collaboration as a tree of hops.
//! - [`diff`]: what changed between a recorded output and a replayed one.
//! - [`stats`]: the installation's figures per capability, from every replica's records.

pub mod chain;
pub mod diff;
pub mod record;
pub mod request_id;
pub mod sealer;
pub mod segment;
pub mod stats;
pub mod tree;
pub mod verify;
pub mod writer;

pub use chain::{Batch, Chain, HeadClaims, HeadSigner, Sealed, StoredHead};
pub use record::{hash_of, Entry, Record, Rendered, Stored, GENESIS};
pub use sealer::WriterPriority;
pub use verify::{Broken, HeadKeys, Report, Verifier};
pub use writer::{AssertionSigner, ChainInfo, Index, Recorder, TrailMetrics, TrailSettings, TrailStore};
