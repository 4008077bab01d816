//! Reporting an accepted task's outcome (DESIGN §8): `POST
//! /v1/tasks/{task_id}/result` as this agent, `{"output": …}` or `{"error":
//! {"code", "message"}}`, retried while the router is unreachable or
//! unavailable, until the task's deadline; any other answer is final.

use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

use crate::call::now_ms;
use crate::HandlerError;

/// Where and as whom one task's outcome is reported.
pub(crate) struct Report {
    pub(crate) http: reqwest::Client,
    pub(crate) url: String,
    pub(crate) token: String,
    pub(crate) deadline_ms: u64,
}

impl Report {
    pub(crate) async fn send<O: Serialize>(self, outcome: Result<O, HandlerError>) {
        let body = match outcome.map(|output| serde_json::to_value(output)) {
            Ok(Ok(output)) => json!({ "output": output }),
            Ok(Err(error)) => json!({ "error": { "code": "OUTPUT_ENCODING", "message": error.to_string() } }),
            Err(error) => json!({ "error": { "code": error.code(), "message": error.message() } }),
        };
        let mut pause = Duration::from_millis(100);
        loop {
            match self.attempt(&body).await {
                Ok(()) => return,
                Err((retryable, why)) => {
                    let out_of_time = now_ms().saturating_add(pause.as_millis() as u64) >= self.deadline_ms;
                    if !retryable || out_of_time {
                        tracing::error!(message = "Task result not reported.", url = %self.url, error = %why);
                        return;
                    }
                    tracing::warn!(message = "Reporting a task result failed; retrying.", url = %self.url, error = %why);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// One report; `Err((retryable, why))`. The same report again is answered
    /// 200 (`duplicate`), so a retry after a lost answer is harmless.
    async fn attempt(&self, body: &Value) -> Result<(), (bool, String)> {
        let response = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await
            .map_err(|error| (true, format!("cannot reach the router: {error}")))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        let code = answer["error"]["code"].as_str().unwrap_or("").to_string();
        let retryable = status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
        Err((retryable, format!("{status} {code}: {}", answer["error"]["message"])))
    }
}
