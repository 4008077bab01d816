//! Writes the seed corpus, a few valid (and a few classic invalid) inputs
//! per target, into `fuzz/corpus/<target>/`: `cargo run -p agent-reach-fuzz
//! --example seeds`. The files are committed; this says where they came
//! from, and remakes the signed ones (tokens and assertions valid until 2100,
//! made with the targets' public fuzzing keys).

use std::path::Path;

use agent_reach_access::AssertionClaims;
use agent_reach_fuzz::assertion::{AUDIENCE, ISSUER};

/// A target's seeds: file name and bytes.
type Seeds = Vec<(&'static str, Vec<u8>)>;

/// What makes a target's seeds.
type Maker = fn() -> Seeds;

/// 2100-01-01: the signed seeds stay valid.
const FAR: u64 = 4_102_444_800;
const ISSUED: u64 = 1_767_225_600;

fn invoke(body: &str, extra: &str) -> String {
    format!(
        "POST /v1/invoke HTTP/1.1\r\nhost: router\r\nauthorization: Bearer t\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
}

fn front_door() -> Seeds {
    let body = r#"{"capability":"order.query","payload":{"order_id":"o-1"}}"#;
    let chunked = format!(
        "POST /v1/invoke HTTP/1.1\r\nhost: router\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let smuggling = format!(
        "POST /v1/invoke HTTP/1.1\r\nhost: router\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n{}",
        invoke(body, "")
    );
    [
        ("plain", invoke(body, "")),
        (
            "pipelined",
            format!("{}{}", invoke(body, ""), invoke("{}", "traceparent: 00-a-b-01\r\n")),
        ),
        ("chunked", chunked),
        ("cl-and-te", smuggling),
        ("two-lengths", invoke(body, "content-length: 7\r\n")),
        (
            "hand-over-mid-connection",
            format!(
                "{}GET /healthz HTTP/1.1\r\nhost: r\r\n\r\n{}",
                invoke(body, ""),
                invoke(body, "")
            ),
        ),
        ("http10", invoke(body, "").replacen("HTTP/1.1", "HTTP/1.0", 1)),
        (
            "connection-close",
            format!("{}{}", invoke(body, "connection: close\r\n"), invoke(body, "")),
        ),
        ("expect", invoke(body, "expect: 100-continue\r\n")),
        ("bodiless", "POST /v1/invoke HTTP/1.1\r\nhost: r\r\n\r\n".to_string()),
        ("over-the-limit", invoke(&"x".repeat(300), "")),
    ]
    .into_iter()
    .map(|(name, text)| (name, text.into_bytes()))
    .chain([(
        // HTTP/2 with prior knowledge: the preface, SETTINGS, a HEADERS frame
        // (POST, http, `/`, from HPACK's static table) ending the stream.
        "h2-prior-knowledge",
        [
            &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..],
            &[0, 0, 0, 4, 0, 0, 0, 0, 0],
            &[0, 0, 3, 1, 5, 0, 0, 0, 1, 0x83, 0x86, 0x84],
        ]
        .concat(),
    )])
    .collect()
}

fn invoke_envelope() -> Seeds {
    [
        ("minimal", r#"{"capability":"order.query"}"#),
        (
            "full",
            r#"{"version":"1.0","request_id":"r-1","session_id":"s-\u00e9\n","context_id":"c\"1","capability":"order.query","capability_version":"^1.2","target_policy":"consistent_hash","priority":"high","timeout_ms":5000,"deadline":1767225600000,"payload":{"order_id":"o-1","n":[1,2.5,-3e10,null,true]}}"#,
        ),
        ("least-connections", r#"{"capability":"a.b_c.d1","target_policy":"least_connections","capability_version":"*","payload":"text"}"#),
        ("unknown-field", r#"{"capability":"order.query","extra":1}"#),
        ("bad-capability", r#"{"capability":"Order.Query"}"#),
        ("bad-version-req", r#"{"capability":"order.query","capability_version":"x.y"}"#),
        ("hash-without-session", r#"{"capability":"order.query","target_policy":"consistent_hash"}"#),
        ("zero-timeout", r#"{"capability":"order.query","timeout_ms":0}"#),
    ]
    .into_iter()
    .map(|(name, text)| (name, text.as_bytes().to_vec()))
    .collect()
}

fn registration() -> Seeds {
    [
        (
            "minimal",
            r#"{"agent_id":"order_query-1","name":"order_query","endpoint":"http://127.0.0.1:9000/invoke","capabilities":[{"name":"order.query","version":"1.2.0"}]}"#,
        ),
        (
            "full",
            r#"{"agent_id":"order_query-1","name":"order_query","endpoint":"https://agent.example:8443/invoke","protocol":"http","weight":10,"tags":{"zone":"a","team/x":"y"},"ttl_s":30,"status":"ready","capabilities":[{"name":"order.query","version":"1.2.0-rc.1+b5","description":"Looks an order up.","input_schema":{"type":"object","properties":{"order_id":{"type":"string","pattern":"^o-[0-9]+$"}},"required":["order_id"],"$defs":{"n":{"type":"number","minimum":0.5}}},"output_schema":true,"timeout_ms":2000},{"name":"order.detail","version":"2.0.0"}]}"#,
        ),
        (
            "bad-schema",
            r#"{"agent_id":"a-1","name":"a","endpoint":"http://h/","capabilities":[{"name":"a.b","version":"1.0.0","input_schema":{"type":"strnig"}}]}"#,
        ),
        (
            "duplicate",
            r#"{"agent_id":"a-1","name":"a","endpoint":"http://h/","capabilities":[{"name":"a.b","version":"1.0.0"},{"name":"a.b","version":"1.0.0"}]}"#,
        ),
        (
            "credentials",
            r#"{"agent_id":"a-1","name":"a","endpoint":"http://u:p@h/","capabilities":[{"name":"a.b","version":"1.0.0"}]}"#,
        ),
        ("not-an-object", "[]"),
    ]
    .into_iter()
    .map(|(name, text)| (name, text.as_bytes().to_vec()))
    .collect()
}

fn acl() -> Seeds {
    let shipped =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../acl.yaml")).expect("the repository's acl.yaml");
    let patterns = "version: 1\npermissions:\n  - caller: ops\n    allow: [\"*\"]\n  - caller: \"*\"\n    allow: [health.*, order.detail.v2]\nproviders:\n  - agent: order_query\n    provides: [order.*]\ncontext:\n  - agent: \"*\"\n    read: [user_id]\n  - agent: writer\n    write: [\"*\"]\n";
    let anchors =
        "version: 1\npermissions:\n  - caller: a\n    allow: &caps [x.y, z.*]\n  - caller: b\n    allow: *caps\n";
    vec![
        ("shipped", shipped),
        ("patterns", patterns.as_bytes().to_vec()),
        ("anchors", anchors.as_bytes().to_vec()),
        (
            "every-problem",
            b"version: 2\npermissions:\n  - caller: Bad Name\n    allow: [Order.Query, ok.*]\n".to_vec(),
        ),
        (
            "flow",
            b"{version: 1, providers: [{agent: p, provides: [a.b]}]}".to_vec(),
        ),
    ]
}

fn token() -> Seeds {
    let secret = agent_reach_fuzz::HS256_SECRET;
    let valid = agent_reach_access::token::issue_hs256_at("intent_parser", secret, ISSUED, FAR).expect("signed");
    let expired = agent_reach_access::token::issue_hs256_at("intent_parser", secret, 1, 2).expect("signed");
    let other_key =
        agent_reach_access::token::issue_hs256_at("intent_parser", b"another secret of 32 bytes at least", ISSUED, FAR)
            .expect("signed");
    vec![
        ("valid", format!("Bearer {valid}").into_bytes()),
        ("lowercase-scheme", format!("bearer  {valid} ").into_bytes()),
        ("expired", format!("Bearer {expired}").into_bytes()),
        ("other-key", format!("Bearer {other_key}").into_bytes()),
        // `alg: none`, unsigned.
        (
            "alg-none",
            b"Bearer eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhIiwiZXhwIjo0MTAyNDQ0ODAwfQ.".to_vec(),
        ),
        ("basic", b"Basic dXNlcjpwYXNz".to_vec()),
    ]
}

fn assertion() -> Seeds {
    let key = agent_reach_fuzz::assertion_key();
    let claims = AssertionClaims {
        iss: ISSUER.to_string(),
        sub: "intent_parser".to_string(),
        aud: AUDIENCE.to_string(),
        cap: "order.query".to_string(),
        tenant: "default".to_string(),
        iat: ISSUED,
        exp: FAR,
        ..AssertionClaims::default()
    };
    let sign = |claims: &AssertionClaims| format!("Bearer {}", key.sign(claims).expect("signed")).into_bytes();
    vec![
        ("valid", sign(&claims)),
        (
            "other-audience",
            sign(&AssertionClaims {
                aud: "reply_writer-1".to_string(),
                ..claims.clone()
            }),
        ),
        (
            "other-issuer",
            sign(&AssertionClaims {
                iss: "someone".to_string(),
                ..claims.clone()
            }),
        ),
        (
            "expired",
            sign(&AssertionClaims {
                iat: 1,
                exp: 2,
                ..claims.clone()
            }),
        ),
        (
            "jwks",
            agent_reach_access::assertion::jwks([&key]).to_string().into_bytes(),
        ),
        ("no-kid", b"Bearer eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhIn0.c2ln".to_vec()),
    ]
}

fn workflow() -> Seeds {
    let linear = r#"{"version":"1.0.0","input_schema":{"type":"object","required":["order_id"],"properties":{"order_id":{"type":"string"}}},
"steps":[{"id":"order","capability":"order.lookup","input":{"order_id":"${input.order_id}"}},
{"id":"lines","capability":"stock.check","for_each":"${steps.order.output.items}","max_parallel":4,"input":{"sku":"${item.sku}","count":"${index}"}},
{"id":"say","capability":"any.thing","when":"${steps.order.output.express == true && !(steps.lines.status != \"succeeded\")}",
 "retry":{"max_attempts":3,"backoff_ms":100,"codes":["AGENT_ERROR"]},"timeout_ms":5000,
 "on_failure":{"compensate":{"capability":"any.thing","input":{"undo":"${steps.order.output}"}}},
 "input":"order ${input.order_id}: ${steps.lines.output} $${literal}"}],
"output":{"said":"${steps.say.output}","lines":"${steps.lines.output[0]}"}}"#;
    let yaml = "version: 2.0.0\ninput_schema: {type: object}\noutput_schema: {type: object}\nsteps:\n  - id: a\n    capability: any.thing\n    input: \"${input}\"\n  - id: b\n    capability: any.thing\n    version: \"^1\"\n    depends_on: [a]\n    on_failure: continue\n    input: {x: \"${steps.a.output.x}\", n: 3}\n  - id: c\n    capability: any.thing\n    input: {b: \"${steps.b.status}\", e: \"${steps.b.error.code}\"}\noutput: {c: \"${steps.c.output}\"}\n";
    let cycle = r#"{"version":"1.0.0","input_schema":{},"steps":[{"id":"a","capability":"any.thing","depends_on":["b"],"input":{}},{"id":"b","capability":"any.thing","input":"${steps.a.output}"}],"output":null}"#;
    let mapping = r#"{"version":"1.0.0","input_schema":{"type":"object","properties":{"n":{"type":"integer"}}},"steps":[{"id":"a","capability":"stock.check","input":{"sku":"${input.n}"}}],"output":"${steps.a.output}"}"#;
    let bad = r#"{"version":"1.0.0","input_schema":{},"steps":[{"id":"a","capability":"any.thing","input":"${input.(}"},{"id":"b","capability":"nobody.here","input":"${steps.zz.output}"}],"output":"${item}"}"#;
    let anchors = "x: &a [1, 2, *a]\nversion: 1.0.0\n";
    [
        ("linear-fan-when-retry", linear.to_string()),
        ("yaml-continue", yaml.to_string()),
        ("cycle", cycle.to_string()),
        ("mapping", mapping.to_string()),
        ("unknown-and-unparsed", bad.to_string()),
        ("yaml-anchors", anchors.to_string()),
    ]
    .into_iter()
    .map(|(name, text)| (name, text.into_bytes()))
    .collect()
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let targets: [(&str, Maker); 7] = [
        ("front_door", front_door),
        ("invoke_envelope", invoke_envelope),
        ("registration", registration),
        ("acl", acl),
        ("token", token),
        ("assertion", assertion),
        ("workflow", workflow),
    ];
    for (target, seeds) in targets {
        let folder = root.join(target);
        std::fs::create_dir_all(&folder).expect("the corpus folder");
        for (name, bytes) in seeds() {
            std::fs::write(folder.join(name), bytes).expect("a seed written");
        }
    }
    println!("seeds written under {}", root.display());
}
