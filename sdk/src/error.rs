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

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.status, self.message)
    }
}

impl std::error::Error for HandlerError {}

/// A failed call to another capability (through the router) or to the context service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct CallError {
    /// The router's or service's stable code, e.g. `NO_AVAILABLE_INSTANCE` or `AGENT_ERROR`.
    pub code: String,
    pub message: String,
    pub retryable: bool,
}

impl CallError {
    pub(crate) fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_string(),
            message: message.into(),
            retryable: false,
        }
    }
}

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
