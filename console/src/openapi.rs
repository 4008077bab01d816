//! The console's routes in the router's OpenAPI description
//! (`GET /v1/openapi.json`): sign-in, the operator reads and the relayed
//! registry actions. The page uses nothing that is not described here.

use serde_json::{json, Map, Value};

/// Every console path with each of its methods.
pub const PATHS: [(&str, &str); 31] = [
    ("/console", "get"),
    ("/v1/console/links", "post"),
    ("/v1/console/session", "get"),
    ("/v1/console/session", "post"),
    ("/v1/console/session", "delete"),
    ("/v1/routing/instances", "get"),
    ("/v1/routing/capabilities", "get"),
    ("/v1/routing/changes", "get"),
    ("/v1/routing/history", "get"),
    ("/v1/requests", "get"),
    ("/v1/requests/{request_id}", "get"),
    ("/v1/backlog", "get"),
    ("/v1/agents/{agent_id}/weight", "put"),
    ("/v1/agents/{agent_id}/drain", "post"),
    ("/v1/heartbeats", "get"),
    ("/v1/capabilities/{name}/split", "get"),
    ("/v1/capabilities/{name}/split", "put"),
    ("/v1/capabilities/{name}/split", "delete"),
    ("/v1/trail", "get"),
    ("/v1/trail/chains", "get"),
    ("/v1/trail/chains/{router}/records", "get"),
    ("/v1/trail/chains/{router}/heads", "get"),
    ("/v1/trail/inputs", "get"),
    ("/v1/routing/access", "get"),
    ("/v1/access-requests", "get"),
    ("/v1/access-requests/{id}/approve", "post"),
    ("/v1/access-requests/{id}/deny", "post"),
    ("/v1/grants/{id}", "delete"),
    ("/v1/capabilities/{name}/policy", "get"),
    ("/v1/capabilities/{name}/policy", "put"),
    ("/v1/capabilities/{name}/policy", "delete"),
];

fn failed(description: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ResultEnvelope" } } }
    })
}

fn object(description: &str, properties: Value) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "type": "object", "properties": properties } } }
    })
}

/// An operator route's answers: `ok` plus the refusals every one of them shares.
fn operator(ok: Value, more: Vec<(&str, Value)>) -> Value {
    let mut responses = Map::new();
    responses.insert("200".into(), ok);
    responses.insert(
        "401".into(),
        failed("UNAUTHENTICATED: no, a bad or expired bearer token; or a console session cookie that expired (details.reason `session_expired`) or is not valid here (`session_invalid`)."),
    );
    responses.insert(
        "403".into(),
        failed("FORBIDDEN: the caller is not under `operators:` in acl.yaml (details.reason `not_an_operator`), or a session cookie came without the `x-agent-reach-console` header (`console_header_missing`)."),
    );
    responses.insert("405".into(), failed("METHOD_NOT_ALLOWED."));
    for (status, answer) in more {
        responses.insert(status.into(), answer);
    }
    Value::Object(responses)
}

/// Operators: a bearer token, or the console's session cookie with the page's header.
fn security() -> Value {
    json!([{ "bearer": [] }, { "consoleSession": [], "consolePage": [] }])
}

/// A relayed registry route: `summary`, and `extra` (its parameters and body).
fn relayed(summary: &str, extra: Value) -> Value {
    let mut operation = json!({
        "summary": summary,
        "description": "The registry's operator route (DESIGN §2.9), relayed with the operator's own token: the same body and the registry's own answer and codes (for example SPLIT_NOT_FOUND, INVALID_WEIGHT, AGENT_NOT_FOUND). The change is logged with the operator's name.",
        "security": security(),
        "responses": operator(
            json!({ "description": "The registry's answer.", "content": { "application/json": { "schema": { "type": "object" } } } }),
            vec![("502", failed("ALL_RETRIES_EXHAUSTED: no registry answered (details.reason `registry_unreachable`)."))],
        )
    });
    if let (Value::Object(operation), Value::Object(extra)) = (&mut operation, extra) {
        operation.extend(extra);
    }
    operation
}

/// `GET /v1/heartbeats`: relayed like the operator routes, with its own answer.
fn heartbeats() -> Value {
    let mut operation = relayed(
        "Every live instance's last heartbeat age, from its lease in etcd (operators; relayed to the registry)",
        json!({}),
    );
    let heartbeat = json!({
        "type": "object",
        "properties": {
            "agent_id": { "type": "string" },
            "lease_id": { "type": "integer" },
            "ttl_s": { "type": "integer", "description": "The TTL etcd granted the lease." },
            "remaining_s": { "type": "integer", "description": "Whole seconds before the lease expires without another heartbeat." },
            "age_s": { "type": "integer", "description": "Whole seconds (rounded up) since a heartbeat last renewed the lease: ttl_s - remaining_s. An etcd leader change renews every lease, which reads as 0." }
        }
    });
    operation["description"] = json!("The registry's `GET /v1/heartbeats` (DESIGN §2.9), relayed with the operator's own token. The registry reads each instance's lease from etcd (LeaseTimeToLive), so the age is the same whichever registry replica took the heartbeats. An instance whose lease is gone is not listed. The registry's own codes pass through (FORBIDDEN for a caller not under `operators:`, STORE_UNAVAILABLE when etcd does not answer).");
    operation["responses"]["200"] = object(
        "The heartbeats, by agent_id.",
        json!({
            "heartbeats": { "type": "array", "items": heartbeat },
            "observed_at_ms": { "type": "integer", "description": "When the registry read the leases (epoch ms)." }
        }),
    );
    operation
}

/// A relayed access route (DESIGN §2.11): the registry decides who may.
fn access_relayed(summary: &str, extra: Value) -> Value {
    let mut operation = relayed(summary, extra);
    operation["description"] = json!("The registry's access route (DESIGN §2.11), relayed with the operator's own token: the registry's own answer and codes pass through (FORBIDDEN with details.reason `not_an_owner` for an operator that acl.yaml's `owners:` does not name an approver of the capability, ACCESS_REQUEST_NOT_FOUND, GRANT_NOT_FOUND, ALREADY_DECIDED). Logged with the operator's name.");
    operation
}

/// The access section's paths (DESIGN §2.11), beside the rest.
fn access_paths() -> Value {
    json!({
        "/v1/routing/access": { "get": {
            "summary": "Who may call what on this router: acl.yaml's `permissions` and `owners`, and the access grants it applies on top of them as its Watch brought them (operators)",
            "security": security(),
            "responses": operator(object("The file's rules and the grants.", json!({
                "permissions": { "type": "array", "items": { "type": "object", "properties": { "caller": { "type": "string" }, "allow": { "type": "array", "items": { "type": "string" } } } } },
                "owners": { "type": "array", "items": { "type": "object", "properties": { "capability": { "type": "string" }, "approvers": { "type": "array", "items": { "type": "string" } } } } },
                "grants": { "type": "array", "items": { "type": "object", "properties": {
                    "id": { "type": "string" }, "caller": { "type": "string" }, "capability": { "type": "string" },
                    "granted_by": { "type": "string" }, "granted_at_ms": { "type": "integer" },
                    "expires_at_ms": { "type": "integer", "nullable": true }, "request_id": { "type": "string" },
                    "live": { "type": "boolean", "description": "False once past its expiry: it allows nothing, and stays listed until the registry removes it." }
                } } }
            })), vec![])
        } },
        "/v1/access-requests": { "get": access_relayed("Access requests, oldest first (relayed to the registry; an operator sees every one)", json!({
            "parameters": [{ "name": "status", "in": "query", "required": false, "schema": { "type": "string", "enum": ["pending", "approved", "denied", "revoked", "expired"] } }]
        })) },
        "/v1/access-requests/{id}/approve": { "post": access_relayed("Approve a pending access request into a grant every router applies (an approver of its capability; relayed to the registry)", json!({
            "parameters": [{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }],
            "requestBody": { "required": false, "content": { "application/json": { "schema": { "type": "object", "properties": { "note": { "type": "string", "maxLength": 1000 } } } } } }
        })) },
        "/v1/access-requests/{id}/deny": { "post": access_relayed("Deny a pending access request (an approver of its capability; relayed to the registry)", json!({
            "parameters": [{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }],
            "requestBody": { "required": false, "content": { "application/json": { "schema": { "type": "object", "properties": { "note": { "type": "string", "maxLength": 1000 } } } } } }
        })) },
        "/v1/grants/{id}": { "delete": access_relayed("Revoke an access grant: every router refuses its calls once the Watch brings the removal (approvers of its capability, operators; relayed to the registry)", json!({
            "parameters": [{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }]
        })) }
    })
}

/// The console's entries of `paths`, its security schemes and its schemas.
pub fn paths() -> (Map<String, Value>, Map<String, Value>, Map<String, Value>) {
    let name = json!([{ "name": "name", "in": "path", "required": true, "schema": { "type": "string" } }]);
    let paths = json!({
        "/console": { "get": {
            "summary": "The operator console: one page, every asset embedded in the router (docs/console.md)",
            "responses": { "200": { "description": "HTML", "content": { "text/html": { "schema": { "type": "string" } } } } }
        } },
        "/v1/console/links": { "post": {
            "summary": "A short-lived sign-in link for the calling operator (`agent-reach console` prints it)",
            "security": [{ "bearer": [] }],
            "requestBody": { "required": false, "content": { "application/json": { "schema": { "type": "object", "properties": { "ttl_s": { "type": "integer", "minimum": 1, "maximum": 600, "description": "The link's life; default 120 s." } } } } } },
            "responses": operator(
                object("The link: open `path` on this router (or any replica sharing its assertion key).", json!({ "path": { "type": "string" }, "code": { "type": "string" }, "operator": { "type": "string" }, "expires_at_ms": { "type": "integer" } })),
                vec![("400", failed("INVALID_ENVELOPE: `ttl_s` out of 1..=600 (details.field), or not JSON."))],
            )
        } },
        "/v1/console/session": {
            "get": {
                "summary": "Who is signed in",
                "security": security(),
                "responses": operator(object("The operator.", json!({ "operator": { "type": "string" } })), vec![])
            },
            "post": {
                "summary": "Exchange a sign-in link's code for the session cookie (HttpOnly, SameSite=Strict, 8 h)",
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object", "required": ["code"], "properties": { "code": { "type": "string" } } } } } },
                "responses": operator(
                    object("Signed in; `Set-Cookie: agent_reach_console=…`.", json!({ "operator": { "type": "string" }, "expires_at_ms": { "type": "integer" } })),
                    vec![
                        ("400", failed("INVALID_ENVELOPE: the body is not {\"code\": \"…\"}.")),
                        ("403", failed("FORBIDDEN (details.reason `console_header_missing`): sent without the `x-agent-reach-console` header, so not from the console's page; or the link's operator is no longer under `operators:`.")),
                        ("401", failed("UNAUTHENTICATED: the link expired (details.reason `link_expired`), is not valid (`link_invalid`), or the token it carries no longer verifies.")),
                    ],
                )
            },
            "delete": {
                "summary": "Sign out: the session cookie is cleared",
                "responses": { "204": { "description": "Signed out." } }
            }
        },
        "/v1/routing/instances": { "get": {
            "summary": "Every instance in this router's snapshot by capability and version: status, weight, health score 0–100, breaker, in flight (operators)",
            "security": security(),
            "responses": operator(object("The instances and the snapshot's freshness.", json!({ "snapshot": { "type": "object" }, "instances": { "type": "array", "items": { "type": "object" } } })), vec![])
        } },
        "/v1/routing/changes": { "get": {
            "summary": "adaptive's recent weight changes on this router, newest first, each with its reason, e.g. \"failure rate 31 % between 02:00 and 03:00 UTC for 5 days\" (operators)",
            "security": security(),
            "parameters": [
                { "name": "capability", "in": "query", "required": false, "schema": { "type": "string" } },
                { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 0 }, "description": "At most this many (clamped to 1..=1000; default 50)." }
            ],
            "responses": operator(object("The changes (the last 512 are kept).", json!({
                "bucket_ms": { "type": "integer" }, "capacity": { "type": "integer" },
                "changes": { "type": "array", "items": { "type": "object", "properties": {
                    "at_ms": { "type": "integer" }, "capability": { "type": "string" }, "version": { "type": "string" },
                    "agent_id": { "type": "string" }, "from_permille": { "type": "integer" }, "to_permille": { "type": "integer" },
                    "target_permille": { "type": "integer" }, "reason": { "type": "string" }
                } } }
            })), vec![("400", failed("INVALID_QUERY."))])
        } },
        "/v1/routing/history": { "get": {
            "summary": "A capability's outcome history on this router (merged across routers with --redis): per instance and version, the hourly buckets of the last week holding attempts (succeeded, agent_error, timeout, server_error, p50/p99) and what adaptive predicts now (operators)",
            "security": security(),
            "parameters": [{ "name": "capability", "in": "query", "required": true, "schema": { "type": "string" } }],
            "responses": operator(object("The history.", json!({
                "capability": { "type": "string" }, "bucket_ms": { "type": "integer" }, "now_bucket": { "type": "integer" },
                "instances": { "type": "array", "items": { "type": "object" } }
            })), vec![
                ("400", failed("INVALID_QUERY: no `capability` (details.field).")),
                ("404", failed("CAPABILITY_NOT_FOUND: no instance of it in this router's snapshot.")),
            ])
        } },
        "/v1/routing/capabilities": { "get": {
            "summary": "Every capability: versions, traffic split, default policy, adaptive's last weight changes, and over the last five minutes of this router's recent calls: calls, failure rate, p50/p90/p99 (operators)",
            "security": security(),
            "responses": operator(object("The capabilities.", json!({ "window_s": { "type": "integer" }, "ring_capacity": { "type": "integer" }, "capabilities": { "type": "array", "items": { "type": "object" } } })), vec![])
        } },
        "/v1/requests": { "get": {
            "summary": "This router's recent calls, newest first, from its bounded in-memory ring (operators)",
            "security": security(),
            "parameters": [
                { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 0 }, "description": "At most this many (clamped to 1..=1000; default 50)." },
                { "name": "outcome", "in": "query", "required": false, "schema": { "type": "string", "enum": ["failed", "any"] } },
                { "name": "capability", "in": "query", "required": false, "schema": { "type": "string" } }
            ],
            "responses": operator(object("The calls.", json!({ "calls": { "type": "array", "items": { "$ref": "#/components/schemas/RecentCall" } }, "ring_capacity": { "type": "integer" } })), vec![("400", failed("INVALID_QUERY."))])
        } },
        "/v1/requests/{request_id}": { "get": {
            "summary": "A call by request id: route, attempts and instances, durations, outcome, trace id; and the task record for a task (operators)",
            "security": security(),
            "parameters": [
                { "name": "request_id", "in": "path", "required": true, "schema": { "type": "string", "maxLength": 128 } },
                { "name": "caller", "in": "query", "required": false, "schema": { "type": "string" }, "description": "The submitting caller: finds a task by (caller, request id) before any of its deliveries ended." }
            ],
            "responses": operator(
                object("Every call with this id this router holds (a task's deliveries are several), newest first, and the task.", json!({ "request_id": { "type": "string" }, "calls": { "type": "array", "items": { "$ref": "#/components/schemas/RecentCall" } }, "task": { "type": "object", "nullable": true } })),
                vec![
                    ("400", failed("INVALID_QUERY: the id is longer than 128 characters.")),
                    ("404", failed("NOT_FOUND (details.reason `request_not_found`): not among this router's recent calls; older, or answered by another replica.")),
                ],
            )
        } },
        "/v1/trail": { "get": {
            "summary": "One collaboration's trail records, oldest first, every router replica's: by session, run or request id; `view=tree` adds the tree of hops (operators and auditors; DESIGN §3.13)",
            "security": security(),
            "parameters": [
                { "name": "session_id", "in": "query", "required": false, "schema": { "type": "string", "maxLength": 256 } },
                { "name": "run_id", "in": "query", "required": false, "schema": { "type": "string", "maxLength": 256 } },
                { "name": "request_id", "in": "query", "required": false, "schema": { "type": "string", "maxLength": 256 } },
                { "name": "cursor", "in": "query", "required": false, "schema": { "type": "string" }, "description": "An earlier answer's `next_cursor`." },
                { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1, "maximum": 1000 } },
                { "name": "view", "in": "query", "required": false, "schema": { "type": "string", "enum": ["list", "tree"] } }
            ],
            "responses": operator(
                object("The records (DESIGN §9) and, with view=tree, the tree.", json!({ "records": { "type": "array", "items": { "type": "object" } }, "next_cursor": { "type": "string", "nullable": true }, "tree": { "type": "array", "items": { "type": "object" } } })),
                vec![
                    ("400", failed("INVALID_QUERY: not exactly one of session_id, run_id, request_id; a bad cursor or view.")),
                    ("501", failed("TRAIL_DISABLED: this router keeps no trail (no --redis, or --trail off).")),
                    ("503", failed("TASK_STORE_UNAVAILABLE: Redis did not answer.")),
                ],
            )
        } },
        "/v1/trail/chains": { "get": {
            "summary": "The tenant's trail chains (one per router replica start), newest first (operators and auditors)",
            "security": security(),
            "responses": operator(object("The chains.", json!({ "chains": { "type": "array", "items": { "type": "object", "properties": { "router": { "type": "string" }, "last_at_ms": { "type": "integer" } } } } })), vec![("501", failed("TRAIL_DISABLED."))])
        } },
        "/v1/trail/chains/{router}/records": { "get": {
            "summary": "A chain's records as stored (body and hash), in order: what `agent-reach trail verify` checks (operators and auditors)",
            "security": security(),
            "parameters": [
                { "name": "router", "in": "path", "required": true, "schema": { "type": "string" } },
                { "name": "after", "in": "query", "required": false, "schema": { "type": "string" }, "description": "An earlier answer's `next_after` (a stream id, `MS-SEQ`)." },
                { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1, "maximum": 10000 } }
            ],
            "responses": operator(object("The records.", json!({ "records": { "type": "array", "items": { "type": "object", "properties": { "id": { "type": "string" }, "body": { "type": "string" }, "hash": { "type": "string" } } } }, "next_after": { "type": "string", "nullable": true } })), vec![("400", failed("INVALID_QUERY: a bad `after`.")), ("404", failed("NOT_FOUND: not a chain name."))])
        } },
        "/v1/trail/chains/{router}/heads": { "get": {
            "summary": "A chain's signed segment heads (JWS, the router's assertion key), in order (operators and auditors)",
            "security": security(),
            "parameters": [
                { "name": "router", "in": "path", "required": true, "schema": { "type": "string" } },
                { "name": "after", "in": "query", "required": false, "schema": { "type": "string" } },
                { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1, "maximum": 10000 } }
            ],
            "responses": operator(object("The heads.", json!({ "heads": { "type": "array", "items": { "type": "object", "properties": { "id": { "type": "string" }, "jws": { "type": "string" } } } }, "next_after": { "type": "string", "nullable": true } })), vec![("400", failed("INVALID_QUERY: a bad `after`.")), ("404", failed("NOT_FOUND: not a chain name."))])
        } },
        "/v1/trail/inputs": { "get": {
            "summary": "The newest records of a capability that hold their input, newest first: what a canary by replay samples (operators and auditors)",
            "security": security(),
            "parameters": [
                { "name": "capability", "in": "query", "required": true, "schema": { "type": "string" } },
                { "name": "limit", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1, "maximum": 1000 } }
            ],
            "responses": operator(object("The records.", json!({ "records": { "type": "array", "items": { "type": "object" } } })), vec![("400", failed("INVALID_QUERY: no or a bad capability name."))])
        } },
        "/v1/backlog": { "get": {
            "summary": "The slow path: tasks waiting by capability and priority, running by priority, the dead letters' count (operators)",
            "security": security(),
            "responses": operator(
                object("The slow path.", json!({ "waiting": { "type": "array" }, "running": { "type": "array" }, "dead_letters": { "type": "integer" } })),
                vec![
                    ("501", failed("TASKS_DISABLED: this router runs without --redis.")),
                    ("503", failed("TASK_STORE_UNAVAILABLE: Redis did not answer.")),
                ],
            )
        } },
        "/v1/agents/{agent_id}/weight": { "put": relayed("Change a live instance's weight (operators; relayed to the registry)", json!({
            "parameters": [{ "name": "agent_id", "in": "path", "required": true, "schema": { "type": "string" } }],
            "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object", "required": ["weight"], "properties": { "weight": { "type": "integer", "minimum": 1, "maximum": 1000 } } } } } }
        })) },
        "/v1/agents/{agent_id}/drain": { "post": relayed("Drain an instance: its status becomes `draining` (final), routers send it no new call, its heartbeats keep its lease until it leaves (operators; relayed to the registry)", json!({
            "parameters": [{ "name": "agent_id", "in": "path", "required": true, "schema": { "type": "string" } }]
        })) },
        "/v1/heartbeats": { "get": heartbeats() },
        "/v1/capabilities/{name}/split": {
            "get": relayed("A capability's traffic split (operators; relayed to the registry)", json!({ "parameters": name })),
            "put": relayed("Split unpinned calls between versions (operators; relayed to the registry)", json!({
                "parameters": name,
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object", "required": ["weights"], "properties": { "weights": { "type": "object", "additionalProperties": { "type": "integer", "minimum": 0, "maximum": 10000 } } } } } } }
            })),
            "delete": relayed("Remove a capability's traffic split (operators; relayed to the registry)", json!({ "parameters": name }))
        },
        "/v1/capabilities/{name}/policy": {
            "get": relayed("A capability's default selection policy (operators; relayed to the registry)", json!({ "parameters": name })),
            "put": relayed("Set the policy a capability's calls use when they name none (operators; relayed to the registry)", json!({
                "parameters": name,
                "requestBody": { "required": true, "content": { "application/json": { "schema": { "type": "object", "required": ["policy"], "properties": { "policy": { "type": "string", "description": "weighted_round_robin, least_connections, consistent_hash, p2c_ewma, adaptive or plugin:NAME" } } } } } }
            })),
            "delete": relayed("Remove a capability's default policy: its calls use the router's default again (operators; relayed to the registry)", json!({ "parameters": name }))
        }
    });
    let schemes = json!({
        "consoleSession": { "type": "apiKey", "in": "cookie", "name": super::COOKIE, "description": "The console's session (POST /v1/console/session)." },
        "consolePage": { "type": "apiKey", "in": "header", "name": super::PAGE_HEADER, "description": "Any value; required with the session cookie (a page on another site cannot send it)." }
    });
    let schemas = json!({
        "RecentCall": {
            "type": "object",
            "description": "One call from the router's recent-calls ring.",
            "properties": {
                "request_id": { "type": "string" }, "task_id": { "type": "string", "nullable": true },
                "capability": { "type": "string" }, "capability_version": { "type": "string", "nullable": true },
                "caller": { "type": "string", "nullable": true }, "session_id": { "type": "string", "nullable": true },
                "trace_id": { "type": "string" }, "entry": { "type": "string", "enum": ["call", "delivery"] },
                "started_at_ms": { "type": "integer" }, "duration_ms": { "type": "number" },
                "outcome": { "type": "string", "enum": ["succeeded", "failed"] },
                "error": { "type": "object", "nullable": true, "properties": { "code": { "type": "string" }, "message": { "type": "string" } } },
                "attempts": { "type": "array", "items": { "type": "object", "properties": {
                    "attempt": { "type": "integer" }, "agent_id": { "type": "string" }, "endpoint": { "type": "string" },
                    "duration_ms": { "type": "number" },
                    "outcome": { "type": "string", "description": "succeeded, accepted, failed, or the retried reason (connect, reset, timeout, unavailable, overloaded, …)" }
                } } }
            }
        }
    });
    let as_map = |value: Value| match value {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    let mut paths = as_map(paths);
    paths.extend(as_map(access_paths()));
    (paths, as_map(schemes), as_map(schemas))
}
