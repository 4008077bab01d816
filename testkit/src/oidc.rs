//! A real OpenID provider on a loopback port: panva's `oidc-provider` (an
//! OpenID Certified implementation, installed from the npm registry by
//! `scripts/setup.sh` into `testkit/oidc-provider/node_modules` from its
//! committed lockfile), run by `testkit/oidc-provider/provider.mjs` under
//! Node. It issues JWT access tokens with the client credentials grant for
//! the resource a client names, so tests get tokens exactly as a service
//! would from Keycloak, Okta or Entra, and can rotate its keys.
//!
//! The provider runs in its own process group, killed with the value.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::{free_port, tail, wait_until, ProcessGroup, START_TIMEOUT};

/// A client of the provider: its tokens' signing algorithm (`RS256`,
/// `ES256`, `EdDSA`; `None`: RS256), lifetime and extra claims.
#[derive(Debug, Clone)]
pub struct OidcClient {
    pub client_id: String,
    pub client_secret: String,
    pub alg: Option<String>,
    pub ttl_s: Option<u64>,
    pub claims: Value,
}

impl OidcClient {
    /// A client signing with `alg`, its secret `{client_id}-secret`, no extra claims.
    pub fn new(client_id: &str, alg: &str) -> Self {
        Self {
            client_id: client_id.to_string(),
            client_secret: format!("{client_id}-secret"),
            alg: Some(alg.to_string()),
            ttl_s: None,
            claims: json!({}),
        }
    }

    /// With these extra claims in its tokens.
    pub fn claims(mut self, claims: Value) -> Self {
        self.claims = claims;
        self
    }

    /// With tokens living `ttl_s` seconds.
    pub fn ttl_s(mut self, ttl_s: u64) -> Self {
        self.ttl_s = Some(ttl_s);
        self
    }
}

/// The running provider; killed on drop.
pub struct OidcProvider {
    _process: ProcessGroup,
    addr: SocketAddr,
    clients: Vec<OidcClient>,
    _dir: tempfile::TempDir,
}

/// Where the provider's script and its packages are.
fn provider_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("oidc-provider")
}

impl OidcProvider {
    /// Starts the provider with `clients` and waits until it serves its
    /// discovery document.
    pub fn start(clients: &[OidcClient]) -> Self {
        let dir = provider_dir();
        assert!(
            dir.join("node_modules/oidc-provider").is_dir(),
            "the OpenID provider's packages are not installed in {}: run `scripts/setup.sh` \
             (npm ci there, from its lockfile)",
            dir.display()
        );
        let node = crate::find_binary("node", "nodejs");
        let temp = tempfile::Builder::new()
            .prefix("agent-reach-oidc-")
            .tempdir()
            .unwrap_or_else(|error| panic!("cannot create a temp dir for the OpenID provider: {error}"));
        let log = temp.path().join("provider.log");
        let specs: Vec<Value> = clients
            .iter()
            .map(|client| {
                json!({
                    "client_id": client.client_id,
                    "client_secret": client.client_secret,
                    "alg": client.alg,
                    "ttl_s": client.ttl_s,
                    "claims": client.claims,
                })
            })
            .collect();
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port();
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let output = std::fs::File::create(&log).unwrap_or_else(|error| panic!("provider log: {error}"));
            let errors = output
                .try_clone()
                .unwrap_or_else(|error| panic!("provider log: {error}"));
            let mut command = Command::new(&node);
            command
                .arg(dir.join("provider.mjs"))
                // The temp dir names every process of this provider (the group's marker).
                .arg(temp.path())
                .current_dir(&dir)
                .env("PORT", port.to_string())
                .env("OIDC_CLIENTS", Value::Array(specs.clone()).to_string())
                .stdin(Stdio::null())
                .stdout(output)
                .stderr(errors);
            let mut process = ProcessGroup::spawn(&mut command, temp.path().to_str())
                .unwrap_or_else(|error| panic!("cannot start node: {error}"));
            let said_ready =
                || std::fs::read_to_string(&log).is_ok_and(|text| text.lines().any(|line| line == "ready"));
            wait_until(START_TIMEOUT, || said_ready() || process.exited());
            if said_ready() && !process.exited() {
                return Self {
                    _process: process,
                    addr,
                    clients: clients.to_vec(),
                    _dir: temp,
                };
            }
            last_log = tail(&log);
        }
        panic!("the OpenID provider did not start; last log lines:\n{last_log}");
    }

    /// The issuer identifier (`http://127.0.0.1:PORT`), as its tokens' `iss` names it.
    pub fn issuer(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// An access token for `client_id` (client credentials grant) whose
    /// audience is `resource` (RFC 8707).
    pub fn token(&self, client_id: &str, resource: &str) -> String {
        let client = self
            .clients
            .iter()
            .find(|client| client.client_id == client_id)
            .unwrap_or_else(|| panic!("no client `{client_id}` was given to the provider"));
        let credentials =
            base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", client.client_id, client.client_secret));
        let body = format!("grant_type=client_credentials&resource={}", form_encode(resource));
        let (status, answer) = self.request(
            "POST",
            "/token",
            &[
                ("authorization", &format!("Basic {credentials}")),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
            &body,
        );
        assert_eq!(status, 200, "token request for `{client_id}`: {answer}");
        answer["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no access_token in {answer}"))
            .to_string()
    }

    /// Rotates the keys: new keys (new `kid`s) sign from now on; the
    /// previous ones stay published unless `retire`. Answers the published `kid`s.
    pub fn rotate(&self, retire: bool) -> Vec<String> {
        let path = if retire {
            "/testkit/rotate?retire=1"
        } else {
            "/testkit/rotate"
        };
        let (status, answer) = self.request("POST", path, &[], "");
        assert_eq!(status, 200, "rotate: {answer}");
        answer["kids"]
            .as_array()
            .map(|kids| kids.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// The published keys (its JWKS document).
    pub fn jwks(&self) -> Value {
        let (status, answer) = self.request("GET", "/jwks", &[], "");
        assert_eq!(status, 200, "jwks: {answer}");
        answer
    }

    /// One HTTP/1.1 exchange (the provider answers with a length, then closes).
    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
        let mut stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2))
            .unwrap_or_else(|error| panic!("cannot reach the OpenID provider: {error}"));
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(body);
        stream
            .write_all(request.as_bytes())
            .unwrap_or_else(|error| panic!("writing to the OpenID provider: {error}"));
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .unwrap_or_else(|error| panic!("reading the OpenID provider's answer: {error}"));
        let answer = String::from_utf8_lossy(&answer);
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {head}"));
        (
            status,
            serde_json::from_str(body).unwrap_or(Value::String(body.to_string())),
        )
    }
}

/// `application/x-www-form-urlencoded` for a URL value.
fn form_encode(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}
