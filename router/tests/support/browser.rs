//! A small WebDriver client (W3C WebDriver over HTTP, as chromedriver
//! speaks it) for the console's headless Chromium tests (Debian's
//! `chromium` and `chromium-driver`, installed by `scripts/setup.sh`).
//! Included by each browser test with `#[path = "support/browser.rs"] mod browser;`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use agent_reach_testkit::{eventually, ProcessGroup};
use base64::Engine as _;
use serde_json::{json, Value};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// chromedriver and everything it starts: one process group, ended with the
/// test (killing chromedriver alone leaves its Chromium running), and
/// anything else naming the profile directory found and ended too.
pub struct Driver {
    _process: ProcessGroup,
    url: String,
    /// Dropped after the processes that use it (fields drop in order).
    _profile: tempfile::TempDir,
}

pub struct Browser {
    http: reqwest::Client,
    session: String,
    screenshots: PathBuf,
    driver: Driver,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Browser {
    pub async fn start() -> Self {
        let port = free_port();
        let profile = tempfile::tempdir().unwrap();
        let process = ProcessGroup::spawn(
            Command::new("chromedriver")
                .arg(format!("--port={port}"))
                .arg("--allowed-ips=127.0.0.1")
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            Some(&profile.path().display().to_string()),
        )
        .expect("chromedriver (Debian's chromium-driver; scripts/setup.sh installs it)");
        let driver = Driver {
            _process: process,
            url: format!("http://127.0.0.1:{port}"),
            _profile: profile,
        };
        let http = reqwest::Client::new();
        let status = format!("{}/status", driver.url);
        assert!(
            eventually(Duration::from_secs(20), || async {
                match http.get(&status).send().await {
                    Ok(response) => response
                        .json::<Value>()
                        .await
                        .is_ok_and(|body| body["value"]["ready"] == true),
                    Err(_) => false,
                }
            })
            .await,
            "chromedriver never became ready"
        );
        let profile = driver._profile.path().display().to_string();
        let created: Value = http
            .post(format!("{}/session", driver.url))
            .json(&json!({ "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": "/usr/bin/chromium",
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                             "--window-size=1280,800", "--no-first-run", "--disable-extensions",
                             format!("--user-data-dir={profile}")]
                }
            } } }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {created}"))
            .to_string();
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
        let screenshots = target.join("console-screenshots");
        std::fs::create_dir_all(&screenshots).unwrap();
        println!("console screenshots: {}", screenshots.display());
        Self {
            http,
            session,
            screenshots,
            driver,
        }
    }

    pub async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.driver.url, self.session);
        let mut request = self.http.request(method, &url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request.send().await.unwrap().json().await.unwrap();
        answer["value"].clone()
    }

    pub async fn open(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// Runs `script` (a function body) in the page; its `return` value.
    pub async fn run(&self, script: &str) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
        .await
    }

    pub async fn find(&self, css: &str) -> String {
        let found = self
            .command(
                reqwest::Method::POST,
                "/element",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await;
        found[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element `{css}`: {found}"))
            .to_string()
    }

    /// Clicks `css` as a user would (WebDriver's element click).
    pub async fn click(&self, css: &str) {
        let element = self.find(css).await;
        let answer = self
            .command(
                reqwest::Method::POST,
                &format!("/element/{element}/click"),
                Some(json!({})),
            )
            .await;
        assert!(answer.is_null(), "click `{css}`: {answer}");
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{element}/clear"),
            Some(json!({})),
        )
        .await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{element}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// Presses `key` on the keyboard (WebDriver actions).
    pub async fn press(&self, key: &str) {
        self.command(
            reqwest::Method::POST,
            "/actions",
            Some(json!({ "actions": [{ "type": "key", "id": "keyboard", "actions": [
                { "type": "keyDown", "value": key }, { "type": "keyUp", "value": key }
            ] }] })),
        )
        .await;
    }

    pub async fn resize(&self, width: u32, height: u32) {
        self.command(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({ "width": width, "height": height })),
        )
        .await;
    }

    pub async fn screenshot(&self, name: &str) {
        let data = self.command(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().expect("a screenshot"))
            .unwrap();
        std::fs::write(self.screenshots.join(format!("{name}.png")), png).unwrap();
    }

    /// Polls `script` until it returns `true`, for at most `bound`.
    pub async fn until(&self, bound: Duration, what: &str, script: &str) {
        let ok = eventually(bound, || async { self.run(script).await == json!(true) }).await;
        if !ok {
            let page = self
                .run("return document.querySelector('main').innerText + ' | ' + document.getElementById('notice').innerText;")
                .await;
            panic!("never: {what}; the page shows: {page}");
        }
    }

    pub async fn text(&self, css: &str) -> String {
        let script = format!("const e = document.querySelector({css:?}); return e ? e.innerText : null;");
        self.run(&script).await.as_str().unwrap_or("").to_string()
    }
}

impl Browser {
    /// The profile directory every process of this browser names.
    pub fn profile(&self) -> String {
        self.driver._profile.path().display().to_string()
    }
}
