//! MCP's `Origin` rule (Streamable HTTP, "Security Warning": servers MUST
//! validate `Origin` and answer 403 to an invalid one; issue 34): a request
//! from a web page of another origin is refused before anything is read,
//! loopback and listed origins pass, and clients that send no `Origin` (every
//! non-browser client) are served as before. Bad `--mcp-allowed-origin`
//! values are refused at start.

use crate::support;

use serde_json::{json, Value};
use support::*;

async fn tools_list(cluster: &Cluster, origin: Option<&str>) -> (u16, Value) {
    let mut request = cluster
        .client
        .post(cluster.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .bearer_auth(token(CALLER))
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}));
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_loopback_and_listed_origins_reach_the_mcp_server() {
    let cluster = Cluster::start_with(|settings| {
        settings.tuning.mcp_allowed_origins = vec!["https://app.example.com".to_string()];
    })
    .await;
    let _agent = cluster.agent(AgentSpec::new("order-1", 1, Behaviour::Echo));
    cluster.wait_for_instances(&["order-1"]).await;

    for origin in [
        None,
        Some("http://localhost:5173"),
        Some("http://127.0.0.1:7500"),
        Some("https://app.example.com"),
    ] {
        let (status, body) = tools_list(&cluster, origin).await;
        assert_eq!(status, 200, "{origin:?}: {body}");
        assert_eq!(body["id"], 7, "{body}");
        assert!(
            body["result"]["tools"]
                .as_array()
                .is_some_and(|tools| !tools.is_empty()),
            "{body}"
        );
    }
    for origin in [
        "http://evil.example",
        "http://localhost.evil.example",
        "null",
        "http://app.example.com",
    ] {
        let (status, body) = tools_list(&cluster, Some(origin)).await;
        assert_eq!(status, 403, "{origin}: {body}");
        assert_eq!(body["jsonrpc"], "2.0");
        assert_eq!(body["id"], Value::Null, "refused before the body is read: {body}");
        assert_eq!(body["error"]["data"]["code"], "FORBIDDEN", "{body}");
        assert_eq!(body["error"]["data"]["details"]["origin"], origin, "{body}");
    }
    // Every method of the endpoint, not only POST.
    let response = cluster
        .client
        .get(cluster.url("/mcp"))
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    // Without a token, a refused origin still learns nothing but the 403.
    let response = cluster
        .client
        .post(cluster.url("/mcp"))
        .header("origin", "http://evil.example")
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
}

#[test]
fn a_bad_allowed_origin_is_refused_at_start() {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        router: agent_reach_router::RouterArgs,
    }
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("assertion.pem");
    std::fs::write(&key, "unused: the flags are only validated").unwrap();
    let flags = Flags::parse_from([
        "router",
        "--insecure-no-auth",
        "--assertion-key",
        key.to_str().unwrap(),
        "--mcp-allowed-origin",
        "app.example.com",
        "--mcp-allowed-origin",
        "https://ok.example.com",
    ]);
    let problems = flags.router.validate().unwrap_err();
    assert!(
        problems
            .iter()
            .any(|problem| problem.contains("--mcp-allowed-origin `app.example.com` must be scheme://host[:port]")),
        "{problems:?}"
    );
    assert!(
        !problems.iter().any(|problem| problem.contains("ok.example.com")),
        "{problems:?}"
    );
}
