//! The key layout (see the module notes): the lanes' hash tags, a
//! capability's lane, and every key's name.

use std::sync::OnceLock;

use agent_reach_stores::slot::{crc16, spread_tag};

use super::{lane_of, TaskStore, LANES};
use crate::model::{Priority, Task};

/// The lanes' hash tags (without braces), computed once.
fn lane_tags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| (0..LANES).map(|lane| spread_tag("q", lane, LANES)).collect())
}

impl TaskStore {
    /// A fresh task id in `capability`'s lane: a capability's tasks, queues
    /// and callbacks then share one slot of a Redis Cluster, and different
    /// capabilities spread over its shards. `t_` and 24 hex digits as
    /// [`new_task_id`](super::new_task_id)'s, the first one the lane.
    pub fn task_id_for(&self, capability: &str) -> String {
        format!(
            "t_{:x}{:015x}{:08x}",
            self.lane_for(capability),
            rand::random::<u64>() >> 4,
            rand::random::<u32>()
        )
    }

    /// The lane of `capability`'s tasks (of this tenant).
    fn lane_for(&self, capability: &str) -> usize {
        let mut name = Vec::with_capacity(self.tenant.len() + 1 + capability.len());
        name.extend_from_slice(self.tenant.as_bytes());
        name.push(b'/');
        name.extend_from_slice(capability.as_bytes());
        usize::from(crc16(&name)) % LANES
    }

    pub(super) fn lane_key(&self, kind: &str, lane: usize) -> String {
        format!("{}:{kind}:{{{}}}", self.namespace, lane_tags()[lane % LANES])
    }

    /// What every task key of `lane` starts with (the scripts load tasks by id).
    pub(super) fn task_prefix(&self, lane: usize) -> String {
        format!("{}:", self.lane_key("task", lane))
    }

    pub(super) fn task_key(&self, task_id: &str) -> String {
        format!("{}{task_id}", self.task_prefix(lane_of(task_id)))
    }

    pub(super) fn queue_key(&self, lane: usize, capability: &str, priority: Priority) -> String {
        format!("{}:{capability}:{}", self.lane_key("queue", lane), priority.as_str())
    }

    /// The queue a task's entry is in (its lane, capability and priority).
    pub(super) fn queue_of(&self, task: &Task) -> String {
        self.queue_key(lane_of(&task.task_id), &task.capability, task.priority)
    }

    pub(super) fn queues_key(&self, lane: usize) -> String {
        self.lane_key("queues", lane)
    }

    pub(super) fn backlog_key(&self, lane: usize) -> String {
        self.lane_key("backlog", lane)
    }

    pub(super) fn callbacks_key(&self, lane: usize) -> String {
        self.lane_key("callbacks", lane)
    }

    pub(super) fn followups_key(&self, lane: usize) -> String {
        self.lane_key("followups", lane)
    }

    pub(super) fn caller_index_key(&self, caller: &str) -> String {
        format!("{}:tasks_of:{caller}", self.namespace)
    }

    pub(super) fn alias_key(&self, task_id: &str) -> String {
        format!("{}:task_alias:{task_id}", self.namespace)
    }

    pub(super) fn request_key(&self, caller: &str, request_id: &str) -> String {
        format!("{}:task_req:{caller}:{request_id}", self.namespace)
    }

    /// A session's results stream and its set of task ids: one slot, the
    /// session's own tag (any id, even one holding braces, gives a valid tag).
    pub(super) fn results_keys(&self, session_id: &str) -> (String, String) {
        let tag = format!("s{:04x}", crc16(session_id.as_bytes()));
        (
            format!("{}:results:{{{tag}}}:{session_id}", self.namespace),
            format!("{}:results_seen:{{{tag}}}:{session_id}", self.namespace),
        )
    }

    pub(super) fn dead_letter_key(&self) -> String {
        format!("{}:dead_letters", self.namespace)
    }
}
