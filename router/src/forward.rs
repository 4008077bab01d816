//! Forwarding one attempt to one instance over a pooled keep-alive HTTP/1.1
//! client, bounded by the request's absolute deadline, and classifying what
//! came back. The decision to retry is the caller's (`invoke`).

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Largest agent answer the router reads (an answer is a JSON envelope, not a stream).
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// What one attempt produced.
#[derive(Debug)]
pub enum AttemptResult {
    /// The agent answered with this status and body.
    Answered { status: StatusCode, body: Bytes },
    /// The connection could not be made: the agent never saw the request.
    ConnectFailed(String),
    /// The connection broke before a complete answer arrived.
    Broken(String),
    /// The deadline passed before an answer.
    TimedOut,
}

/// Headers the router sets on every forwarded request.
pub struct ForwardHeaders<'a> {
    pub traceparent: &'a HeaderValue,
    pub request_id: &'a HeaderValue,
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Distinguishes forwarders sharing a thread (several routers in one test process).
static NEXT_FORWARDER_ID: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// One client (and so one connection pool) per forwarder per thread: a pooled
    /// connection is driven by a task on the thread that opened it, so a request
    /// never hops threads to reach its connection, and threads share no pool lock.
    static CLIENTS: RefCell<Vec<(usize, HttpClient)>> = const { RefCell::new(Vec::new()) };
}

pub struct Forwarder {
    id: usize,
    idle_per_instance: usize,
}

impl Forwarder {
    pub fn new(idle_per_instance: usize) -> Self {
        Self {
            id: NEXT_FORWARDER_ID.fetch_add(1, Ordering::Relaxed),
            idle_per_instance,
        }
    }

    fn build_client(&self) -> HttpClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(self.idle_per_instance)
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector)
    }

    /// This thread's client for this forwarder (a cheap handle clone).
    fn client(&self) -> HttpClient {
        CLIENTS.with(|clients| {
            let mut clients = clients.borrow_mut();
            if let Some((_, client)) = clients.iter().find(|(id, _)| *id == self.id) {
                return client.clone();
            }
            let client = self.build_client();
            clients.push((self.id, client.clone()));
            client
        })
    }

    /// POSTs `body` to `uri`, giving up at `deadline`.
    pub async fn send(
        &self,
        uri: &http::Uri,
        body: Bytes,
        headers: &ForwardHeaders<'_>,
        deadline: Instant,
    ) -> AttemptResult {
        let request = Request::post(uri.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("traceparent", headers.traceparent.clone())
            .header("x-request-id", headers.request_id.clone())
            .body(Full::new(body));
        let request = match request {
            Ok(request) => request,
            Err(error) => return AttemptResult::ConnectFailed(format!("cannot build the request: {error}")),
        };
        let exchange = async {
            let response = match self.client().request(request).await {
                Ok(response) => response,
                Err(error) if error.is_connect() => return AttemptResult::ConnectFailed(error.to_string()),
                Err(error) => return AttemptResult::Broken(error.to_string()),
            };
            let status = response.status();
            match Limited::new(response.into_body(), MAX_ANSWER_BYTES).collect().await {
                Ok(collected) => AttemptResult::Answered {
                    status,
                    body: collected.to_bytes(),
                },
                Err(error) => AttemptResult::Broken(format!("reading the answer failed: {error}")),
            }
        };
        match tokio::time::timeout_at(deadline.into(), exchange).await {
            Ok(result) => result,
            Err(_) => AttemptResult::TimedOut,
        }
    }
}
