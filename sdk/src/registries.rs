//! The registries an agent talks to, in order, and which one it uses now:
//! every failure (a refused registration, a broken keep-alive stream) moves
//! to the next. They share one etcd, so a lease granted through one is
//! renewed through any other.

use std::sync::atomic::{AtomicUsize, Ordering};

use agent_reach_proto::registry::registry_client::RegistryClient;
use tonic::transport::Channel;

pub(crate) struct Registries {
    clients: Vec<(String, RegistryClient<Channel>)>,
    current: AtomicUsize,
}

impl Registries {
    /// `clients` is never empty: the builder refuses a configuration without a URL.
    pub(crate) fn new(clients: Vec<(String, RegistryClient<Channel>)>) -> Self {
        Self {
            clients,
            current: AtomicUsize::new(0),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.clients.len()
    }

    /// The registry in use and its URL.
    pub(crate) fn current(&self) -> (&str, RegistryClient<Channel>) {
        let (url, client) = &self.clients[self.current.load(Ordering::Acquire) % self.clients.len()];
        (url, client.clone())
    }

    /// The registry in use failed: the next call goes to the next one.
    pub(crate) fn failed(&self) {
        if self.clients.len() > 1 {
            let before = self.current.fetch_add(1, Ordering::AcqRel) % self.clients.len();
            let after = (before + 1) % self.clients.len();
            tracing::warn!(
                message = "Registry failed; moving to the next one.",
                failed = %self.clients[before].0,
                next = %self.clients[after].0,
            );
        }
    }
}
