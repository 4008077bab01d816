//! The router's stable error codes (DESIGN §3.8), defined once: the router
//! answers with them, the SDKs read them (`agent_reach_sdk::RouterCode`), and
//! `agent_reach_errors` gives each its HTTP status. The string forms are part
//! of the API.

use std::fmt;

macro_rules! router_codes {
    ($($(#[$doc:meta])* $variant:ident = $text:literal, $status:literal;)*) => {
        /// One of the router's stable codes. New codes are added over time:
        /// outside this crate a `match` needs a catch-all arm.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum RouterCode {
            $($(#[$doc])* $variant,)*
        }

        impl RouterCode {
            /// Every code, in a fixed order (metrics index outcomes by it).
            pub const ALL: &'static [RouterCode] = &[$(RouterCode::$variant,)*];

            pub const fn as_str(self) -> &'static str {
                match self {
                    $(RouterCode::$variant => $text,)*
                }
            }

            /// The HTTP status the router answers the code with. `AGENT_ERROR`
            /// carries the agent's own status instead (a passthrough); 502 is
            /// only its fallback.
            pub const fn status_code(self) -> u16 {
                match self {
                    $(RouterCode::$variant => $status,)*
                }
            }
        }
    };
}

router_codes! {
    InvalidEnvelope = "INVALID_ENVELOPE", 400;
    InvalidQuery = "INVALID_QUERY", 400;
    Unauthenticated = "UNAUTHENTICATED", 401;
    Forbidden = "FORBIDDEN", 403;
    CapabilityNotFound = "CAPABILITY_NOT_FOUND", 404;
    VersionNotFound = "VERSION_NOT_FOUND", 404;
    PayloadTooLarge = "PAYLOAD_TOO_LARGE", 413;
    SchemaMismatch = "SCHEMA_MISMATCH", 422;
    Overloaded = "OVERLOADED", 429;
    AgentError = "AGENT_ERROR", 502;
    AllRetriesExhausted = "ALL_RETRIES_EXHAUSTED", 502;
    NoAvailableInstance = "NO_AVAILABLE_INSTANCE", 503;
    DeadlineExceeded = "DEADLINE_EXCEEDED", 504;
    NotFound = "NOT_FOUND", 404;
    MethodNotAllowed = "METHOD_NOT_ALLOWED", 405;
    TasksDisabled = "TASKS_DISABLED", 501;
    TaskNotFound = "TASK_NOT_FOUND", 404;
    TaskConflict = "TASK_CONFLICT", 409;
    TaskStoreUnavailable = "TASK_STORE_UNAVAILABLE", 503;
    /// Redis is unreachable and the local task buffer is full (or cannot be written).
    TaskBufferFull = "TASK_BUFFER_FULL", 503;
    InvalidTaskResult = "INVALID_TASK_RESULT", 400;
    DeadLetterNotFound = "DEAD_LETTER_NOT_FOUND", 404;
    RateLimited = "RATE_LIMITED", 429;
    OutputSchemaMismatch = "OUTPUT_SCHEMA_MISMATCH", 502;
    AssertionFailed = "ASSERTION_FAILED", 500;
    InvalidCallback = "INVALID_CALLBACK", 400;
    Canceled = "CANCELED", 409;
    StreamInterrupted = "STREAM_INTERRUPTED", 502;
    /// No workflow of that name (its runs API; DESIGN §9).
    WorkflowNotFound = "WORKFLOW_NOT_FOUND", 404;
    /// No run of that id for this caller (or it expired).
    RunNotFound = "RUN_NOT_FOUND", 404;
    /// The run ended already (a cancel came too late).
    RunConflict = "RUN_CONFLICT", 409;
    /// A workflow's run failed because one of its steps did (`details.step`, `details.error`).
    StepFailed = "STEP_FAILED", 502;
    /// The router keeps no trail (no `--redis`, or `--trail off`).
    TrailDisabled = "TRAIL_DISABLED", 501;
    /// A delegation chain deeper than the capability's `max_depth` (DESIGN §9).
    DepthExceeded = "DEPTH_EXCEEDED", 403;
    /// A chain that reaches the same capability on the same instance again.
    LoopDetected = "LOOP_DETECTED", 403;
    /// The chain's budget has no call (or cost) left.
    BudgetExhausted = "BUDGET_EXHAUSTED", 402;
    /// The router's last resort: an answer it could not encode (DESIGN §3.7).
    Internal = "INTERNAL", 500;
}

impl RouterCode {
    /// The code for `text`, if it is one of the router's.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|code| code.as_str() == text)
    }

    /// May the caller succeed by sending the same request again later?
    pub const fn is_retryable(self) -> bool {
        matches!(
            self,
            RouterCode::Overloaded
                | RouterCode::RateLimited
                | RouterCode::AllRetriesExhausted
                | RouterCode::NoAvailableInstance
                | RouterCode::DeadlineExceeded
                | RouterCode::TaskStoreUnavailable
                | RouterCode::TaskBufferFull
                // The router does not retry a stream it began relaying; the caller may call again.
                | RouterCode::StreamInterrupted
                | RouterCode::Internal
        )
    }
}

impl fmt::Display for RouterCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_parse_back() {
        let names: std::collections::HashSet<_> = RouterCode::ALL.iter().map(|code| code.as_str()).collect();
        assert_eq!(names.len(), RouterCode::ALL.len());
        for code in RouterCode::ALL {
            assert_eq!(RouterCode::parse(code.as_str()), Some(*code));
        }
        assert_eq!(RouterCode::parse("NOPE"), None);
        assert_eq!(RouterCode::SchemaMismatch.status_code(), 422);
        assert_eq!(RouterCode::DeadlineExceeded.status_code(), 504);
    }
}
