//! Feeds the snapshot from the registry's gRPC `Watch`: a snapshot with its
//! revision, then deltas. On any loss the last snapshot keeps serving; the
//! task reconnects with jittered exponential backoff and resumes from the last
//! applied revision (a `reset` snapshot replaces everything). With several
//! registries, each failure moves to the next one: they serve one etcd, so a
//! revision from one is a revision for all, and the first retry is at once.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_reach_proto::registry::registry_client::RegistryClient;
use agent_reach_proto::registry::watch_event::Kind;
use agent_reach_proto::registry::{WatchEvent, WatchRequest};
use agent_reach_serving::tls::ClientFiles;
use futures::FutureExt;
use rand::Rng;

use crate::metrics::Metrics;
use crate::snapshot::{SnapshotBuilder, SnapshotHandle};

/// How the router proves itself to the registry's Watch.
#[derive(Debug, Clone)]
pub enum RegistryCredential {
    /// A token read from this file at every (re)connect.
    TokenFile(PathBuf),
    /// Sign a short-lived token with the shared HS256 secret in this file.
    SignWithSecret(PathBuf),
    /// Send nothing (the registry runs with `--insecure-no-auth`).
    None,
}

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Validity of a self-signed registry token; a fresh one is signed at every connect.
const SELF_SIGNED_TTL: Duration = Duration::from_secs(3600);
/// The name the router signs its own registry token with.
pub const ROUTER_IDENTITY: &str = "router";
/// The largest Watch message the router decodes: a snapshot comes in pages of
/// at most 1 MiB, and one delta is one instance, which the registry's
/// registration limits keep far below this (tonic's default, 4 MiB, is not).
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Runs until the snapshot handle is dropped by everyone else (the service stopped).
pub async fn run(
    registries: Vec<String>,
    tls: ClientFiles,
    credential: RegistryCredential,
    tenant: String,
    handle: Arc<SnapshotHandle>,
    metrics: Metrics,
) {
    if registries.is_empty() {
        tracing::error!(message = "No registry URL given; the snapshot stays empty.");
        return;
    }
    let mut builder = SnapshotBuilder::new(metrics.clone());
    let mut backoff = MIN_BACKOFF;
    let mut index = 0usize;
    // Failures since a stream was last up: a full round of them backs off.
    let mut failures = 0usize;
    loop {
        if Arc::strong_count(&handle) == 1 {
            return;
        }
        let registry = &registries[index % registries.len()];
        index += 1;
        metrics.watch_reconnects.inc();
        match watch_once(registry, &tls, (&credential, &tenant), &handle, &mut builder, &metrics).await {
            Ok(()) => tracing::warn!(message = "Registry watch ended; reconnecting.", registry = %registry),
            Err(error) => tracing::warn!(
                message = "Registry watch failed; serving the last snapshot and reconnecting.",
                registry = %registry, %error, revision = builder.revision()
            ),
        }
        if handle.is_connected() {
            // A stream that was up resets the backoff.
            backoff = MIN_BACKOFF;
            failures = 0;
        }
        handle.set_connected(false);
        metrics.registry_connected.set(0);
        failures += 1;
        if failures < registries.len() {
            // Another registry has not been tried since the loss: try it now.
            continue;
        }
        failures = 0;
        let jitter = rand::thread_rng().gen_range(0..=backoff.as_millis() as u64 / 2);
        tokio::time::sleep(backoff + Duration::from_millis(jitter)).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn watch_once(
    registry: &str,
    tls: &ClientFiles,
    (credential, tenant): (&RegistryCredential, &str),
    handle: &SnapshotHandle,
    builder: &mut SnapshotBuilder,
    metrics: &Metrics,
) -> anyhow::Result<()> {
    // TLS for an https:// registry (its files are reread at every reconnect).
    let channel = agent_reach_serving::tls::grpc_endpoint(registry, tls)?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let mut client = RegistryClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
    let mut request = tonic::Request::new(WatchRequest {
        start_revision: builder.revision(),
        paged: true,
    });
    if let Some(token) = token(credential, tenant)? {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse()?);
    }
    let mut stream = client.watch(request).await?.into_inner();
    // A paged snapshot's pages so far: applied together once the last is in.
    let mut pages: Option<WatchEvent> = None;
    while let Some(event) = stream.message().await? {
        let Some(event) = whole(&mut pages, event) else {
            continue;
        };
        if !handle.is_connected() {
            handle.set_connected(true);
            metrics.registry_connected.set(1);
            tracing::info!(message = "Registry watch connected.", revision = builder.revision());
        }
        let mut changed = builder.apply(event);
        // Apply whatever else already arrived before rebuilding once.
        while let Some(Ok(Some(event))) = stream.message().now_or_never() {
            if let Some(event) = whole(&mut pages, event) {
                changed |= builder.apply(event);
            }
        }
        // Grants first: a call admitted against the new snapshot sees them too.
        if let Some(grants) = builder.take_grants() {
            handle.grants().store(grants);
        }
        if changed || !handle.is_synced() {
            handle.store(builder.build());
        }
    }
    Ok(())
}

/// `event` if it is whole; a page of a paged snapshot is kept in `pages`
/// until the last one, which gives the whole snapshot.
fn whole(pages: &mut Option<WatchEvent>, event: WatchEvent) -> Option<WatchEvent> {
    let Some(Kind::Snapshot(page)) = &event.kind else {
        return Some(event);
    };
    let more = page.more;
    let event = match pages.take() {
        None => event,
        Some(mut first) => {
            if let (Some(Kind::Snapshot(first)), Some(Kind::Snapshot(page))) = (&mut first.kind, event.kind) {
                first.instances.extend(page.instances);
                first.splits.extend(page.splits);
                first.grants.extend(page.grants);
                first.policies.extend(page.policies);
                first.more = page.more;
            }
            first
        }
    };
    if more {
        *pages = Some(event);
        return None;
    }
    Some(event)
}

/// The registry token; one the router signs itself names the router's tenant
/// (no claim for `default`, as before tenants).
fn token(credential: &RegistryCredential, tenant: &str) -> anyhow::Result<Option<String>> {
    match credential {
        RegistryCredential::None => Ok(None),
        RegistryCredential::TokenFile(path) => {
            // A router serving several tenants reads each tenant's token from its own file.
            let path = std::path::PathBuf::from(path.to_string_lossy().replace("{tenant}", tenant));
            let path = &path;
            let text = std::fs::read_to_string(path)
                .map_err(|error| anyhow::anyhow!("cannot read the registry token {}: {error}", path.display()))?;
            Ok(Some(text.trim().to_string()))
        }
        RegistryCredential::SignWithSecret(path) => {
            let secret = agent_reach_access::token::read_hs256_secret(path).map_err(anyhow::Error::msg)?;
            let claim = (tenant != agent_reach_access::token::DEFAULT_TENANT).then_some(tenant);
            let token = agent_reach_access::token::issue_hs256_for(ROUTER_IDENTITY, claim, &secret, SELF_SIGNED_TTL)
                .map_err(anyhow::Error::msg)?;
            Ok(Some(token))
        }
    }
}

#[cfg(test)]
mod tests {
    use agent_reach_proto::registry as pb;

    use super::*;

    fn page(ids: &[&str], splits: usize, more: bool) -> WatchEvent {
        WatchEvent {
            revision: 9,
            kind: Some(Kind::Snapshot(pb::Snapshot {
                instances: ids
                    .iter()
                    .map(|id| pb::AgentInstance {
                        agent_id: id.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                reset: false,
                splits: vec![pb::CapabilitySplit::default(); splits],
                grants: Vec::new(),
                more,
                policies: Vec::new(),
            })),
        }
    }

    /// A paged snapshot is applied whole, once its last page is in; other
    /// events pass through.
    #[test]
    fn paged_snapshots_are_applied_whole() {
        let mut pages = None;
        assert!(whole(&mut pages, page(&["a", "b"], 1, true)).is_none());
        assert!(whole(&mut pages, page(&["c"], 0, true)).is_none());
        let Some(WatchEvent {
            revision: 9,
            kind: Some(Kind::Snapshot(snapshot)),
        }) = whole(&mut pages, page(&["d"], 0, false))
        else {
            panic!("the last page gives the snapshot");
        };
        let ids: Vec<_> = snapshot.instances.iter().map(|i| i.agent_id.as_str()).collect();
        assert_eq!(
            (ids, snapshot.splits.len(), snapshot.more),
            (vec!["a", "b", "c", "d"], 1, false)
        );
        assert!(pages.is_none());
        // An unpaged snapshot and a delta are whole as they come.
        assert!(whole(&mut pages, page(&["x"], 0, false)).is_some());
        let delta = WatchEvent {
            revision: 10,
            kind: Some(Kind::Removed(pb::InstanceRemoved::default())),
        };
        assert!(whole(&mut pages, delta).is_some());
    }
}
