//! Test support: spawns real `etcd`, `redis-server` and `prometheus` processes
//! on free loopback ports with temporary data directories, waits until they
//! answer, and kills them on drop; [`EtcdCluster`] runs three etcd members, [`RedisSentinels`] a
//! Redis primary, its replica and three Sentinels, [`RedisCluster`] a Redis
//! Cluster of three primaries and three replicas.
//!
//! A missing binary fails with a message naming the package and the setup
//! command (`scripts/setup.sh`). Everything binds to 127.0.0.1 only.
//!
//! With the `otlp` feature, [`otlp::Receiver`] is a real OTLP/gRPC trace
//! receiver in-process, for tests of exported spans. With the `services`
//! feature: [`eventually`] (poll a condition with a bound), [`hs256_token`],
//! [`Isolated`] (a service on its own runtime, killable like a process) and
//! [`RegistryProcess`] (the real registry run that way). With `pki`,
//! [`pki::Pki`] writes a test CA and certificates signed by it. With `oidc`,
//! [`oidc::OidcProvider`] runs a real OpenID provider (Node's
//! `oidc-provider`, from `testkit/oidc-provider`). [`assert_every_test_file_runs`]
//! keeps a package's one integration-test binary whole.

mod etcd_cluster;
mod group;
#[cfg(feature = "oidc")]
pub mod oidc;
#[cfg(feature = "otlp")]
pub mod otlp;
#[cfg(feature = "pki")]
pub mod pki;
mod redis_cluster;
mod redis_ha;
#[cfg(feature = "services")]
mod services;
mod test_files;

#[cfg(feature = "services")]
pub use services::{eventually, hs256_token, Isolated, RegistryProcess};

pub use etcd_cluster::EtcdCluster;
pub use group::ProcessGroup;
pub use redis_cluster::{ClusterShape, NodeView, RedisCluster};
pub use redis_ha::RedisSentinels;
pub use test_files::assert_every_test_file_runs;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to become healthy.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(30);
const SETUP_HINT: &str = "run `sudo scripts/setup.sh` (installs etcd-server, redis-server and prometheus)";

/// A free TCP port on 127.0.0.1. Another process could take it before we
/// bind it; server start-up retries on a fresh port when that happens.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .unwrap_or_else(|error| panic!("cannot bind a loopback port: {error}"))
}

/// Finds `binary` on PATH or in the usual system directories.
pub fn find_binary(binary: &str, package: &str) -> PathBuf {
    let from_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    let candidates = from_path
        .into_iter()
        .chain(["/usr/bin", "/usr/sbin", "/usr/local/bin"].map(PathBuf::from));
    for dir in candidates {
        let candidate = dir.join(binary);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!("`{binary}` not found: install the Debian package `{package}`; {SETUP_HINT}");
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sends a raw request and returns the response text (used for health probes,
/// so the kit needs no HTTP or Redis client).
pub(crate) fn exchange(addr: SocketAddr, request: &[u8]) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    stream.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    stream.write_all(request).ok()?;
    let mut buf = vec![0u8; 4096];
    let mut out = Vec::new();
    // Read until the peer closes or the answer looks complete.
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if out.ends_with(b"\r\n") && !request.starts_with(b"GET") {
            break;
        }
    }
    String::from_utf8(out).ok()
}

/// Whether `GET path` on `addr` answers 200.
pub fn http_ok(addr: SocketAddr, path: &str) -> bool {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    exchange(addr, request.as_bytes()).is_some_and(|answer| answer.starts_with("HTTP/1.1 200"))
}

/// A running child process that is killed (and reaped) on drop.
pub(crate) struct Guard {
    child: Child,
}

impl Guard {
    fn spawn(command: &mut Command, log: &Path) -> std::io::Result<Self> {
        let log = std::fs::File::create(log)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        Ok(Self { child })
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.kill();
    }
}

pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

// === etcd ===

/// A single-member etcd on loopback. Killed on drop; its data dir is removed.
pub struct Etcd {
    process: Option<Guard>,
    client_port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
    /// Serve clients over https with these certificates, requiring a client certificate.
    tls: Option<(PathBuf, PathBuf, PathBuf)>,
}

impl Etcd {
    /// Starts etcd and waits until `/health` reports healthy.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// Starts etcd serving clients over https only (a server certificate from
    /// `pki`, client certificates signed by its CA required).
    #[cfg(feature = "pki")]
    pub fn start_tls(pki: &pki::Pki) -> Self {
        let server = pki.server("etcd");
        Self::start_with(Some((pki.ca_file.clone(), server.cert, server.key)))
    }

    fn start_with(tls: Option<(PathBuf, PathBuf, PathBuf)>) -> Self {
        let binary = find_binary("etcd", "etcd-server");
        let dir = tempfile::Builder::new()
            .prefix("agent-reach-etcd-")
            .tempdir()
            .unwrap_or_else(|error| panic!("cannot create a temp dir for etcd: {error}"));
        let mut etcd = Self {
            process: None,
            client_port: 0,
            peer_port: 0,
            dir,
            tls,
        };
        let mut last_log = String::new();
        for _ in 0..5 {
            etcd.client_port = free_port();
            etcd.peer_port = free_port();
            match etcd.launch(&binary) {
                Ok(()) => return etcd,
                Err(log) => last_log = log,
            }
        }
        panic!("etcd did not become healthy; last log lines:\n{last_log}");
    }

    fn launch(&mut self, binary: &Path) -> Result<(), String> {
        let data = self.dir.path().join(format!("data-{}", self.client_port));
        let log = self.dir.path().join("etcd.log");
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut command = Command::new(binary);
        if let Some((ca, cert, key)) = &self.tls {
            command
                .arg(format!("--cert-file={}", cert.display()))
                .arg(format!("--key-file={}", key.display()))
                .arg(format!("--trusted-ca-file={}", ca.display()))
                .arg("--client-cert-auth=true");
        }
        command
            .arg("--name=testkit")
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=testkit={peer}"))
            .arg("--initial-cluster-state=new")
            .arg(if self.tls.is_some() {
                "--log-level=info"
            } else {
                "--log-level=warn"
            })
            // Fast elections for a single member.
            .arg("--heartbeat-interval=50")
            .arg("--election-timeout=500")
            .env("ETCD_UNSUPPORTED_ARCH", std::env::consts::ARCH);
        let mut guard = Guard::spawn(&mut command, &log).map_err(|error| error.to_string())?;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.client_port));
        let tls = self.tls.is_some();
        let healthy = wait_until(START_TIMEOUT, || {
            if guard.exited().is_some() {
                return true;
            }
            if tls {
                // The kit speaks no TLS: etcd says when it serves (at info level).
                return std::fs::read_to_string(&log).is_ok_and(|text| {
                    text.contains("serving client requests on") || text.contains("serving client traffic securely")
                });
            }
            exchange(addr, b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                .is_some_and(|answer| answer.contains("\"health\":\"true\""))
        });
        if guard.exited().is_some() || !healthy {
            return Err(tail(&log));
        }
        self.process = Some(guard);
        Ok(())
    }

    /// `http://127.0.0.1:PORT` (`https://` when started with TLS)
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The etcd process id (benches read its CPU time from /proc).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|process| process.child.id())
    }

    /// Kills etcd (SIGKILL), keeping its data for [`Etcd::restart`].
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Starts etcd again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        let binary = find_binary("etcd", "etcd-server");
        if let Err(log) = self.launch(&binary) {
            panic!("etcd did not come back; last log lines:\n{log}");
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

// === Redis ===

/// A Redis server on loopback without persistence. Killed on drop.
pub struct Redis {
    process: Option<Guard>,
    port: u16,
    dir: tempfile::TempDir,
    /// TLS only on `port` (CA, certificate, key), client certificates required.
    tls: Option<(PathBuf, PathBuf, PathBuf)>,
}

impl Redis {
    /// Starts redis-server and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// Starts redis-server speaking TLS only (`--tls-port`, a server
    /// certificate from `pki`, client certificates signed by its CA required).
    #[cfg(feature = "pki")]
    pub fn start_tls(pki: &pki::Pki) -> Self {
        let server = pki.server("redis");
        Self::start_with(Some((pki.ca_file.clone(), server.cert, server.key)))
    }

    /// The redis-server process id while it runs (benches read its CPU time).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|process| process.child.id())
    }

    fn start_with(tls: Option<(PathBuf, PathBuf, PathBuf)>) -> Self {
        let binary = find_binary("redis-server", "redis-server");
        let dir = tempfile::Builder::new()
            .prefix("agent-reach-redis-")
            .tempdir()
            .unwrap_or_else(|error| panic!("cannot create a temp dir for redis: {error}"));
        let mut redis = Self {
            process: None,
            port: 0,
            dir,
            tls,
        };
        let mut last_log = String::new();
        for _ in 0..5 {
            redis.port = free_port();
            match redis.launch(&binary) {
                Ok(()) => return redis,
                Err(log) => last_log = log,
            }
        }
        panic!("redis-server did not become healthy; last log lines:\n{last_log}");
    }

    fn launch(&mut self, binary: &Path) -> Result<(), String> {
        let log = self.dir.path().join("redis.log");
        let mut command = Command::new(binary);
        match &self.tls {
            Some((ca, cert, key)) => {
                command
                    .arg("--port")
                    .arg("0")
                    .arg("--tls-port")
                    .arg(self.port.to_string())
                    .arg("--tls-cert-file")
                    .arg(cert)
                    .arg("--tls-key-file")
                    .arg(key)
                    .arg("--tls-ca-cert-file")
                    .arg(ca)
                    .arg("--tls-auth-clients")
                    .arg("yes");
            }
            None => {
                command.arg("--port").arg(self.port.to_string());
            }
        }
        command
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--protected-mode")
            .arg("yes");
        let mut guard = Guard::spawn(&mut command, &log).map_err(|error| error.to_string())?;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let tls = self.tls.is_some();
        let healthy = wait_until(START_TIMEOUT, || {
            if tls {
                // The kit speaks no TLS: Redis says when it serves.
                return guard.exited().is_some()
                    || std::fs::read_to_string(&log).is_ok_and(|text| text.contains("Ready to accept connections"));
            }
            guard.exited().is_some() || exchange(addr, b"PING\r\n").is_some_and(|answer| answer.starts_with("+PONG"))
        });
        if guard.exited().is_some() || !healthy {
            return Err(tail(&log));
        }
        self.process = Some(guard);
        Ok(())
    }

    /// `redis://127.0.0.1:PORT` (`rediss://` when started with TLS)
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills Redis (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Freezes Redis (SIGSTOP): its connections stay open but nothing is
    /// answered, as with a hung host or a network partition. [`Redis::thaw`]
    /// resumes it; dropping a frozen Redis still kills it.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a frozen Redis run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        let Some(process) = &self.process else {
            panic!("redis-server is not running");
        };
        let pid = libc::pid_t::try_from(process.child.id()).unwrap_or_else(|_| panic!("pid out of range"));
        // SAFETY: kill(2) with a pid this Redis guard spawned and has not reaped.
        if unsafe { libc::kill(pid, signal) } != 0 {
            panic!("cannot signal redis-server: {}", std::io::Error::last_os_error());
        }
    }

    /// Starts Redis again on the same port (data is not kept: no persistence).
    pub fn restart(&mut self) {
        self.kill();
        let binary = find_binary("redis-server", "redis-server");
        if let Err(log) = self.launch(&binary) {
            panic!("redis-server did not come back; last log lines:\n{log}");
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

// === Prometheus ===

/// `promtool` (shipped by the Debian package `prometheus`).
pub fn promtool() -> PathBuf {
    find_binary("promtool", "prometheus")
}

/// A Prometheus server on loopback scraping the given jobs, with a temp TSDB.
/// Killed on drop; its data dir is removed.
pub struct Prometheus {
    process: Option<Guard>,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping `jobs` (job name, `host:port` targets) every
    /// `scrape_interval`, and waits until `/-/ready` answers.
    pub fn start(jobs: &[(&str, Vec<String>)], scrape_interval: Duration) -> Self {
        let binary = find_binary("prometheus", "prometheus");
        let dir = tempfile::Builder::new()
            .prefix("agent-reach-prometheus-")
            .tempdir()
            .unwrap_or_else(|error| panic!("cannot create a temp dir for prometheus: {error}"));
        let interval = format!("{}ms", scrape_interval.as_millis().max(1));
        let mut config =
            format!("global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\nscrape_configs:\n");
        for (job, targets) in jobs {
            let targets: Vec<String> = targets.iter().map(|target| format!("\"{target}\"")).collect();
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ));
        }
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config)
            .unwrap_or_else(|error| panic!("cannot write the prometheus config: {error}"));
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port();
            let log = dir.path().join("prometheus.log");
            let mut command = Command::new(&binary);
            command
                .arg(format!("--config.file={}", config_path.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join(format!("data-{port}")).display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .arg("--log.level=warn");
            let mut guard = match Guard::spawn(&mut command, &log) {
                Ok(guard) => guard,
                Err(error) => panic!("cannot start {}: {error}", binary.display()),
            };
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let ready = wait_until(START_TIMEOUT, || {
                guard.exited().is_some()
                    || exchange(addr, b"GET /-/ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                        .is_some_and(|answer| answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"))
            });
            if guard.exited().is_none() && ready {
                return Self {
                    process: Some(guard),
                    port,
                    _dir: dir,
                };
            }
            last_log = tail(&log);
        }
        panic!("prometheus did not become ready; last log lines:\n{last_log}");
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops the server now (also done on drop).
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }
}
