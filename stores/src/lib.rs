//! How the services reach their stores (DESIGN §7.8): one Redis URL form for
//! the context service and the task store, Sentinel discovery of the current
//! primary, the TLS material (CA bundle, client certificate) for `rediss://`
//! and `https://` etcd endpoints, and the `WAIT` option for writes that must
//! survive a failover.
//!
//! - [`redis_url`]: `redis://`, `rediss://`, `redis+sentinel://`,
//!   `rediss+sentinel://`, `redis+cluster://`, `rediss+cluster://` parsed
//!   into [`RedisUrl`], printed without secrets.
//! - [`slot`]: Redis Cluster key slots and the hash tags the stores spread
//!   their key groups with.
//! - [`sentinel`]: asks the Sentinels for the primary ([`Sentinels`]).
//! - [`tls`]: PEM files read and checked at start-up ([`TlsFiles`]), turned
//!   into a rustls client configuration or the `redis` crate's certificates.
//! - [`args`]: the Redis link flags both services share ([`RedisLinkArgs`]),
//!   validated into a [`RedisLink`].
//!
//! Services keep their own clients (the context service's RESP client, the
//! task store's `redis` connections, the registry's etcd gRPC client); this
//! crate only tells them where to connect and how to trust what answers.

pub mod args;
pub mod redis_url;
pub mod sentinel;
pub mod slot;
pub mod tls;

pub use args::{RedisLink, RedisLinkArgs, RedisTlsArgs, Wait};
pub use redis_url::{HostPort, Nodes, RedisUrl, SentinelAuth};
pub use sentinel::{Primary, Sentinels};
pub use tls::{error_chain, TlsFiles};
