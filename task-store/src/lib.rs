//! The slow path (issue 6): durable asynchronous tasks.
//!
//! - [`model`]: tasks, priorities and the one state-machine table.
//! - [`store`]: tasks on Redis — queued in a stream per priority with a
//!   consumer group, acknowledged only when their outcome is recorded,
//!   reclaimed from dead workers, idempotent by request id, results kept per
//!   session for callers that reconnect, retention on everything finished.
//! - [`callback`]: signed result callbacks with the retry schedule and the
//!   dead-letter stream, refusing private targets unless allowed.
//!
//! The router's `/v1/tasks` API and the delivery worker build on these.

pub mod callback;
pub mod model;
pub mod store;

pub use callback::{CallbackConfig, CallbackError, CallbackOutcome, Deliverer, NotificationBody};
pub use model::{Accepted, Callback, Priority, PushAuthentication, PushConfig, Role, State, Task, Transition, Turn};
pub use store::{
    new_task_id, AfterStep, Claimed, DeadLetter, EntryOrder, FirstAdvance, HeldTask, HistorySlot, HistoryTotals,
    LocalBuffer, NewTask, QuotaAsk, QuotaExchange, QuotaLimit, QuotaReport, Reported, RunEntry, RunStarted,
    SessionResult, StepEnd, StoreConfig, StoredRun, Submitted, TaskStore, TaskStoreError, MOST_PUSH_CONFIGS,
};
