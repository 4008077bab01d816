//! In-process stand-ins for separate processes, for integration tests: a
//! service on its own runtime and thread ([`Isolated`]), which a test can kill
//! outright as `kill -9` would (every task and socket dropped at once), and the
//! real registry run that way ([`RegistryProcess`]). Plus the bits every suite
//! needs: polling a condition with a bound ([`eventually`]) and HS256 test
//! tokens ([`hs256_token`]).

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

/// Polls `condition` every 10 ms until it holds or `timeout` passes; whether it held.
pub async fn eventually<F, Fut>(timeout: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if condition().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A bearer token for `name` signed with `secret` (HS256), valid for an hour.
pub fn hs256_token(name: &str, secret: &[u8]) -> String {
    agent_reach_access::token::issue_hs256(name, secret, Duration::from_secs(3600))
        .unwrap_or_else(|error| panic!("cannot sign a test token for `{name}`: {error}"))
}

/// Something running on its own single-worker runtime and thread; [`kill`]
/// (or drop) ends it all at once, as a killed process ends.
///
/// [`kill`]: Isolated::kill
pub struct Isolated {
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Isolated {
    /// Runs `start` on a fresh runtime and returns what it answered once it
    /// has; the runtime keeps running whatever `start` spawned until killed.
    pub fn spawn<R, Fut>(start: impl FnOnce() -> Fut + Send + 'static) -> (Self, R)
    where
        R: Send + 'static,
        Fut: Future<Output = R> + 'static,
    {
        let (info_tx, info_rx) = std::sync::mpsc::channel();
        let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap_or_else(|error| panic!("cannot build an isolated runtime: {error}"));
            let info = runtime.block_on(start());
            let _ = info_tx.send(info);
            let _ = runtime.block_on(kill_rx);
            // Dropping the runtime's tasks closes every connection at once.
            runtime.shutdown_background();
        });
        let info = info_rx
            .recv()
            .unwrap_or_else(|_| panic!("the isolated process failed to start (its thread panicked)"));
        (
            Self {
                kill: Some(kill_tx),
                thread: Some(thread),
            },
            info,
        )
    }

    pub fn kill(&mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Isolated {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The real registry, isolated: served on `settings.listen` (port 0: a free
/// one) and ready (`/readyz` answers 200) when [`RegistryProcess::start`]
/// returns. [`RegistryProcess::kill`] ends it like `kill -9`; a new one may
/// start on the same address.
pub struct RegistryProcess {
    pub addr: SocketAddr,
    process: Isolated,
}

impl RegistryProcess {
    pub fn start(settings: agent_reach_registry::Settings) -> Self {
        let (process, addr) = Isolated::spawn(move || async move {
            let service = agent_reach_registry::build(&settings)
                .await
                .unwrap_or_else(|error| panic!("registry build: {error:#}"));
            let listener = tokio::net::TcpListener::bind(settings.listen)
                .await
                .unwrap_or_else(|error| panic!("registry bind {}: {error}", settings.listen));
            let addr = listener
                .local_addr()
                .unwrap_or_else(|error| panic!("registry address: {error}"));
            tokio::spawn(agent_reach_registry::serve(listener, service, std::future::pending()));
            addr
        });
        let ready = crate::wait_until(Duration::from_secs(10), || crate::http_ok(addr, "/readyz"));
        assert!(ready, "the registry on {addr} did not become ready within 10 s");
        Self { addr, process }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn kill(&mut self) {
        self.process.kill();
    }
}
