//! Where the store connects and how: one server, the primary the Sentinels
//! name, or a Redis Cluster, behind one connection type; the store made.

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::Duration;

use agent_reach_stores::slot::key_slot;
use redis::aio::ConnectionManager;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::Value as RedisValue;

use super::scripts::Scripts;
use super::{unavailable, StoreConfig, TaskStore, TaskStoreError};

/// Where the store connects.
pub(super) enum Link {
    /// One server (`redis://`, `rediss://`).
    Direct(redis::Client),
    /// The primary the Sentinels name; `url` holds the credentials and database.
    Sentinel {
        primary: std::sync::Arc<agent_reach_stores::Primary>,
        url: agent_reach_stores::RedisUrl,
    },
    /// A Redis Cluster (`redis+cluster://`): the client follows its slots.
    Cluster(Box<redis::cluster::ClusterClient>),
}

/// One connection of either kind; both are multiplexed and cheap to clone.
#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, RedisValue> {
        match self {
            Connection::Single(connection) => connection.req_packed_command(cmd),
            Connection::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<RedisValue>> {
        match self {
            Connection::Single(connection) => connection.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(connection) => connection.get_db(),
            Connection::Cluster(connection) => connection.get_db(),
        }
    }
}

impl Connection {
    /// `WAIT replicas timeout` on the node holding `key`, after a write to it
    /// on this connection: how many replicas have the write.
    pub(super) async fn wait_for(&mut self, key: &str, wait: agent_reach_stores::Wait) -> redis::RedisResult<i64> {
        let mut command = redis::cmd("WAIT");
        command.arg(wait.replicas).arg(wait.timeout_ms());
        match self {
            Connection::Single(connection) => command.query_async(connection).await,
            Connection::Cluster(connection) => {
                // The shard the write went to, not every primary (the crate's default for WAIT).
                let route = Route::new(key_slot(key.as_bytes()), SlotAddr::Master);
                let reached = connection
                    .route_command(
                        command,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await?;
                Ok(redis::from_redis_value(reached)?)
            }
        }
    }
}

/// A client for `url`'s server, or for `address` (the Sentinels' primary),
/// over TLS when the URL says so (verification always on).
fn client_for(
    url: &agent_reach_stores::RedisUrl,
    address: Option<&agent_reach_stores::HostPort>,
    tls: &agent_reach_stores::TlsFiles,
) -> Result<redis::Client, String> {
    let node = match (address, &url.nodes) {
        (Some(address), _) => address.clone(),
        (None, agent_reach_stores::Nodes::Direct(node)) => node.clone(),
        (None, _) => return Err("a Sentinel or cluster URL needs a node's address".to_string()),
    };
    let mut settings = redis::RedisConnectionInfo::default().set_db(url.db);
    if let Some(username) = &url.username {
        settings = settings.set_username(username);
    }
    if let Some(password) = &url.password {
        settings = settings.set_password(password);
    }
    let info = redis::IntoConnectionInfo::into_connection_info(node_address(&node, url.tls))
        .map_err(|error| format!("Redis {node}: {error}"))?
        .set_redis_settings(settings);
    let client = if url.tls {
        redis::Client::build_with_tls(info, tls.redis_certificates())
    } else {
        redis::Client::open(info)
    };
    client.map_err(|error| format!("Redis {node}: {}", agent_reach_stores::error_chain(&error)))
}

fn node_address(node: &agent_reach_stores::HostPort, tls: bool) -> redis::ConnectionAddr {
    if tls {
        redis::ConnectionAddr::TcpTls {
            host: node.host.clone(),
            port: node.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        redis::ConnectionAddr::Tcp(node.host.clone(), node.port)
    }
}

/// A cluster client for `url`'s seeds: TLS to every node when the URL says
/// so, the URL's credentials on every node, retries short enough that a
/// redirection or a `TRYAGAIN` costs milliseconds, not the crate's default
/// second and more.
fn cluster_client_for(
    url: &agent_reach_stores::RedisUrl,
    seeds: &[agent_reach_stores::HostPort],
    tls: &agent_reach_stores::TlsFiles,
) -> Result<redis::cluster::ClusterClient, String> {
    let infos = seeds
        .iter()
        .map(|node| redis::IntoConnectionInfo::into_connection_info(node_address(node, url.tls)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("Redis Cluster seeds: {error}"))?;
    let mut builder = redis::cluster::ClusterClientBuilder::new(infos)
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .overall_response_timeout(Some(Duration::from_secs(5)))
        .retries(12)
        .min_retry_wait(10)
        .max_retry_wait(250);
    if let Some(username) = &url.username {
        builder = builder.username(username);
    }
    if let Some(password) = &url.password {
        builder = builder.password(password);
    }
    if url.tls {
        builder = builder
            .tls(redis::cluster::TlsMode::Secure)
            .certs(tls.redis_certificates());
    }
    builder
        .build()
        .map_err(|error| format!("Redis Cluster: {}", agent_reach_stores::error_chain(&error)))
}

impl TaskStore {
    /// Connects lazily; calls fail with `Unavailable` while Redis is down and
    /// succeed again once it is back. `url` is any DESIGN §7.8 form:
    /// `redis://`, `rediss://`, `redis+sentinel://`, `rediss+sentinel://`,
    /// `redis+cluster://` or `rediss+cluster://`.
    pub fn new(url: &str, config: &StoreConfig) -> Result<Self, String> {
        let parsed = agent_reach_stores::RedisUrl::parse(url)?;
        let link = match &parsed.nodes {
            agent_reach_stores::Nodes::Direct(_) => Link::Direct(client_for(&parsed, None, &config.tls)?),
            agent_reach_stores::Nodes::Cluster { seeds } => {
                Link::Cluster(Box::new(cluster_client_for(&parsed, seeds, &config.tls)?))
            }
            agent_reach_stores::Nodes::Sentinel { .. } => {
                let sentinels = agent_reach_stores::Sentinels::from_url(&parsed, &config.tls)
                    .ok_or_else(|| format!("`{parsed}` names no Sentinel"))?;
                let primary = agent_reach_stores::Primary::new(sentinels, Duration::from_secs(2));
                // Follows failovers in the background; requests never ask the Sentinels.
                if tokio::runtime::Handle::try_current().is_ok() {
                    primary.follow();
                }
                Link::Sentinel { primary, url: parsed }
            }
        };
        Ok(Self {
            link,
            connection: std::sync::Mutex::new(None),
            wait: config.wait,
            namespace: format!("{}:{}", config.prefix, config.tenant),
            tenant: config.tenant.clone(),
            retention_s: config.retention.as_secs().max(1),
            tls: config.tls.clone(),
            scripts: Scripts::load(),
            run_scripts: super::runs::RunScripts::load(),
            pause_scripts: super::pauses::PauseScripts::load(),
            next_callback_lane: AtomicUsize::new(0),
            last_followup_sweep_ms: AtomicU64::new(0),
            backlog_view: std::sync::Mutex::new(None),
        })
    }

    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.link, Link::Cluster(_))
    }

    /// The connection: the one open, unless the Sentinels have named another
    /// primary since it was opened (one atomic load). A cluster connection
    /// follows the cluster's slots and failovers by itself.
    pub(super) async fn connection(&self) -> Result<Connection, TaskStoreError> {
        let wanted = match &self.link {
            Link::Direct(_) | Link::Cluster(_) => 0,
            Link::Sentinel { primary, .. } => primary.generation(),
        };
        if let Some((generation, connection)) = self
            .connection
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .as_ref()
        {
            if *generation == wanted {
                return Ok(connection.clone());
            }
        }
        let (generation, client) = match &self.link {
            Link::Cluster(client) => {
                let connection = Connection::Cluster(client.get_async_connection().await.map_err(unavailable)?);
                *self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Some((0, connection.clone()));
                return Ok(connection);
            }
            Link::Direct(client) => (0, client.clone()),
            Link::Sentinel { primary, url } => {
                let (address, generation) = primary.current().await.map_err(TaskStoreError::Unavailable)?;
                (
                    generation,
                    client_for(url, Some(&address), &self.tls).map_err(TaskStoreError::Unavailable)?,
                )
            }
        };
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(2);
        let mut connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(unavailable)?;
        if let Link::Sentinel { primary, .. } = &self.link {
            // A Sentinel's answer can lag a failover: never write to a replica.
            let role: Vec<RedisValue> = redis::cmd("ROLE")
                .query_async(&mut connection)
                .await
                .map_err(unavailable)?;
            let role = match role.first() {
                Some(RedisValue::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                Some(RedisValue::SimpleString(text)) => text.clone(),
                _ => "server with an unreadable ROLE".to_string(),
            };
            if role != "master" {
                let _ = primary.refresh().await;
                return Err(TaskStoreError::Unavailable(format!(
                    "refusing a Redis that is a {role} now, not the primary of `{}`",
                    primary.service()
                )));
            }
        }
        let connection = Connection::Single(connection);
        *self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
            Some((generation, connection.clone()));
        Ok(connection)
    }

    /// The tenant whose tasks this store holds: deliveries are made on behalf
    /// of callers of this tenant.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }
}
