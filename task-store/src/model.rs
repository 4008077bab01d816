//! Tasks and their state machine: `pending → running → succeeded | failed |
//! canceled`, with `retrying` between attempts, and `input_required` when the
//! agent asked for more input (a multi-turn task: a message continuing it
//! makes it `pending` again). Every transition is checked here, in
//! [`State::may_become`], and nowhere else (the store's scripts are given the
//! allowed predecessors computed from it).

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Pending,
    Running,
    Retrying,
    Succeeded,
    Failed,
    Canceled,
    /// The agent asked for more input (an interrupted state, not an end):
    /// a message continuing the task queues it again.
    InputRequired,
}

impl State {
    pub const ALL: [State; 7] = [
        State::Pending,
        State::Running,
        State::Retrying,
        State::Succeeded,
        State::Failed,
        State::Canceled,
        State::InputRequired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Running => "running",
            State::Retrying => "retrying",
            State::Succeeded => "succeeded",
            State::Failed => "failed",
            State::Canceled => "canceled",
            State::InputRequired => "input_required",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == text)
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, State::Succeeded | State::Failed | State::Canceled)
    }

    /// An interrupted state: the task waits for its caller, not for an agent.
    pub fn is_interrupted(self) -> bool {
        self == State::InputRequired
    }

    /// Ended or interrupted: no agent works on the task, whoever waits for it may stop.
    pub fn is_settled(self) -> bool {
        self.is_terminal() || self.is_interrupted()
    }

    /// The one transition table.
    pub fn may_become(self, next: State) -> bool {
        use State::*;
        matches!(
            (self, next),
            (Pending, Running)
                | (Pending, Canceled)
                | (Running, Succeeded)
                | (Running, Failed)
                | (Running, Retrying)
                | (Running, Canceled)
                | (Retrying, Running)
                | (Retrying, Failed)
                | (Retrying, Canceled)
                | (Running, InputRequired)
                | (InputRequired, Pending)
                | (InputRequired, Canceled)
        )
    }

    /// Every state `next` may be reached from.
    pub fn predecessors(next: State) -> Vec<State> {
        Self::ALL.into_iter().filter(|state| state.may_become(next)).collect()
    }
}

/// A task's priority is the call's (one vocabulary, defined in `proto`).
pub use agent_reach_proto::Priority;

/// Where a finished task's result envelope is POSTed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Callback {
    pub url: String,
    /// Names a signing secret configured on the router; never the secret itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
    /// What an A2A push notification config adds (set through A2A only;
    /// `POST /v1/tasks` refuses the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2a: Option<PushConfig>,
}

/// An A2A push notification config's own fields (A2A spec §4.3): its id,
/// and what the receiver asked to be sent with each notification.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushConfig {
    /// The config's id, the client's or one the router gave.
    pub id: String,
    /// Sent as `X-A2A-Notification-Token` with each notification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Sent as `Authorization: <scheme> <credentials>` with each notification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<PushAuthentication>,
}

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushAuthentication {
    pub scheme: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
}

// Written by hand: the token and the credentials never reach a log.
impl std::fmt::Debug for PushConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PushConfig")
            .field("id", &self.id)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("authentication", &self.authentication)
            .finish()
    }
}

impl std::fmt::Debug for PushAuthentication {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PushAuthentication")
            .field("scheme", &self.scheme)
            .field("credentials", &self.credentials.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    pub state: State,
    pub at_ms: u64,
}

/// A task as stored: the invoke envelope to deliver and everything learned since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub task_id: String,
    /// The idempotency key: resubmitting it returns this task.
    pub request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub caller: String,
    pub capability: String,
    pub priority: Priority,
    pub state: State,
    /// The invoke envelope (DESIGN §3) as submitted.
    pub envelope: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<Callback>,
    /// Deliver to this instance only (a broadcast child).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_agent: Option<String>,
    /// The broadcast parent this task reports to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// For a broadcast parent: the instances its children target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<String>,
    pub attempts: u32,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Every state the task entered, in order, with its time.
    pub transitions: Vec<Transition>,
    /// The result envelope once the task ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Set while an agent that answered the delivery `202` has yet to report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted: Option<Accepted>,
    /// The conversation after the message that started the task (whose
    /// payload is the envelope's): each question of the agent and each
    /// answer of the caller, in order. Empty for a one-turn task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turns: Vec<Turn>,
    /// A2A push notification configs (A2A spec §4.3), by id; each one is
    /// notified when the task ends or asks for input.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub push_configs: Vec<Callback>,
}

impl Task {
    /// The agent's question, while the task waits for input.
    pub fn question(&self) -> Option<&Turn> {
        self.turns
            .last()
            .filter(|turn| self.state == State::InputRequired && turn.role == Role::Agent)
    }

    /// The push config `id` of this task.
    pub fn push_config(&self, id: &str) -> Option<&Callback> {
        self.push_configs
            .iter()
            .find(|config| config.a2a.as_ref().is_some_and(|push| push.id == id))
    }
}

/// Who spoke a turn of a multi-turn task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The caller: its message's payload.
    User,
    /// The agent: its request for more input.
    Agent,
}

/// One turn of a multi-turn task after its first message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    pub role: Role,
    /// The sender's message id (a caller's `messageId`; one the router made
    /// for the agent's question). A caller's is its delivery's request id.
    pub message_id: String,
    /// A caller's turn: the payload it sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    /// An agent's turn: what it asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub at_ms: u64,
}

impl Turn {
    /// The caller's answer `payload`, sent as message `message_id`.
    pub fn user(message_id: impl Into<String>, payload: Value) -> Self {
        Self {
            role: Role::User,
            message_id: message_id.into(),
            payload: Some(payload),
            message: None,
            at_ms: crate::store::now_ms(),
        }
    }

    /// The agent's request for more input.
    pub fn agent(message_id: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            role: Role::Agent,
            message_id: message_id.into(),
            payload: None,
            message: Some(message.into()),
            at_ms: crate::store::now_ms(),
        }
    }
}

/// A delivery the agent answered `202 Accepted` (DESIGN §8): the task stays
/// `running` until that agent reports, or fails at `deadline_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    pub agent_id: String,
    /// The agent's name: only a token with this subject may report.
    pub agent_name: String,
    pub capability_version: String,
    pub at_ms: u64,
    pub deadline_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_table() {
        assert!(State::Pending.may_become(State::Running));
        assert!(State::Running.may_become(State::Retrying));
        assert!(State::Retrying.may_become(State::Running));
        assert!(
            !State::Succeeded.may_become(State::Running),
            "terminal states are final"
        );
        assert!(
            !State::Pending.may_become(State::Succeeded),
            "a task runs before it ends"
        );
        assert!(!State::Canceled.may_become(State::Canceled));
        assert_eq!(
            State::predecessors(State::Canceled),
            [State::Pending, State::Running, State::Retrying, State::InputRequired]
        );
        // A multi-turn task: asked for input while running, queued again by a message.
        assert_eq!(State::predecessors(State::InputRequired), [State::Running]);
        assert!(State::InputRequired.may_become(State::Pending));
        assert!(
            !State::InputRequired.may_become(State::Succeeded),
            "it runs again first"
        );
        assert!(!State::InputRequired.is_terminal() && State::InputRequired.is_interrupted());
        assert!(State::ALL
            .iter()
            .all(|state| State::parse(state.as_str()) == Some(*state)));
    }
}
