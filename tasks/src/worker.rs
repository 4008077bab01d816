//! The worker: claims queued tasks and delivers each through the router's
//! one admission and attempt loop, `workers` at a time (or through its tag's
//! gate), records the outcome, completes broadcast parents, and reclaims the
//! tasks of routers that died. While a delivery runs (or waits at a gate, or
//! waits for an accepted task's report) its claim is kept fresh, so only a
//! dead router's tasks are ever reclaimed, however long they run.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use agent_reach_access::Caller;
use agent_reach_proto::envelope::{ResultEnvelope, ResultStatus, ENVELOPE_VERSION};
use agent_reach_task_store::{Accepted, Claimed, Role, State, Task, TaskStoreError, Turn};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::TaskService;
use agent_reach_pipeline::call::Call;
use agent_reach_pipeline::envelope;
use agent_reach_pipeline::error::{Code, RouterError};
use agent_reach_pipeline::outcome::{input_required, Failure};
use agent_reach_pipeline::RouterService;

/// Claims queued tasks and delivers them, `workers` at a time, until the
/// router is dropped; reclaims tasks of routers that died.
pub(super) async fn run(service: Weak<RouterService>, tasks: Arc<TaskService>) {
    let consumer = format!("router-{:016x}", rand::random::<u64>());
    let slots = Arc::new(Semaphore::new(tasks.settings.workers.max(1)));
    let mut round = 0u64;
    let mut last_reclaim = Instant::now();
    let mut last_gauges = Instant::now();
    let mut last_resume = Instant::now();
    let mut prepared = false;
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(service) = service.upgrade() else { return };
        // No delivery before the first routing snapshot: a router that just
        // started would otherwise fail tasks for capabilities it cannot see yet.
        if !service.is_synced() {
            drop(service);
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        if !prepared {
            match tasks.store.prepare().await {
                Ok(()) => prepared = true,
                Err(error) => {
                    tracing::warn!(message = "Task store unavailable; retrying.", %error);
                    drop(service);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
        }
        if last_gauges.elapsed() >= Duration::from_secs(2) {
            last_gauges = Instant::now();
            tasks.refresh_gauges().await;
        }
        // Paused tasks due again go back to their queues (any router does it, once).
        if last_resume.elapsed() >= Duration::from_millis(50) {
            last_resume = Instant::now();
            if let Err(error) = tasks.store.resume_due(64).await {
                tracing::debug!(message = "Cannot queue paused tasks again; retrying.", %error);
            }
        }
        // Bound what waits in memory at tag gates (it stays durable in Redis meanwhile).
        if tasks.gated.load(Ordering::Acquire) >= tasks.settings.workers.max(1) * 4 {
            drop(service);
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let free = slots.available_permits();
        if free == 0 {
            drop(service);
            // Wait for a delivery to finish.
            if let Ok(permit) = slots.clone().acquire_owned().await {
                drop(permit);
            }
            continue;
        }
        let claimed = if last_reclaim.elapsed() >= tasks.settings.reclaim_after / 2 {
            last_reclaim = Instant::now();
            tasks.store.reclaim(&consumer, tasks.settings.reclaim_after, free).await
        } else {
            round += 1;
            tasks.store.claim(&consumer, free, round).await
        };
        match claimed {
            Ok(claimed) if claimed.is_empty() => {
                drop(service);
                // Idle: poll again shortly, or at once when a task is submitted here.
                let _ = tokio::time::timeout(Duration::from_millis(10), tasks.submitted.notified()).await;
            }
            Ok(claimed) => {
                backoff = Duration::from_millis(100);
                for task in claimed {
                    if let Some(gate) = tasks.gate_for(&service, &task.task.capability) {
                        // Limited by its tag's gate, not by the general slots: it waits
                        // (still pending, still in the stream's pending list) without
                        // holding back other capabilities.
                        let (service, tasks) = (service.clone(), tasks.clone());
                        tasks.gated.fetch_add(1, Ordering::AcqRel);
                        tokio::spawn(async move {
                            // Waiting at the gate holds the claim as a delivery does.
                            let pass = keeping_claim(&tasks, &task, gate.enter(task.task.priority)).await;
                            deliver(&service, &tasks, task).await;
                            drop(pass);
                            tasks.gated.fetch_sub(1, Ordering::AcqRel);
                        });
                        continue;
                    }
                    let Ok(permit) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    let (service, tasks) = (service.clone(), tasks.clone());
                    tokio::spawn(async move {
                        deliver(&service, &tasks, task).await;
                        drop(permit);
                    });
                }
            }
            Err(error) => {
                tracing::warn!(message = "Claiming tasks failed; retrying.", %error);
                // A Redis that restarted empty has lost the consumer groups too.
                prepared = false;
                drop(service);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// How often a waiting delivery looks for the agent's report.
const REPORT_POLL: Duration = Duration::from_millis(200);

/// Runs `work` while refreshing `claimed`'s claim every third of the reclaim
/// window, so no router (this one included) takes it over while it runs. When
/// this router dies the refreshes stop and the entry is reclaimed as before.
async fn keeping_claim<F: Future>(tasks: &TaskService, claimed: &Claimed, work: F) -> F::Output {
    let every = (tasks.settings.reclaim_after / 3).max(Duration::from_millis(10));
    let mut refresh = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(work);
    loop {
        tokio::select! {
            output = &mut work => return output,
            _ = refresh.tick() => match tasks.store.extend_claim(claimed).await {
                Ok(true) => {}
                Ok(false) => tracing::warn!(
                    message = "A running delivery's claim was taken over; it may run twice.",
                    task_id = %claimed.task.task_id
                ),
                Err(error) => tracing::warn!(
                    message = "Cannot refresh a running delivery's claim; retrying.",
                    task_id = %claimed.task.task_id, %error
                ),
            },
        }
    }
}

#[tracing::instrument(name = "tasks.deliver", skip_all, fields(task_id = %claimed.task.task_id))]
async fn deliver(service: &RouterService, tasks: &Arc<TaskService>, claimed: Claimed) {
    // Taken over from a router that died while its agent worked on it: not
    // delivered again, the report is still awaited.
    if let Some(accepted) = claimed.task.accepted.clone() {
        await_report_off_slot(tasks, claimed, accepted).await;
        return;
    }
    let delivered = keeping_claim(tasks, &claimed, deliver_once(service, tasks, &claimed)).await;
    if let Some(accepted) = delivered {
        await_report_off_slot(tasks, claimed, accepted).await;
    }
}

/// Waits for an accepted task's report outside the delivery slots when there
/// is room (the agent holds no connection of ours), else in its slot.
async fn await_report_off_slot(tasks: &Arc<TaskService>, claimed: Claimed, accepted: Accepted) {
    match tasks.awaiting.clone().try_acquire_owned() {
        Ok(permit) => {
            let tasks = tasks.clone();
            tokio::spawn(async move {
                keeping_claim(&tasks, &claimed, await_report(&tasks, &claimed, &accepted)).await;
                drop(permit);
            });
        }
        Err(_) => keeping_claim(tasks, &claimed, await_report(tasks, &claimed, &accepted)).await,
    }
}

/// An accepted task ends by its agent's report (on any router), by a cancel,
/// or here at its deadline with `DEADLINE_EXCEEDED`.
async fn await_report(tasks: &TaskService, claimed: &Claimed, accepted: &Accepted) {
    let task_id = &claimed.task.task_id;
    loop {
        match tasks.store.get(task_id).await {
            Ok(task) if task.state.is_terminal() => {
                // Reported (or canceled): release the queue entry if the report did not.
                let _ = tasks.store.finish(claimed, task.state, &Value::Null).await;
                return;
            }
            Ok(_) => {}
            // Expired meanwhile: nothing left to wait for.
            Err(TaskStoreError::NotFound(_)) => return,
            Err(error) => tracing::warn!(message = "Cannot read an accepted task; retrying.", %task_id, %error),
        }
        let now = agent_reach_task_store::store::now_ms();
        if now >= accepted.deadline_ms {
            let error = RouterError::new(
                Code::DeadlineExceeded,
                format!(
                    "agent `{}` accepted the task (202) but reported no result before its deadline",
                    accepted.agent_id
                ),
            )
            .with_details(json!({ "reason": "result_not_reported", "agent_id": accepted.agent_id }));
            let result = ResultEnvelope {
                version: ENVELOPE_VERSION.to_string(),
                request_id: claimed.task.request_id.clone(),
                status: ResultStatus::Failed,
                capability: Some(claimed.task.capability.clone()),
                capability_version: Some(accepted.capability_version.clone()),
                agent_id: Some(accepted.agent_id.clone()),
                attempts: claimed.task.attempts.max(1),
                duration_ms: now.saturating_sub(accepted.at_ms),
                output: None,
                error: Some(error.envelope_error()),
                budget: None,
            };
            let result = serde_json::to_value(&result).unwrap_or(Value::Null);
            match tasks.store.finish(claimed, State::Failed, &result).await {
                Ok(_) => {
                    tasks
                        .metrics
                        .finished
                        .with_label_values(&[State::Failed.as_str()])
                        .inc();
                    tasks.ended(&claimed.task, State::Failed, &result);
                    if let Some(parent) = &claimed.task.parent {
                        complete_parent(tasks, parent).await;
                    }
                    return;
                }
                // Reported at the last moment: the report stands.
                Err(TaskStoreError::Refused { .. }) => return,
                Err(error) => {
                    tracing::warn!(message = "Cannot fail an overdue accepted task; retrying.", %task_id, %error)
                }
            }
        }
        let left = Duration::from_millis(accepted.deadline_ms.saturating_sub(now));
        tokio::time::sleep(REPORT_POLL.min(left.max(Duration::from_millis(1)))).await;
    }
}

/// Delivers a task through the attempt loop and records its outcome; an
/// agent's `202` leaves it running and returns what to wait for.
async fn deliver_once(service: &RouterService, tasks: &TaskService, claimed: &Claimed) -> Option<Accepted> {
    let task = &claimed.task;
    let caller = match task.caller.as_str() {
        "anonymous" => Caller::Unauthenticated,
        // The submitter was verified in this router's tenant, the store's.
        name => Caller::in_tenant(name, tasks.store.tenant()),
    };
    let mut attempts = 0u32;
    let mut running_since_ms;
    // Listed while it runs: a more urgent delivery may ask it to pause (DESIGN §9).
    let _listed = tasks.deliveries.enter(task, &caller);
    let mut preemptions = 0u32;
    let result = loop {
        // The caller's limits: a delivery waits for a place among its calls in flight
        // (its submission already spent a token).
        let _permit = service.admission().enter_delivery(&caller).await;
        // A reclaimed task (its router died) or a retried one passes through `retrying`.
        if attempts > 0 || claimed.task.state != State::Pending {
            let _ = tasks.store.transition(&task.task_id, State::Retrying).await;
        }
        running_since_ms = agent_reach_task_store::store::now_ms();
        match tasks.store.transition(&task.task_id, State::Running).await {
            Ok(_) => {}
            Err(error @ (TaskStoreError::Refused { .. } | TaskStoreError::NotFound(_))) => {
                // Canceled meanwhile: record nothing new, release the queue entry.
                tracing::info!(message = "Task not delivered.", task_id = %task.task_id, %error);
                let _ = tasks.store.finish(claimed, State::Canceled, &Value::Null).await;
                return None;
            }
            Err(error) => {
                // Redis did not answer (the move may have been written or not):
                // never take that for a cancel. The entry stays claimed and
                // unacknowledged, so it is reclaimed and delivered after
                // `--task-reclaim-after-s` (found by the chaos run: a task
                // accepted with 202 ended `canceled` with no result).
                tracing::warn!(message = "Task delivery postponed: the task store did not answer; it will be reclaimed.", task_id = %task.task_id, %error);
                return None;
            }
        }
        attempts += 1;
        let started = Instant::now();
        let outcome = match envelope::parse(task.envelope.to_string().as_bytes()).and_then(envelope::check) {
            Ok(mut checked) => {
                // The agent may answer 202 and report under this id (DESIGN §8).
                checked.task_id = Some(task.task_id.clone());
                checked.request.request_id = Some(task.request_id.clone());
                // A workflow's step: its hop assertion says which run (DESIGN §9).
                checked.run_id.clone_from(&task.run);
                // A paused task resumes from its handler's checkpoint (DESIGN §9).
                checked.checkpoint.clone_from(&task.checkpoint);
                // A multi-turn task's next turn: the latest answer, the conversation so far.
                if let Some(next) = next_turn(task) {
                    checked.request.payload = next.payload;
                    checked.request.request_id = Some(next.request_id);
                    checked.history = Some(next.history);
                }
                let call = Call::delivery(caller.clone(), checked);
                match &task.target_agent {
                    // A broadcast child: its one instance, or nothing.
                    Some(agent_id) => match service.broadcast(&call, Some(agent_id)).await {
                        Ok(mut outcomes) => outcomes.pop().map(|(_, outcome)| outcome).unwrap_or_else(|| {
                            Err(RouterError::new(Code::NoAvailableInstance, format!("`{agent_id}` is gone")).into())
                        }),
                        Err(failure) => Err(failure),
                    },
                    None => service.invoke(&call).await,
                }
            }
            Err(error) => Err(error.into()),
        };
        // Task results are stored as JSON values (rare outputs a value cannot hold fail the task).
        let outcome = outcome.and_then(|success| match success.output_value() {
            Ok(output) => Ok((success, output)),
            Err(error) => Err(Failure {
                error,
                capability_version: Some(success.capability_version),
                agent_id: Some(success.agent_id),
                attempts: success.attempts,
            }),
        });
        match outcome {
            Ok((success, _)) if success.paused.is_some() => {
                let checkpoint = success
                    .paused
                    .and_then(|paused| paused.checkpoint)
                    .map_or_else(|| "null".to_string(), |raw| raw.get().to_string());
                repause(tasks, claimed, &checkpoint, crate::preempt::RESUME_AFTER, "preempted").await;
                return None;
            }
            Ok((success, _)) if success.accepted.is_some() => {
                let Some(accepted) = success.accepted else {
                    return None; // matched just above
                };
                let accepted = Accepted {
                    agent_id: success.agent_id,
                    agent_name: accepted.agent_name,
                    capability_version: success.capability_version,
                    at_ms: agent_reach_task_store::store::now_ms(),
                    deadline_ms: accepted.deadline_ms,
                };
                return match tasks.store.accept(claimed, &accepted).await {
                    Ok(()) => Some(accepted),
                    Err(TaskStoreError::Refused { current, .. }) => {
                        // Canceled meanwhile: the report will be refused; release the entry.
                        tracing::info!(message = "Accepted task ended meanwhile.", task_id = %task.task_id, state = %current);
                        let _ = tasks.store.finish(claimed, State::Canceled, &Value::Null).await;
                        None
                    }
                    Err(error) => {
                        // Not recorded: the entry stays pending, its claim lapses and the
                        // task is delivered again (agents dedup by request_id).
                        tracing::warn!(message = "Accepted delivery not recorded; it will be reclaimed.", task_id = %task.task_id, %error);
                        None
                    }
                };
            }
            Ok((success, output)) => {
                break ResultEnvelope {
                    version: ENVELOPE_VERSION.to_string(),
                    request_id: task.request_id.clone(),
                    status: ResultStatus::Succeeded,
                    capability: Some(task.capability.clone()),
                    capability_version: Some(success.capability_version),
                    agent_id: Some(success.agent_id),
                    attempts: success.attempts,
                    duration_ms: started.elapsed().as_millis() as u64,
                    output: Some(output),
                    error: None,
                    budget: None,
                }
            }
            // A workflow's step cannot be asked a question (nobody converses
            // with a run's steps): it fails with `INPUT_REQUIRED` below, and
            // its step's `on_failure` decides (docs/design.md §3.14).
            Err(failure) if input_required(&failure.error).is_some() && task.run.is_none() => {
                let question = Turn::agent(
                    agent_reach_pipeline::trace::new_request_id(),
                    input_required(&failure.error).unwrap_or_default(),
                );
                ask_for_input(tasks, claimed, &question).await;
                return None;
            }
            Err(failure) => {
                if crate::preempt::is_no_room(failure.error.code) {
                    // A more urgent delivery than some running here: room is asked for.
                    if preemptions < crate::preempt::MAX_PREEMPTIONS && tasks.deliveries.make_room(service, task).await
                    {
                        preemptions += 1;
                        attempts -= 1;
                        continue;
                    }
                    // A resumed task that finds no room yet: paused again, never failed for it.
                    if let Some(checkpoint) = &task.checkpoint {
                        let wait = crate::preempt::resume_after(task);
                        repause(tasks, claimed, &checkpoint.to_string(), wait, "no_room").await;
                        return None;
                    }
                }
                let retry = failure.error.code.is_retryable()
                    && failure.error.code != Code::DeadlineExceeded
                    && attempts < tasks.settings.max_task_attempts;
                if retry {
                    tokio::time::sleep(Duration::from_millis(200 * 2u64.pow(attempts))).await;
                    continue;
                }
                break ResultEnvelope {
                    version: ENVELOPE_VERSION.to_string(),
                    request_id: task.request_id.clone(),
                    status: ResultStatus::Failed,
                    capability: Some(task.capability.clone()),
                    capability_version: failure.capability_version,
                    agent_id: failure.agent_id,
                    attempts: failure.attempts,
                    duration_ms: started.elapsed().as_millis() as u64,
                    output: None,
                    error: Some(failure.error.envelope_error()),
                    budget: None,
                };
            }
        }
    };
    let state = match result.status {
        ResultStatus::Succeeded => State::Succeeded,
        ResultStatus::Failed => State::Failed,
    };
    let result = serde_json::to_value(&result).unwrap_or(Value::Null);
    // A workflow's step ends with the advance of its run it starts (one
    // script where the store allows it); any other task ends on its own.
    let (recorded, told) = match tasks.end_step(claimed, state, &result) {
        Some(ending) => (ending.await, true),
        None => (tasks.store.finish(claimed, state, &result).await, false),
    };
    match recorded {
        Ok(_) => {
            tasks.metrics.finished.with_label_values(&[state.as_str()]).inc();
            if let Some(parent) = &task.parent {
                complete_parent(tasks, parent).await;
            }
            if !told {
                tasks.ended(task, state, &result);
            }
        }
        Err(TaskStoreError::Refused { current, .. }) => {
            tracing::info!(message = "Task ended elsewhere; result dropped.", task_id = %task.task_id, state = %current);
            return None;
        }
        Err(error) => {
            // Not acknowledged: another router reclaims and delivers it again
            // (agents dedup by request_id).
            tracing::warn!(message = "Recording a task outcome failed; it will be reclaimed.", task_id = %task.task_id, %error);
            return None;
        }
    }
    // Time in each state, from what this delivery saw (no extra read).
    let ended_ms = agent_reach_task_store::store::now_ms();
    if let Some(queued) = task.transitions.last() {
        let waited = running_since_ms.saturating_sub(queued.at_ms) as f64 / 1000.0;
        tasks
            .metrics
            .state_seconds
            .with_label_values(&[queued.state.as_str()])
            .observe(waited);
    }
    let ran = ended_ms.saturating_sub(running_since_ms) as f64 / 1000.0;
    tasks
        .metrics
        .state_seconds
        .with_label_values(&[State::Running.as_str()])
        .observe(ran);
    // A callback, if any, was scheduled durably with the outcome; `run_callbacks` sends it.
    None
}

/// Pauses a claimed task with `checkpoint` (JSON), to be queued again after `wait`.
async fn repause(tasks: &TaskService, claimed: &Claimed, checkpoint: &str, wait: Duration, reason: &str) {
    let due = agent_reach_task_store::store::now_ms() + u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    match tasks.store.pause(claimed, checkpoint, due).await {
        Ok(()) => {
            tasks
                .metrics
                .paused
                .with_label_values(&[&claimed.task.capability, reason])
                .inc();
            tracing::info!(message = "Task paused.", task_id = %claimed.task.task_id, reason);
        }
        Err(TaskStoreError::Refused { current, .. }) => {
            tracing::info!(message = "Task ended meanwhile; not paused.", task_id = %claimed.task.task_id, state = %current);
        }
        // Not recorded: the entry stays pending and the task is reclaimed (its checkpoint is lost).
        Err(error) => {
            tracing::warn!(message = "A paused task could not be recorded; it will be reclaimed.", task_id = %claimed.task.task_id, %error)
        }
    }
}

/// The agent asked for more input: the task waits in `input_required` (its
/// queue entry acknowledged) until a message continues it.
async fn ask_for_input(tasks: &TaskService, claimed: &Claimed, question: &Turn) {
    let task_id = &claimed.task.task_id;
    match tasks.store.ask_for_input(claimed, question).await {
        // Not an end: `agent_reach_tasks_finished_total` counts it when it ends.
        Ok(_) => {}
        // Canceled meanwhile: the entry is acknowledged, the cancel stands.
        Err(error @ (TaskStoreError::Refused { .. } | TaskStoreError::NotFound(_))) => {
            tracing::info!(message = "Task ended before its agent asked for input.", %task_id, %error)
        }
        // Not recorded: the entry stays claimed and is delivered again once
        // reclaimed (the agent asks again: agents dedup by request_id).
        Err(error) => {
            tracing::warn!(message = "A task asking for input not recorded; it will be reclaimed.", %task_id, %error)
        }
    }
}

/// What a multi-turn task's next delivery carries instead of the envelope's.
struct NextTurn {
    payload: Value,
    request_id: String,
    history: Value,
}

/// The delivery of a task continued by a message (its last turn the
/// caller's): that turn's payload under a request id of its own (the task's
/// with the turn's number: an agent deduplicating by request id answers each
/// turn afresh, a delivery of the same turn again alike), and the
/// conversation before it, oldest first (docs/design.md, "Multi-turn tasks").
/// `None` for a task's first turn.
fn next_turn(task: &Task) -> Option<NextTurn> {
    let (last, before) = task.turns.split_last()?;
    if last.role != Role::User {
        return None;
    }
    let answers = task.turns.iter().filter(|turn| turn.role == Role::User).count();
    let first = json!({ "role": "user", "payload": task.envelope.get("payload").cloned().unwrap_or(Value::Null) });
    let history = std::iter::once(first)
        .chain(before.iter().map(|turn| match turn.role {
            Role::User => json!({ "role": "user", "payload": turn.payload }),
            Role::Agent => json!({ "role": "agent", "message": turn.message }),
        }))
        .collect();
    Some(NextTurn {
        payload: last.payload.clone().unwrap_or(Value::Null),
        request_id: format!("{}.{answers}", task.request_id),
        history: Value::Array(history),
    })
}

pub(super) async fn complete_parent(tasks: &TaskService, parent_id: &str) {
    let Ok(parent) = tasks.store.get(parent_id).await else {
        return;
    };
    if parent.state.is_terminal() {
        return;
    }
    let mut outcomes = Vec::new();
    for agent_id in &parent.children {
        let request_id = format!("{}@{agent_id}", parent.request_id);
        let Ok(Some(child_id)) = tasks.store.find(&parent.caller, &request_id).await else {
            return;
        };
        let Ok(child) = tasks.store.get(&child_id).await else {
            return;
        };
        if !child.state.is_terminal() {
            return; // not all done yet; the last child to end completes the parent
        }
        outcomes.push(json!({
            "agent_id": agent_id, "task_id": child.task_id, "status": child.state.as_str(), "result": child.result
        }));
    }
    let result = json!({
        "version": ENVELOPE_VERSION,
        "request_id": parent.request_id,
        "status": "succeeded",
        "capability": parent.capability,
        "attempts": 1,
        "duration_ms": agent_reach_task_store::store::now_ms().saturating_sub(parent.created_at_ms),
        "output": { "outcomes": outcomes },
    });
    // Two children ending at once may both get here: the second is refused, harmlessly.
    if tasks.store.complete(parent_id, State::Succeeded, &result).await.is_ok() {
        tasks
            .metrics
            .finished
            .with_label_values(&[State::Succeeded.as_str()])
            .inc();
    }
}
