//! Where segments are sealed and written: the trail's CPU-heavy part (each
//! record's body and SHA-256, the head's signature, the store's commands
//! for the batch).
//!
//! By default ([`WriterPriority::Idle`]) that runs on one process-wide
//! thread scheduled `SCHED_IDLE` on Linux: it runs only on CPU nothing else
//! wants, so the trail takes a router's spare cycles and not its calls'. A
//! job is a future polled there within its caller's runtime (its I/O and
//! what it spawns stay the runtime's: the store's connections are never
//! driven by this thread). On `router-bench --trail` (2 cores shared by the
//! router, the agents, wrk and Redis) the trail cost the router ~11 % of
//! its req/s at 32 connections with sealing on the runtime's threads, ~4-6 %
//! with sealing here; sealing on a `SCHED_BATCH` thread, as span export
//! does, changed nothing: the trail's CPU still came out of the calls'
//! (docs/benchmarks.md).
//! When the calls keep every core busy an idle thread gets no CPU: a job it
//! has not started within half a second, and a batch it fell behind on
//! (more than a quarter of the buffer waiting), is run by the writer itself
//! at the calls' priority (counted, and said in the log), so a saturated
//! router pays the trail's CPU rather than drop its records.
//! [`WriterPriority::Normal`] (`--trail-writer-priority normal`) always
//! runs it at the calls' priority.

use std::panic::AssertUnwindSafe;

use futures::FutureExt as _;
use std::sync::{mpsc, Arc, Mutex, OnceLock};

/// What CPU sealing and writing the trail's segments gets
/// (`--trail-writer-priority`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WriterPriority {
    /// Only CPU nothing else wants (a `SCHED_IDLE` thread on Linux), except
    /// for a batch that thread has not started within 0.5 s or fell behind
    /// on (then the calls' priority).
    #[default]
    Idle,
    /// The calls' own priority (on the runtime's threads).
    Normal,
}

type Job = Box<dyn FnOnce() + Send>;

/// The idle-priority thread's queue, the thread started on first use;
/// `None` when it cannot be started (then jobs run on their caller).
fn idle_thread() -> Option<&'static mpsc::Sender<Job>> {
    static THREAD: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();
    THREAD
        .get_or_init(|| {
            let (jobs, queue) = mpsc::channel::<Job>();
            let started = std::thread::Builder::new()
                .name("trail-sealer".to_string())
                .spawn(move || {
                    lower_priority();
                    for job in queue {
                        // A job that panics loses its own answer (its caller
                        // hears so), never the thread.
                        if std::panic::catch_unwind(AssertUnwindSafe(job)).is_err() {
                            tracing::error!(message = "A trail sealing job panicked; its records are dropped.");
                        }
                    }
                });
            match started {
                Ok(_) => Some(jobs),
                Err(error) => {
                    tracing::warn!(
                        message = "Cannot start the trail's idle-priority sealing thread; segments are sealed at the calls' priority.",
                        %error
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// Schedules the calling thread `SCHED_IDLE` (Linux; elsewhere nothing). A
/// thread may always lower itself, so failure only means it keeps the calls'
/// priority; it is reported, not fatal.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid, initialised sched_param that outlives
        // the call; pid 0 means the calling thread.
        let result = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        if result != 0 {
            tracing::warn!(
                message = "Cannot schedule the trail's sealing thread SCHED_IDLE; it competes with the calls.",
                error = %std::io::Error::last_os_error()
            );
        }
    }
}

/// Where a job ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ran {
    /// On the idle-priority thread.
    Idle,
    /// On its caller, the idle thread not having started it within its patience.
    Here,
}

/// Runs the future `work` makes on the idle-priority thread (one job at a
/// time), within the caller's runtime (what it spawns, its I/O and its
/// timers are the runtime's: only its own polling is on the idle thread),
/// and waits for it; when the thread has not started it within `patience`
/// (the cores busy with calls: an idle thread gets no CPU then), or there
/// is no such thread, runs it here instead. A job the thread has started is
/// waited for, however long it takes. `None` when the job panicked.
pub(crate) async fn preferably_idle<T, W, F>(work: W, patience: std::time::Duration) -> Option<(T, Ran)>
where
    W: FnOnce() -> F + Send + 'static,
    F: std::future::Future<Output = T> + Send,
    T: Send + 'static,
{
    // Whoever takes the job out of the slot runs it: the idle thread, or
    // the caller once its patience is out.
    let slot = Arc::new(Mutex::new(Some(work)));
    let (answer, mut answered) = tokio::sync::oneshot::channel();
    let runtime = tokio::runtime::Handle::current();
    let queued = {
        let slot = slot.clone();
        move || {
            if let Some(work) = take(&slot) {
                // This thread is in no runtime: blocking on the caller's is allowed.
                let out = runtime.block_on(work());
                // The caller may have gone (its runtime stopping): nobody to answer.
                let _ = answer.send(out);
            }
        }
    };
    // A send fails only if the thread has gone, which it never does (it
    // outlives every job); the job is then run here.
    let sent = idle_thread().is_some_and(|thread| thread.send(Box::new(queued)).is_ok());
    if sent {
        if let Ok(answer) = tokio::time::timeout(patience, &mut answered).await {
            return answer.ok().map(|out| (out, Ran::Idle));
        }
    }
    let taken = take(&slot);
    match taken {
        Some(work) => here(work).await.map(|out| (out, Ran::Here)),
        None => answered.await.ok().map(|out| (out, Ran::Idle)),
    }
}

/// Runs the future `work` makes on its caller. `None` when the job
/// panicked: it loses its own answer, as on the idle thread, never its
/// caller's task.
pub(crate) async fn here<T, W, F>(work: W) -> Option<T>
where
    W: FnOnce() -> F,
    F: std::future::Future<Output = T>,
{
    let out = AssertUnwindSafe(async move { work().await }).catch_unwind().await;
    if out.is_err() {
        tracing::error!(message = "A trail sealing job panicked; its records are dropped.");
    }
    out.ok()
}

/// The job in `slot`, if nobody has taken it (a slot a panicking job held
/// is empty: its job was taken).
fn take<J>(slot: &Mutex<Option<J>>) -> Option<J> {
    slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
}

/// The scheduling policy of the calling thread (tests).
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn policy_of_this_thread() -> libc::c_int {
    // SAFETY: no arguments but pid 0 (the calling thread); reads only.
    unsafe { libc::sched_getscheduler(0) }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const PATIENT: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn jobs_run_on_the_idle_priority_thread_and_answer_their_callers() {
        let (name, ran) = preferably_idle(|| async { std::thread::current().name().map(str::to_string) }, PATIENT)
            .await
            .unwrap();
        assert_eq!((name.as_deref(), ran), (Some("trail-sealer"), Ran::Idle));
        #[cfg(target_os = "linux")]
        assert_eq!(
            preferably_idle(|| async { policy_of_this_thread() }, PATIENT)
                .await
                .unwrap()
                .0,
            libc::SCHED_IDLE
        );
        // Many callers at once: each job runs once, and its answer reaches
        // its caller.
        let answers: Vec<_> = (0..20_u32)
            .map(|n| tokio::spawn(preferably_idle(move || async move { n * 2 }, PATIENT)))
            .collect();
        for (n, answer) in (0..20_u32).zip(answers) {
            assert_eq!(answer.await.unwrap().unwrap().0, n * 2);
        }
        // A job awaits within its caller's runtime: its timers and what it
        // spawns are the runtime's.
        let (spawned, ran) = preferably_idle(
            || async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                tokio::spawn(async { std::thread::current().name().map(str::to_string) })
                    .await
                    .unwrap()
            },
            PATIENT,
        )
        .await
        .unwrap();
        assert_eq!(ran, Ran::Idle);
        assert_ne!(spawned.as_deref(), Some("trail-sealer"));
    }

    #[tokio::test]
    async fn a_job_the_busy_thread_has_not_started_runs_on_its_caller() {
        // Occupy the thread until released (as calls on every core would).
        let (started, running) = tokio::sync::oneshot::channel::<()>();
        let (release, released) = mpsc::channel::<()>();
        let busy = tokio::spawn(preferably_idle(
            move || async move {
                let _ = started.send(());
                released.recv().ok()
            },
            PATIENT,
        ));
        running.await.unwrap();
        let (thread, ran) = preferably_idle(
            || async { std::thread::current().name().map(str::to_string) },
            Duration::from_millis(50),
        )
        .await
        .unwrap();
        assert_eq!(ran, Ran::Here);
        assert_ne!(thread.as_deref(), Some("trail-sealer"));
        release.send(()).unwrap();
        assert_eq!(busy.await.unwrap().unwrap().1, Ran::Idle);
    }

    #[tokio::test]
    async fn a_panicking_job_answers_none_and_the_thread_goes_on() {
        let panicked: Option<((), Ran)> = preferably_idle(|| async { panic!("on purpose") }, PATIENT).await;
        assert_eq!(panicked, None);
        assert_eq!(preferably_idle(|| async { 2 + 2 }, PATIENT).await.unwrap().0, 4);
    }
}
