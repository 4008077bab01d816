//! Paused tasks (DESIGN §9, preemption): a running delivery its agent
//! paused for higher-priority work keeps its checkpoint, gives up its queue
//! entry and waits in its lane's `paused:{L}` sorted set (by when it may be
//! queued again); any router's worker queues it again when it is due, as
//! `pending`, its next delivery carrying the checkpoint. Each move is one
//! script on the lane's slot.

use redis::AsyncCommands;

use super::scripts::state_args;
use super::{lane_of, now_ms, unavailable, Claimed, TaskStore, TaskStoreError, GROUP, LANES};
use crate::model::{State, Task};

const PAUSE: &str = r#"
-- A running delivery paused: the checkpoint kept, the entry acknowledged,
-- the task waiting to be queued again from the due time.
-- KEYS: 1 task hash, 2 queue, 3 paused set
-- ARGV: 1 now ms, 2 checkpoint JSON, 3 entry id, 4 group, 5 due ms, 6 task id, 7.. allowed predecessors
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return {'missing'} end
redis.call('XACK', KEYS[2], ARGV[4], ARGV[3])
if current == 'paused' then return {'ok', current} end
local allowed = false
for i = 7, #ARGV do if current == ARGV[i] then allowed = true end end
if not allowed then return {'refused', current} end
redis.call('HSET', KEYS[1], 'state', 'paused', 'updated_at_ms', ARGV[1], 'checkpoint', ARGV[2])
redis.call('HDEL', KEYS[1], 'accepted', 'accepted_agent', 'entry_id')
redis.call('HSET', KEYS[1], 'transitions',
  (redis.call('HGET', KEYS[1], 'transitions') or '') .. '{"state":"paused","at_ms":' .. ARGV[1] .. '}\n')
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[6])
return {'ok', current}
"#;

const RESUME: &str = r#"
-- A paused task queued again as pending (unless it is no longer paused:
-- canceled, or resumed by another router), and taken off the paused set.
-- KEYS: 1 task hash, 2 queue, 3 the lane's queue set, 4 backlog, 5 paused set
-- ARGV: 1 now ms, 2 group, 3 backlog field, 4 task id
redis.call('ZREM', KEYS[5], ARGV[4])
if redis.call('HGET', KEYS[1], 'state') ~= 'paused' then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[2], '0', 'MKSTREAM')
  redis.call('SADD', KEYS[3], KEYS[2])
end
redis.call('HSET', KEYS[1], 'state', 'pending', 'updated_at_ms', ARGV[1], 'backlog', ARGV[3])
redis.call('HSET', KEYS[1], 'transitions',
  (redis.call('HGET', KEYS[1], 'transitions') or '') .. '{"state":"pending","at_ms":' .. ARGV[1] .. '}\n')
redis.call('HINCRBY', KEYS[4], ARGV[3], 1)
redis.call('XADD', KEYS[2], '*', 'task_id', ARGV[4])
return 1
"#;

/// The pause scripts, loaded once.
pub(super) struct PauseScripts {
    pause: redis::Script,
    resume: redis::Script,
}

impl PauseScripts {
    pub(super) fn load() -> Self {
        Self {
            pause: redis::Script::new(PAUSE),
            resume: redis::Script::new(RESUME),
        }
    }
}

impl TaskStore {
    fn paused_key(&self, lane: usize) -> String {
        self.lane_key("paused", lane)
    }

    /// The claimed task's delivery was paused by its agent with `checkpoint`
    /// (JSON): it becomes `paused`, its entry is acknowledged, and it is
    /// queued again at `due_ms` or later. A task canceled meanwhile is `Refused`.
    pub async fn pause(&self, claimed: &Claimed, checkpoint: &str, due_ms: u64) -> Result<(), TaskStoreError> {
        let task_id = &claimed.task.task_id;
        let mut connection = self.connection().await?;
        let mut invocation = self.pause_scripts.pause.key(self.task_key(task_id));
        invocation
            .key(&claimed.queue)
            .key(self.paused_key(lane_of(task_id)))
            .arg(now_ms())
            .arg(checkpoint)
            .arg(&claimed.entry_id)
            .arg(GROUP)
            .arg(due_ms)
            .arg(task_id);
        for allowed in state_args(State::Paused) {
            invocation.arg(allowed);
        }
        let answer: Vec<String> = invocation.invoke_async(&mut connection).await.map_err(unavailable)?;
        match answer.first().map(String::as_str) {
            Some("ok") => Ok(()),
            Some("refused") => Err(TaskStoreError::Refused {
                current: answer.get(1).cloned().unwrap_or_default(),
                wanted: State::Paused.as_str().to_string(),
            }),
            Some("missing") => Err(TaskStoreError::NotFound(task_id.clone())),
            other => Err(TaskStoreError::Corrupt(format!("unexpected script answer {other:?}"))),
        }
    }

    /// Queues again (as `pending`) the paused tasks due now, at most `limit`
    /// per lane; returns how many. Any router may: a task is queued once.
    pub async fn resume_due(&self, limit: usize) -> Result<usize, TaskStoreError> {
        let connection = self.connection().await?;
        let now = now_ms();
        let count = isize::try_from(limit).unwrap_or(isize::MAX);
        // The lanes' due tasks read at once (an idle worker's poll costs one round trip).
        let reads = (0..LANES).map(|lane| {
            let mut connection = connection.clone();
            async move {
                connection
                    .zrangebyscore_limit::<_, _, _, Vec<String>>(self.paused_key(lane), 0, now, 0, count)
                    .await
            }
        });
        let mut resumed = 0;
        for due in futures::future::join_all(reads).await {
            for task_id in due.map_err(unavailable)? {
                resumed += usize::from(self.resume(&task_id).await?);
            }
        }
        Ok(resumed)
    }

    /// Queues paused task `task_id` again now (once; `false` when it is not paused).
    pub async fn resume(&self, task_id: &str) -> Result<bool, TaskStoreError> {
        let lane = lane_of(task_id);
        let task: Task = match self.get(task_id).await {
            Ok(task) => task,
            Err(TaskStoreError::NotFound(_)) => {
                let mut connection = self.connection().await?;
                connection
                    .zrem::<_, _, i64>(self.paused_key(lane), task_id)
                    .await
                    .map_err(unavailable)?;
                return Ok(false);
            }
            Err(error) => return Err(error),
        };
        let field = format!("{}|{}", task.capability, task.priority.as_str());
        let mut connection = self.connection().await?;
        let resumed: i64 = self
            .pause_scripts
            .resume
            .key(self.task_key(task_id))
            .key(self.queue_of(&task))
            .key(self.queues_key(lane))
            .key(self.backlog_key(lane))
            .key(self.paused_key(lane))
            .arg(now_ms())
            .arg(GROUP)
            .arg(&field)
            .arg(task_id)
            .invoke_async(&mut connection)
            .await
            .map_err(unavailable)?;
        if resumed == 1 {
            self.note_queued(lane, &field);
        }
        Ok(resumed == 1)
    }

    /// Paused tasks' ids, every lane (the console and tests).
    pub async fn paused(&self) -> Result<Vec<String>, TaskStoreError> {
        let mut connection = self.connection().await?;
        let mut paused = Vec::new();
        for lane in 0..LANES {
            let ids: Vec<String> = connection
                .zrange(self.paused_key(lane), 0, -1)
                .await
                .map_err(unavailable)?;
            paused.extend(ids);
        }
        Ok(paused)
    }
}
