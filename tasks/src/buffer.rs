//! The local buffer for task submissions while Redis is unreachable
//! (DESIGN §3.10.10): submissions are appended to a file and fsynced before
//! the 202, so a router that stays up loses none; a background task
//! replays them into Redis in order once it answers again, under the task
//! ids already given out. While anything waits in the buffer, new
//! submissions queue behind it, so order holds and a resubmission finds its
//! first copy. Beyond `--task-buffer-max` entries: 503 `TASK_BUFFER_FULL`.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach_task_store::{NewTask, Submitted, TaskStore, TaskStoreError};
use serde::{Deserialize, Serialize};

/// How often the replayer tries Redis while the buffer holds something.
const REPLAY_EVERY: Duration = Duration::from_millis(200);
const FILE: &str = "task-buffer.jsonl";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    task_id: String,
    task: NewTask,
}

/// Where a submission went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Buffered {
    /// Kept locally under this new task id.
    Created(String),
    /// The same caller and request id already wait in the buffer.
    Existing(String),
}

#[derive(Debug, thiserror::Error)]
pub enum BufferError {
    #[error("the local task buffer is full ({limit} submissions wait for Redis)")]
    Full { limit: usize },
    #[error("the local task buffer cannot be written: {0}")]
    Io(String),
}

struct State {
    entries: VecDeque<Entry>,
    /// (caller, request id) → task id, for the entries waiting.
    index: HashMap<(String, String), String>,
    file: std::fs::File,
}

pub struct TaskBuffer {
    path: PathBuf,
    limit: usize,
    state: Mutex<State>,
    depth: prometheus::IntGauge,
    outcomes: prometheus::IntCounterVec,
}

impl TaskBuffer {
    /// Opens (or creates) the buffer in `dir`, loading what a previous run left.
    pub fn open(dir: &Path, limit: usize, registry: &prometheus::Registry) -> Result<Arc<Self>, String> {
        std::fs::create_dir_all(dir).map_err(|error| format!("task buffer dir {}: {error}", dir.display()))?;
        let path = dir.join(FILE);
        let mut entries = VecDeque::new();
        if let Ok(text) = std::fs::read_to_string(&path) {
            for (number, line) in text.lines().enumerate() {
                // A line cut short by a crash mid-append is the only one that can be bad: skip it.
                match serde_json::from_str::<Entry>(line) {
                    Ok(entry) => entries.push_back(entry),
                    Err(error) => tracing::warn!(
                        message = "Skipping an unreadable task buffer line.",
                        path = %path.display(), line = number + 1, %error
                    ),
                }
            }
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|error| format!("task buffer {}: {error}", path.display()))?;
        let index = entries
            .iter()
            .map(|entry| {
                (
                    (entry.task.caller.clone(), entry.task.request_id.clone()),
                    entry.task_id.clone(),
                )
            })
            .collect();
        let depth = prometheus::IntGauge::new(
            "agent_reach_task_buffer_depth",
            "Task submissions kept locally while Redis is unreachable, waiting to be replayed.",
        )
        .map_err(|error| error.to_string())?;
        let outcomes = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "agent_reach_task_buffer_total",
                "Task submissions through the local buffer: buffered, replayed, refused (full), dropped (refused by Redis on replay).",
            ),
            &["outcome"],
        )
        .map_err(|error| error.to_string())?;
        registry
            .register(Box::new(depth.clone()))
            .map_err(|error| error.to_string())?;
        registry
            .register(Box::new(outcomes.clone()))
            .map_err(|error| error.to_string())?;
        depth.set(i64::try_from(entries.len()).unwrap_or(i64::MAX));
        Ok(Arc::new(Self {
            path,
            limit,
            state: Mutex::new(State { entries, index, file }),
            depth,
            outcomes,
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn is_empty(&self) -> bool {
        self.lock().entries.is_empty()
    }

    /// The caller of `task_id` when it waits in the buffer.
    pub fn caller_of(&self, task_id: &str) -> Option<String> {
        self.lock()
            .entries
            .iter()
            .find(|entry| entry.task_id == task_id)
            .map(|entry| entry.task.caller.clone())
    }

    /// Keeps `task` (durably: appended and fsynced) under `task_id`.
    pub async fn push(self: &Arc<Self>, task_id: String, task: NewTask) -> Result<Buffered, BufferError> {
        let buffer = self.clone();
        // File writes and fsync off the serving thread (the router's runtimes
        // are single-threaded).
        tokio::task::spawn_blocking(move || buffer.push_blocking(task_id, task))
            .await
            .map_err(|error| BufferError::Io(error.to_string()))?
    }

    fn push_blocking(&self, task_id: String, task: NewTask) -> Result<Buffered, BufferError> {
        let mut state = self.lock();
        let key = (task.caller.clone(), task.request_id.clone());
        if let Some(existing) = state.index.get(&key) {
            return Ok(Buffered::Existing(existing.clone()));
        }
        if state.entries.len() >= self.limit {
            self.outcomes.with_label_values(&["refused"]).inc();
            return Err(BufferError::Full { limit: self.limit });
        }
        let entry = Entry { task_id, task };
        let mut line = serde_json::to_vec(&entry).map_err(|error| BufferError::Io(error.to_string()))?;
        line.push(b'\n');
        state
            .file
            .write_all(&line)
            .and_then(|()| state.file.sync_data())
            .map_err(|error| BufferError::Io(format!("{}: {error}", self.path.display())))?;
        state.index.insert(key, entry.task_id.clone());
        let id = entry.task_id.clone();
        state.entries.push_back(entry);
        self.depth.set(i64::try_from(state.entries.len()).unwrap_or(i64::MAX));
        self.outcomes.with_label_values(&["buffered"]).inc();
        Ok(Buffered::Created(id))
    }

    /// Replays into `store`, in order, until the buffer is empty or the
    /// store fails; then rewrites the file with what is left.
    async fn replay_once(self: &Arc<Self>, store: &TaskStore) {
        // Idempotent, and needed when Redis came back empty (no persistence).
        if store.prepare().await.is_err() {
            return;
        }
        let mut replayed = 0usize;
        loop {
            let Some(front) = self.lock().entries.front().cloned() else {
                break;
            };
            match store.submit_with_id(front.task.clone(), &front.task_id).await {
                Ok(Submitted::Created(_)) => {}
                Ok(Submitted::Existing(existing)) if existing == front.task_id => {}
                Ok(Submitted::Existing(existing)) => {
                    // The request was in Redis already under another id (a
                    // submission before the outage): the id this router gave
                    // out must lead there, not to a 404.
                    if let Err(error) = store.alias(&front.task_id, &existing).await {
                        tracing::warn!(message = "Cannot record a buffered task id's alias; retrying the replay later.", task_id = %front.task_id, %error);
                        break;
                    }
                }
                Err(TaskStoreError::Unavailable(_)) => break,
                Err(error) => {
                    // Not Redis being away: this one will never go in; do not let it block the rest.
                    tracing::error!(message = "A buffered task submission was refused on replay; dropped.", task_id = %front.task_id, %error);
                    self.outcomes.with_label_values(&["dropped"]).inc();
                }
            }
            let mut state = self.lock();
            if state
                .entries
                .front()
                .is_some_and(|entry| entry.task_id == front.task_id)
            {
                state.entries.pop_front();
                state
                    .index
                    .remove(&(front.task.caller.clone(), front.task.request_id.clone()));
            }
            self.depth.set(i64::try_from(state.entries.len()).unwrap_or(i64::MAX));
            replayed += 1;
            self.outcomes.with_label_values(&["replayed"]).inc();
        }
        if replayed > 0 {
            tracing::info!(message = "Buffered task submissions replayed into Redis.", replayed);
            let buffer = self.clone();
            let rewritten = tokio::task::spawn_blocking(move || buffer.rewrite()).await;
            if let Ok(Err(error)) | Err(error) = rewritten.map_err(|error| error.to_string()) {
                tracing::error!(message = "Cannot rewrite the task buffer file.", %error);
            }
        }
    }

    /// The file holds exactly the entries still waiting (a temp file renamed over it).
    fn rewrite(&self) -> Result<(), String> {
        let mut state = self.lock();
        let temp = self.path.with_extension("jsonl.tmp");
        let mut text = Vec::new();
        for entry in &state.entries {
            text.extend(serde_json::to_vec(entry).map_err(|error| error.to_string())?);
            text.push(b'\n');
        }
        let write = || -> std::io::Result<std::fs::File> {
            let mut file = std::fs::File::create(&temp)?;
            file.write_all(&text)?;
            file.sync_data()?;
            std::fs::rename(&temp, &self.path)?;
            std::fs::OpenOptions::new().append(true).open(&self.path)
        };
        state.file = write().map_err(|error| format!("{}: {error}", self.path.display()))?;
        Ok(())
    }

    /// Replays every [`REPLAY_EVERY`] while the buffer holds something,
    /// until the slow path is dropped.
    pub fn spawn_replay(tasks: std::sync::Weak<super::TaskService>) {
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(REPLAY_EVERY);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let Some(tasks) = tasks.upgrade() else { return };
                if let Some(buffer) = tasks.buffer.as_ref().filter(|buffer| !buffer.is_empty()) {
                    buffer.replay_once(&tasks.store).await;
                }
            }
        });
    }
}
