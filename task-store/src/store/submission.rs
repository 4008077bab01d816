//! Submission (see the module notes): the request id claimed for the task,
//! then the task stored and queued in its lane (one script on one server);
//! and the queues' consumer groups, made again for a Redis that lost them.

use redis::AsyncCommands;

use super::connection::Connection;
use super::parts::{invoke, Part};
use super::record::Spec;
use super::runs::{FirstAdvance, RunStarted};
use super::{
    lane_of, now_ms, unavailable, NewTask, Submitted, TaskStore, TaskStoreError, CALLER_INDEX_MAX, GROUP, LANES,
};

/// What a submission's store step needs beyond the spec.
#[derive(Clone)]
struct StoreStep<'a> {
    request_key: &'a str,
    /// The backlog field, `capability|priority`.
    field: &'a str,
    /// Stored without queueing (a broadcast parent).
    hold: bool,
    bound: Option<u64>,
    /// The task's first A2A push config: (id, the config's JSON).
    push: Option<(String, String)>,
    /// The task is a run's held task: the run's spec and grace, the run
    /// created in the same script as the task is stored (`START_RUN`).
    run: Option<(&'a str, u64)>,
    /// The run's first advance, written with its start when the run is
    /// created (one server; the run's id is the task id it was planned for).
    first: Option<FirstAdvance<'a>>,
}

/// A store step's answer: SUBMIT's code and task id (or waiting count, or
/// holder), and for a run's held task whether the run was created then and
/// whether its first advance was written with it.
type Stored = ((i64, String), Option<(bool, bool)>);

impl TaskStore {
    /// Recreates the consumer group of every queue the lanes list (a Redis
    /// that lost them); the groups are otherwise made with each queue, by
    /// its first submission. Idempotent.
    pub async fn prepare(&self) -> Result<(), TaskStoreError> {
        let connection = self.connection().await?;
        let prepared = (0..LANES).map(|lane| {
            let mut connection = connection.clone();
            async move {
                self.scripts
                    .prepare
                    .key(self.queues_key(lane))
                    .arg(GROUP)
                    .invoke_async::<i64>(&mut connection)
                    .await
                    .map_err(unavailable)
            }
        });
        for outcome in futures::future::join_all(prepared).await {
            outcome?;
        }
        Ok(())
    }

    /// Stores the task and queues it; a repeated request id from the same
    /// caller returns the existing task instead.
    pub async fn submit(&self, task: NewTask) -> Result<Submitted, TaskStoreError> {
        let task_id = self.task_id_for(&task.capability);
        self.submit_with_id(task, &task_id).await
    }

    /// [`TaskStore::submit`] under a task id chosen by the caller (the
    /// router's local buffer gives ids out before Redis has the task).
    pub async fn submit_with_id(&self, task: NewTask, task_id: &str) -> Result<Submitted, TaskStoreError> {
        self.submit_within(task, task_id, None).await
    }

    /// [`TaskStore::submit_with_id`], refused with [`TaskStoreError::BacklogFull`]
    /// when `backlog_bound` tasks or more wait already (a tenant's quota). On
    /// one server the count and the submission are one script, so a flood
    /// cannot overshoot it; on a cluster the other lanes' waiting tasks are
    /// counted just before, so concurrent submissions may overshoot it by as
    /// many as are in flight at once.
    pub async fn submit_within(
        &self,
        task: NewTask,
        task_id: &str,
        backlog_bound: Option<u64>,
    ) -> Result<Submitted, TaskStoreError> {
        self.submit_inner(task, task_id, backlog_bound, None, None)
            .await
            .map(|(submitted, _)| submitted)
    }

    /// Submits a run's held task (`task`, `hold` set) and creates its run
    /// with `spec`, due for a look by any router after `grace_ms`, in the
    /// same script (docs/design.md §3.14.4): answers the submission and
    /// whether the run was created by it (`false`: it existed, a repeat).
    pub async fn submit_run(
        &self,
        task: NewTask,
        spec: &str,
        grace_ms: u64,
    ) -> Result<(Submitted, bool), TaskStoreError> {
        let task_id = self.task_id_for(&task.capability);
        let started = self.start_run(task, &task_id, (spec, grace_ms), None).await?;
        Ok((started.submitted, started.created))
    }

    /// [`Self::submit_run`] as `run_id`, with the run's `first` advance
    /// (planned for that id) in the same script when the run is created
    /// by it, on one server that does not wait for replicas
    /// ([`Self::folds_steps`]; docs/design.md §3.14.4): its calls
    /// submitted, its entries written, the run and its held task moved to
    /// `running`, the run due at the advance's time. Anywhere else, or when
    /// the advance stops (a call's request id names another task), the run
    /// is left `pending` (`advanced: false`) for the caller to advance.
    pub async fn start_run(
        &self,
        task: NewTask,
        run_id: &str,
        (spec, grace_ms): (&str, u64),
        first: Option<FirstAdvance<'_>>,
    ) -> Result<RunStarted, TaskStoreError> {
        let first = first.filter(|_| self.folds_steps());
        let (submitted, run) = self
            .submit_inner(task, run_id, None, Some((spec, grace_ms)), first)
            .await?;
        let (created, advanced) = run.unwrap_or((false, false));
        if created && self.is_cluster() {
            let connection = self.connection().await?;
            self.index_run(&connection, submitted.task_id()).await;
        }
        Ok(RunStarted {
            submitted,
            created,
            advanced,
        })
    }

    /// `SUBMIT`'s keys and arguments for a plain `task` (no bound, no push
    /// config, queued) submitted as `task_id` on one server, the whole
    /// submission in it; with its lane and backlog field (for
    /// [`Self::note_queued`]).
    pub(super) fn one_server_part(
        &self,
        task: &NewTask,
        task_id: &str,
    ) -> Result<(Part, usize, String), TaskStoreError> {
        let spec = spec_of(task.clone(), task_id);
        let request_key = self.request_key(&task.caller, &task.request_id);
        let field = format!("{}|{}", spec.capability, spec.priority.as_str());
        let step = StoreStep {
            request_key: &request_key,
            field: &field,
            hold: task.hold,
            bound: None,
            push: None,
            run: None,
            first: None,
        };
        let spec_json = self.spec_json(&spec, task_id)?;
        let part = self.store_part(task_id, &spec_json, &spec, &step, 0, true);
        Ok((part, lane_of(task_id), field))
    }

    async fn submit_inner(
        &self,
        mut task: NewTask,
        task_id: &str,
        backlog_bound: Option<u64>,
        run: Option<(&str, u64)>,
        first: Option<FirstAdvance<'_>>,
    ) -> Result<(Submitted, Option<(bool, bool)>), TaskStoreError> {
        let (hold, push_config) = (task.hold, task.push_config.take());
        let spec = spec_of(task, task_id);
        let connection = self.connection().await?;
        let request_key = self.request_key(&spec.caller, &spec.request_id);
        let field = format!("{}|{}", spec.capability, spec.priority.as_str());
        let push = match &push_config {
            Some(config) => Some((
                config.a2a.as_ref().map(|push| push.id.clone()).unwrap_or_default(),
                serde_json::to_string(config).map_err(|error| TaskStoreError::Corrupt(error.to_string()))?,
            )),
            None => None,
        };
        let step = StoreStep {
            request_key: &request_key,
            field: &field,
            hold,
            bound: backlog_bound,
            push,
            run,
            first,
        };
        let (own, id, ((code, answer), created)) = if self.is_cluster() {
            self.submit_in_two_steps(&connection, &spec, &step).await?
        } else {
            self.submit_at_once(&connection, &spec, &step).await?
        };
        let lane = lane_of(&id);
        let task_key = self.task_key(&id);
        if code == 2 {
            // (One server: refused before anything was written.)
            if own && self.is_cluster() {
                // Refused: the request id is free again, as if never submitted
                // (two keys, two slots: each alone).
                let release = async {
                    let mut connection = connection.clone();
                    self.scripts
                        .release_request
                        .key(&request_key)
                        .arg(&id)
                        .invoke_async::<i64>(&mut connection)
                        .await
                };
                let unlist = async {
                    let mut connection = connection.clone();
                    connection
                        .zrem::<_, _, i64>(self.caller_index_key(&spec.caller), &id)
                        .await
                };
                let (released, unlisted) = tokio::join!(release, unlist);
                if let Err(error) = released.and(unlisted) {
                    tracing::warn!(message = "Cannot free a refused submission's request id.", %error, task_id = %id);
                }
            }
            return Err(TaskStoreError::BacklogFull {
                waiting: answer.parse().unwrap_or(0),
                bound: backlog_bound.unwrap_or(0),
            });
        }
        if code == 1 && !hold {
            self.note_queued(lane, &field);
        }
        // A repeat that found its task stored (the request id names another
        // task, code 0 there) wrote nothing: nothing of its own to wait for
        // (the task is as durable as its first submission made it). Waiting
        // for its replicas anyway answered a repeat sent while a replica
        // lagged as an outage, which the router's buffer then took under a
        // fresh id (202, an alias of the stored task once replayed) instead
        // of the stored task being answered (200, its id).
        let wrote = own || code != 0;
        if let Some(wait) = self.wait.filter(|_| wrote) {
            self.wait_replicated(&connection, &request_key, &task_key, wait).await?;
        }
        // Own: the request id names this submission's task id, stored now or by
        // an earlier attempt of this same submission (a retried write, the
        // buffer's replay): for its caller, the one creation.
        let submitted = if own {
            Submitted::Created(id)
        } else {
            Submitted::Existing(id)
        };
        Ok((submitted, created))
    }

    /// A cluster's submission: `SET … NX GET` claims the request id (for a
    /// bound, the other lanes' waiting tasks are counted meanwhile), then
    /// the task it names is stored in its lane beside the caller's index.
    /// Returns (whether this submission claimed it, the task id, the store
    /// step's answer).
    async fn submit_in_two_steps(
        &self,
        connection: &Connection,
        spec: &Spec,
        step: &StoreStep<'_>,
    ) -> Result<(bool, String, Stored), TaskStoreError> {
        let claim = async {
            let mut connection = connection.clone();
            self.claim_request(step.request_key, &spec.task_id)
                .query_async::<Option<String>>(&mut connection)
                .await
                .map_err(unavailable)
        };
        let waiting = async {
            match step.bound {
                Some(_) => self.waiting_per_lane().await.map(Some),
                None => Ok(None),
            }
        };
        let (holder, waiting) = tokio::join!(claim, waiting);
        let (holder, waiting) = (holder?, waiting?);
        let own = holder.as_deref().is_none_or(|holder| holder == spec.task_id);
        let id = holder.unwrap_or_else(|| spec.task_id.clone());
        let lane = lane_of(&id);
        let elsewhere: i64 = waiting.map_or(0, |counts| {
            counts
                .iter()
                .enumerate()
                .filter(|(other, _)| *other != lane)
                .map(|(_, count)| *count)
                .sum()
        });
        let store = async {
            let spec_json = self.spec_json(spec, &id)?;
            let part = self.store_part(&id, &spec_json, spec, step, elsewhere, false);
            self.store(connection, (&id, part), step, false).await
        };
        // The caller's index, beside it, for a task this submission created.
        let index = async {
            if !own {
                return Ok(());
            }
            let mut connection = connection.clone();
            self.index_invocation(spec, &id)
                .invoke_async::<i64>(&mut connection)
                .await
                .map(drop)
                .map_err(unavailable)
        };
        let (stored, indexed) = tokio::join!(store, index);
        let stored = stored?;
        indexed?;
        Ok((own, id, stored))
    }

    /// One server's submission: one script claims the request id, stores
    /// and queues the task and indexes it; when another task holds the
    /// request id, the same script for that task follows (a repeat; or the
    /// completion of a submission cut between a cluster's steps).
    async fn submit_at_once(
        &self,
        connection: &Connection,
        spec: &Spec,
        step: &StoreStep<'_>,
    ) -> Result<(bool, String, Stored), TaskStoreError> {
        let spec_json = self.spec_json(spec, &spec.task_id)?;
        let part = self.store_part(&spec.task_id, &spec_json, spec, step, 0, true);
        let ((code, answer), created) = self.store(connection, (&spec.task_id, part), step, true).await?;
        if code != 3 {
            return Ok((true, spec.task_id.clone(), ((code, answer), created)));
        }
        let holder = answer;
        let spec_json = self.spec_json(spec, &holder)?;
        let part = self.store_part(&holder, &spec_json, spec, step, 0, true);
        // (A first advance was planned for the id this submission chose, not the holder's.)
        let step = StoreStep {
            first: None,
            ..step.clone()
        };
        let stored = self.store(connection, (&holder, part), &step, true).await?;
        if stored.0 .0 == 3 {
            // The request id changed hands again meanwhile (it expired and was taken):
            // answered as a store outage, so the caller submits again.
            return Err(TaskStoreError::Unavailable(format!(
                "request `{}` moved between tasks while it was submitted; submit it again",
                spec.request_id
            )));
        }
        Ok((false, holder, stored))
    }

    /// `SET <request key> <task id> NX GET EX <retention>`: claims the request
    /// id for the task, or names the task that holds it.
    fn claim_request(&self, request_key: &str, task_id: &str) -> redis::Cmd {
        let mut claim = redis::cmd("SET");
        claim
            .arg(request_key)
            .arg(task_id)
            .arg("NX")
            .arg("GET")
            .arg("EX")
            .arg(self.retention_s);
        claim
    }

    /// The spec as stored for task `id`.
    fn spec_json(&self, spec: &Spec, id: &str) -> Result<String, TaskStoreError> {
        let mut spec = spec.clone();
        id.clone_into(&mut spec.task_id);
        serde_json::to_string(&spec).map_err(|error| TaskStoreError::Corrupt(error.to_string()))
    }

    /// The store step for task `id` in its lane (`SUBMIT`, or for a run's
    /// held task `START_RUN`, the run created beside it); `one_server`: the
    /// whole submission (claim, store, index) in it, the bound counting every lane.
    async fn store(
        &self,
        connection: &Connection,
        (id, store): (&str, Part),
        step: &StoreStep<'_>,
        one_server: bool,
    ) -> Result<Stored, TaskStoreError> {
        let mut connection = connection.clone();
        let Some((run_spec, grace_ms)) = step.run else {
            return invoke(&self.scripts.submit, &[&store], &mut connection)
                .await
                .map(|answer| (answer, None));
        };
        let create = self.create_part(id, run_spec, grace_ms);
        let recent = self.recent_part(id);
        let (first, queued) = match step.first.filter(|_| one_server) {
            Some(first) => self.advance_parts(id, (first.calls, first.entries), first.due_at_ms, true)?,
            None => Default::default(),
        };
        let mut parts = vec![&store, &create];
        if one_server {
            parts.push(&recent);
            parts.extend(&first);
        }
        let (answer, created, advanced): ((i64, String), i64, i64) =
            invoke(&self.run_scripts.start, &parts, &mut connection).await?;
        let advanced = advanced == 1;
        if advanced {
            for (lane, field) in &queued {
                self.note_queued(*lane, field);
            }
        }
        Ok((answer, (created >= 0).then_some((created == 1, advanced))))
    }

    /// `SUBMIT`'s keys and arguments for task `id`.
    fn store_part(
        &self,
        id: &str,
        spec_json: &str,
        spec: &Spec,
        step: &StoreStep<'_>,
        elsewhere: i64,
        one_server: bool,
    ) -> Part {
        let lane = lane_of(id);
        let mut part = Part::default();
        part.key(self.task_key(id))
            .key(self.queue_key(lane, &spec.capability, spec.priority))
            .key(self.queues_key(lane))
            .key(self.backlog_key(lane));
        if one_server {
            part.key(step.request_key).key(self.caller_index_key(&spec.caller));
            if step.bound.is_some() {
                for other in (0..LANES).filter(|other| *other != lane) {
                    part.key(self.backlog_key(other));
                }
            }
        }
        part.arg(id)
            .arg(spec_json)
            .arg(spec.created_at_ms)
            .arg(step.field)
            .arg(if step.hold { "0" } else { "1" })
            .arg(GROUP)
            .arg(step.bound.unwrap_or(0))
            .arg(elsewhere.max(0))
            .arg(if one_server { "1" } else { "0" })
            .arg(self.retention_s)
            .arg(CALLER_INDEX_MAX);
        match &step.push {
            Some((id, config)) => part.arg(format!("{}{id}", super::record::PUSH_FIELD)).arg(config),
            None => part.arg("").arg(""),
        };
        part
    }

    /// The caller's index gaining task `id` (a cluster's submission).
    fn index_invocation(&self, spec: &Spec, id: &str) -> redis::ScriptInvocation<'_> {
        let mut invocation = self.scripts.index.key(self.caller_index_key(&spec.caller));
        invocation
            .arg(id)
            .arg(spec.created_at_ms)
            .arg(CALLER_INDEX_MAX)
            .arg(self.retention_s);
        invocation
    }

    /// `WAIT` for a submission's writes: on one server one `WAIT` after the
    /// last covers both; on a cluster each shard written to waits for its own.
    async fn wait_replicated(
        &self,
        connection: &Connection,
        request_key: &str,
        task_key: &str,
        wait: agent_reach_stores::Wait,
    ) -> Result<(), TaskStoreError> {
        let reached = |key: &str| {
            let mut connection = connection.clone();
            let key = key.to_string();
            async move { connection.wait_for(&key, wait).await.map_err(unavailable) }
        };
        let least = if self.is_cluster() {
            let (request, task) = tokio::join!(reached(request_key), reached(task_key));
            request?.min(task?)
        } else {
            reached(task_key).await?
        };
        if least < i64::from(wait.replicas) {
            return Err(TaskStoreError::Unavailable(format!(
                "the task reached {least} of {} replicas within {} ms; it may survive a failover or not: \
                 submit again with the same request_id (it is not created twice)",
                wait.replicas,
                wait.timeout_ms()
            )));
        }
        Ok(())
    }
}

/// `task`'s spec as stored under `task_id`, created now.
fn spec_of(task: NewTask, task_id: &str) -> Spec {
    Spec {
        task_id: task_id.to_string(),
        request_id: task.request_id,
        session_id: task.session_id,
        caller: task.caller,
        capability: task.capability,
        priority: task.priority,
        envelope: task.envelope,
        callback: task.callback,
        target_agent: task.target_agent,
        parent: task.parent,
        children: task.children,
        run: task.run,
        created_at_ms: now_ms(),
    }
}
