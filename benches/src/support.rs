//! What the benches share, so that each bench file holds only its own
//! measurement: the allocator; `main`, flags and the smoke mode (`Run`); the
//! files the services read; the services as child processes (this binary
//! re-executed as a registry, router or context service); bounded waits; a
//! JSON agent, registration with heartbeats; HTTP/1.1 client connections and
//! client threads; wrk; CPU readings and quantiles. Included by `#[path]`
//! from each bench binary of the README's table (`chaos` has its own stack).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use serde_json::json;

/// mimalloc, as in the `agent-reach` binary: under load glibc malloc (with its arena
/// locks) took 15-20 % of the router's and context service's CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// === Run ===

/// Whether a run is judged against its bench's target, or is a smoke run
/// (`--smoke`): every stack and comparison process of the bench, for a few
/// seconds on tiny sizes, to show the bench still runs. Numbers that short
/// say nothing about a target, so a smoke run prints them without a verdict
/// and never fails on one; it fails only when something does not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    Judged,
    /// The flags that set the smoke run's sizes.
    Smoke(&'static [&'static str]),
}

impl Run {
    /// `when_met` or `when_missed` in a judged run; nothing in a smoke run.
    pub fn verdict<'a>(self, met: bool, (when_met, when_missed): (&'a str, &'a str)) -> &'a str {
        match (self, met) {
            (Self::Smoke(_), _) => "",
            (Self::Judged, true) => when_met,
            (Self::Judged, false) => when_missed,
        }
    }

    pub fn is_judged(self) -> bool {
        self == Self::Judged
    }

    /// How long to warm up before a measurement: `judged` in a judged run; a
    /// smoke run skips warm-ups (they repeat the measured path).
    pub fn warm_up(self, judged: Duration) -> Option<Duration> {
        match self {
            Self::Judged => Some(judged),
            Self::Smoke(_) => None,
        }
    }

    /// Says so above a smoke run's numbers, so they are not read as a measurement.
    pub fn announce(self, bench: &str) {
        if let Self::Smoke(flags) = self {
            println!(
                "{bench}: smoke run (--smoke: {}, no warm-ups): numbers without a verdict",
                flags.join(" ")
            );
        }
    }
}

/// The bench's own runtime (its agents and load generator).
#[derive(Debug, Clone, Copy)]
pub enum Threads {
    /// Two worker threads whatever the box's cores (router-, protocols- and
    /// tenants-bench, as every run in docs/benchmarks.md had them).
    Two,
    /// One worker thread per core (tokio's default).
    PerCore,
}

/// A bench's `main`: a process the bench started as one of `services` runs
/// that service; the bench itself parses its flags ([`parse_flags`], with
/// `smoke` for `--smoke`) and runs `bench` on a runtime with `threads`.
pub fn main<A, F>(
    services: &[ChildService],
    smoke: &'static [&'static str],
    threads: Threads,
    bench: impl FnOnce(A, Run) -> F,
) -> anyhow::Result<()>
where
    A: clap::Parser,
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    if let Some(service) = run_child(services) {
        return service;
    }
    let (args, run) = parse_flags::<A>(smoke);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Threads::Two = threads {
        runtime.worker_threads(2);
    }
    runtime.enable_all().build()?.block_on(bench(args, run))
}

/// Parses the bench's flags, `A` (which has a `smoke` flag). With `--smoke`
/// they are parsed again with `smoke` added, the smoke run's sizes as flags:
/// a smoke run is the bench run with those flags (a size given beside
/// `--smoke` is refused as given twice).
pub fn parse_flags<A: clap::Parser>(smoke: &'static [&'static str]) -> (A, Run) {
    let command = A::command();
    let parsed = |argv: Vec<String>| -> Result<(A, bool), clap::Error> {
        let mut matches = command.clone().try_get_matches_from(argv)?;
        // Every bench's flags define `smoke` (clap panics on an undefined one:
        // a bench's bug, which its first run shows).
        let smoke = matches.get_flag("smoke");
        Ok((A::from_arg_matches_mut(&mut matches)?, smoke))
    };
    let argv: Vec<String> = std::env::args().collect();
    let outcome = parsed(argv.clone()).and_then(|(args, smoking)| match smoking {
        false => Ok((args, Run::Judged)),
        true => {
            let with_sizes = argv
                .into_iter()
                .chain(smoke.iter().map(|flag| flag.to_string()))
                .collect();
            let sized = parsed(with_sizes).map_err(|error| match error.kind() {
                clap::error::ErrorKind::ArgumentConflict => clap::Error::raw(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!(
                        "{} cannot be given with --smoke, which sets `{}` itself\n",
                        error
                            .get(clap::error::ContextKind::InvalidArg)
                            .map_or_else(|| "a size".to_string(), ToString::to_string),
                        smoke.join(" ")
                    ),
                ),
                _ => error,
            });
            Ok((sized?.0, Run::Smoke(smoke)))
        }
    });
    // As `Parser::parse`: the usage error (or `--help`) printed, and the process exits.
    outcome.unwrap_or_else(|error| error.exit())
}

// === Files and tokens ===

/// The HS256 secret every bench's services verify tokens with.
pub const SECRET: &str = "bench-secret-bench-secret-bench-secret-000000";

/// What a bench's services read, in a temp dir removed on drop: the HS256
/// secret, the key the router signs every forwarded call's assertion with
/// (a fresh one per run) and `acl.yaml`.
pub struct Files {
    pub dir: tempfile::TempDir,
    pub secret: PathBuf,
    pub assertion_key: PathBuf,
    pub acl: PathBuf,
}

impl Files {
    pub fn write(acl: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let secret = dir.path().join("hs256.secret");
        std::fs::write(&secret, SECRET)?;
        let assertion_key = dir.path().join("assertion.pem");
        let (_, pem) = agent_reach_access::AssertionKey::generate().map_err(anyhow::Error::msg)?;
        std::fs::write(&assertion_key, pem)?;
        let acl_file = dir.path().join("acl.yaml");
        std::fs::write(&acl_file, acl)?;
        Ok(Self {
            dir,
            secret,
            assertion_key,
            acl: acl_file,
        })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A file of the run: written into the temp dir, its path as an argument.
    pub fn write_file(&self, name: &str, contents: &str) -> anyhow::Result<PathBuf> {
        self.write_bytes(name, contents.as_bytes())
    }

    /// A file of `contents` in the bench's directory (e.g. a request body a load generator sends).
    pub fn write_bytes(&self, name: &str, contents: &[u8]) -> anyhow::Result<PathBuf> {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents)?;
        Ok(path)
    }

    /// The flags every service takes alike: where it listens, its policy and its secret.
    fn service_args(&self, listen: SocketAddr) -> Vec<String> {
        vec![
            "--listen".into(),
            listen.to_string(),
            "--acl".into(),
            path_arg(&self.acl),
            "--auth-hs256-secret-file".into(),
            path_arg(&self.secret),
        ]
    }
}

/// An `acl.yaml` letting `caller` call `allow` (a YAML list's items) and
/// the benches' agents, `bench_agent`, provide any `bench.*` capability.
pub fn caller_acl(caller: &str, allow: &str) -> String {
    format!(
        "version: 1\npermissions:\n  - caller: {caller}\n    allow: [{allow}]\nproviders:\n  - agent: bench_agent\n    provides: [\"bench.*\"]\n"
    )
}

pub fn path_arg(path: &Path) -> String {
    path.to_string_lossy().to_string()
}

/// A token of the default tenant for `name`, valid for the longest run.
pub fn token(name: &str) -> anyhow::Result<String> {
    tenant_token(name, None)
}

/// A token for `name` in `tenant` (`None`: the default tenant, no claim).
pub fn tenant_token(name: &str, tenant: Option<&str>) -> anyhow::Result<String> {
    agent_reach_access::token::issue_hs256_for(name, tenant, SECRET.as_bytes(), Duration::from_secs(86_400))
        .map_err(anyhow::Error::msg)
}

// === Child processes ===

/// A child process killed on drop.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A server stopped with SIGTERM on drop, then killed if it has not exited
/// within five seconds: a server with children of its own (nginx's workers)
/// stops them on SIGTERM, while SIGKILL would leave them running.
pub struct TerminatedGuard(pub Child);

impl Drop for TerminatedGuard {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.0.id()) {
            // SAFETY: kill(2) with the pid of a child this process spawned and has not reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until {
                if matches!(self.0.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A program of the distribution's packages (`scripts/setup.sh` installs them),
/// run as a child of the bench that is killed on drop.
pub fn spawn_program(program: &str, package: &str, args: &[String]) -> anyhow::Result<Child> {
    Command::new(agent_reach_testkit::find_binary(program, package))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("running {program} (apt-get install {package}; scripts/setup.sh does)"))
}

pub fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], agent_reach_testkit::free_port()))
}

/// Polls `ok` until it holds, at most `timeout`.
pub async fn wait_for(what: &str, timeout: Duration, mut ok: impl AsyncFnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ok().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{what} not ready within {timeout:?}")
}

/// Whether `request` was answered with a 2xx within five seconds (a poll
/// that hangs counts as not yet, so the poll's own bound still holds).
pub async fn answers_ok(request: reqwest::RequestBuilder) -> bool {
    request
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .is_ok_and(|response| response.status().is_success())
}

// === Services ===

/// A service this binary runs as a child process of itself (so the
/// service's CPU is measured apart from the load generator's), named by its
/// first argument.
#[derive(Clone, Copy)]
pub struct ChildService {
    mode: &'static str,
    run: fn(Vec<String>) -> anyhow::Result<()>,
}

pub const REGISTRY: ChildService = ChildService {
    mode: "__serve-registry",
    run: serve_registry,
};
pub const ROUTER: ChildService = ChildService {
    mode: "__serve-router",
    run: serve_router,
};
pub const CONTEXT: ChildService = ChildService {
    mode: "__serve-context",
    run: serve_context,
};

/// Set on router children that log (and trace, when `OTEL_*` ask) like `agent-reach router`.
pub const BENCH_TELEMETRY: &str = "AGENT_REACH_BENCH_TELEMETRY";

/// When the bench started this process as one of `services` (its first
/// argument names it), runs that service and returns its outcome; `None` in
/// the bench itself. (A slice, so that a bench links only the services it runs.)
pub fn run_child(services: &[ChildService]) -> Option<anyhow::Result<()>> {
    let mut argv: Vec<String> = std::env::args().collect();
    let service = services
        .iter()
        .find(|service| argv.get(1) == Some(&service.mode.to_string()))?;
    argv.remove(1);
    Some((service.run)(argv))
}

/// A service's own flags, as its `agent-reach` subcommand takes them.
#[derive(Debug, Parser)]
struct ServiceFlags<T: clap::Args> {
    #[command(flatten)]
    flags: T,
}

/// Parses a service's flags from `argv` and runs it until the bench kills it.
fn serve<T, F>(argv: Vec<String>, run: impl FnOnce(T) -> F) -> anyhow::Result<()>
where
    T: clap::Args,
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    let flags = ServiceFlags::<T>::parse_from(argv).flags;
    tokio::runtime::Runtime::new()?.block_on(run(flags))
}

fn serve_registry(argv: Vec<String>) -> anyhow::Result<()> {
    serve(argv, |flags| agent_reach_registry::run(flags, std::future::pending()))
}

fn serve_router(argv: Vec<String>) -> anyhow::Result<()> {
    serve(argv, |flags| async {
        let _telemetry = match std::env::var_os(BENCH_TELEMETRY) {
            Some(_) => Some(agent_reach_telemetry::init(&agent_reach_telemetry::Options {
                format: agent_reach_telemetry::LogFormat::Text,
                default_filter: "info".to_string(),
                service_name: "agent-reach-router".to_string(),
            })?),
            None => None,
        };
        // As `agent-reach router` (cli/src/plugins.rs): the example policy plugged in.
        let plugins = agent_reach_router::Plugins::new()
            .with(agent_reach_policy_example::NAME, agent_reach_policy_example::Cheapest)
            .map_err(anyhow::Error::msg)?;
        agent_reach_router::run_with_plugins(flags, plugins, std::future::pending()).await
    })
}

fn serve_context(argv: Vec<String>) -> anyhow::Result<()> {
    serve(argv, |flags| agent_reach_context::run(flags, std::future::pending()))
}

/// A service of the bench, running as a child process, killed on drop.
pub struct Service {
    pub child: ChildGuard,
    pub addr: SocketAddr,
    /// `http://ADDR`
    pub url: String,
}

impl Service {
    /// `service` on a free port, with the flags every service takes, then `args`.
    pub fn spawn(
        service: ChildService,
        files: &Files,
        args: &[String],
        env: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let addr = free_addr();
        let child = Command::new(std::env::current_exe()?)
            .arg(service.mode)
            .args(files.service_args(addr))
            .args(args)
            .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawning {}", service.mode))?;
        Ok(Self {
            child: ChildGuard(child),
            addr,
            url: format!("http://{addr}"),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Polls until `ok` holds, at most `timeout`; fails at once, with the
    /// service's exit status, when it has exited (a flag it refused).
    pub async fn wait_until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut ok: impl AsyncFnMut() -> bool,
    ) -> anyhow::Result<()> {
        let child = &mut self.child.0;
        let mut exited = None;
        wait_for(what, timeout, async || {
            exited = child.try_wait().ok().flatten();
            exited.is_some() || ok().await
        })
        .await?;
        match exited {
            Some(status) => bail!("{what}: the service exited ({status}) before it was ready"),
            None => Ok(()),
        }
    }

    /// Polls `GET /readyz` until it answers 200, at most `timeout`.
    pub async fn wait_ready(&mut self, what: &str, timeout: Duration) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let ready = format!("{}/readyz", self.url);
        self.wait_until(what, timeout, async || answers_ok(client.get(&ready)).await)
            .await
    }
}

/// The registry on `etcd`, ready (`/readyz`), with the common flags and `args`.
pub async fn start_registry(files: &Files, etcd: &str, args: &[String]) -> anyhow::Result<Service> {
    let mut all = vec!["--etcd".to_string(), etcd.to_string()];
    all.extend_from_slice(args);
    let mut registry = Service::spawn(REGISTRY, files, &all, &[])?;
    registry.wait_ready("registry", Duration::from_secs(30)).await?;
    Ok(registry)
}

/// How a bench's router child is started beyond the common flags.
#[derive(Default)]
pub struct RouterOptions<'a> {
    /// Request threads (`--threads`; 0: one per core).
    pub threads: usize,
    /// More flags (`--agent-ca-file`, `--tenant-map`, ...).
    pub args: &'a [String],
    /// More environment (`BENCH_TELEMETRY`, `OTEL_*`).
    pub env: &'a [(&'a str, String)],
}

/// A router on `registry`, signing assertions with the run's key. Not
/// waited for: each bench waits until its own agents are routable.
pub fn spawn_router(files: &Files, registry: &str, options: RouterOptions<'_>) -> anyhow::Result<Service> {
    let mut args = vec![
        "--registry".to_string(),
        registry.to_string(),
        "--assertion-key".into(),
        path_arg(&files.assertion_key),
        "--threads".into(),
        options.threads.to_string(),
    ];
    args.extend_from_slice(options.args);
    Service::spawn(ROUTER, files, &args, options.env)
}

/// The context service on `redis`, ready (`/readyz`).
pub async fn start_context(files: &Files, redis: &str) -> anyhow::Result<Service> {
    let args = [
        "--redis".to_string(),
        redis.to_string(),
        "--key-prefix".into(),
        "bench".into(),
    ];
    let env = [("AGENT_REACH_CONTEXT_REDIS_TIMEOUT", "2s".to_string())];
    let mut context = Service::spawn(CONTEXT, files, &args, &env)?;
    context.wait_ready("context service", Duration::from_secs(30)).await?;
    Ok(context)
}

// === Agents ===

/// A listener with Nagle's algorithm off, as proxies have it.
pub fn nodelay(listener: tokio::net::TcpListener) -> impl axum::serve::Listener<Addr = SocketAddr> {
    use axum::serve::ListenerExt as _;
    listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    })
}

async fn json_agent(body: axum::body::Bytes) -> impl axum::response::IntoResponse {
    // Reading the body is part of the work; the answer is a small envelope.
    let _ = body.len();
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        r#"{"output":{"status":"paid","ships_today":true}}"#,
    )
}

fn json_agent_app() -> axum::Router {
    axum::Router::new().route("/invoke", axum::routing::post(json_agent))
}

/// An agent answering every call at once with a small JSON output. It does
/// not check the router's assertion (as no backend of HAProxy or nginx
/// would), so the router, the comparison proxy and a direct call all reach
/// the same handler.
pub async fn start_json_agent() -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = json_agent_app();
    tokio::spawn(async move { axum::serve(nodelay(listener), app).await });
    Ok(addr)
}

/// [`start_json_agent`] behind TLS with `cert` (the front door's TLS; it sets no Nagle too).
pub async fn start_json_agent_tls(cert: &agent_reach_testkit::pki::CertFiles) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let tls = agent_reach_serving::tls::ServerTls::load(agent_reach_serving::tls::ServerFiles {
        cert: cert.cert.clone(),
        key: cert.key.clone(),
        client_ca: None,
    })?;
    let door = agent_reach_serving::front::Door {
        hot: agent_reach_serving::front::NoHotRoutes,
        app: json_agent_app(),
        body_limit: 0,
        tls: Some(tls),
    };
    tokio::spawn(door.serve(listener, std::future::pending()));
    Ok(addr)
}

/// One instance to register: one capability taking `{order_id}`.
pub struct Instance<'a> {
    pub id: &'a str,
    /// The agent name (the token's `sub`, the ACL's `providers`).
    pub name: &'a str,
    pub endpoint: String,
    pub capability: &'a str,
    pub weight: u32,
}

/// Registers `instance` with `token` and keeps its lease alive for the rest of the run.
pub async fn register(
    client: &reqwest::Client,
    registry: &str,
    token: &str,
    instance: Instance<'_>,
) -> anyhow::Result<()> {
    let id = instance.id;
    let body = json!({
        "agent_id": id, "name": instance.name, "endpoint": instance.endpoint,
        "weight": instance.weight, "ttl_s": 30, "status": "ready",
        "capabilities": [{
            "name": instance.capability, "version": "1.0.0",
            "input_schema": { "type": "object", "required": ["order_id"], "properties": { "order_id": { "type": "string" } } }
        }]
    });
    let response = client
        .post(format!("{registry}/v1/agents"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("registration of {id} failed: {}", response.text().await?);
    }
    let answer: serde_json::Value = response.json().await?;
    let lease = answer["lease_id"].as_i64().context("lease_id")?;
    let (client, registry, id, token) = (client.clone(), registry.to_string(), id.to_string(), token.to_string());
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let _ = client
                .put(format!("{registry}/v1/agents/{id}/heartbeat"))
                .bearer_auth(&token)
                .json(&json!({ "lease_id": lease }))
                .send()
                .await;
        }
    });
    Ok(())
}

// === Clients ===

/// An HTTP/1.1 connection kept alive across requests.
pub type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// A kept-alive HTTP/1.1 connection to `addr`, Nagle off.
pub async fn connect(addr: SocketAddr) -> anyhow::Result<Sender> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// Runs `work` on a thread of its own with a single-threaded runtime: a
/// measuring client's connections, their reads and its clock all on one
/// thread, as a separate client process would be, queueing behind nothing
/// else of this process (on the bench's shared runtime every body frame
/// crossed from a worker thread to the measuring task, and one client's
/// tasks waited behind another's).
pub async fn on_own_runtime<T: Send + 'static>(
    work: impl std::future::Future<Output = anyhow::Result<T>> + Send + 'static,
) -> anyhow::Result<T> {
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("bench-client".into()).spawn(move || {
        let outcome = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|runtime| runtime.block_on(work));
        let _ = done.send(outcome);
    })?;
    result.await.context("the client thread ended without a result")?
}

// === wrk ===

/// One wrk run.
pub struct Wrk<'a> {
    pub script: &'a Path,
    pub url: &'a str,
    pub threads: u32,
    pub connections: u32,
    pub duration_s: u64,
}

/// What wrk printed.
#[derive(Debug, Clone)]
pub struct WrkOutput {
    pub requests_per_s: f64,
    /// Requests completed in the run.
    pub requests: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// wrk's `Non-2xx ...` and `Socket errors ...` lines, empty when there were none.
    pub errors: String,
}

impl Wrk<'_> {
    /// Runs wrk (`--latency`, which only adds the percentiles to what it prints).
    pub fn run(&self) -> anyhow::Result<WrkOutput> {
        let output = Command::new(agent_reach_testkit::find_binary("wrk", "wrk"))
            .arg(format!("-t{}", self.threads.min(self.connections).max(1)))
            .arg(format!("-c{}", self.connections))
            .arg(format!("-d{}s", self.duration_s))
            .arg("--latency")
            .arg("-s")
            .arg(self.script)
            .arg(self.url)
            .output()
            .context("running wrk (apt-get install wrk)")?;
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        let mut result = WrkOutput {
            requests_per_s: 0.0,
            requests: 0,
            p50_us: f64::NAN,
            p99_us: f64::NAN,
            errors: String::new(),
        };
        for line in text.lines() {
            let trimmed = line.trim();
            if let Some(rest) = trimmed.strip_prefix("Requests/sec:") {
                result.requests_per_s = rest.trim().parse().unwrap_or(0.0);
            } else if let Some(rest) = trimmed.strip_prefix("50%") {
                result.p50_us = parse_latency_us(rest).unwrap_or(f64::NAN);
            } else if let Some(rest) = trimmed.strip_prefix("99%") {
                result.p99_us = parse_latency_us(rest).unwrap_or(f64::NAN);
            } else if let Some((count, _)) = trimmed.split_once(" requests in ") {
                result.requests = count.trim().parse().unwrap_or(0);
            } else if trimmed.starts_with("Non-2xx") || trimmed.starts_with("Socket errors") {
                result.errors.push_str(trimmed);
                result.errors.push(' ');
            }
        }
        if result.requests_per_s == 0.0 {
            bail!(
                "wrk produced no result against {}:\n{text}\n{}",
                self.url,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(result)
    }
}

fn parse_latency_us(text: &str) -> Option<f64> {
    let text = text.trim();
    let (number, factor) = if let Some(n) = text.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1_000.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1_000_000.0)
    } else {
        (text, 1.0)
    };
    number.trim().parse::<f64>().ok().map(|value| value * factor)
}

/// A wrk script POSTing `body` (JSON) with `token`, written into the run's dir.
pub fn wrk_post_script(files: &Files, name: &str, body: &str, token: &str) -> anyhow::Result<PathBuf> {
    files.write_file(
        name,
        &format!(
            "wrk.method = \"POST\"\nwrk.body = '{body}'\nwrk.headers[\"Content-Type\"] = \"application/json\"\n\
             wrk.headers[\"Authorization\"] = \"Bearer {token}\"\n"
        ),
    )
}

// === Numbers ===

/// CPU seconds (user + system) process `pid` has used, from /proc/PID/stat.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let (_, after) = stat.rsplit_once(')').context("unexpected /proc stat format")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |index: usize| -> anyhow::Result<f64> {
        Ok(fields.get(index).context("a short /proc stat line")?.parse::<f64>()?)
    };
    // Linux reports in clock ticks of 1/100 s (CLK_TCK) on every mainstream platform.
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// The `q` quantile (0..=1) of `sorted`, nearest rank.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// Serves on a free loopback port (`serve` gets the bound listener, on a task of its own).
pub async fn serve_on_free_port<F, Fut>(serve: F) -> anyhow::Result<SocketAddr>
where
    F: FnOnce(tokio::net::TcpListener) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(listener));
    Ok(addr)
}

/// The slow-path benches' stack in this process (tasks-bench, workflows-bench):
/// a registry on its embedded store, a router with the slow path on `redis`
/// (`workers` deliveries at once, quotas shared, no trail), and two SDK echo
/// agents (`bench.echo`, as `bench_agent`) the router routes to.
pub struct EchoStack {
    pub files: Files,
    pub agents: Vec<agent_reach_sdk::Agent>,
    pub registry: String,
    pub router: String,
}

impl EchoStack {
    pub async fn start(acl: &str, redis: String, workers: usize) -> anyhow::Result<Self> {
        use agent_reach_access::AuthConfig;
        let files = Files::write(acl)?;
        let (secret, acl) = (files.secret.clone(), files.acl.clone());
        let any: SocketAddr = "127.0.0.1:0".parse()?;
        let registry = agent_reach_registry::build(&agent_reach_registry::Settings {
            listen: any,
            store: agent_reach_registry::StoreChoice::Embedded,
            acl: acl.clone(),
            auth: AuthConfig::Hs256SecretFile(secret.clone()),
            service: agent_reach_registry::RegistryConfig::default(),
            listener_tls: None,
        })
        .await?;
        let registry_addr = serve_on_free_port(|listener| async move {
            let _ = agent_reach_registry::serve(listener, registry, std::future::pending()).await;
        })
        .await?;
        let registry = format!("http://{registry_addr}");

        let mut settings =
            agent_reach_router::Settings::new(any, registry.clone(), AuthConfig::Hs256SecretFile(secret), acl);
        let mut callbacks = agent_reach_task_store::CallbackConfig::new(SECRET.as_bytes().to_vec());
        callbacks.allow_private_targets = true;
        settings.tasks = Some(agent_reach_router::TasksSettings {
            redis,
            store: agent_reach_task_store::StoreConfig::default(),
            callbacks,
            workers,
            reclaim_after: Duration::from_secs(120),
            max_task_attempts: 3,
            quota_share: Some(Duration::from_millis(100)),
            trail: None,
            tag_limits: Vec::new(),
        });
        let router = agent_reach_router::build(&settings).await?;
        let router_addr = serve_on_free_port(|listener| async move {
            let _ = agent_reach_router::serve(listener, router, std::future::pending()).await;
        })
        .await?;
        let router = format!("http://{router_addr}");

        let mut agents = Vec::new();
        for index in 0..2 {
            let echo = agent_reach_sdk::Handler::new(
                "bench.echo",
                "1.0.0",
                |_ctx: agent_reach_sdk::Ctx, input: serde_json::Value| async move {
                    Ok::<_, agent_reach_sdk::HandlerError>(input)
                },
            );
            // Hop assertions are mandatory: the agent fetches the keys the router
            // signs them with from its `/.well-known/jwks.json`, as in production.
            let agent = agent_reach_sdk::Agent::builder("bench_agent", &format!("bench-{index}"))
                .registry(&registry)
                .router(&router)
                .token(token("bench_agent")?)
                .max_concurrency(1024)
                .handler(echo)
                .start()
                .await?;
            agent.mark_ready();
            agents.push(agent);
        }
        Ok(Self {
            files,
            agents,
            registry,
            router,
        })
    }

    /// Waits until the router routes to both agents (a broadcast reaches two), as `caller`.
    pub async fn wait_for_agents(&self, client: &reqwest::Client, caller: &str) -> anyhow::Result<()> {
        wait_for("the router with both agents", Duration::from_secs(30), async || {
            let probe = client
                .post(format!("{}/v1/broadcast", self.router))
                .bearer_auth(caller)
                .json(&serde_json::json!({"capability": "bench.echo", "payload": {}}))
                .send()
                .await;
            let Ok(probe) = probe else { return false };
            let outcomes = probe
                .json::<serde_json::Value>()
                .await
                .map(|probe| probe["outcomes"].as_array().map(Vec::len));
            matches!(outcomes, Ok(Some(2)))
        })
        .await
    }
}
