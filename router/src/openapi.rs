//! The OpenAPI 3 description of the router's external API, served at
//! `GET /v1/openapi.json`. A test checks it against the routes and the
//! envelope types, so it cannot drift silently.

use std::sync::OnceLock;

use serde_json::{json, Value};

use agent_reach_pipeline::error::Code;

/// Paths the router serves, with their methods (the test compares with `http::routes`).
pub const PATHS: [(&str, &str); 18] = [
    ("/v1/invoke", "post"),
    ("/v1/broadcast", "post"),
    ("/v1/tasks", "post"),
    ("/v1/tasks/{task_id}", "get"),
    ("/v1/tasks/{task_id}/cancel", "post"),
    ("/v1/tasks/{task_id}/events", "get"),
    ("/v1/tasks/{task_id}/result", "post"),
    ("/v1/dead-letters", "get"),
    ("/v1/dead-letters/{id}", "get"),
    ("/v1/dead-letters/{id}/replay", "post"),
    ("/v1/sessions/{session_id}/results", "get"),
    ("/v1/tenants", "get"),
    ("/v1/openapi.json", "get"),
    ("/.well-known/jwks.json", "get"),
    ("/.well-known/oauth-protected-resource", "get"),
    ("/healthz", "get"),
    ("/readyz", "get"),
    ("/metrics", "get"),
];

pub fn document() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(build)
}

/// A failure answer: the failed result envelope (every route's one shape).
fn failed(description: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ResultEnvelope" } } }
    })
}

fn ok(description: &str, schema: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } }
    })
}

/// A stored task's answer, with the links to follow it (OpenAPI links: what a
/// client, or a fuzzer's stateful phase, does next with `task_id`).
fn accepted_task(description: &str) -> Value {
    let mut answer = ok(description, "TaskAccepted");
    let follow =
        |operation: &str| json!({ "operationId": operation, "parameters": { "task_id": "$response.body#/task_id" } });
    answer["links"] =
        json!({ "status": follow("getTask"), "cancel": follow("cancelTask"), "events": follow("taskEvents") });
    answer
}

fn text(description: &str) -> Value {
    json!({ "description": description, "content": { "text/plain": { "schema": { "type": "string" } } } })
}

/// Failures every authenticated route can answer.
fn authenticated(mut responses: serde_json::Map<String, Value>) -> Value {
    responses.insert(
        "401".into(),
        failed(
            "UNAUTHENTICATED: no, a malformed, expired or forged bearer token; or an \
             `agent-reach-upstream` assertion not believed (details.reason `upstream_*`).",
        ),
    );
    responses.insert("405".into(), failed("METHOD_NOT_ALLOWED."));
    Value::Object(responses)
}

/// Failures of the task routes (the slow path).
fn task_failures(responses: &mut serde_json::Map<String, Value>) {
    responses.insert(
        "501".into(),
        failed("TASKS_DISABLED: this router runs without --redis."),
    );
    responses.insert(
        "503".into(),
        failed("TASK_STORE_UNAVAILABLE: Redis is unreachable; retry shortly."),
    );
}

fn map(entries: Vec<(&str, Value)>) -> serde_json::Map<String, Value> {
    entries
        .into_iter()
        .map(|(key, value)| (key.to_string(), value))
        .collect()
}

fn task_id_parameter() -> Value {
    json!([{ "name": "task_id", "in": "path", "required": true, "schema": { "type": "string" } }])
}

fn dead_letter_id_parameter() -> Value {
    json!([{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" },
             "description": "A dead letter's `id` (`MS-SEQ`) from the list; anything else is 404 DEAD_LETTER_NOT_FOUND." }])
}

/// The answers of the operator routes over dead letters (`operators:` in acl.yaml).
fn operator_failures(responses: &mut serde_json::Map<String, Value>) {
    responses.insert(
        "403".into(),
        failed("FORBIDDEN: the caller is not in acl.yaml's `operators` (details.reason `not_an_operator`)."),
    );
    task_failures(responses);
}

fn build() -> Value {
    let codes: Vec<&str> = Code::ALL.iter().map(|code| code.as_str()).collect();
    let envelope_failures = || {
        vec![
            ("400", failed("INVALID_ENVELOPE (details.field names the field).")),
            (
                "402",
                failed("BUDGET_EXHAUSTED: the delegation chain's budget has no call or cost left."),
            ),
            (
                "403",
                failed(
                    "FORBIDDEN (details name caller and capability, and the chain for a chained call); \
                     DEPTH_EXCEEDED or LOOP_DETECTED for a delegation chain too deep or looping.",
                ),
            ),
            (
                "404",
                failed("CAPABILITY_NOT_FOUND or VERSION_NOT_FOUND (details.available lists versions)."),
            ),
            ("413", failed("PAYLOAD_TOO_LARGE (details.limit_bytes).")),
        ]
    };
    let mut invoke = map(envelope_failures());
    invoke.extend(map(vec![
        (
            "200",
            ok(
                "Succeeded: `status` is `succeeded` and `output` holds the agent's answer.",
                "ResultEnvelope",
            ),
        ),
        (
            "422",
            failed("SCHEMA_MISMATCH (details.errors[].pointer), or an agent's own 422 as AGENT_ERROR."),
        ),
        ("429", failed("OVERLOADED: every instance tried answered 429; or RATE_LIMITED: the caller is over its acl.yaml limits (Retry-After says when to come back).")),
        (
            "502",
            failed("ALL_RETRIES_EXHAUSTED, OUTPUT_SCHEMA_MISMATCH (the answer broke the output schema; details.errors[].pointer, details.agent_id), or AGENT_ERROR without a status of its own."),
        ),
        ("503", failed("NO_AVAILABLE_INSTANCE.")),
        (
            "504",
            failed("DEADLINE_EXCEEDED; or an agent's own 504 as AGENT_ERROR (details.agent_code, e.g. DEADLINE_EXCEEDED when the agent saw the deadline pass first)."),
        ),
        (
            "default",
            failed("AGENT_ERROR: the agent's business error, its status passed through."),
        ),
    ]));
    let mut broadcast = map(envelope_failures());
    broadcast.extend(map(vec![
        (
            "200",
            ok(
                "Synchronous: one outcome per instance; asynchronous: this request_id was submitted before.",
                "BroadcastAnswer",
            ),
        ),
        (
            "202",
            ok(
                "Asynchronous (`?async=true`): the parent task and a child task per instance, stored.",
                "BroadcastTask",
            ),
        ),
        ("422", failed("SCHEMA_MISMATCH.")),
        (
            "501",
            failed("TASKS_DISABLED: `?async=true` on a router without --redis."),
        ),
        (
            "503",
            failed("NO_AVAILABLE_INSTANCE, or TASK_STORE_UNAVAILABLE (asynchronous)."),
        ),
        ("504", failed("DEADLINE_EXCEEDED: the deadline had passed.")),
    ]));
    broadcast.insert("400".into(), failed("INVALID_ENVELOPE, INVALID_CALLBACK, or INVALID_QUERY (an unknown query parameter or a non-boolean `async`)."));
    let mut submit = map(vec![
        ("202", accepted_task("Stored and queued.")),
        (
            "200",
            accepted_task("This request_id was submitted before: the existing task."),
        ),
        (
            "400",
            failed("INVALID_ENVELOPE (details.field) or INVALID_CALLBACK (details.reason)."),
        ),
        ("403", failed("FORBIDDEN: the caller may not call the capability.")),
        ("413", failed("PAYLOAD_TOO_LARGE.")),
        (
            "429",
            failed("RATE_LIMITED: the caller is over its acl.yaml limits (Retry-After)."),
        ),
    ]);
    task_failures(&mut submit);
    let mut status = map(vec![
        ("200", ok("The task.", "Task")),
        ("404", failed("TASK_NOT_FOUND (or another caller's task).")),
    ]);
    task_failures(&mut status);
    let mut cancel = map(vec![
        ("200", ok("The canceled task.", "Task")),
        ("404", failed("TASK_NOT_FOUND.")),
        ("409", failed("TASK_CONFLICT: the task has already ended.")),
    ]);
    task_failures(&mut cancel);
    let mut report = map(vec![
        (
            "200",
            ok(
                "Recorded: the task ended with it (`duplicate: false`); or the same report again, which changed nothing (`duplicate: true`).",
                "TaskReported",
            ),
        ),
        (
            "400",
            failed("INVALID_TASK_RESULT: not {\"output\": ...} or {\"error\": {\"code\", \"message\"}} (details.field), or an unreadable body (INVALID_ENVELOPE)."),
        ),
        (
            "403",
            failed("FORBIDDEN: the delivery went to another agent (details.reason `not_the_delivery_agent`)."),
        ),
        ("404", failed("TASK_NOT_FOUND.")),
        (
            "409",
            failed("TASK_CONFLICT: no agent answered this task's delivery 202 (details.reason `not_accepted`), or a different result was recorded already or the task ended otherwise, e.g. at its deadline (`result_conflict`)."),
        ),
        ("413", failed("PAYLOAD_TOO_LARGE.")),
    ]);
    task_failures(&mut report);
    let mut dead_letters = map(vec![
        ("200", ok("Dead letters after `after`, oldest first.", "DeadLetters")),
        (
            "400",
            failed("INVALID_QUERY: an unknown parameter, a non-integer `limit`, or an `after` that is not an id."),
        ),
    ]);
    operator_failures(&mut dead_letters);
    let mut tenants = map(vec![(
        "200",
        ok("Every tenant this router serves (one without a tenant map).", "Tenants"),
    )]);
    operator_failures(&mut tenants);
    let mut dead_letter = map(vec![
        ("200", ok("The dead letter, with the result it holds.", "DeadLetter")),
        ("404", failed("DEAD_LETTER_NOT_FOUND.")),
    ]);
    operator_failures(&mut dead_letter);
    let mut replay = map(vec![
        (
            "200",
            ok(
                "Scheduled: the callback is due now, from its first attempt.",
                "DeadLetterReplayed",
            ),
        ),
        (
            "404",
            failed("DEAD_LETTER_NOT_FOUND (replayed already), or TASK_NOT_FOUND: its task is past its retention."),
        ),
    ]);
    operator_failures(&mut replay);
    let mut events = map(vec![
        (
            "200",
            json!({
                "description": "Server-sent events: one `state` event per state; the last carries the result.",
                "content": { "text/event-stream": { "schema": {
                    "description": "One event (the stream also carries keep-alive comments).",
                    "type": "object",
                    "required": ["event", "data"],
                    "properties": {
                        "event": { "type": "string", "enum": ["state"] },
                        "data": { "type": "string", "description": "JSON: {task_id, status, at} and, on the last event, result (the result envelope)." }
                    }
                } } }
            }),
        ),
        ("404", failed("TASK_NOT_FOUND.")),
    ]);
    task_failures(&mut events);
    let mut results = map(vec![
        (
            "200",
            ok("The session's finished tasks after the cursor.", "SessionResults"),
        ),
        (
            "400",
            failed("INVALID_QUERY: an unknown query parameter, or `limit`/`after` of the wrong type."),
        ),
    ]);
    task_failures(&mut results);
    let invoke_properties = json!({
        "version": { "type": "string", "enum": ["1.0"] },
        "request_id": { "type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[!-~]+$", "description": "Idempotency key (printable ASCII, no spaces); generated when absent." },
        "session_id": { "type": "string", "description": "Key of consistent_hash." },
        "context_id": { "type": "string" },
        "capability": { "type": "string", "pattern": "^[a-z][a-z0-9_]*(\\.[a-z][a-z0-9_]*)*$" },
        "capability_version": { "type": "string", "description": "Semver requirement; absent means the highest version." },
        "target_policy": { "type": "string", "pattern": "^(weighted_round_robin|weighted_random|least_connections|consistent_hash|p2c_ewma|adaptive|plugin:[a-z][a-z0-9_]{0,63})$", "description": "How the instance is picked (DESIGN §3.4): weighted_round_robin, least_connections, consistent_hash (needs session_id), p2c_ewma, adaptive, or plugin:NAME for a policy plugged into the router. Absent: the capability's policy set by an operator, else weighted_round_robin." },
        "priority": { "type": "string", "enum": ["high", "normal", "low"] },
        "timeout_ms": { "type": "integer", "minimum": 1 },
        "deadline": { "type": "integer", "minimum": 0, "description": "Absolute epoch milliseconds; wins over timeout_ms." },
        "timeout": {
            "type": "object",
            "additionalProperties": false,
            "required": ["value"],
            "properties": { "value": { "type": "integer", "minimum": 1 }, "unit": { "type": "string", "enum": ["ms", "millis", "milliseconds", "s", "sec", "secs", "seconds", "m", "min", "mins", "minutes"] } },
            "description": "The seeds' form of timeout_ms (give one of the two)."
        },
        "trace_id": { "type": "string", "description": "The seeds' trace id: continues that trace when no traceparent header is sent (32 hex digits are the W3C id; any other text is hashed into one)." },
        "source": { "type": "string", "description": "Accepted and ignored: the caller is who its token says." },
        "replay_of": { "type": "string", "description": "A replay of a recorded call (`agent-reach trail replay`): the request id it replays, recorded in the trail (not forwarded)." },
        "budget": { "type": "object", "additionalProperties": false, "minProperties": 1, "description": "A budget for this call and every call made on its behalf down the delegation chain (design §3.15): `calls` in all (this one included) and `cost`, an abstract unit agents report in `usage.cost`; an absent member is no limit of that kind. Ignored on a chained call (the chain's budget binds it). Spent: 402 BUDGET_EXHAUSTED.", "properties": { "calls": { "type": "integer", "minimum": 0, "maximum": 4294967295u64 }, "cost": { "type": "number", "minimum": 0 } } },
        "payload": { "description": "Checked against the capability's input schema." }
    });
    // One call a reader can copy; the fuzz test (sdk/python/tests/test_router_api.py)
    // serves `text.summarize`, so its example phase goes all the way to an agent.
    let example = json!({
        "capability": "text.summarize",
        "capability_version": "^1",
        "session_id": "session-ada",
        "payload": { "text": "Can my order SO-2024001 ship today?" }
    });
    let mut task_properties = invoke_properties.clone();
    task_properties["callback"] = json!({
        "type": "object",
        "nullable": true,
        "description": "POSTed the result when the task ends (signed); null or absent: no callback.",
        "additionalProperties": false,
        "required": ["url"],
        "properties": {
            "url": { "type": "string" },
            "secret_ref": { "type": "string" },
            "type": { "type": "string", "enum": ["http"], "description": "The seeds' form; only http." }
        }
    });
    let operational = |responses: Vec<(&str, Value)>| {
        let mut responses = map(responses);
        responses.insert("405".into(), failed("METHOD_NOT_ALLOWED."));
        Value::Object(responses)
    };
    let mut document = json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Agent-Reach router",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Call a capability by name: authenticated (bearer JWT), authorised (acl.yaml), \
                            schema-checked, routed to a healthy instance, retried on unavailability. \
                            Every failure of every route answers the failed ResultEnvelope with a stable code."
        },
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer", "bearerFormat": "JWT" } },
            "schemas": {
                "InvokeRequest": {
                    "type": "object",
                    "description": "The seeds' envelope is accepted too: msg_id for request_id, agent_capability for capability (a cap: prefix is dropped), weighted_random for weighted_round_robin, timeout, trace_id, source.",
                    "additionalProperties": false,
                    "required": ["capability"],
                    "properties": invoke_properties
                },
                "TaskRequest": {
                    "description": "The invoke envelope plus an optional callback.",
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["capability"],
                    "properties": task_properties
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
                        "error": { "$ref": "#/components/schemas/EnvelopeError" },
                        "budget": {
                            "type": "object",
                            "description": "What was left of the call's delegation budget once it (and all it caused) ended, when it carried one; a member is absent when the budget set no limit of that kind.",
                            "properties": { "calls_left": { "type": "integer" }, "cost_left": { "type": "number" } }
                        }
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
                },
                "BroadcastAnswer": {
                    "type": "object",
                    "required": ["version", "request_id", "duration_ms", "outcomes"],
                    "properties": {
                        "version": { "type": "string" },
                        "request_id": { "type": "string" },
                        "capability": { "type": "string" },
                        "duration_ms": { "type": "integer" },
                        "outcomes": { "type": "array", "items": {
                            "type": "object",
                            "required": ["agent_id", "status"],
                            "properties": {
                                "agent_id": { "type": "string" },
                                "status": { "type": "string", "enum": ["succeeded", "failed"] },
                                "output": {},
                                "error": { "$ref": "#/components/schemas/EnvelopeError" }
                            }
                        } }
                    }
                },
                "BroadcastTask": {
                    "type": "object",
                    "required": ["task_id", "status", "children"],
                    "properties": {
                        "task_id": { "type": "string" },
                        "status": { "type": "string" },
                        "children": { "type": "array", "items": {
                            "type": "object",
                            "required": ["agent_id", "task_id"],
                            "properties": { "agent_id": { "type": "string" }, "task_id": { "type": "string" } }
                        } }
                    }
                },
                "TaskAccepted": {
                    "type": "object",
                    "required": ["task_id", "status"],
                    "properties": {
                        "task_id": { "type": "string" },
                        "status": { "type": "string" },
                        "duplicate": { "type": "boolean" }
                    }
                },
                "Task": {
                    "type": "object",
                    "required": ["task_id", "request_id", "capability", "priority", "status", "attempts", "created_at", "updated_at", "transitions"],
                    "properties": {
                        "task_id": { "type": "string" },
                        "request_id": { "type": "string" },
                        "session_id": { "type": "string", "nullable": true },
                        "capability": { "type": "string" },
                        "priority": { "type": "string", "enum": ["high", "normal", "low"] },
                        "status": { "type": "string", "enum": ["pending", "running", "retrying", "succeeded", "failed", "canceled"] },
                        "attempts": { "type": "integer" },
                        "created_at": { "type": "integer" },
                        "updated_at": { "type": "integer" },
                        "transitions": { "type": "array", "items": {
                            "type": "object",
                            "required": ["status", "at"],
                            "properties": { "status": { "type": "string" }, "at": { "type": "integer" } }
                        } },
                        "result": { "description": "The result envelope once the task has ended (null before)." }
                    }
                },
                "TaskReport": {
                    "description": "An agent's report of a delivery it answered 202: exactly one of `output` or `error`.",
                    "type": "object",
                    "additionalProperties": false,
                    "properties": {
                        "output": { "description": "The agent's output, checked against the capability's output_schema." },
                        "error": {
                            "type": "object",
                            "additionalProperties": false,
                            "required": ["code"],
                            "properties": { "code": { "type": "string", "minLength": 1 }, "message": { "type": "string" } }
                        }
                    }
                },
                "TaskReported": {
                    "type": "object",
                    "required": ["task_id", "status", "duplicate"],
                    "properties": {
                        "task_id": { "type": "string" },
                        "status": { "type": "string", "enum": ["succeeded", "failed"] },
                        "duplicate": { "type": "boolean" }
                    }
                },
                "DeadLetter": {
                    "type": "object",
                    "required": ["id", "task_id", "url", "error"],
                    "properties": {
                        "id": { "type": "string" },
                        "task_id": { "type": "string" },
                        "url": { "type": "string" },
                        "error": { "type": "string", "description": "Why the last attempt failed." },
                        "parked_at": { "type": "integer", "nullable": true, "description": "Epoch ms." },
                        "result": { "description": "The result envelope the callback carried (only when one is shown)." }
                    }
                },
                "Tenants": {
                    "type": "object",
                    "required": ["home", "tenants"],
                    "properties": {
                        "home": { "type": "string", "description": "The home tenant (`--tenant`)." },
                        "tenants": { "type": "array", "items": {
                            "type": "object",
                            "required": ["name", "placement", "quotas", "usage"],
                            "properties": {
                                "name": { "type": "string" },
                                "placement": { "type": "string", "description": "`shared`, or `own Redis URL` (no secrets)." },
                                "acl": { "type": "string", "nullable": true, "description": "The tenant's own ACL file." },
                                "quotas": { "type": "object", "description": "rate_per_s, burst, concurrency, task_backlog (null: unbounded)." },
                                "usage": { "type": "object", "description": "instances, in_flight, requests_total, rate_limited_total (since start), task_backlog (tasks waiting; null without --redis)." }
                            }
                        } }
                    }
                },
                "DeadLetters": {
                    "type": "object",
                    "required": ["dead_letters", "total"],
                    "properties": {
                        "dead_letters": { "type": "array", "items": { "$ref": "#/components/schemas/DeadLetter" } },
                        "total": { "type": "integer", "description": "Dead letters parked in all." },
                        "next_after": { "type": "string", "nullable": true, "description": "Pass as `after` to continue." }
                    }
                },
                "DeadLetterReplayed": {
                    "type": "object",
                    "required": ["id", "task_id", "status"],
                    "properties": {
                        "id": { "type": "string" },
                        "task_id": { "type": "string" },
                        "status": { "type": "string", "enum": ["scheduled"] }
                    }
                },
                "SessionResults": {
                    "type": "object",
                    "required": ["session_id", "results"],
                    "properties": {
                        "session_id": { "type": "string" },
                        "results": { "type": "array", "items": {
                            "type": "object",
                            "required": ["cursor", "task_id", "status"],
                            "properties": {
                                "cursor": { "type": "string" },
                                "task_id": { "type": "string" },
                                "status": { "type": "string" },
                                "result": {}
                            }
                        } },
                        "next_after": { "type": "string", "nullable": true, "description": "Pass as `after` to continue." }
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
                        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/InvokeRequest" }, "example": example } }
                    },
                    "responses": authenticated(invoke)
                }
            },
            "/v1/broadcast": {
                "post": {
                    "summary": "Deliver one envelope to every routable instance of a capability (fan-out)",
                    "description": "Same envelope and checks as /v1/invoke. `?async=true` stores a parent task and a child task per routable instance instead (needs --redis).",
                    "security": [{ "bearer": [] }],
                    "parameters": [{ "name": "async", "in": "query", "required": false, "schema": { "type": "boolean" } }],
                    "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/TaskRequest" }, "example": example } } },
                    "responses": authenticated(broadcast)
                }
            },
            "/v1/tasks": {
                "post": {
                    "summary": "Submit an asynchronous task: the invoke envelope plus an optional callback {url, secret_ref?}",
                    "description": "202 once durably stored; a repeated request_id answers 200 with the existing task. Needs the router to run with --redis.",
                    "security": [{ "bearer": [] }],
                    "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/TaskRequest" }, "example": example } } },
                    "responses": authenticated(submit)
                }
            },
            "/v1/tasks/{task_id}": {
                "get": {
                    "summary": "A task's state, attempts, transitions and result",
                    "operationId": "getTask",
                    "security": [{ "bearer": [] }],
                    "parameters": task_id_parameter(),
                    "responses": authenticated(status)
                }
            },
            "/v1/tasks/{task_id}/cancel": {
                "post": {
                    "summary": "Cancel a task that has not ended (a pending one is never delivered)",
                    "operationId": "cancelTask",
                    "security": [{ "bearer": [] }],
                    "parameters": task_id_parameter(),
                    "responses": authenticated(cancel)
                }
            },
            "/v1/tasks/{task_id}/events": {
                "get": {
                    "summary": "Server-sent events: one `state` event per state the task enters; the last carries the result",
                    "operationId": "taskEvents",
                    "security": [{ "bearer": [] }],
                    "parameters": task_id_parameter(),
                    "responses": authenticated(events)
                }
            },
            "/v1/tasks/{task_id}/result": {
                "post": {
                    "summary": "Report the outcome of a task delivery this agent answered 202 Accepted (DESIGN §8)",
                    "description": "Authenticated as the agent the delivery went to (its token's subject is the agent's name). Accepted once; the same report again answers 200 with `duplicate: true`. The task's deadline still bounds it: unreported by then, it fails with DEADLINE_EXCEEDED.",
                    "security": [{ "bearer": [] }],
                    "parameters": task_id_parameter(),
                    "requestBody": { "required": true, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/TaskReport" }, "example": { "output": { "summary": "…" } } } } },
                    "responses": authenticated(report)
                }
            },
            "/v1/dead-letters": {
                "get": {
                    "summary": "Callbacks that could not be delivered, oldest first (operators)",
                    "security": [{ "bearer": [] }],
                    "parameters": [
                        { "name": "after", "in": "query", "required": false, "schema": { "type": "string", "pattern": "^[0-9]+-[0-9]+$" }, "description": "The `next_after` (or an `id`) of an earlier answer." },
                        { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 0 }, "description": "At most this many (clamped to 1..=1000; default 100)." }
                    ],
                    "responses": authenticated(dead_letters)
                }
            },
            "/v1/dead-letters/{id}": {
                "get": {
                    "summary": "One dead letter with the result it holds (operators)",
                    "security": [{ "bearer": [] }],
                    "parameters": dead_letter_id_parameter(),
                    "responses": authenticated(dead_letter)
                }
            },
            "/v1/dead-letters/{id}/replay": {
                "post": {
                    "summary": "Send a dead letter's callback again, from its first attempt (operators); a last failure parks a new one",
                    "security": [{ "bearer": [] }],
                    "parameters": dead_letter_id_parameter(),
                    "responses": authenticated(replay)
                }
            },
            "/v1/tenants": {
                "get": {
                    "summary": "The tenants this router serves: placement, quotas, usage (operators of the home tenant; DESIGN §8 Tenants)",
                    "security": [{ "bearer": [] }],
                    "responses": authenticated(tenants)
                }
            },
            "/v1/sessions/{session_id}/results": {
                "get": {
                    "summary": "Finished tasks of a session after a cursor, for callers that reconnect",
                    "security": [{ "bearer": [] }],
                    "parameters": [
                        { "name": "session_id", "in": "path", "required": true, "schema": { "type": "string" } },
                        { "name": "after", "in": "query", "required": false, "schema": { "type": "string", "pattern": "^[0-9]+-[0-9]+$" }, "description": "The `next_after` (or a result's `cursor`) of an earlier answer; anything else is 400 INVALID_QUERY." },
                        { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 0 }, "description": "At most this many results (clamped to 1..=1000; default 100)." }
                    ],
                    "responses": authenticated(results)
                }
            },
            "/v1/openapi.json": { "get": { "summary": "This document", "responses": operational(vec![("200", json!({ "description": "OpenAPI 3 JSON", "content": { "application/json": { "schema": { "type": "object" } } } }))]) } },
            "/.well-known/jwks.json": { "get": {
                "summary": "The public keys (RFC 7517 JWKS, Ed25519) that verify the assertion the router puts on every forwarded call; the signing key first, then the published ones",
                "responses": operational(vec![("200", json!({ "description": "JWKS", "content": { "application/jwk-set+json": { "schema": { "type": "object", "required": ["keys"], "properties": { "keys": { "type": "array" } } } } } }))])
            } },
            "/.well-known/oauth-protected-resource": { "get": {
                "summary": "OAuth 2.0 Protected Resource Metadata (RFC 9728): the router's resource identifier and the OIDC issuers whose tokens it accepts, for clients (MCP's) that look for where to get a token; every 401 points here in `WWW-Authenticate: Bearer resource_metadata=…`",
                "responses": operational(vec![
                    ("200", json!({ "description": "The metadata", "content": { "application/json": { "schema": { "type": "object", "required": ["resource", "authorization_servers"], "properties": { "resource": { "type": "string" }, "authorization_servers": { "type": "array", "items": { "type": "string" } }, "bearer_methods_supported": { "type": "array", "items": { "type": "string" } }, "resource_name": { "type": "string" } } } } } })),
                    ("404", failed("NOT_FOUND: the router accepts no OIDC issuer's tokens (no --auth-oidc-issuer)."))
                ])
            } },
            "/healthz": { "get": { "summary": "Liveness", "responses": operational(vec![("200", text("ok"))]) } },
            "/readyz": { "get": {
                "summary": "Readiness: a routing snapshot exists and is not too stale",
                "responses": operational(vec![("200", text("ready, with the snapshot's revision and size")), ("503", text("no snapshot yet, or the registry lost for longer than --max-staleness-s"))])
            } },
            "/metrics": { "get": { "summary": "Prometheus metrics", "responses": operational(vec![("200", text("Prometheus text exposition format"))]) } }
        }
    });
    // The console's routes (`agent_reach_console::openapi`) are described beside the rest.
    let (paths, schemes, schemas) = agent_reach_console::openapi::paths();
    if let Some(all) = document["paths"].as_object_mut() {
        all.extend(paths);
    }
    if let Some(all) = document["components"]["securitySchemes"].as_object_mut() {
        all.extend(schemes);
    }
    if let Some(all) = document["components"]["schemas"].as_object_mut() {
        all.extend(schemas);
    }
    // And the runs' (`agent_reach_runs::openapi`).
    let (paths, schemas) = agent_reach_runs::openapi::paths();
    if let Some(all) = document["paths"].as_object_mut() {
        all.extend(paths);
    }
    if let Some(all) = document["components"]["schemas"].as_object_mut() {
        all.extend(schemas);
    }
    document
}
