//! The recent-calls ring (the console's request lookup, issue 26): the last
//! calls this router admitted or refused at admission, each with its route,
//! attempts, instances, durations, outcome and trace id, kept in memory only.
//!
//! Off the request path's cost: the ring is [`SHARDS`] fixed-size shards and
//! each thread writes the shard it was given on first use, so the router's
//! per-core threads never share one (no global lock, no contention; a lookup
//! locks each shard in turn, briefly). A slot is overwritten in place: its
//! strings keep their capacity, so a steady stream of calls allocates nothing
//! here but the attempts' instance handles (reference counts).

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{json, Value};

use crate::snapshot::Instance;

/// Shards of the ring; threads beyond this many share shards round-robin.
pub const SHARDS: usize = 16;
/// Calls kept per shard: the ring holds at most `SHARDS × PER_SHARD` calls.
pub const PER_SHARD: usize = 512;

/// One attempt of a call: the instance it went to, how long, how it ended.
pub struct Attempt {
    pub instance: Arc<Instance>,
    pub duration_us: u64,
    /// `succeeded`, `accepted`, `failed` or the retryable reason (`connect`, `unavailable`, …).
    pub outcome: &'static str,
}

/// The attempts of one call, inline up to the usual few.
pub type Tried = smallvec::SmallVec<[Attempt; 4]>;

/// One recorded call.
#[derive(Default)]
pub struct Call {
    pub request_id: String,
    pub task_id: String,
    pub capability: String,
    pub version: String,
    pub caller: String,
    pub session_id: String,
    pub trace_id: String,
    /// `call` (a caller's own request) or `delivery` (a task's).
    pub entry: &'static str,
    pub started_ms: u64,
    pub duration_us: u64,
    /// `None`: succeeded; otherwise the stable code.
    pub code: Option<&'static str>,
    pub message: String,
    pub attempts: Vec<Attempt>,
}

impl Call {
    /// The call as the API shows it (`GET /v1/requests/{id}`).
    pub fn view(&self) -> Value {
        let optional = |text: &str| if text.is_empty() { Value::Null } else { json!(text) };
        json!({
            "request_id": self.request_id,
            "task_id": optional(&self.task_id),
            "capability": self.capability,
            "capability_version": optional(&self.version),
            "caller": optional(&self.caller),
            "session_id": optional(&self.session_id),
            "trace_id": self.trace_id,
            "entry": self.entry,
            "started_at_ms": self.started_ms,
            "duration_ms": self.duration_us as f64 / 1000.0,
            "outcome": if self.code.is_none() { "succeeded" } else { "failed" },
            "error": self.code.map(|code| json!({ "code": code, "message": self.message })),
            "attempts": self.attempts.iter().enumerate().map(|(index, attempt)| json!({
                "attempt": index + 1,
                "agent_id": attempt.instance.agent_id,
                "endpoint": attempt.instance.endpoint,
                "duration_ms": attempt.duration_us as f64 / 1000.0,
                "outcome": attempt.outcome,
            })).collect::<Vec<_>>(),
        })
    }
}

/// What a finished call hands the ring (borrowed: copied into a reused slot).
pub struct Finished<'a> {
    pub request_id: &'a str,
    pub task_id: Option<&'a str>,
    pub capability: &'a str,
    pub version: Option<&'a str>,
    pub caller: Option<&'a str>,
    pub session_id: Option<&'a str>,
    pub trace_id: &'a str,
    pub entry: &'static str,
    pub started_ms: u64,
    pub duration_us: u64,
    pub error: Option<(&'static str, &'a str)>,
}

struct Shard {
    slots: Vec<Call>,
    /// The slot the next call overwrites.
    next: usize,
}

/// The ring: [`SHARDS`] shards of [`PER_SHARD`] calls.
pub struct RecentCalls {
    shards: Box<[Mutex<Shard>]>,
}

/// Hands each thread its shard, round-robin.
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn my_shard() -> usize {
    SHARD.with(|shard| {
        if shard.get() == usize::MAX {
            shard.set(NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS);
        }
        shard.get()
    })
}

fn copy_into(target: &mut String, text: &str) {
    target.clear();
    target.push_str(text);
}

impl Default for RecentCalls {
    fn default() -> Self {
        Self::new()
    }
}

impl RecentCalls {
    pub fn new() -> Self {
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    slots: Vec::with_capacity(PER_SHARD),
                    next: 0,
                })
            })
            .collect();
        Self { shards }
    }

    /// The most calls the ring holds.
    pub fn capacity(&self) -> usize {
        SHARDS * PER_SHARD
    }

    /// Records a finished call, overwriting this thread's shard's oldest.
    pub fn record(&self, finished: &Finished<'_>, attempts: Tried) {
        let Some(shard) = self.shards.get(my_shard()) else {
            return;
        };
        // A panic while a shard was held left whole slots behind: keep using it.
        let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
        let next = shard.next;
        shard.next = (next + 1) % PER_SHARD;
        if shard.slots.len() <= next {
            shard.slots.push(Call::default());
        }
        let Some(slot) = shard.slots.get_mut(next) else {
            return;
        };
        copy_into(&mut slot.request_id, finished.request_id);
        copy_into(&mut slot.task_id, finished.task_id.unwrap_or(""));
        copy_into(&mut slot.capability, finished.capability);
        copy_into(&mut slot.version, finished.version.unwrap_or(""));
        copy_into(&mut slot.caller, finished.caller.unwrap_or(""));
        copy_into(&mut slot.session_id, finished.session_id.unwrap_or(""));
        copy_into(&mut slot.trace_id, finished.trace_id);
        slot.entry = finished.entry;
        slot.started_ms = finished.started_ms;
        slot.duration_us = finished.duration_us;
        slot.code = finished.error.map(|(code, _)| code);
        copy_into(&mut slot.message, finished.error.map_or("", |(_, message)| message));
        slot.attempts.clear();
        slot.attempts.extend(attempts);
    }

    /// Every recorded call `keep` accepts, as `view` renders it, newest first.
    pub fn find(&self, mut keep: impl FnMut(&Call) -> bool, view: impl Fn(&Call) -> Value) -> Vec<(u64, Value)> {
        let mut found = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            for call in shard.slots.iter().filter(|call| keep(call)) {
                found.push((call.started_ms, view(call)));
            }
        }
        found.sort_by_key(|(started_ms, _)| std::cmp::Reverse(*started_ms));
        found
    }

    /// Shows every recorded call to `each` (the capabilities' statistics).
    pub fn each(&self, mut each: impl FnMut(&Call)) {
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            shard.slots.iter().for_each(&mut each);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(request_id: &str, started_ms: u64) -> Finished<'_> {
        Finished {
            request_id,
            task_id: None,
            capability: "order.query",
            version: Some("1.0.0"),
            caller: Some("tester"),
            session_id: None,
            trace_id: "0af7651916cd43dd8448eb211c80319c",
            entry: "call",
            started_ms,
            duration_us: 1500,
            error: Some(("AGENT_ERROR", "no such order")),
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_calls_of_each_shard_and_finds_them() {
        let ring = RecentCalls::new();
        for n in 0..(PER_SHARD as u64 + 10) {
            ring.record(&finished(&format!("req-{n}"), n), Tried::new());
        }
        let all = ring.find(|_| true, Call::view);
        assert_eq!(all.len(), PER_SHARD, "one thread fills one shard, oldest overwritten");
        assert_eq!(all[0].1["request_id"], "req-521", "newest first");
        assert!(ring.find(|call| call.request_id == "req-0", Call::view).is_empty());
        let found = ring.find(|call| call.request_id == "req-100", Call::view);
        assert_eq!(found[0].1["error"]["code"], "AGENT_ERROR");
        assert_eq!(found[0].1["outcome"], "failed");
        assert_eq!(found[0].1["duration_ms"], 1.5);
        // Another thread writes another shard.
        std::thread::scope(|scope| {
            scope.spawn(|| ring.record(&finished("elsewhere", 9999), Tried::new()));
        });
        assert_eq!(ring.find(|_| true, Call::view).len(), PER_SHARD + 1);
    }
}
