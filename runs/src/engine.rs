//! The engine (docs/design.md §3.14.4): starts runs, advances each as its
//! steps end, ends it. A run's state lives only in the task store — its
//! held task and its run hash — so any router can advance any run:
//!
//! - a step's task that ends on this router is recorded at once and its run
//!   advanced ([`Engine::step_ended`], told by the slow path's worker);
//! - every advance leaves the run due for a look again (`runs_due`), so a
//!   router that dies mid-advance, or whose step ended elsewhere, leaves the
//!   run to any router's sweep ([`Engine::sweep`]), which reads the tasks in
//!   flight first;
//! - every decision is the planner's ([`crate::plan`]), the same on every
//!   router, and every call is a task whose request id names its run, step,
//!   element and attempt: advancing twice submits nothing twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use agent_reach_access::kept::Kept;
use agent_reach_access::Caller;
use agent_reach_pipeline::error::{Code, RouterError};
use agent_reach_pipeline::RouterService;
use agent_reach_proto::envelope::{ResultEnvelope, ResultStatus, ENVELOPE_VERSION};
use agent_reach_proto::Priority;
use agent_reach_task_store::store::now_ms;
use agent_reach_task_store::{
    Callback, FirstAdvance, HeldTask, NewTask, RunEntry, State, StepEnd, StoredRun, Submitted, TaskStore,
    TaskStoreError,
};
use agent_reach_tasks::{store_error, TaskService};
use agent_reach_workflows::Workflow;
use serde_json::{json, Value};

use crate::model::{call_request_id, entry_of_request, step_field, ItemRecord, ItemStatus, RunSpec};
use crate::plan::{self, Action, End, Records};

/// How the engine paces itself.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// A run is due for a look by any router this long after its last
    /// advance (the backstop: a step ended on a router that died).
    pub check_after: Duration,
    /// How often this router looks for due runs.
    pub sweep_every: Duration,
    /// A due run is leased to the router looking at it this long.
    pub lease: Duration,
}

impl Default for RunSettings {
    fn default() -> Self {
        Self {
            check_after: Duration::from_secs(10),
            sweep_every: Duration::from_millis(500),
            lease: Duration::from_secs(30),
        }
    }
}

/// A run to start.
pub struct Start<'a> {
    pub workflow: &'a Arc<Workflow>,
    pub caller: &'a Caller,
    pub input: Value,
    pub request_id: String,
    pub session_id: Option<String>,
    pub context_id: Option<String>,
    pub priority: Priority,
    pub callback: Option<Callback>,
    pub trace_id: Option<String>,
}

/// A run started (or found: the same caller's request id again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub run_id: String,
    pub duplicate: bool,
    pub state: State,
}

/// A run's definition as written, and as checked from it.
type Checked = (Value, Arc<Workflow>);

/// A run's spec and its checked workflow.
type Known = (Arc<RunSpec>, Arc<Workflow>);

/// Runs' specs kept in each of the cache's two generations (a cache, never
/// the truth; those in use kept longest, as a run may wait seconds between
/// its steps behind a backlog). A kept spec leaves out the definition: its
/// checked workflow is kept beside it.
const SPECS_KEPT: usize = 8192;

pub struct Engine {
    tasks: Arc<TaskService>,
    service: Weak<RouterService>,
    settings: RunSettings,
    /// Checked workflows by (name, version), with the definition they were checked from.
    workflows: Mutex<HashMap<(String, String), Checked>>,
    /// Runs' specs as read and checked (a run's spec never changes), so an
    /// advance does not parse the spec and compare definitions each time.
    specs: Mutex<Kept<String, Known>>,
    /// Runs this router is advancing now: whether news came meanwhile, and
    /// the steps' outcomes its next pass writes with its decisions.
    advancing: Mutex<HashMap<String, Advancing>>,
    /// Who waits here for a run's news (a call answered when its run ends, an events stream).
    waiters: Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
    pub(crate) metrics: crate::metrics::RunMetrics,
}

/// A run being advanced on this router.
#[derive(Default)]
struct Advancing {
    /// News came meanwhile: go round once more.
    news: bool,
    /// Steps' outcomes (entry field, record) not written yet.
    ended: Vec<(String, ItemRecord)>,
}

impl Engine {
    pub fn new(
        tasks: Arc<TaskService>,
        service: Weak<RouterService>,
        settings: RunSettings,
        registry: &prometheus::Registry,
    ) -> Result<Arc<Self>, String> {
        Ok(Arc::new(Self {
            tasks,
            service,
            settings,
            workflows: Mutex::new(HashMap::new()),
            specs: Mutex::new(Kept::new(SPECS_KEPT)),
            advancing: Mutex::new(HashMap::new()),
            waiters: Mutex::new(HashMap::new()),
            metrics: crate::metrics::RunMetrics::register(registry)?,
        }))
    }

    pub fn store(&self) -> &TaskStore {
        self.tasks.store()
    }

    pub(crate) fn service(&self) -> Option<Arc<RouterService>> {
        self.service.upgrade()
    }

    /// Starts a run of `start.workflow`: its held task (idempotent by the
    /// caller's request id), its record and its first advance, one script
    /// where the store folds them (one server without `WAIT`); elsewhere
    /// the first advance follows the start at once.
    pub async fn start(self: &Arc<Self>, start: Start<'_>) -> Result<Started, RouterError> {
        let workflow = start.workflow;
        let caller = start.caller.name().unwrap_or("anonymous").to_string();
        let spec = RunSpec {
            workflow: workflow.name.clone(),
            version: workflow.version.to_string(),
            definition: serde_json::to_value(&workflow.definition).unwrap_or(Value::Null),
            input: start.input.clone(),
            caller: caller.clone(),
            request_id: start.request_id.clone(),
            session_id: start.session_id.clone(),
            context_id: start.context_id.clone(),
            priority: start.priority,
            trace_id: start.trace_id.clone(),
            created_at_ms: now_ms(),
            has_callback: Some(start.callback.is_some()),
        };
        let envelope = json!({
            "capability": workflow.name, "request_id": start.request_id, "session_id": start.session_id,
            "context_id": start.context_id, "priority": start.priority, "payload": start.input,
        });
        let spec_json =
            serde_json::to_string(&spec).map_err(|error| RouterError::new(Code::Internal, error.to_string()))?;
        let grace = u64::try_from(self.settings.check_after.as_millis()).unwrap_or(u64::MAX);
        // The held task, the run and (where the store folds them) its
        // first advance, one script (a repeat finds both and advances nothing).
        let run_id = self.store().task_id_for(&workflow.name);
        let first = self
            .store()
            .folds_steps()
            .then(|| self.first_advance(&run_id, &spec, workflow))
            .flatten();
        let started = self
            .store()
            .start_run(
                NewTask {
                    request_id: start.request_id,
                    session_id: start.session_id,
                    caller,
                    capability: workflow.name.clone(),
                    priority: start.priority,
                    envelope,
                    callback: start.callback,
                    hold: true,
                    ..NewTask::default()
                },
                &run_id,
                (&spec_json, grace),
                first.as_ref().map(|first| FirstAdvance {
                    calls: &first.calls,
                    entries: &first.entries,
                    due_at_ms: first.wake,
                }),
            )
            .await
            .map_err(store_error)?;
        let submitted = started.submitted;
        let run_id = submitted.task_id().to_string();
        if started.created {
            self.metrics.started.with_label_values(&[&workflow.name]).inc();
            tracing::info!(message = "Run started.", %run_id, workflow = %workflow.name, version = %workflow.version);
            let advanced = first.filter(|_| started.advanced);
            if let Some(first) = &advanced {
                self.count_calls(&spec, first.calls.len());
            }
            // This router's advances of it need neither parse nor check.
            self.keep_spec(&run_id, spec, workflow.clone());
            match advanced {
                Some(first) => {
                    for at in first.wakes {
                        self.wake_at(&run_id, at);
                    }
                }
                None => self.kick(StoredRun {
                    run_id: run_id.clone(),
                    spec: spec_json,
                    state: State::Pending,
                    updated_at_ms: now_ms(),
                    entries: Default::default(),
                    result: None,
                }),
            }
            // (The run as accepted: its first advance may have moved it already.)
            return Ok(Started {
                run_id,
                duplicate: false,
                state: State::Pending,
            });
        }
        let stored = self.store().run(&run_id).await.map_err(run_error)?;
        Ok(Started {
            duplicate: matches!(submitted, Submitted::Existing(_)),
            run_id,
            state: stored.state,
        })
    }

    /// Advances a run this router has just created (as `created`, not read
    /// back: no other router looks at it before its grace ends, and one that
    /// did would only make this advance's writes the refused repeats of its own).
    fn kick(self: &Arc<Self>, created: StoredRun) {
        let engine = self.clone();
        tokio::spawn(async move {
            let run_id = created.run_id.clone();
            engine.advance_with(&run_id, false, None, Some(created)).await;
        });
    }

    /// A step's task ended on this router (as `state`, with `result`):
    /// advance its run, the advance writing the outcome with what it decides
    /// (one script). A router that dies before leaves the run due: the
    /// sweep reads the ended task and records it then.
    pub fn step_ended(self: &Arc<Self>, task: &agent_reach_task_store::Task, state: State, result: &Value) {
        let Some(run_id) = task.run.clone() else {
            return;
        };
        let Some((field, attempt)) = entry_of_request(&run_id, &task.request_id) else {
            return;
        };
        let ended = ended_record(task, attempt, state, result);
        let engine = self.clone();
        tokio::spawn(async move { engine.advance_with(&run_id, false, Some((field, ended)), None).await });
    }

    /// A step's task ends here (`claimed`, as `state` with `result`) with the
    /// advance of its run it starts: the step's `FINISH` is written in that
    /// advance's script (one server; elsewhere the store ends the step
    /// first, on its own). `None` when the run is being advanced on this
    /// router already: the worker ends the step and tells [`Self::step_ended`],
    /// which that advance hears as news.
    pub fn end_step<'a>(
        self: &Arc<Self>,
        claimed: &'a agent_reach_task_store::Claimed,
        state: State,
        result: &'a Value,
    ) -> Option<agent_reach_tasks::StepEnding<'a>> {
        let run_id = claimed.task.run.clone()?;
        let (field, attempt) = entry_of_request(&run_id, &claimed.task.request_id)?;
        {
            let mut advancing = self.advancing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if advancing.contains_key(&run_id) {
                return None;
            }
            let ended = ended_record(&claimed.task, attempt, state, result);
            advancing.insert(
                run_id.clone(),
                Advancing {
                    news: false,
                    ended: vec![(field, ended)],
                },
            );
        }
        let mut slot = Slot {
            engine: self.clone(),
            run_id,
            held: true,
        };
        Some(Box::pin(async move {
            let mut step = Carried {
                end: StepEnd { claimed, state, result },
                ended: None,
            };
            let engine = slot.engine.clone();
            engine.advance_loop(&slot.run_id, false, None, Some(&mut step)).await;
            slot.given_back();
            step.ended(engine.store()).await
        }))
    }

    async fn record(&self, run_id: &str, field: &str, record: &ItemRecord) -> Result<bool, TaskStoreError> {
        let json = serde_json::to_string(record).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
        self.store().put_run_entry(run_id, field, record.order(), &json).await
    }

    /// Advances a run, one advance at a time on this router (news arriving
    /// meanwhile makes the running advance go round once more).
    pub(crate) async fn advance(self: &Arc<Self>, run_id: &str, refresh: bool) {
        self.advance_with(run_id, refresh, None, None).await;
    }

    /// [`Engine::advance`], with a step's outcome (entry field, record) for
    /// the advance to write, or the run as this router created it.
    async fn advance_with(
        self: &Arc<Self>,
        run_id: &str,
        refresh: bool,
        ended: Option<(String, ItemRecord)>,
        mut created: Option<StoredRun>,
    ) {
        {
            let mut advancing = self.advancing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(running) = advancing.get_mut(run_id) {
                running.news = true;
                running.ended.extend(ended);
                return;
            }
            advancing.insert(
                run_id.to_string(),
                Advancing {
                    news: false,
                    ended: ended.into_iter().collect(),
                },
            );
        }
        self.advance_loop(run_id, refresh, created.take(), None).await;
    }

    /// The advances of a run whose slot in `advancing` this call holds: one,
    /// then one more for each time news came meanwhile; the first carries
    /// `step`'s end when given (ended on its own before anything else is
    /// written when that advance cannot carry it).
    async fn advance_loop(
        self: &Arc<Self>,
        run_id: &str,
        refresh: bool,
        mut created: Option<StoredRun>,
        mut step: Option<&mut Carried<'_>>,
    ) {
        let mut refresh = refresh;
        loop {
            let mut ended = self
                .advancing
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .get_mut(run_id)
                .map(|running| std::mem::take(&mut running.ended))
                .unwrap_or_default();
            let advanced = self
                .advance_once(run_id, refresh, &ended, created.take(), step.as_deref_mut())
                .await;
            // The step's end, if not written by that advance, before anything
            // more; a step that ended elsewhere (or could not end) has no
            // outcome of ours to record.
            if let Some(step) = step.take() {
                step.end_alone(self.store()).await;
                if matches!(step.ended, Some(Err(_))) {
                    ended.clear();
                }
            }
            if let Err(error) = advanced {
                tracing::warn!(message = "A run could not advance; it is due again later.", %run_id, %error);
                // The outcomes on their own, as the sweep would record them.
                for (field, record) in &ended {
                    if let Err(error) = self.record(run_id, field, record).await {
                        tracing::warn!(message = "A step's outcome is not in its run yet; a sweep finds it.", %run_id, %error);
                    }
                }
            }
            refresh = false;
            let mut advancing = self.advancing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match advancing.get_mut(run_id) {
                Some(running) if running.news => running.news = false,
                _ => {
                    advancing.remove(run_id);
                    break;
                }
            }
        }
        self.notify(run_id);
    }

    /// One pass: read the run (unless this router just created it), apply `ended` (steps' outcomes not written
    /// yet), plan, submit, write the outcomes and decisions in one script.
    async fn advance_once(
        self: &Arc<Self>,
        run_id: &str,
        refresh: bool,
        ended: &[(String, ItemRecord)],
        created: Option<StoredRun>,
        mut step: Option<&mut Carried<'_>>,
    ) -> Result<(), TaskStoreError> {
        let stored = match created {
            Some(created) => created,
            None => match self.store().run(run_id).await {
                Ok(stored) => stored,
                Err(TaskStoreError::NotFound(_)) => return Ok(()),
                Err(error) => return Err(error),
            },
        };
        if stored.state.is_terminal() {
            self.forget_spec(run_id);
            return Ok(());
        }
        let known = self
            .specs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(run_id)
            .cloned();
        let (spec, workflow) = match known {
            Some(known) => known,
            None => {
                let spec: RunSpec =
                    serde_json::from_str(&stored.spec).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
                let workflow = match self.workflow(&spec) {
                    Ok(workflow) => workflow,
                    Err(problem) => {
                        let error = json!({"code": "INTERNAL", "message": format!("the run's definition does not check: {problem}"), "retryable": false});
                        return self.finish(run_id, &spec, End::Failed(error), &[], step).await;
                    }
                };
                self.keep_spec(run_id, spec, workflow)
            }
        };
        let mut records = Records::from_entries(&stored.entries);
        // What this advance decided is written at once, with the run's next
        // due time, after its calls are submitted: a router that dies before
        // leaves the run due, and the next advance submits the same calls
        // again under the same request ids (found, not duplicated). The
        // steps' outcomes go first (as the script writes them: unless the
        // stored entry is later).
        let mut entries = Vec::new();
        for (field, record) in ended {
            if records
                .entry(field)
                .is_some_and(|stored| stored.order() > record.order())
            {
                continue;
            }
            let json = serde_json::to_string(record).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
            entries.push(RunEntry {
                field: field.clone(),
                order: record.order(),
                json,
            });
            records.set_entry(field, record.clone());
        }
        if refresh {
            self.refresh(run_id, &mut records).await?;
        }
        // The first advance moves the run and its held task (the run's face
        // on the task routes) to `running` with what it decided, in the one
        // script that writes that (a router that dies before leaves the run
        // pending and due: the next advance submits the same calls, found).
        let first = stored.state == State::Pending;
        let Decided {
            mut entries,
            calls,
            placed,
            wake,
            wakes,
            cancels,
            end,
        } = self.decide(run_id, (&spec, &workflow), &mut records, entries)?;
        for at in wakes {
            self.wake_at(run_id, at);
        }
        self.cancel_tasks(&cancels).await;
        if let Some(end) = end {
            self.forget_spec(run_id);
            self.submit_calls(&spec, calls, &placed, &mut entries).await?;
            if first {
                // Ended at its first look (every step skipped):
                // running first, as every run's end expects.
                if let Some(step) = step.as_deref_mut() {
                    step.end_alone(self.store()).await;
                }
                self.store().start_running(run_id, &[], wake).await?;
            }
            return self.finish(run_id, &spec, end, &entries, step).await;
        }
        // The calls and the writes in one script where the store can (one
        // server), after the step's end that started this advance; else each
        // call submitted on its own, then the writes.
        let advanced = match step.as_deref_mut() {
            Some(step) if step.ended.is_none() => {
                let after = self
                    .store()
                    .advance_run_after_step(run_id, (&calls, &entries), (wake, first), step.end)
                    .await?;
                let refused = after.step.is_err();
                step.ended = Some(after.step);
                if refused {
                    // Ended elsewhere: nothing of the run was written; the
                    // router that ended it advances the run.
                    return Ok(());
                }
                after.run?
            }
            _ => self.store().advance_run(run_id, &calls, &entries, wake, first).await?,
        };
        if advanced {
            self.count_calls(&spec, calls.len());
            return Ok(());
        }
        if let Some(step) = step {
            step.end_alone(self.store()).await;
        }
        self.submit_calls(&spec, calls, &placed, &mut entries).await?;
        if first {
            return self.store().start_running(run_id, &entries, wake).await;
        }
        self.store()
            .put_run_entries(run_id, &entries, Some(wake))
            .await
            .map(drop)
    }

    /// The planner's pass over `records` (`entries`: the steps' outcomes to
    /// write first), as what to write at once: the calls and their entries,
    /// the run's next due time, and what else it decided.
    fn decide(
        &self,
        run_id: &str,
        (spec, workflow): (&RunSpec, &Workflow),
        records: &mut Records,
        entries: Vec<RunEntry>,
    ) -> Result<Decided, TaskStoreError> {
        let now = now_ms();
        let actions = plan::plan(workflow, spec, records, now);
        let mut decided = Decided {
            entries,
            calls: Vec::new(),
            placed: Vec::new(),
            wake: now + u64::try_from(self.settings.check_after.as_millis()).unwrap_or(u64::MAX),
            wakes: Vec::new(),
            cancels: Vec::new(),
            end: None,
        };
        for action in actions {
            match action {
                Action::Start { step, record } => {
                    let json =
                        serde_json::to_string(&record).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
                    decided.entries.push(RunEntry {
                        field: step_field(&workflow.steps[step].id),
                        order: agent_reach_task_store::EntryOrder { attempt: 0, rank: 0 },
                        json,
                    });
                }
                Action::Call(call) => {
                    let (task, entry) = self.call(run_id, spec, workflow, call, now)?;
                    decided.placed.push(decided.entries.len());
                    decided.entries.push(entry);
                    decided.calls.push(task);
                }
                Action::WakeAt(at) => {
                    decided.wake = decided.wake.min(at);
                    decided.wakes.push(at);
                }
                Action::Cancel(task_ids) => decided.cancels.extend(task_ids),
                Action::Finish(end) => {
                    decided.end = Some(end);
                    break;
                }
            }
        }
        Ok(decided)
    }

    /// A new run's first advance, planned before its start for the store to
    /// write in the script that starts it: `None` when it ends the run at
    /// once (every step skipped) or cannot be planned (the run then takes
    /// its first advance after its start, as on a cluster).
    fn first_advance(&self, run_id: &str, spec: &RunSpec, workflow: &Workflow) -> Option<Decided> {
        match self.decide(run_id, (spec, workflow), &mut Records::default(), Vec::new()) {
            Ok(decided) if decided.end.is_none() && decided.cancels.is_empty() => Some(decided),
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(message = "A run's first advance could not be planned with its start; it follows it.", %run_id, %error);
                None
            }
        }
    }

    /// Submits `calls` one by one (each under its id, or found under the
    /// task its request id names: then its entry, at `placed` in `entries`,
    /// names that task).
    async fn submit_calls(
        &self,
        spec: &RunSpec,
        calls: Vec<(NewTask, String)>,
        placed: &[usize],
        entries: &mut [RunEntry],
    ) -> Result<(), TaskStoreError> {
        let count = calls.len();
        for ((task, task_id), &index) in calls.into_iter().zip(placed) {
            let submitted = self.store().submit_with_id(task, &task_id).await?;
            if submitted.task_id() != task_id {
                let mut record: ItemRecord = serde_json::from_str(&entries[index].json)
                    .map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
                submitted.task_id().clone_into(&mut record.task_id);
                entries[index].json =
                    serde_json::to_string(&record).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
            }
        }
        self.count_calls(spec, count);
        Ok(())
    }

    fn count_calls(&self, spec: &RunSpec, count: usize) {
        for _ in 0..count {
            self.tasks.submitted();
        }
        self.metrics
            .calls
            .with_label_values(&[&spec.workflow])
            .inc_by(u64::try_from(count).unwrap_or(u64::MAX));
    }

    /// Keeps a run's checked spec (without its definition: the checked
    /// workflow beside it is what the planner reads) for its next advances.
    fn keep_spec(&self, run_id: &str, spec: RunSpec, workflow: Arc<Workflow>) -> Known {
        let known = (
            Arc::new(RunSpec {
                definition: Value::Null,
                ..spec
            }),
            workflow,
        );
        self.specs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(run_id.to_string(), known.clone());
        known
    }

    fn forget_spec(&self, run_id: &str) {
        self.specs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(run_id);
    }

    /// Reads every task the run has in flight and records those that ended
    /// (a sweep's first step: their router may have died before recording them).
    async fn refresh(&self, run_id: &str, records: &mut Records) -> Result<(), TaskStoreError> {
        let in_flight: Vec<(String, ItemRecord)> = records
            .items
            .iter()
            .map(|(field, record)| (field.clone(), record.clone()))
            .chain(
                records
                    .compensations
                    .iter()
                    .map(|(step, record)| (crate::model::compensation_field(step), record.clone())),
            )
            .filter(|(_, record)| !record.is_ended() && !record.task_id.is_empty())
            .collect();
        for (field, record) in in_flight {
            let ended = match self.store().get(&record.task_id).await {
                Ok(task) if task.state.is_terminal() => {
                    record.ended(task.state, task.result.as_ref(), task.updated_at_ms)
                }
                Ok(_) => continue,
                // Gone (expired) while the run waited: a failure, never a wait without end.
                Err(TaskStoreError::NotFound(_)) => ItemRecord {
                    status: ItemStatus::Failed,
                    finished_at_ms: Some(now_ms()),
                    error: Some(json!({"code": "TASK_NOT_FOUND", "message": "the step's task is gone"})),
                    ..record
                },
                Err(error) => return Err(error),
            };
            self.record(run_id, &field, &ended).await?;
            records.set_entry(&field, ended);
        }
        Ok(())
    }

    /// One call as a task to submit (the same request id whoever submits
    /// it) and the id to submit it as, and its record for the advance to
    /// write (naming that id).
    fn call(
        &self,
        run_id: &str,
        spec: &RunSpec,
        workflow: &Workflow,
        call: plan::Call,
        now: u64,
    ) -> Result<((NewTask, String), RunEntry), TaskStoreError> {
        let step = &workflow.steps[call.step];
        let (capability, version, timeout_ms) = match (&call.item, &step.on_failure) {
            (None, agent_reach_workflows::OnFailure::Compensate(compensation)) => (
                compensation.capability.as_str(),
                compensation.version.as_ref(),
                compensation.timeout_ms,
            ),
            _ => (step.capability.as_str(), step.version.as_ref(), step.timeout_ms),
        };
        let request_id = call_request_id(run_id, &step.id, call.item, call.attempt);
        let mut envelope = json!({
            "capability": capability, "request_id": request_id, "priority": spec.priority, "payload": call.payload,
        });
        let optional = [
            ("capability_version", version.map(ToString::to_string)),
            ("session_id", spec.session_id.clone()),
            ("context_id", spec.context_id.clone()),
            ("trace_id", spec.trace_id.clone()),
        ];
        for (field, value) in optional {
            if let Some(value) = value {
                envelope[field] = json!(value);
            }
        }
        if let Some(timeout_ms) = timeout_ms {
            envelope["timeout_ms"] = json!(timeout_ms);
        }
        let task_id = self.store().task_id_for(capability);
        let task = NewTask {
            request_id,
            caller: spec.caller.clone(),
            capability: capability.to_string(),
            priority: spec.priority,
            envelope,
            run: Some(run_id.to_string()),
            ..NewTask::default()
        };
        let record = ItemRecord {
            attempt: call.attempt,
            status: ItemStatus::Submitted,
            task_id: task_id.clone(),
            submitted_at_ms: now,
            finished_at_ms: None,
            agent_id: None,
            capability_version: None,
            output: None,
            error: None,
        };
        let json = serde_json::to_string(&record).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?;
        let entry = RunEntry {
            field: call.field,
            order: record.order(),
            json,
        };
        Ok(((task, task_id), entry))
    }

    /// A retry's backoff on this router (the run is also due by then for any router).
    fn wake_at(self: &Arc<Self>, run_id: &str, at_ms: u64) {
        let (engine, run_id) = (Arc::downgrade(self), run_id.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(at_ms.saturating_sub(now_ms()))).await;
            if let Some(engine) = engine.upgrade() {
                engine.advance(&run_id, false).await;
            }
        });
    }

    async fn cancel_tasks(&self, task_ids: &[String]) {
        for task_id in task_ids {
            let result = json!({
                "version": ENVELOPE_VERSION, "request_id": "", "status": "failed",
                "error": {"code": "CANCELED", "message": "the run no longer needs this call", "retryable": false},
            });
            match self.store().cancel(task_id, &result).await {
                Ok(_) | Err(TaskStoreError::Refused { .. } | TaskStoreError::NotFound(_)) => {}
                Err(error) => tracing::warn!(message = "A run's call could not be canceled.", %task_id, %error),
            }
        }
    }

    /// Writes `entries` (the last outcomes and decisions) and ends the run
    /// once, in one script (another router may have ended it first), then its held task.
    async fn finish(
        &self,
        run_id: &str,
        spec: &RunSpec,
        end: End,
        entries: &[RunEntry],
        step: Option<&mut Carried<'_>>,
    ) -> Result<(), TaskStoreError> {
        let (state, result, envelope) = match end {
            End::Succeeded(output) => (
                State::Succeeded,
                json!({"output": output}),
                self.envelope(run_id, spec, ResultStatus::Succeeded, Some(output), None),
            ),
            End::Failed(error) => (
                State::Failed,
                json!({"error": error}),
                self.envelope(run_id, spec, ResultStatus::Failed, None, Some(error)),
            ),
        };
        let result = result.to_string();
        let from = [State::Pending, State::Running];
        let held = spec.has_callback.map(|has_callback| HeldTask {
            caller: &spec.caller,
            request_id: &spec.request_id,
            session_id: spec.session_id.as_deref(),
            capability: &spec.workflow,
            priority: spec.priority,
            has_callback,
        });
        // The run's end and its held task's, one script (a run stored before
        // its spec said whether it has a callback: the task read, then ended).
        // The step whose end ends the run, in the same script when it can be.
        let step = match step {
            Some(step) if step.ended.is_none() && held.is_some() => Some(step),
            Some(step) => {
                step.end_alone(self.store()).await;
                None
            }
            None => None,
        };
        let held_ended = match held {
            Some(held) => {
                let ended = match step {
                    Some(step) => {
                        let after = self
                            .store()
                            .end_run_after_step(
                                run_id,
                                (state, &from),
                                (&result, entries),
                                (&held, &envelope),
                                step.end,
                            )
                            .await?;
                        let refused = after.step.is_err();
                        step.ended = Some(after.step);
                        if refused {
                            // Ended elsewhere: the run was not written.
                            return Ok(());
                        }
                        after.run
                    }
                    None => {
                        self.store()
                            .end_run(run_id, (state, &from), &result, entries, (&held, &envelope))
                            .await
                    }
                };
                match ended {
                    Ok((_, held_ended)) => Some(held_ended),
                    Err(TaskStoreError::Refused { .. }) => return Ok(()),
                    Err(error) => return Err(error),
                }
            }
            None => {
                match self
                    .store()
                    .move_run_with(run_id, state, &from, Some(&result), entries)
                    .await
                {
                    Ok(_) => None,
                    Err(TaskStoreError::Refused { .. }) => return Ok(()),
                    Err(error) => return Err(error),
                }
            }
        };
        self.metrics
            .ended
            .with_label_values(&[&spec.workflow, state.as_str()])
            .inc();
        tracing::info!(message = "Run ended.", %run_id, workflow = %spec.workflow, state = state.as_str());
        self.end_held_task(run_id, state, &envelope, held_ended).await;
        Ok(())
    }

    /// The run's result as a result envelope (its held task's, its callback's).
    fn envelope(
        &self,
        run_id: &str,
        spec: &RunSpec,
        status: ResultStatus,
        output: Option<Value>,
        error: Option<Value>,
    ) -> Value {
        let mut envelope = serde_json::to_value(ResultEnvelope {
            version: ENVELOPE_VERSION.to_string(),
            request_id: spec.request_id.clone(),
            status,
            capability: Some(spec.workflow.clone()),
            capability_version: Some(spec.version.clone()),
            agent_id: Some(run_id.to_string()),
            attempts: 1,
            duration_ms: now_ms().saturating_sub(spec.created_at_ms),
            output,
            error: None,
            budget: None,
        })
        .unwrap_or(Value::Null);
        if let Some(error) = error {
            envelope["error"] = error;
        }
        envelope
    }

    /// Ends the run's held task (its callback, its session result) as the run ended.
    /// `ended`: how the run's end script ended it already (`None`: not tried).
    async fn end_held_task(
        &self,
        run_id: &str,
        state: State,
        envelope: &Value,
        ended: Option<Result<State, TaskStoreError>>,
    ) {
        // Running since the run's first advance; moved here first only when
        // that move was lost (the task still pending).
        let mut ended = match ended {
            Some(ended) => ended,
            None => self.store().complete(run_id, state, envelope).await,
        };
        if let Err(TaskStoreError::Refused { current, .. }) = &ended {
            if State::parse(current).is_some_and(|current| !current.is_terminal()) {
                let _ = self.store().transition(run_id, State::Running).await;
                ended = self.store().complete(run_id, state, envelope).await;
            }
        }
        match ended {
            // A delivery of `/v1/tasks` that is itself this run (its worker records it too).
            Ok(_) | Err(TaskStoreError::Refused { .. }) => {}
            Err(error) => tracing::warn!(message = "A run's task could not be ended.", %run_id, %error),
        }
    }

    /// Cancels a run: no call of it starts any more, those in flight are
    /// canceled, compensations do not run. `RUN_CONFLICT` once it ended.
    pub async fn cancel(&self, run_id: &str) -> Result<(), RouterError> {
        let result = json!({"error": {"code": "CANCELED", "message": "the run was canceled", "retryable": false}});
        match self
            .store()
            .move_run(
                run_id,
                State::Canceled,
                &[State::Pending, State::Running],
                Some(&result.to_string()),
            )
            .await
        {
            Ok(_) => {}
            Err(TaskStoreError::Refused { current, .. }) => {
                return Err(RouterError::new(
                    Code::RunConflict,
                    format!("the run is `{current}` already; it cannot be canceled"),
                )
                .with_details(json!({"status": current})))
            }
            Err(error) => return Err(run_error(error)),
        }
        let stored = self.store().run(run_id).await.map_err(run_error)?;
        let records = Records::from_entries(&stored.entries);
        let in_flight: Vec<String> = records
            .in_flight()
            .into_iter()
            .map(|(_, record)| record.task_id.clone())
            .filter(|task_id| !task_id.is_empty())
            .collect();
        self.cancel_tasks(&in_flight).await;
        if let Ok(spec) = serde_json::from_str::<RunSpec>(&stored.spec) {
            self.metrics
                .ended
                .with_label_values(&[&spec.workflow, State::Canceled.as_str()])
                .inc();
            let envelope = self.envelope(
                run_id,
                &spec,
                ResultStatus::Failed,
                None,
                Some(json!({"code": "CANCELED", "message": "the run was canceled", "retryable": false})),
            );
            let _ = self.store().cancel(run_id, &envelope).await;
        }
        tracing::info!(message = "Run canceled.", %run_id, calls_canceled = in_flight.len());
        self.notify(run_id);
        Ok(())
    }

    /// The checked workflow a run started with, kept by name and version once
    /// checked here: the router's own when it is the same definition, else
    /// the stored definition checked.
    pub(crate) fn workflow(&self, spec: &RunSpec) -> Result<Arc<Workflow>, agent_reach_workflows::Problem> {
        let key = (spec.workflow.clone(), spec.version.clone());
        if let Some((definition, workflow)) = self
            .workflows
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&key)
        {
            if *definition == spec.definition {
                return Ok(workflow.clone());
            }
        }
        // Not checked here yet: the registered workflow if the run started
        // from the same definition (then kept as checked), else the stored
        // definition checked anew.
        let workflow = match self.service().and_then(|service| service.workflow(&spec.workflow)) {
            Some(current)
                if current.version.to_string() == spec.version
                    && serde_json::to_value(&current.definition)
                        .is_ok_and(|definition| definition == spec.definition) =>
            {
                current
            }
            _ => Arc::new(Workflow::from_stored(&spec.workflow, spec.definition.clone())?),
        };
        let mut workflows = self.workflows.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if workflows.len() >= 256 {
            workflows.clear();
        }
        workflows.insert(key, (spec.definition.clone(), workflow.clone()));
        Ok(workflow)
    }

    /// Looks at the runs due now (leased to this router), each read afresh.
    pub(crate) async fn sweep(self: &Arc<Self>) {
        let lease = u64::try_from(self.settings.lease.as_millis()).unwrap_or(u64::MAX);
        match self.store().lease_due_runs(lease, 64).await {
            Ok(due) => {
                for run_id in due {
                    let engine = self.clone();
                    tokio::spawn(async move { engine.advance(&run_id, true).await });
                }
            }
            Err(error) => tracing::debug!(message = "Cannot look for due runs; retrying.", %error),
        }
    }

    /// Runs the sweep until the engine is dropped.
    pub fn spawn_sweep(self: &Arc<Self>) {
        let engine = Arc::downgrade(self);
        let every = self.settings.sweep_every;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(engine) = engine.upgrade() else { return };
                if engine.service().is_some_and(|service| service.is_synced()) {
                    engine.sweep().await;
                }
            }
        });
    }

    // === Waiting for news ===

    fn notify(&self, run_id: &str) {
        let waiters = self.waiters.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(notify) = waiters.get(run_id) {
            notify.notify_waiters();
        }
    }

    /// The notifier of `run_id`'s news, shared by everyone waiting for it here.
    pub(crate) fn waiter(&self, run_id: &str) -> Arc<tokio::sync::Notify> {
        let mut waiters = self.waiters.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        waiters.entry(run_id.to_string()).or_default().clone()
    }

    /// Done waiting: the last waiter of a run takes its notifier away.
    pub(crate) fn release_waiter(&self, run_id: &str, notify: Arc<tokio::sync::Notify>) {
        let mut waiters = self.waiters.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // The map's and this one: nobody else waits.
        if Arc::strong_count(&notify) <= 2 {
            waiters.remove(run_id);
        }
    }

    /// The run as stored once it ended, or as it is at `until`. News of this
    /// router wakes it at once; a run advanced elsewhere is read again every
    /// [`crate::POLL`].
    pub async fn wait(&self, run_id: &str, until: tokio::time::Instant) -> Result<StoredRun, RouterError> {
        let notify = self.waiter(run_id);
        let outcome = loop {
            // Listening before reading: news between the two is not lost.
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let stored = match self.store().run(run_id).await {
                Ok(stored) => stored,
                Err(error) => break Err(run_error(error)),
            };
            let now = tokio::time::Instant::now();
            if stored.state.is_terminal() || now >= until {
                break Ok(stored);
            }
            let _ = tokio::time::timeout((until - now).min(crate::POLL), notified).await;
        };
        self.release_waiter(run_id, notify);
        outcome
    }
}

/// A store failure reading a run: an unknown run is `RUN_NOT_FOUND`.
pub fn run_error(error: TaskStoreError) -> RouterError {
    match error {
        TaskStoreError::NotFound(run_id) => {
            RouterError::new(Code::RunNotFound, format!("no run `{run_id}` (or it expired)"))
        }
        other => store_error(other),
    }
}

/// A step's call record as its task ended (`state`, `result`): what its run's
/// entry says of it.
/// What one pass of the planner decided ([`Engine::decide`]), to write at once.
struct Decided {
    /// The entries to write: the steps' outcomes given, then the decisions.
    entries: Vec<RunEntry>,
    /// The calls to submit (each task, the id it is submitted as) and
    /// where each one's entry is among `entries`.
    calls: Vec<(NewTask, String)>,
    placed: Vec<usize>,
    /// When the run is due for a look by any router next.
    wake: u64,
    /// The retries' backoffs this router wakes the run for.
    wakes: Vec<u64>,
    /// The calls the run no longer needs.
    cancels: Vec<String>,
    /// The run's end, when this pass ends it.
    end: Option<End>,
}

fn ended_record(task: &agent_reach_task_store::Task, attempt: u32, state: State, result: &Value) -> ItemRecord {
    ItemRecord {
        attempt,
        status: ItemStatus::Submitted,
        task_id: task.task_id.clone(),
        submitted_at_ms: task.created_at_ms,
        finished_at_ms: None,
        agent_id: None,
        capability_version: None,
        output: None,
        error: None,
    }
    .ended(state, Some(result), now_ms())
}

/// A step's end carried by the advance its end starts ([`Engine::end_step`]):
/// written in that advance's script, or, on the paths that cannot carry it,
/// on its own before the run is written.
struct Carried<'a> {
    end: StepEnd<'a>,
    /// How it ended, once it was written (`None`: not yet).
    ended: Option<Result<State, TaskStoreError>>,
}

impl Carried<'_> {
    /// Ends the step on its own unless it ended already.
    async fn end_alone(&mut self, store: &agent_reach_task_store::TaskStore) {
        if self.ended.is_none() {
            self.ended = Some(store.finish(self.end.claimed, self.end.state, self.end.result).await);
        }
    }

    /// How the step ended (ended on its own now if it was not yet).
    async fn ended(mut self, store: &agent_reach_task_store::TaskStore) -> Result<State, TaskStoreError> {
        self.end_alone(store).await;
        self.ended
            .unwrap_or_else(|| Err(TaskStoreError::Corrupt("a step's end was not written".to_string())))
    }
}

/// The run's slot in `advancing` that [`Engine::end_step`] took, given back
/// if its future is dropped before its advances ran (the advance loop gives
/// it back itself): the run is then advanced afresh, its calls' outcomes read
/// from their tasks, so no news that came meanwhile waits for the sweep.
struct Slot {
    engine: Arc<Engine>,
    run_id: String,
    /// The slot is still this future's to give back.
    held: bool,
}

impl Slot {
    /// The advance loop gave the slot back itself.
    fn given_back(&mut self) {
        self.held = false;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        self.engine
            .advancing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&self.run_id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (engine, run_id) = (self.engine.clone(), std::mem::take(&mut self.run_id));
            runtime.spawn(async move { engine.advance(&run_id, true).await });
        }
    }
}
