//! The OpenAPI 3 description of the router's external API, served at
//! `GET /v1/openapi.json`. A test checks it against the routes and the
//! envelope types, so it cannot drift silently.

use std::sync::OnceLock;

use serde_json::{json, Value};

use crate::error::Code;

/// Paths the router serves, with their methods (the test compares with `http::routes`).
pub const PATHS: [(&str, &str); 11] = [
    ("/v1/invoke", "post"),
    ("/v1/broadcast", "post"),
    ("/v1/tasks", "post"),
    ("/v1/tasks/{task_id}", "get"),
    ("/v1/tasks/{task_id}/cancel", "post"),
    ("/v1/tasks/{task_id}/events", "get"),
    ("/v1/sessions/{session_id}/results", "get"),
    ("/v1/openapi.json", "get"),
    ("/healthz", "get"),
    ("/readyz", "get"),
    ("/metrics", "get"),
];

pub fn document() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(build)
}

fn build() -> Value {
    let codes: Vec<&str> = Code::ALL.iter().map(|code| code.as_str()).collect();
    let failed = |description: &str| {
        json!({
            "description": description,
            "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ResultEnvelope" } } }
        })
    };
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Agent-Reach router",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Call a capability by name: authenticated (bearer JWT), authorised (acl.yaml), \
                            schema-checked, routed to a healthy instance, retried on unavailability."
        },
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer", "bearerFormat": "JWT" } },
            "schemas": {
                "InvokeRequest": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["capability"],
                    "properties": {
                        "version": { "type": "string", "enum": ["1.0"] },
                        "request_id": { "type": "string", "maxLength": 128, "description": "Idempotency key; generated when absent." },
                        "session_id": { "type": "string", "description": "Key of consistent_hash." },
                        "context_id": { "type": "string" },
                        "capability": { "type": "string", "pattern": "^[a-z][a-z0-9_]*(\\.[a-z][a-z0-9_]*)*$" },
                        "capability_version": { "type": "string", "description": "Semver requirement; absent means the highest version." },
                        "target_policy": { "type": "string", "enum": ["weighted_round_robin", "least_connections", "consistent_hash"] },
                        "priority": { "type": "string", "enum": ["high", "normal", "low"] },
                        "timeout_ms": { "type": "integer", "minimum": 1 },
                        "deadline": { "type": "integer", "description": "Absolute epoch milliseconds; wins over timeout_ms." },
                        "payload": { "description": "Checked against the capability's input schema." }
                    }
                },
                "ResultEnvelope": {
                    "type": "object",
                    "required": ["version", "request_id", "status", "attempts", "duration_ms"],
                    "properties": {
                        "version": { "type": "string" },
                        "request_id": { "type": "string" },
                        "status": { "type": "string", "enum": ["succeeded", "failed"] },
                        "capability": { "type": "string" },
                        "capability_version": { "type": "string" },
                        "agent_id": { "type": "string" },
                        "attempts": { "type": "integer" },
                        "duration_ms": { "type": "integer" },
                        "output": { "description": "The agent's output (succeeded only)." },
                        "error": { "$ref": "#/components/schemas/EnvelopeError" }
                    }
                },
                "EnvelopeError": {
                    "type": "object",
                    "required": ["code", "message", "retryable"],
                    "properties": {
                        "code": { "type": "string", "enum": codes },
                        "message": { "type": "string" },
                        "retryable": { "type": "boolean" },
                        "details": { "type": "object" }
                    }
                }
            }
        },
        "paths": {
            "/v1/invoke": {
                "post": {
                    "summary": "Invoke a capability",
                    "security": [{ "bearer": [] }],
                    "requestBody": {
                        "required": true,
                        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/InvokeRequest" } } }
                    },
                    "responses": {
                        "200": failed("Succeeded: `status` is `succeeded` and `output` holds the agent's answer."),
                        "400": failed("INVALID_ENVELOPE (details.field names the field)."),
                        "401": failed("UNAUTHENTICATED."),
                        "403": failed("FORBIDDEN (details name caller and capability)."),
                        "404": failed("CAPABILITY_NOT_FOUND or VERSION_NOT_FOUND (details.available lists versions)."),
                        "413": failed("PAYLOAD_TOO_LARGE."),
                        "422": failed("SCHEMA_MISMATCH (details.errors[].pointer), or an agent's own 422 as AGENT_ERROR."),
                        "429": failed("OVERLOADED: every instance tried answered 429."),
                        "502": failed("ALL_RETRIES_EXHAUSTED, or AGENT_ERROR without a status of its own."),
                        "503": failed("NO_AVAILABLE_INSTANCE."),
                        "504": failed("DEADLINE_EXCEEDED."),
                        "default": failed("AGENT_ERROR: the agent's business error, its status passed through.")
                    }
                }
            },
            "/v1/openapi.json": { "get": { "summary": "This document", "responses": { "200": { "description": "OpenAPI 3 JSON" } } } },
            "/v1/broadcast": {
                "post": {
                    "summary": "Deliver one envelope to every routable instance of a capability (fan-out)",
                    "description": "Same envelope and checks as /v1/invoke. 200 {request_id, capability, duration_ms, outcomes: [{agent_id, status, output | error}]}; a refused request answers the failed result envelope.",
                    "security": [{ "bearer": [] }],
                    "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/InvokeRequest" } } } },
                    "responses": {
                        "200": { "description": "one outcome per instance" },
                        "default": failed("refused: a failed result envelope with a stable code")
                    }
                }
            },
            "/v1/tasks": {
                "post": {
                    "summary": "Submit an asynchronous task: the invoke envelope plus an optional callback {url, secret_ref?}",
                    "description": "202 {task_id, status: pending} once durably stored; a repeated request_id returns 200 with the existing task. Needs the router to run with --redis (else 501 TASKS_DISABLED).",
                    "security": [{ "bearer": [] }],
                    "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object" } } } },
                    "responses": {
                        "202": { "description": "stored and queued" },
                        "200": { "description": "this request_id was submitted before: the existing task" },
                        "default": { "description": "refused; body {error: {code, message, retryable}}" }
                    }
                }
            },
            "/v1/tasks/{task_id}": {
                "get": {
                    "summary": "A task's state, attempts, transitions and result",
                    "security": [{ "bearer": [] }],
                    "parameters": [{ "name": "task_id", "in": "path", "required": true, "schema": { "type": "string" } }],
                    "responses": { "200": { "description": "the task" }, "default": { "description": "error body" } }
                }
            },
            "/v1/tasks/{task_id}/cancel": {
                "post": {
                    "summary": "Cancel a task that has not ended (a pending one is never delivered)",
                    "security": [{ "bearer": [] }],
                    "parameters": [{ "name": "task_id", "in": "path", "required": true, "schema": { "type": "string" } }],
                    "responses": { "200": { "description": "the canceled task" }, "default": { "description": "error body" } }
                }
            },
            "/v1/tasks/{task_id}/events": {
                "get": {
                    "summary": "Server-sent events: one `state` event per state the task enters; the last carries the result",
                    "security": [{ "bearer": [] }],
                    "parameters": [{ "name": "task_id", "in": "path", "required": true, "schema": { "type": "string" } }],
                    "responses": { "200": { "description": "text/event-stream" }, "default": { "description": "error body" } }
                }
            },
            "/v1/sessions/{session_id}/results": {
                "get": {
                    "summary": "Finished tasks of a session after a cursor, for callers that reconnect",
                    "security": [{ "bearer": [] }],
                    "parameters": [
                        { "name": "session_id", "in": "path", "required": true, "schema": { "type": "string" } },
                        { "name": "after", "in": "query", "required": false, "schema": { "type": "string" } },
                        { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer" } }
                    ],
                    "responses": { "200": { "description": "{session_id, results: [{cursor, task_id, status, result}], next_after}" } }
                }
            },
            "/healthz": { "get": { "summary": "Liveness", "responses": { "200": { "description": "ok" } } } },
            "/readyz": { "get": {
                "summary": "Readiness: a routing snapshot exists and is not too stale",
                "responses": { "200": { "description": "ready" }, "503": { "description": "no snapshot, or registry lost too long" } }
            } },
            "/metrics": { "get": { "summary": "Prometheus metrics", "responses": { "200": { "description": "text exposition format" } } } }
        }
    })
}
