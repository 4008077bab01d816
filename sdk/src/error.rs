//! Errors a handler returns, and errors of calls an agent makes.

use std::fmt;

/// A handler's business error. The router passes it to the caller as
/// `AGENT_ERROR` with this status and code, and never retries it — except
/// [`HandlerError::unavailable`] (503), which tells the router to try another
/// instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    pub(crate) status: u16,
    pub(crate) code: String,
    pub(crate) message: String,
}

impl HandlerError {
    /// A business error (HTTP 422) with a stable code of your choosing.
    ///
    /// ```
    /// use agent_reach_sdk::HandlerError;
    /// let error = HandlerError::new("ORDER_NOT_FOUND", "no order SO-1");
    /// assert_eq!(error.status(), 422);
    /// ```
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: 422,
            code: code.into(),
            message: message.into(),
        }
    }

    /// The same error with another HTTP status (4xx or 5xx).
    ///
    /// ```
    /// use agent_reach_sdk::HandlerError;
    /// assert_eq!(HandlerError::new("GONE", "archived").with_status(410).status(), 410);
    /// ```
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = if (400..=599).contains(&status) { status } else { 500 };
        self
    }

    /// "Not now": the router retries on another instance.
    ///
    /// ```
    /// use agent_reach_sdk::HandlerError;
    /// assert_eq!(HandlerError::unavailable("model warming up").status(), 503);
    /// ```
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new("UNAVAILABLE", message).with_status(503)
    }

    /// The answer [`Ctx::accept_and_report`](crate::Ctx::accept_and_report)
    /// returns on a task's delivery: `202 Accepted`, the outcome reported later.
    pub(crate) fn accepted() -> Self {
        Self {
            status: 202,
            code: "ACCEPTED".to_string(),
            message: "accepted; the result is reported to the router".to_string(),
        }
    }

    /// Whether this is [`Ctx::accept_and_report`](crate::Ctx::accept_and_report)'s `202`.
    pub(crate) fn is_accepted(&self) -> bool {
        self.status == 202
    }

    /// "Need more input" (docs/design.md, "Multi-turn tasks"): the handler
    /// cannot answer until the caller says more; `message` says what it
    /// needs. Answered 422 with the code `INPUT_REQUIRED`: an A2A task goes
    /// `input-required` with `message` as its status message, and the
    /// caller's next message naming the task is delivered with the
    /// conversation so far ([`Ctx::history`](crate::Ctx::history)). A plain
    /// `/v1/invoke` caller gets it as `AGENT_ERROR` (`details.agent_code`).
    ///
    /// ```
    /// use agent_reach_sdk::HandlerError;
    /// let error = HandlerError::input_required("Which size: S, M or L?");
    /// assert_eq!((error.status(), error.code()), (422, "INPUT_REQUIRED"));
    /// assert!(error.is_input_required());
    /// ```
    pub fn input_required(message: impl Into<String>) -> Self {
        Self::new(INPUT_REQUIRED, message)
    }

    /// Whether this is [`HandlerError::input_required`]'s answer.
    pub fn is_input_required(&self) -> bool {
        self.code == INPUT_REQUIRED && (400..500).contains(&self.status)
    }

    /// The input did not match the handler's type (HTTP 400).
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::new("INVALID_INPUT", message).with_status(400)
    }

    pub fn status(&self) -> u16 {
        self.status
    }

    pub fn code(&self) -> &str {
        &self.code
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

/// The code of a handler's answer asking for more input.
const INPUT_REQUIRED: &str = "INPUT_REQUIRED";

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.status, self.message)
    }
}

impl std::error::Error for HandlerError {}

/// A failed call to another capability or a task route (through the router),
/// or to the context service; the SDK's own failures (the router unreachable,
/// an unreadable answer) have codes of their own (`ROUTER_UNREACHABLE`,
/// `INVALID_RESULT`, `OUTPUT_MISMATCH`, ...).
///
/// ```
/// # async fn example(client: agent_reach_sdk::Client) {
/// use agent_reach_sdk::RouterCode;
/// match client.invoke::<serde_json::Value>("order.query", serde_json::json!({"order_id": "SO-1"})).await {
///     Ok(output) => println!("{output}"),
///     Err(error) if error.router_code() == Some(RouterCode::NoAvailableInstance) => { /* later */ }
///     Err(error) if error.retryable => { /* try again later */ }
///     Err(error) => eprintln!("{error}"),
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct CallError {
    /// The router's or service's stable code, e.g. `NO_AVAILABLE_INSTANCE` or `AGENT_ERROR`.
    pub code: String,
    pub message: String,
    pub retryable: bool,
    /// The HTTP status the router answered with (`None` when no answer came).
    pub status: Option<u16>,
    /// The error's `details` (DESIGN §3.8), e.g. `{agent_status, agent_code}` for `AGENT_ERROR`.
    pub details: Option<serde_json::Value>,
}

impl CallError {
    pub(crate) fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_string(),
            message: message.into(),
            retryable: false,
            status: None,
            details: None,
        }
    }

    pub(crate) fn retryable(mut self) -> Self {
        self.retryable = true;
        self
    }

    /// The router's code, typed; `None` for a code that is not the router's
    /// (the context service's, or the SDK's own).
    pub fn router_code(&self) -> Option<RouterCode> {
        RouterCode::parse(&self.code)
    }
}

/// The router's stable error codes (DESIGN §3.8), as the router defines them.
pub use agent_reach_proto::RouterCode;

/// A call's error becomes the handler's error with the same code, so a chain
/// of agents reports the failure at its origin.
impl From<CallError> for HandlerError {
    fn from(error: CallError) -> Self {
        let status = if error.retryable { 503 } else { 502 };
        HandlerError::new(error.code, error.message).with_status(status)
    }
}

/// Why an agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid agent configuration: {0}")]
    Config(String),
    #[error("cannot listen on {address}: {error}")]
    Listen { address: String, error: std::io::Error },
}

#[cfg(test)]
mod tests {
    use super::RouterCode;

    /// Every code of DESIGN §3.8's table is a [`RouterCode`], and every
    /// `RouterCode` but `INTERNAL` (the router's last-resort answer, §3.7) is
    /// in the table: the SDK's list cannot drift from the router's contract.
    #[test]
    fn router_codes_are_the_designs() {
        let design = include_str!("../../docs/design.md");
        let section = design
            .split("### 3.8 Error codes")
            .nth(1)
            .and_then(|rest| rest.split("\n### ").next())
            .unwrap();
        let documented: Vec<&str> = section
            .lines()
            .filter_map(|line| line.strip_prefix("| `"))
            .filter_map(|rest| rest.split('`').next())
            .collect();
        assert!(documented.len() >= 20, "{documented:?}");
        for code in &documented {
            assert!(RouterCode::parse(code).is_some(), "{code} is not a RouterCode");
        }
        for &code in RouterCode::ALL {
            assert!(
                code == RouterCode::Internal || documented.contains(&code.as_str()),
                "{code} is not in DESIGN §3.8"
            );
        }
    }
}
