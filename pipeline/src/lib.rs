//! The call pipeline (DESIGN §3): turns "I need `order.query`" into a
//! reliable call to a healthy instance, and every failure into a stable
//! answer. Every door of the router (its own `/v1/invoke` and broadcast
//! here, and the slow path, A2A, MCP and the console in crates of their
//! own) goes through the API this crate exports:
//!
//! - a request is identified once ([`call::identify`]), an envelope read by
//!   the one prelude ([`call::prelude`]) or built by a protocol door
//!   ([`envelope::call`]) into a [`call::Call`];
//! - [`RouterService`] admits it ([`admission`]: ACL, quotas, capability,
//!   version and split, schema, deadline) and runs its attempts through the
//!   one loop (`call::attempts`): answered whole ([`RouterService::invoke`]),
//!   streamed ([`RouterService::stream`], [`stream::EventStream`]) or to every
//!   instance ([`RouterService::broadcast`]);
//! - every failure answers one shape ([`answer`], [`error`]), and the
//!   recent calls ([`recent`]) and [`views`] show operators what happened.
//!
//! Inside, [`watch`] feeds the immutable `snapshot` from the registry's Watch
//! stream, `select` picks among routable instances (health- and
//! breaker-aware), `forward` sends with the deadline, `outcome` classifies,
//! `retry` decides. Those stay private: doors see the call API only.
//!
//! Architecture invariant: the request path never calls the registry, etcd or
//! Redis, takes no global lock and never compiles a schema.

pub mod admission;
pub mod answer;
mod breaker;
pub mod call;
pub mod clock;
pub mod delegation;
pub mod envelope;
pub mod error;
mod forward;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod grants;
mod health;
pub mod history;
pub mod http;
pub mod json;
mod limits;
pub mod metrics;
pub mod outcome;
mod part;
pub mod recent;
mod retry;
mod schema;
mod select;
mod service;
mod snapshot;
mod split;
pub mod stream;
pub mod trace;
pub mod trail;
mod tuning;
mod usage;
pub mod views;
pub mod watch;
pub mod workflows;

pub use agent_reach_access::{AssertionSettings, SigningKey};
pub use history::exchange::{HistoryLedger, SlotExchange, SlotTotals};
pub use history::Counts as HistoryCounts;
pub use limits::shares::{
    Answered, Demand, Exchanged, QuotaLedger, Reported, DEFAULT_EVERY as DEFAULT_QUOTA_SHARE_EVERY,
};
pub use part::{AgentTls, PartConfig};
/// Selection policies teams plug in (`plugin:NAME`, DESIGN §3.4).
pub use select::plugin as policy;
pub use service::{Delivery, Offered, RouterService};
pub use tuning::Tuning;
pub use watch::RegistryCredential;
pub use workflows::{RoutedWorkflow, Runner};
