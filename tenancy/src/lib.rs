//! One process, many tenants (DESIGN §8 "Tenants"): [`map`] is the tenant map
//! (`--tenant-map`: the tenants a process serves, each one's Redis placement,
//! policy file and quotas), parsed strictly and followed live; [`parts`]
//! holds each tenant's part of a service and hands every request to the part
//! of the tenant its bearer token names. The registry, the router and the
//! context service build their parts from these two.

pub mod map;
pub mod parts;

pub use map::{check_at_start, Quotas, TenantEntry, TenantMap, TenantMapHandle};
pub use parts::{dispatch, dispatch_with, metrics_registry, render_metrics, Parts};
