//! The runs' routes in the router's OpenAPI description (`GET /v1/openapi.json`).

use serde_json::{json, Map, Value};

/// Every runs path with each of its methods.
pub const PATHS: [(&str, &str); 5] = [
    ("/v1/workflows/{name}/runs", "post"),
    ("/v1/runs", "get"),
    ("/v1/runs/{run_id}", "get"),
    ("/v1/runs/{run_id}/events", "get"),
    ("/v1/runs/{run_id}/cancel", "post"),
];

fn failed(description: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ResultEnvelope" } } }
    })
}

fn run_view() -> Value {
    json!({
        "description": "The run: every step's state, its output or error once it ended.",
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Run" } } }
    })
}

/// What every runs route may also answer.
fn responses(mut own: Vec<(&str, Value)>) -> Value {
    own.extend([
        ("401", failed("UNAUTHENTICATED.")),
        ("405", failed("METHOD_NOT_ALLOWED.")),
        (
            "501",
            failed("TASKS_DISABLED: runs need the slow path (the router's --redis)."),
        ),
        ("503", failed("TASK_STORE_UNAVAILABLE: Redis did not answer; retry.")),
    ]);
    Value::Object(
        own.into_iter()
            .map(|(status, answer)| (status.to_string(), answer))
            .collect(),
    )
}

/// The runs' entries of `paths`, and their schemas.
pub fn paths() -> (Map<String, Value>, Map<String, Value>) {
    let run_id = json!([{ "name": "run_id", "in": "path", "required": true, "schema": { "type": "string" } }]);
    let not_found = || failed("RUN_NOT_FOUND: no such run, or another caller's (operators see every run).");
    let paths = json!({
        "/v1/workflows/{name}/runs": { "post": {
            "summary": "Start a run of a workflow (DESIGN §9): its steps run as durable tasks, each called as this caller",
            "parameters": [{ "name": "name", "in": "path", "required": true, "schema": { "type": "string" } }],
            "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/RunRequest" } } } },
            "responses": responses(vec![
                ("202", json!({ "description": "Started: `{run_id, status: \"pending\"}`.", "content": { "application/json": { "schema": { "type": "object", "properties": { "run_id": { "type": "string" }, "status": { "type": "string" } } } } } })),
                ("200", json!({ "description": "This request_id started a run before: `{run_id, status, duplicate: true}`.", "content": { "application/json": { "schema": { "type": "object" } } } })),
                ("400", failed("INVALID_ENVELOPE (a body field, named in details.field) or INVALID_CALLBACK.")),
                ("403", failed("FORBIDDEN: acl.yaml's permissions do not let the caller call the workflow.")),
                ("404", failed("WORKFLOW_NOT_FOUND.")),
                ("413", failed("PAYLOAD_TOO_LARGE.")),
                ("422", failed("SCHEMA_MISMATCH: the payload does not match the workflow's input schema (details.errors[].pointer).")),
                ("429", failed("RATE_LIMITED.")),
            ])
        } },
        "/v1/runs": { "get": {
            "summary": "The newest runs the caller may see (its own; every run for operators), newest first",
            "parameters": [
                { "name": "workflow", "in": "query", "required": false, "schema": { "type": "string" } },
                { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer" }, "description": "1..=200, default 50." }
            ],
            "responses": responses(vec![
                ("200", json!({ "description": "`{runs: [{run_id, workflow, version, status, caller, created_at_ms, updated_at_ms}]}`.", "content": { "application/json": { "schema": { "type": "object" } } } })),
                ("400", failed("INVALID_QUERY.")),
            ])
        } },
        "/v1/runs/{run_id}": { "get": {
            "summary": "A run: its status and every step's (pending, running, paused, succeeded, failed, canceled)",
            "parameters": run_id,
            "responses": responses(vec![("200", run_view()), ("404", not_found())])
        } },
        "/v1/runs/{run_id}/events": { "get": {
            "summary": "Server-sent events: `event: run` with the whole run each time it changes, the last when it ended",
            "parameters": run_id,
            "responses": responses(vec![
                ("200", json!({ "description": "text/event-stream", "content": { "text/event-stream": { "schema": { "type": "string" } } } })),
                ("404", not_found()),
            ])
        } },
        "/v1/runs/{run_id}/cancel": { "post": {
            "summary": "Cancel a run: no step starts any more, calls in flight are canceled",
            "parameters": run_id,
            "responses": responses(vec![
                ("200", run_view()),
                ("404", not_found()),
                ("409", failed("RUN_CONFLICT: the run ended already (details.status).")),
            ])
        } }
    });
    let schemas = json!({
        "RunRequest": {
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "payload": { "description": "The run's input, checked against the workflow's input schema." },
                "request_id": { "type": "string", "description": "Makes the start idempotent for this caller." },
                "session_id": { "type": "string" },
                "context_id": { "type": "string" },
                "priority": { "type": "string", "enum": ["high", "normal", "low"] },
                "callback": { "type": "object", "properties": { "url": { "type": "string" }, "secret_ref": { "type": "string" } }, "required": ["url"] }
            }
        },
        "Run": {
            "type": "object",
            "required": ["run_id", "workflow", "version", "status", "steps"],
            "properties": {
                "run_id": { "type": "string" },
                "workflow": { "type": "string" },
                "version": { "type": "string" },
                "status": { "type": "string", "enum": ["pending", "running", "succeeded", "failed", "canceled"] },
                "steps": { "type": "array", "items": { "type": "object", "required": ["id", "status", "attempts"], "properties": {
                    "id": { "type": "string" },
                    "capability": { "type": "string" },
                    "status": { "type": "string", "enum": ["pending", "running", "paused", "succeeded", "failed", "canceled"] },
                    "attempts": { "type": "integer" },
                    "depends_on": { "type": "array", "items": { "type": "string" } },
                    "agent_id": { "type": "string" },
                    "capability_version": { "type": "string" },
                    "started_at_ms": { "type": "integer" },
                    "finished_at_ms": { "type": "integer" },
                    "skipped": { "type": "boolean" },
                    "output": {},
                    "error": { "type": "object" },
                    "items": { "type": "array", "description": "A for_each step's calls.", "items": { "type": "object" } },
                    "compensation": { "type": "object" }
                } } },
                "output": {},
                "error": { "type": "object" }
            }
        }
    });
    let as_map = |value: Value| match value {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    (as_map(paths), as_map(schemas))
}
