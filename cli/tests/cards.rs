//! Signed agent cards end to end (issue 39, point 5): a real router (registry
//! on a real etcd) serves each capability's A2A card signed with its
//! assertion key; `agent-reach cards verify` accepts the served card, and
//! refuses an edited one (from a file, and served by another host), an
//! unsigned one and one whose key the key set does not hold, each with its
//! code and exit status. A key rotation re-signs the card (new kid, new ETag).

use std::net::SocketAddr;
use std::process::Output;
use std::time::Duration;

use agent_reach_examples::scenario_instances;
use agent_reach_examples::stack::{Stack, StackOptions};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CAPABILITY: &str = "order.query";

async fn stack(etcd: &agent_reach_testkit::Etcd) -> Stack {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let stack = Stack::start(StackOptions {
        registry_listen: any,
        router_listen: any,
        context_listen: any,
        etcd: vec![etcd.endpoint()],
        redis: None,
        acl: None,
        agents: scenario_instances(),
    })
    .await
    .unwrap();
    stack
        .wait_until_routable(&[CAPABILITY], Duration::from_secs(20))
        .await
        .unwrap();
    stack
}

async fn verify(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .args(["cards", "verify"])
        .args(args)
        .output()
        .await
        .unwrap()
}

/// The exit status, and stdout and stderr together.
fn outcome(output: &Output) -> (i32, String) {
    (
        output.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

/// Serves `body` as JSON to every request, on a port of its own (a card moved to another host).
async fn serve_elsewhere(body: Vec<u8>) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 1024];
                while !request.windows(4).any(|window| window == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => request.extend_from_slice(&buffer[..read]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(&body).await;
            });
        }
    });
    (format!("http://{address}/.well-known/agent-card.json"), server)
}

fn kid_of(card: &Value) -> String {
    let headers = agent_reach_access::card_signature::headers(card).unwrap();
    headers[0].kid.clone().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_card_verifies_and_an_edited_or_unsigned_one_does_not() {
    let etcd = agent_reach_testkit::Etcd::start();
    let stack = stack(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let url = format!("{}/a2a/{CAPABILITY}/.well-known/agent-card.json", stack.router);
    let jwks_url = format!("{}/.well-known/jwks.json", stack.router);

    // The card as served: signed by the router's published key, its ETag over the signed bytes.
    let response = client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let etag = response.headers()["etag"].to_str().unwrap().to_string();
    let body = response.bytes().await.unwrap().to_vec();
    let card: Value = serde_json::from_slice(&body).unwrap();
    let jwks: Value = client.get(&jwks_url).send().await.unwrap().json().await.unwrap();
    let kid = jwks["keys"][0]["kid"].as_str().unwrap().to_string();
    assert_eq!(kid_of(&card), kid);
    let header = &agent_reach_access::card_signature::headers(&card).unwrap()[0];
    assert_eq!(
        (header.alg.as_str(), header.jku.as_deref()),
        ("EdDSA", Some(jwks_url.as_str()))
    );
    let again = client.get(&url).send().await.unwrap();
    assert_eq!(again.headers()["etag"].to_str().unwrap(), etag);
    assert_eq!(
        again.bytes().await.unwrap().to_vec(),
        body,
        "signed once, served the same"
    );
    let unchanged = client.get(&url).header("if-none-match", &etag).send().await.unwrap();
    assert_eq!(unchanged.status(), 304);

    // Verified from its URL, the keys from the jku it names (on its own origin).
    let (status, text) = outcome(&verify(&[&url]).await);
    assert_eq!(status, 0, "{text}");
    assert!(text.starts_with("OK:") && text.contains(&kid), "{text}");
    let output = verify(&[&url, "--json"]).await;
    let printed: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(printed, json!({ "ok": true, "kid": kid, "keys": jwks_url }));

    // From a file, with the keys named.
    let file = dir.path().join("card.json");
    std::fs::write(&file, &body).unwrap();
    let file = file.to_str().unwrap();
    let (status, text) = outcome(&verify(&["--file", file, "--jwks", &jwks_url]).await);
    assert_eq!(status, 0, "{text}");
    let key_file = dir.path().join("jwks.json");
    std::fs::write(&key_file, jwks.to_string()).unwrap();
    let key_file = key_file.to_str().unwrap();
    let (status, text) = outcome(&verify(&["--file", file, "--key", key_file]).await);
    assert_eq!(status, 0, "{text}");
    // A file does not choose its own keys.
    let (status, text) = outcome(&verify(&["--file", file]).await);
    assert_eq!((status, text.contains("KEY_SET_UNTRUSTED")), (2, true), "{text}");

    // An edited card fails: from a file...
    let mut edited = card.clone();
    edited["supportedInterfaces"][0]["url"] = json!("http://attacker.example/a2a/order.query");
    let edited_file = dir.path().join("edited.json");
    std::fs::write(&edited_file, serde_json::to_vec_pretty(&edited).unwrap()).unwrap();
    let edited_file = edited_file.to_str().unwrap();
    let (status, text) = outcome(&verify(&["--file", edited_file, "--jwks", &jwks_url]).await);
    assert_eq!(
        (status, text.contains("error[CARD_SIGNATURE_INVALID]")),
        (1, true),
        "{text}"
    );
    // ...and served by another host, whose jku (the router's) is not followed unasked.
    let (elsewhere, server) = serve_elsewhere(serde_json::to_vec(&edited).unwrap()).await;
    let (status, text) = outcome(&verify(&[&elsewhere]).await);
    assert_eq!((status, text.contains("KEY_SET_UNTRUSTED")), (2, true), "{text}");
    let (status, text) = outcome(&verify(&[&elsewhere, "--jwks", &jwks_url]).await);
    assert_eq!((status, text.contains("CARD_SIGNATURE_INVALID")), (1, true), "{text}");
    let output = verify(&[&elsewhere, "--jwks", &jwks_url, "--json"]).await;
    let printed: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        (output.status.code(), &printed["code"]),
        (Some(1), &json!("CARD_SIGNATURE_INVALID"))
    );
    server.abort();

    // Unsigned.
    let mut unsigned = card.clone();
    unsigned.as_object_mut().unwrap().remove("signatures");
    let unsigned_file = dir.path().join("unsigned.json");
    std::fs::write(&unsigned_file, unsigned.to_string()).unwrap();
    let (status, text) = outcome(&verify(&["--file", unsigned_file.to_str().unwrap(), "--jwks", &jwks_url]).await);
    assert_eq!((status, text.contains("error[CARD_UNSIGNED]")), (1, true), "{text}");

    // A key set without the card's key.
    let (other, _) = agent_reach_access::AssertionKey::generate().unwrap();
    let other_file = dir.path().join("other.json");
    std::fs::write(&other_file, other.jwk().to_string()).unwrap();
    let (status, text) = outcome(&verify(&["--file", file, "--key", other_file.to_str().unwrap()]).await);
    assert_eq!((status, text.contains("error[KEY_NOT_FOUND]")), (1, true), "{text}");

    // Nothing to read: exit 2 with a code.
    let missing = format!("{}/a2a/no.such.capability/.well-known/agent-card.json", stack.router);
    let (status, text) = outcome(&verify(&[&missing]).await);
    assert_eq!((status, text.contains("error[CARD_FETCH_FAILED]")), (2, true), "{text}");
    let (status, text) = outcome(&verify(&["http://127.0.0.1:1/card.json"]).await);
    assert_eq!((status, text.contains("error[CARD_FETCH_FAILED]")), (2, true), "{text}");
    let (status, text) = outcome(&verify(&["--file", file, "--key", "/nonexistent/keys.json"]).await);
    assert_eq!(
        (status, text.contains("error[KEY_SET_UNAVAILABLE]")),
        (2, true),
        "{text}"
    );
    let (status, text) = outcome(&verify(&[]).await);
    assert_eq!(status, 2, "usage: {text}");

    // A rotation: the router signs with the new key, so the card is signed again (new kid, new ETag).
    let (_, pem) = agent_reach_access::AssertionKey::generate().unwrap();
    std::fs::write(&stack.assertion_key_file, pem).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let rotated = loop {
        let response = client.get(&url).send().await.unwrap();
        let rotated_etag = response.headers()["etag"].to_str().unwrap().to_string();
        let rotated: Value = response.json().await.unwrap();
        if kid_of(&rotated) != kid {
            assert_ne!(rotated_etag, etag, "the ETag covers the signature");
            break rotated;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the card was not signed with the new key"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (status, text) = outcome(&verify(&[&url]).await);
    assert_eq!(status, 0, "{text}");
    assert!(text.contains(&kid_of(&rotated)), "{text}");

    stack.shutdown().await;
}
