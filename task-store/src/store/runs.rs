//! Workflow runs' records (DESIGN §9, docs/design.md §3.14.4). A run is a
//! held task (its id, its idempotency key, its result, callback, session
//! result and retention are that task's) plus a hash in the same lane:
//!
//! - `run:{L}:{run_id}` — hash: `spec` (immutable JSON, the runs crate's),
//!   `state`, `updated_at_ms`, `result` once ended, and one field per step,
//!   per call of a step and per compensation (`s:…`, `i:…`, `c:…`), each
//!   `ATTEMPT.RANK|JSON`: a write lands only if its (attempt, rank) is not
//!   below the stored one's, so routers advancing one run at once never
//!   move a call back (a later attempt, or an end, wins).
//! - `runs_due:{L}` — sorted set: run id by when any router should look at
//!   it again (the backstop for a router that died mid-advance; a router
//!   leases a due run by pushing its time out, as callbacks are leased).
//! - `runs_recent` — sorted set: the newest run ids by creation time (the
//!   console's list), at most [`RECENT_RUNS`].
//!
//! Every change to a run's hash and its due entry is one script on the
//! lane's slot; a run's start, first advance and end change its held task
//! in the same script, and on one server an advance submits its calls in
//! it too (`START_RUN`, `ADVANCE`, `END_RUN`, made of the scripts they
//! combine by [`super::parts`]). What the fields mean is the runs crate's;
//! the store keeps them ordered and durable.

use std::collections::BTreeMap;

use redis::AsyncCommands;

use super::connection::Connection;
use super::outcome::{script_answer, Ending};
use super::parts::{function, invoke, Part, PARTS};
use super::scripts;
use super::{lane_of, now_ms, unavailable, TaskStore, TaskStoreError, LANES};
use crate::model::{Priority, State};

/// How many run ids the recent-runs index keeps.
pub const RECENT_RUNS: isize = 1000;

/// A run's record as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRun {
    pub run_id: String,
    /// The immutable spec (JSON).
    pub spec: String,
    pub state: State,
    pub updated_at_ms: u64,
    /// The steps' and calls' records (JSON) by field, without their order prefix.
    pub entries: BTreeMap<String, String>,
    /// The run's result (JSON) once it ended.
    pub result: Option<String>,
}

/// One entry of a run to write: its field, where it stands, its record (JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEntry {
    pub field: String,
    pub order: EntryOrder,
    pub json: String,
}

/// Where an entry stands: a later attempt, and within one attempt a later
/// rank (e.g. an end after a start), replaces it; nothing earlier does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct EntryOrder {
    pub attempt: u32,
    pub rank: u8,
}

const CREATE_RUN: &str = r#"
-- Stores a run's spec unless the run exists, as `pending`, due for a first
-- look after the grace (the router that created it looks at once).
-- KEYS: 1 run hash, 2 due set; ARGV: 1 spec, 2 now ms, 3 due ms, 4 run id
if redis.call('HSETNX', KEYS[1], 'spec', ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'state', 'pending', 'updated_at_ms', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return 1
"#;

/// Writes the entries given from `ARGV[first]` on (field, attempt, rank,
/// json each), each unless the stored one is later (attempt, then rank);
/// answers how many were written. Shared by the scripts below.
const WRITE_ENTRIES: &str = r#"
local function write_entries(key, first)
  local written = 0
  for i = first, #ARGV, 4 do
    local field, new_attempt, new_rank = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    local old = redis.call('HGET', key, field)
    local later = false
    if old then
      local attempt, rank = string.match(old, '^(%d+)%.(%d+)|')
      attempt = tonumber(attempt) or 0
      rank = tonumber(rank) or 0
      later = attempt > new_attempt or (attempt == new_attempt and rank > new_rank)
    end
    if not later then
      redis.call('HSET', key, field, ARGV[i + 1] .. '.' .. ARGV[i + 2] .. '|' .. ARGV[i + 3])
      written = written + 1
    end
  end
  return written
end
"#;

const PUT_ENTRIES: &str = r#"
-- Writes each entry unless the stored one is later (attempt, then rank),
-- then, when asked, the run's due time (XX: an ended run stays undue).
-- KEYS: 1 run hash, 2 due set
-- ARGV: 1 now ms, 2 due ms ('' for none), 3 run id, then per entry: field, attempt, rank, json
-- Returns -1 when the run is gone, else how many entries were written.
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local written = write_entries(KEYS[1], 4)
if written > 0 then redis.call('HSET', KEYS[1], 'updated_at_ms', ARGV[1]) end
if ARGV[2] ~= '' then redis.call('ZADD', KEYS[2], 'XX', ARGV[2], ARGV[3]) end
return written
"#;

const MOVE_RUN: &str = r#"
-- Writes the entries given (as PUT_ENTRIES does, whatever the move's
-- answer: a step's outcome is true of a canceled run too), then moves the
-- run to a state if it is in one of the allowed ones (a run in that state
-- already is refused: one end, one cancel); an end also keeps the result,
-- starts the retention and drops the due entry.
-- KEYS: 1 run hash, 2 due set
-- ARGV: 1 state, 2 now ms, 3 result ('' for none), 4 retention s ('' keeps the hash), 5 run id,
--       6 n, 7..6+n the allowed states, then per entry: field, attempt, rank, json
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return {'missing'} end
local n = tonumber(ARGV[6])
if write_entries(KEYS[1], 7 + n) > 0 then redis.call('HSET', KEYS[1], 'updated_at_ms', ARGV[2]) end
if current == ARGV[1] then return {'refused', current} end
local allowed = false
for i = 7, 6 + n do if current == ARGV[i] then allowed = true end end
if not allowed then return {'refused', current} end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'updated_at_ms', ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'result', ARGV[3]) end
if ARGV[4] ~= '' then
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  redis.call('ZREM', KEYS[2], ARGV[5])
end
return {'ok', current}
"#;

/// An advance's writes, in one script: its calls submitted (SUBMIT each,
/// on one server: every lane there), then what it decided written, the run
/// due again. A call whose request id names another task stops it before
/// anything of the run is written (answer 0: the caller takes the long way,
/// each submission on its own, which completes the ones stored here as
/// repeats). A first advance (`first`) moves the run to `running` with its
/// entries (MOVE_RUN) and, when the run is running, its held task beside it
/// (TRANSITION), then sets the due time (PUT_ENTRIES, no entries); any
/// other writes its entries and due time (PUT_ENTRIES).
/// The first part's arguments: the number of calls, '1' for a first advance.
/// Answers 1 (done), 0 (stopped), -1 (the run is gone).
const ADVANCE: &str = r#"
local function advance(p)
local calls, first = tonumber(p[1][2][1]), p[1][2][2] == '1'
for i = 1, calls do
  local answer = submit(p[1 + i][1], p[1 + i][2])
  if answer[1] ~= 0 and answer[1] ~= 1 then return 0 end
end
local k = 2 + calls
if first then
  local moved = move_run(p[k][1], p[k][2])
  if moved[1] == 'missing' then return -1 end
  if moved[1] == 'ok' or moved[2] == 'running' then transition(p[k + 1][1], p[k + 1][2]) end
  put_entries(p[k + 2][1], p[k + 2][2])
  return 1
end
return put_entries(p[k][1], p[k][2]) == -1 and -1 or 1
end
"#;

/// [`ADVANCE`] alone: answers its answer.
const ADVANCE_ALONE: &str = "return advance(parts())\n";

/// A step's end and what it starts, in one script (one server): the step's
/// task ended (FINISH, the first part), then, when it ended, `then` (a
/// combined script's function, [`ADVANCE`]'s or [`END_RUN`]'s) with the parts
/// left. Answers {FINISH's answer, `then`'s (`not_run` when it did not run)}.
fn step_then(then: &str, not_run: &str) -> String {
    format!(
        "local p = parts()\nlocal ended = finish(p[1][1], p[1][2])\n\
         if ended[1] ~= 'ok' then return {{ended, {not_run}}} end\n\
         table.remove(p, 1)\nreturn {{ended, {then}(p)}}\n"
    )
}

/// A run's end, in one script: the run moved to its end with its last
/// entries (MOVE_RUN), then, when it moved, its held task ended (FINISH).
/// Answers {the move's answer, FINISH's ({} when the run did not move)}.
const END_RUN: &str = r#"
local function end_run(p)
local moved = move_run(p[1][1], p[1][2])
if moved[1] ~= 'ok' then return {moved, {}} end
return {moved, finish(p[2][1], p[2][2])}
end
"#;

/// [`END_RUN`] alone: answers its answer.
const END_RUN_ALONE: &str = "return end_run(parts())\n";

/// A run's start, in one script: its held task submitted (SUBMIT), then,
/// for the task this submission stored or found stored under its own id,
/// the run created (CREATE_RUN) and, on one server, indexed among the
/// recent runs; a run created here then takes its first advance, when
/// given (the parts after the index, as [`ADVANCE`] reads them).
/// Answers {SUBMIT's answer, CREATE_RUN's (-1: not run), the advance's
/// (0: not run or stopped)}.
pub(super) const START_RUN: &str = r#"
local p = parts()
local submitted = submit(p[1][1], p[1][2])
if submitted[1] ~= 0 and submitted[1] ~= 1 then return {submitted, -1, 0} end
local created = create_run(p[2][1], p[2][2])
local advanced = 0
if created == 1 and p[3] then
  redis.call('ZADD', p[3][1][1], p[3][2][1], p[3][2][2])
  redis.call('ZREMRANGEBYRANK', p[3][1][1], 0, -1 - tonumber(p[3][2][3]))
  if p[4] then
    local first = {}
    for i = 4, #p do first[#first + 1] = p[i] end
    advanced = advance(first)
  end
end
return {submitted, created, advanced}
"#;

/// `entries` as the scripts read them (`WRITE_ENTRIES`): field, attempt, rank, json each.
fn entry_args(part: &mut Part, entries: &[RunEntry]) {
    for entry in entries {
        part.arg(&entry.field)
            .arg(entry.order.attempt)
            .arg(entry.order.rank)
            .arg(&entry.json);
    }
}

/// The run scripts, loaded once.
pub(super) struct RunScripts {
    create: redis::Script,
    put_entries: redis::Script,
    move_run: redis::Script,
    advance: redis::Script,
    step_then_advance: redis::Script,
    end: redis::Script,
    step_then_end: redis::Script,
    pub(super) start: redis::Script,
}

impl RunScripts {
    pub(super) fn load() -> Self {
        let put_entries = format!("{WRITE_ENTRIES}{PUT_ENTRIES}");
        let move_run = format!("{WRITE_ENTRIES}{MOVE_RUN}");
        let finish = format!("{}{}", scripts::NOTIFY_PUSH, scripts::FINISH);
        // The advance's and the end's functions (each with the step's
        // `finish`, for the scripts that carry a step's end first).
        let advance = format!(
            "{PARTS}{}{}{}{}{}{ADVANCE}",
            function("submit", scripts::SUBMIT),
            function("move_run", &move_run),
            function("transition", scripts::TRANSITION),
            function("put_entries", &put_entries),
            function("finish", &finish),
        );
        let end = format!(
            "{PARTS}{}{}{END_RUN}",
            function("move_run", &move_run),
            function("finish", &finish)
        );
        Self {
            create: redis::Script::new(CREATE_RUN),
            put_entries: redis::Script::new(&put_entries),
            move_run: redis::Script::new(&move_run),
            advance: redis::Script::new(&format!("{advance}{ADVANCE_ALONE}")),
            step_then_advance: redis::Script::new(&format!("{advance}{}", step_then("advance", "0"))),
            end: redis::Script::new(&format!("{end}{END_RUN_ALONE}")),
            step_then_end: redis::Script::new(&format!("{end}{}", step_then("end_run", "{{}, {}}"))),
            start: redis::Script::new(&format!("{advance}{}{START_RUN}", function("create_run", CREATE_RUN))),
        }
    }
}

/// A run's held task as its run knows it (docs/design.md §3.14.4): what
/// ending it needs, so that the run's end need not read it.
#[derive(Debug, Clone, Copy)]
pub struct HeldTask<'a> {
    pub caller: &'a str,
    pub request_id: &'a str,
    pub session_id: Option<&'a str>,
    /// The workflow's name (the task's capability).
    pub capability: &'a str,
    pub priority: Priority,
    pub has_callback: bool,
}

/// A run's first advance, planned before its start and written in the
/// script that starts it ([`TaskStore::start_run`]): its calls (each task
/// and the id it is submitted as), what it decided, and when the run is
/// due for a look next.
#[derive(Debug, Clone, Copy)]
pub struct FirstAdvance<'a> {
    pub calls: &'a [(crate::store::NewTask, String)],
    pub entries: &'a [RunEntry],
    pub due_at_ms: u64,
}

/// A run's start as [`TaskStore::start_run`] answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunStarted {
    /// The held task's submission (`Existing`: the caller's request id named another run).
    pub submitted: crate::store::Submitted,
    /// Whether this submission created the run.
    pub created: bool,
    /// Whether the run's first advance was written with it (the run and its
    /// held task `running`, its calls submitted); else the run is `pending`
    /// and the caller advances it.
    pub advanced: bool,
}

/// The calls an advance's script queues: each one's lane and backlog
/// field (for [`TaskStore::note_queued`] once the script ran).
pub(super) type Queued = Vec<(usize, String)>;

/// A run's end as [`TaskStore::end_run`] answers it: the run's move, and
/// its held task's end.
type RunEnded = Result<(State, Result<State, TaskStoreError>), TaskStoreError>;

/// A workflow step's end, carried by the advance its end starts
/// ([`TaskStore::advance_run_after_step`], [`TaskStore::end_run_after_step`]):
/// the step's task as claimed, its end state and its result envelope.
#[derive(Debug, Clone, Copy)]
pub struct StepEnd<'a> {
    pub claimed: &'a crate::store::Claimed,
    pub state: State,
    pub result: &'a serde_json::Value,
}

/// What an advance or a run's end that carried a step's end did: the run's
/// part, and the step's end (as [`TaskStore::finish`] answers it; an error:
/// the step ended elsewhere or could not end, and the run was not written).
#[derive(Debug)]
pub struct AfterStep<T> {
    pub run: Result<T, TaskStoreError>,
    pub step: Result<State, TaskStoreError>,
}

impl TaskStore {
    fn run_key(&self, run_id: &str) -> String {
        format!("{}:{run_id}", self.lane_key("run", lane_of(run_id)))
    }

    fn runs_due_key(&self, lane: usize) -> String {
        self.lane_key("runs_due", lane)
    }

    fn runs_recent_key(&self) -> String {
        format!("{}:runs_recent", self.namespace)
    }

    /// Stores run `run_id` (the id of its held task) with `spec`, due for a
    /// look by any router after `grace_ms`; `false` when it exists already.
    pub async fn create_run(&self, run_id: &str, spec: &str, grace_ms: u64) -> Result<bool, TaskStoreError> {
        let mut connection = self.connection().await?;
        let created: i64 = invoke(
            &self.run_scripts.create,
            &[&self.create_part(run_id, spec, grace_ms)],
            &mut connection,
        )
        .await?;
        if created == 1 {
            self.index_run(&connection, run_id).await;
        }
        Ok(created == 1)
    }

    /// `CREATE_RUN`'s keys and arguments.
    pub(super) fn create_part(&self, run_id: &str, spec: &str, grace_ms: u64) -> Part {
        let now = now_ms();
        let mut part = Part::default();
        part.key(self.run_key(run_id))
            .key(self.runs_due_key(lane_of(run_id)))
            .arg(spec)
            .arg(now)
            .arg(now + grace_ms)
            .arg(run_id);
        part
    }

    /// The recent runs' index (another slot) as `START_RUN` reads it on one server.
    pub(super) fn recent_part(&self, run_id: &str) -> Part {
        let mut part = Part::default();
        part.key(self.runs_recent_key())
            .arg(now_ms())
            .arg(run_id)
            .arg(RECENT_RUNS);
        part
    }

    /// The console's list gains a run just created: best effort, beside
    /// the run (another slot).
    pub(super) async fn index_run(&self, connection: &Connection, run_id: &str) {
        let mut connection = connection.clone();
        let recent = self.runs_recent_key();
        let indexed: Result<(), redis::RedisError> = redis::pipe()
            .zadd(&recent, run_id, now_ms())
            .ignore()
            .zremrangebyrank(&recent, 0, -(RECENT_RUNS + 1))
            .ignore()
            .query_async(&mut connection)
            .await;
        if let Err(error) = indexed {
            tracing::warn!(message = "A run is missing from the recent runs' index.", %run_id, %error);
        }
    }

    /// Run `run_id` as stored.
    pub async fn run(&self, run_id: &str) -> Result<StoredRun, TaskStoreError> {
        let mut connection = self.connection().await?;
        let fields: std::collections::HashMap<String, String> =
            connection.hgetall(self.run_key(run_id)).await.map_err(unavailable)?;
        if fields.is_empty() {
            return Err(TaskStoreError::NotFound(run_id.to_string()));
        }
        let mut stored = StoredRun {
            run_id: run_id.to_string(),
            spec: String::new(),
            state: State::Pending,
            updated_at_ms: 0,
            entries: BTreeMap::new(),
            result: None,
        };
        for (field, value) in fields {
            match field.as_str() {
                "spec" => stored.spec = value,
                "state" => {
                    stored.state = State::parse(&value)
                        .ok_or_else(|| TaskStoreError::Corrupt(format!("run {run_id} has state `{value}`")))?
                }
                "updated_at_ms" => stored.updated_at_ms = value.parse().unwrap_or(0),
                "result" => stored.result = Some(value),
                _ => {
                    let json = value.split_once('|').map_or(value.as_str(), |(_, json)| json);
                    stored.entries.insert(field, json.to_string());
                }
            }
        }
        if stored.spec.is_empty() {
            return Err(TaskStoreError::Corrupt(format!("run {run_id} has no spec")));
        }
        Ok(stored)
    }

    /// Writes `field` of run `run_id` unless the stored entry is later than
    /// `order`; `true` when written. A run that is gone (expired) is `NotFound`.
    pub async fn put_run_entry(
        &self,
        run_id: &str,
        field: &str,
        order: EntryOrder,
        json: &str,
    ) -> Result<bool, TaskStoreError> {
        let entry = RunEntry {
            field: field.to_string(),
            order,
            json: json.to_string(),
        };
        self.put_run_entries(run_id, std::slice::from_ref(&entry), None)
            .await
            .map(|written| written == 1)
    }

    /// Writes each of `entries` (as [`Self::put_run_entry`] does) and, with
    /// `due_at_ms`, the run's due time (as [`Self::schedule_run`]), in one
    /// script: what an advance of the run decided, written at once. Answers
    /// how many entries were written.
    pub async fn put_run_entries(
        &self,
        run_id: &str,
        entries: &[RunEntry],
        due_at_ms: Option<u64>,
    ) -> Result<usize, TaskStoreError> {
        if entries.is_empty() && due_at_ms.is_none() {
            return Ok(0);
        }
        let mut connection = self.connection().await?;
        let written: i64 = invoke(
            &self.run_scripts.put_entries,
            &[&self.put_part(run_id, entries, due_at_ms)],
            &mut connection,
        )
        .await?;
        match written {
            -1 => Err(TaskStoreError::NotFound(run_id.to_string())),
            written => Ok(usize::try_from(written).unwrap_or(0)),
        }
    }

    /// `PUT_ENTRIES`'s keys and arguments.
    fn put_part(&self, run_id: &str, entries: &[RunEntry], due_at_ms: Option<u64>) -> Part {
        let mut part = Part::default();
        part.key(self.run_key(run_id))
            .key(self.runs_due_key(lane_of(run_id)))
            .arg(now_ms())
            .arg(due_at_ms.map_or_else(String::new, |due| due.to_string()))
            .arg(run_id);
        entry_args(&mut part, entries);
        part
    }

    /// Moves run `run_id` to `state` from one of `from`; a terminal state
    /// keeps `result`, starts the retention and drops the run's due entry.
    /// Returns the state it was in; `Refused` when it is in another.
    pub async fn move_run(
        &self,
        run_id: &str,
        state: State,
        from: &[State],
        result: Option<&str>,
    ) -> Result<State, TaskStoreError> {
        self.move_run_with(run_id, state, from, result, &[]).await
    }

    /// [`Self::move_run`], writing `entries` first in the same script (as
    /// [`Self::put_run_entries`] writes them, whether or not the move is
    /// refused): a run's last outcomes and its end, at once.
    pub async fn move_run_with(
        &self,
        run_id: &str,
        state: State,
        from: &[State],
        result: Option<&str>,
        entries: &[RunEntry],
    ) -> Result<State, TaskStoreError> {
        let mut connection = self.connection().await?;
        let answer: Vec<String> = invoke(
            &self.run_scripts.move_run,
            &[&self.move_part(run_id, (state, from), result, entries)],
            &mut connection,
        )
        .await?;
        script_answer(answer, run_id, state)
    }

    /// `MOVE_RUN`'s keys and arguments.
    fn move_part(
        &self,
        run_id: &str,
        (state, from): (State, &[State]),
        result: Option<&str>,
        entries: &[RunEntry],
    ) -> Part {
        let mut part = Part::default();
        part.key(self.run_key(run_id))
            .key(self.runs_due_key(lane_of(run_id)))
            .arg(state.as_str())
            .arg(now_ms())
            .arg(result.unwrap_or(""))
            .arg(if state.is_terminal() {
                self.retention_s.to_string()
            } else {
                String::new()
            })
            .arg(run_id)
            .arg(from.len());
        for allowed in from {
            part.arg(allowed.as_str());
        }
        entry_args(&mut part, entries);
        part
    }

    /// A run's first advance (docs/design.md §3.14.4), one script: run
    /// `run_id` moved from `pending` to `running` with `entries` (written
    /// whatever the move's answer, as [`Self::move_run_with`] writes them),
    /// its held task moved to `running` when the run is running, and the
    /// run due for a look at `due_at_ms`. `NotFound` when the run is gone;
    /// a run another router moved, or canceled, is no error (its entries
    /// are written all the same).
    pub async fn start_running(
        &self,
        run_id: &str,
        entries: &[RunEntry],
        due_at_ms: u64,
    ) -> Result<(), TaskStoreError> {
        match self.advance_run(run_id, &[], entries, due_at_ms, true).await? {
            true => Ok(()),
            // (No call to stop at.)
            false => Err(TaskStoreError::Corrupt(format!("run {run_id}'s first advance stopped"))),
        }
    }

    /// An advance's writes in one script (docs/design.md §3.14.4): `calls`
    /// (each task and the id it is submitted as) submitted, then `entries`
    /// written (a first advance, `first`: with the run's and its held task's
    /// moves to `running`, as [`Self::start_running`]) and the run due at
    /// `due_at_ms`. `false`: nothing of the run written, for the caller to
    /// take the long way ([`Self::submit`] each call, then the writes):
    /// calls on a cluster (other slots), a store that waits for replicas,
    /// or a call whose request id names another task than the id given.
    /// `NotFound` when the run is gone.
    pub async fn advance_run(
        &self,
        run_id: &str,
        calls: &[(crate::store::NewTask, String)],
        entries: &[RunEntry],
        due_at_ms: u64,
        first: bool,
    ) -> Result<bool, TaskStoreError> {
        let (advanced, _) = self
            .advance_inner(run_id, calls, entries, due_at_ms, first, None)
            .await?;
        advanced
    }

    /// [`Self::advance_run`] carrying `step`'s end (the workflow step whose
    /// end started this advance): on one server ([`Self::folds_steps`]) the
    /// step's `FINISH` is the script's first part, and a step that ended
    /// elsewhere (its `FINISH` refused) stops it before anything of the run
    /// is written; elsewhere the step is ended first, on its own, as
    /// [`Self::finish`] ends it. Answers the advance (as `advance_run`; not
    /// run, `Ok(false)`, when the step's end is an error) and the step's end.
    pub async fn advance_run_after_step(
        &self,
        run_id: &str,
        (calls, entries): (&[(crate::store::NewTask, String)], &[RunEntry]),
        (due_at_ms, first): (u64, bool),
        step: StepEnd<'_>,
    ) -> Result<AfterStep<bool>, TaskStoreError> {
        if !self.folds_steps() {
            let ended = self.finish(step.claimed, step.state, step.result).await;
            let advanced = match ended {
                Ok(_) => self.advance_run(run_id, calls, entries, due_at_ms, first).await,
                Err(_) => Ok(false),
            };
            return Ok(AfterStep {
                run: advanced,
                step: ended,
            });
        }
        let (run, step) = self
            .advance_inner(run_id, calls, entries, due_at_ms, first, Some(step))
            .await?;
        Ok(AfterStep {
            run,
            step: step.unwrap_or_else(|| Err(TaskStoreError::Corrupt("a step's end was not carried".to_string()))),
        })
    }

    /// Whether a workflow step's end can be written in the script of the
    /// advance it starts: one server (a cluster has the step and its run in
    /// other slots) that does not wait for replicas.
    pub fn folds_steps(&self) -> bool {
        !self.is_cluster() && self.wait.is_none()
    }

    async fn advance_inner(
        &self,
        run_id: &str,
        calls: &[(crate::store::NewTask, String)],
        entries: &[RunEntry],
        due_at_ms: u64,
        first: bool,
        step: Option<StepEnd<'_>>,
    ) -> Result<(Result<bool, TaskStoreError>, Option<Result<State, TaskStoreError>>), TaskStoreError> {
        if step.is_none() && !calls.is_empty() && !self.folds_steps() {
            return Ok((Ok(false), None));
        }
        let (advance, queued) = self.advance_parts(run_id, (calls, entries), due_at_ms, first)?;
        let ending = step.map(|step| (step, Ending::of(self, &step.claimed.task)));
        let leading = ending.as_ref().map(|(step, ending)| self.step_part(step, ending));
        let parts: Vec<&Part> = leading.iter().chain(&advance).collect();
        let connection = self.connection().await?;
        let (answer, ended) = match &ending {
            None => {
                let mut connection = connection.clone();
                let answer: i64 = invoke(&self.run_scripts.advance, &parts, &mut connection).await?;
                (answer, None)
            }
            Some((step, ending)) => {
                let (ended, answer): (Vec<String>, i64) = {
                    let mut connection = connection.clone();
                    invoke(&self.run_scripts.step_then_advance, &parts, &mut connection).await?
                };
                self.publish_recorded(&connection, ending, step.state, &ended).await;
                let ended = script_answer(ended, ending.task_id, step.state);
                if ended.is_err() {
                    return Ok((Ok(false), Some(ended)));
                }
                (answer, Some(ended))
            }
        };
        let advanced = match answer {
            -1 => Err(TaskStoreError::NotFound(run_id.to_string())),
            0 => Ok(false),
            _ => {
                for (lane, field) in &queued {
                    self.note_queued(*lane, field);
                }
                Ok(true)
            }
        };
        Ok((advanced, ended))
    }

    /// [`ADVANCE`]'s parts (its header, each call's `SUBMIT` on one server,
    /// then the run's writes), and each call's lane and backlog field (for
    /// [`Self::note_queued`] once the script ran).
    pub(super) fn advance_parts(
        &self,
        run_id: &str,
        (calls, entries): (&[(crate::store::NewTask, String)], &[RunEntry]),
        due_at_ms: u64,
        first: bool,
    ) -> Result<(Vec<Part>, Queued), TaskStoreError> {
        let mut parts = Vec::with_capacity(calls.len() + 4);
        let mut header = Part::default();
        header.arg(calls.len()).arg(if first { "1" } else { "0" });
        parts.push(header);
        let mut queued = Vec::with_capacity(calls.len());
        for (task, task_id) in calls {
            let (part, lane, field) = self.one_server_part(task, task_id)?;
            parts.push(part);
            queued.push((lane, field));
        }
        if first {
            parts.push(self.move_part(run_id, (State::Running, &[State::Pending]), None, entries));
            parts.push(self.transition_part(run_id, State::Running));
            parts.push(self.put_part(run_id, &[], Some(due_at_ms)));
        } else {
            parts.push(self.put_part(run_id, entries, Some(due_at_ms)));
        }
        Ok((parts, queued))
    }

    /// `step`'s `FINISH` part, as [`Self::finish`] writes it.
    fn step_part(&self, step: &StepEnd<'_>, ending: &Ending<'_>) -> Part {
        let entry = (step.claimed.queue.as_str(), step.claimed.entry_id.as_str());
        self.finish_part(ending, step.state, step.result, Some(entry), None)
    }

    /// Ends run `run_id` and its held task `held` in one script (docs/design.md
    /// §3.14.4): the run moved to `state` from one of `from` with its
    /// `result` and last `entries` (as [`Self::move_run_with`]); when it
    /// moved, its held task ended with `envelope` as [`Self::complete`]
    /// ends it, without reading it first. Answers the run's move, and, when
    /// it moved, the held task's end (`Refused` when the task is not
    /// running: its move to `running` was lost; see [`Self::complete`]).
    pub async fn end_run(
        &self,
        run_id: &str,
        (state, from): (State, &[State]),
        result: &str,
        entries: &[RunEntry],
        held: (&HeldTask<'_>, &serde_json::Value),
    ) -> Result<(State, Result<State, TaskStoreError>), TaskStoreError> {
        let (ended, _) = self
            .end_inner(run_id, (state, from), result, entries, held, None)
            .await?;
        ended
    }

    /// [`Self::end_run`] carrying `step`'s end (the run's last step, whose
    /// end ends the run), as [`Self::advance_run_after_step`] carries it:
    /// on one server the step's `FINISH` first in the script (refused: the
    /// run not written), elsewhere the step ended first on its own.
    pub async fn end_run_after_step(
        &self,
        run_id: &str,
        (state, from): (State, &[State]),
        (result, entries): (&str, &[RunEntry]),
        held: (&HeldTask<'_>, &serde_json::Value),
        step: StepEnd<'_>,
    ) -> Result<AfterStep<(State, Result<State, TaskStoreError>)>, TaskStoreError> {
        if !self.folds_steps() {
            let ended = self.finish(step.claimed, step.state, step.result).await;
            let run = match ended {
                Ok(_) => self.end_run(run_id, (state, from), result, entries, held).await,
                Err(_) => Err(TaskStoreError::Refused {
                    current: String::new(),
                    wanted: state.as_str().to_string(),
                }),
            };
            return Ok(AfterStep { run, step: ended });
        }
        let (run, step) = self
            .end_inner(run_id, (state, from), result, entries, held, Some(step))
            .await?;
        Ok(AfterStep {
            run,
            step: step.unwrap_or_else(|| Err(TaskStoreError::Corrupt("a step's end was not carried".to_string()))),
        })
    }

    async fn end_inner(
        &self,
        run_id: &str,
        (state, from): (State, &[State]),
        result: &str,
        entries: &[RunEntry],
        (held, envelope): (&HeldTask<'_>, &serde_json::Value),
        step: Option<StepEnd<'_>>,
    ) -> Result<(RunEnded, Option<Result<State, TaskStoreError>>), TaskStoreError> {
        let connection = self.connection().await?;
        let ending = Ending {
            task_id: run_id,
            caller: held.caller,
            request_id: held.request_id,
            session_id: held.session_id,
            queue: self.queue_key(lane_of(run_id), held.capability, held.priority),
            has_callback: held.has_callback,
        };
        let stepping = step.map(|step| (step, Ending::of(self, &step.claimed.task)));
        let leading = stepping.as_ref().map(|(step, stepping)| self.step_part(step, stepping));
        let run_parts = [
            self.move_part(run_id, (state, from), Some(result), entries),
            self.finish_part(&ending, state, envelope, None, None),
        ];
        let parts: Vec<&Part> = leading.iter().chain(&run_parts).collect();
        let (moved, finished, step_ended) = match &stepping {
            None => {
                let mut connection = connection.clone();
                let (moved, finished): (Vec<String>, Vec<String>) =
                    invoke(&self.run_scripts.end, &parts, &mut connection).await?;
                (moved, finished, None)
            }
            Some((step, stepping)) => {
                let (ended, (moved, finished)): (Vec<String>, (Vec<String>, Vec<String>)) = {
                    let mut connection = connection.clone();
                    invoke(&self.run_scripts.step_then_end, &parts, &mut connection).await?
                };
                self.publish_recorded(&connection, stepping, step.state, &ended).await;
                let ended = script_answer(ended, stepping.task_id, step.state);
                if ended.is_err() {
                    let refused = Err(TaskStoreError::Refused {
                        current: String::new(),
                        wanted: state.as_str().to_string(),
                    });
                    return Ok((refused, Some(ended)));
                }
                (moved, finished, Some(ended))
            }
        };
        let moved = match script_answer(moved, run_id, state) {
            Ok(moved) => moved,
            Err(error) => return Ok((Err(error), step_ended)),
        };
        if self.is_cluster() {
            // The idempotency key is in its own slot: its retention starts
            // again beside the script (a failure leaves it the submission's).
            if let Err(error) = self.retain_request(&connection, held.caller, held.request_id).await {
                tracing::warn!(
                    message = "An ended task's idempotency key keeps the retention from its submission.",
                    task_id = %run_id, %error
                );
            }
        }
        self.publish_recorded(&connection, &ending, state, &finished).await;
        Ok((Ok((moved, script_answer(finished, run_id, state))), step_ended))
    }

    /// Run `run_id` is due for a look by any router at `at_ms` (unless it ended).
    pub async fn schedule_run(&self, run_id: &str, at_ms: u64) -> Result<(), TaskStoreError> {
        let mut connection = self.connection().await?;
        // XX: an ended run's entry is gone and stays gone.
        redis::cmd("ZADD")
            .arg(self.runs_due_key(lane_of(run_id)))
            .arg("XX")
            .arg(at_ms)
            .arg(run_id)
            .query_async::<i64>(&mut connection)
            .await
            .map(drop)
            .map_err(unavailable)
    }

    /// Runs due for a look now (at most `limit`), each leased to this
    /// router for `lease_ms` (its due time pushed out), lanes in turn.
    pub async fn lease_due_runs(&self, lease_ms: u64, limit: usize) -> Result<Vec<String>, TaskStoreError> {
        let connection = self.connection().await?;
        let now = now_ms();
        let leases = (0..LANES).map(|lane| {
            let mut connection = connection.clone();
            async move {
                self.scripts
                    .lease_due
                    .key(self.runs_due_key(lane))
                    .arg(now)
                    .arg(now + lease_ms)
                    .arg(limit)
                    .invoke_async::<Vec<String>>(&mut connection)
                    .await
            }
        });
        let mut due = Vec::new();
        for leased in futures::future::join_all(leases).await {
            due.extend(leased.map_err(unavailable)?);
        }
        due.truncate(limit);
        Ok(due)
    }

    /// The newest runs' ids, newest first (at most `limit`).
    pub async fn recent_runs(&self, limit: usize) -> Result<Vec<String>, TaskStoreError> {
        let mut connection = self.connection().await?;
        let stop = isize::try_from(limit).unwrap_or(isize::MAX).saturating_sub(1);
        connection
            .zrevrange(self.runs_recent_key(), 0, stop)
            .await
            .map_err(unavailable)
    }
}
