//! The registry's operator routes on the router (`POST /v1/agents/{id}/drain`,
//! `PUT /v1/agents/{id}/weight`,
//! `GET`/`PUT`/`DELETE /v1/capabilities/{name}/split` and `…/policy`, and the one read
//! only the registry can answer, `GET /v1/heartbeats`): the same paths,
//! bodies and answers as the registry's own (DESIGN §2.9), relayed with the
//! operator's own token so the registry checks and records who did it. The
//! console uses them; the CLI sends the same requests to the registry.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;

use super::{operator, ConsoleState};
use agent_reach_pipeline::answer::refused;
use agent_reach_pipeline::call::identify::Identified;
use agent_reach_pipeline::error::{Code, RouterError};

/// Largest request and answer relayed (the registry's own limits are smaller).
const LIMIT: usize = 1 << 20;
/// How long one registry may take to connect and answer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// How the console reaches the registry, and how it sets its cookie.
pub struct Console {
    registry: Vec<String>,
    /// The TLS client for `https://` registries, or why there is none.
    tls: Result<Arc<rustls::ClientConfig>, String>,
    secure_cookie: bool,
}

impl Console {
    /// `registry`: the router's `--registry` URLs; `secure_cookie`: the
    /// router serves TLS, so the session cookie is `Secure`.
    pub fn new(registry: &[String], registry_tls: &agent_reach_serving::tls::ClientFiles, secure_cookie: bool) -> Self {
        let tls = agent_reach_serving::tls::client_config(registry_tls, &[b"http/1.1"])
            .map(Arc::new)
            .map_err(|error| error.to_string());
        Self {
            registry: registry.to_vec(),
            tls,
            secure_cookie,
        }
    }

    pub fn secure_cookie(&self) -> bool {
        self.secure_cookie
    }

    /// Sends one request to the first registry that answers: its status and body.
    async fn send(&self, method: &Method, path: &str, token: &str, body: Bytes) -> Result<(StatusCode, Bytes), String> {
        let mut problems = Vec::new();
        for base in &self.registry {
            match tokio::time::timeout(TIMEOUT, self.send_to(base, method, path, token, body.clone())).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(problem)) => problems.push(format!("{base}: {problem}")),
                Err(_) => problems.push(format!("{base}: no answer within {} s", TIMEOUT.as_secs())),
            }
        }
        Err(problems.join("; "))
    }

    async fn send_to(
        &self,
        base: &str,
        method: &Method,
        path: &str,
        token: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), String> {
        let uri: http::Uri = format!("{}{path}", base.trim_end_matches('/'))
            .parse()
            .map_err(|error| format!("not a URL: {error}"))?;
        let https = uri.scheme_str() == Some("https");
        let host = uri.host().ok_or("no host")?.to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let authority = uri
            .authority()
            .map(|authority| authority.to_string())
            .unwrap_or_default();
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|error| format!("cannot connect: {error}"))?;
        let mut request = http::Request::builder()
            .method(method.clone())
            .uri(uri.path_and_query().map_or("/", |path| path.as_str()))
            .header(header::HOST, authority)
            .header(header::CONTENT_TYPE, "application/json");
        if !token.is_empty() {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Full::new(body))
            .map_err(|error| format!("cannot build the request: {error}"))?;
        if https {
            let config = self.tls.clone()?;
            let name = rustls::pki_types::ServerName::try_from(host)
                .map_err(|error| format!("not a TLS server name: {error}"))?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|error| format!("TLS: {error}"))?;
            exchange(TokioIo::new(stream), request).await
        } else {
            exchange(TokioIo::new(tcp), request).await
        }
    }
}

async fn exchange<T>(io: T, request: http::Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|error| format!("HTTP: {error}"))?;
    tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|error| format!("HTTP: {error}"))?;
    let status = response.status();
    let body = Limited::new(response.into_body(), LIMIT)
        .collect()
        .await
        .map_err(|error| format!("reading the answer: {error}"))?
        .to_bytes();
    Ok((status, body))
}

/// Relays one operator request; logs the change with the operator's name.
pub(crate) async fn relay(
    state: &ConsoleState,
    (identified, headers): (&Identified, &HeaderMap),
    method: Method,
    uri: &http::Uri,
    body: Bytes,
) -> Response {
    let operator = match operator(state.service.admission(), identified, headers) {
        Ok(operator) => operator,
        Err(error) => return refused(error),
    };
    let path = uri.path_and_query().map_or(uri.path(), |path| path.as_str());
    if body.len() > LIMIT {
        return refused(RouterError::new(
            Code::PayloadTooLarge,
            format!("the body is {} bytes; at most {LIMIT}", body.len()),
        ));
    }
    match state.console.send(&method, path, &operator.token, body.clone()).await {
        Ok((status, answer)) => {
            if method != Method::GET {
                let change = String::from_utf8_lossy(&body);
                tracing::info!(
                    message = "Operator changed the registry.",
                    operator = %operator.name(), %method, path, status = status.as_u16(), change = %change
                );
            }
            let mut response = (status, answer).into_response();
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
            response
        }
        Err(problems) => refused(
            RouterError::new(
                Code::AllRetriesExhausted,
                format!("no registry answered the operator request ({problems}); try again once one is up"),
            )
            .with_details(serde_json::json!({ "reason": "registry_unreachable" })),
        ),
    }
}

/// `PUT /v1/agents/{agent_id}/weight`, relayed.
pub async fn weight(
    State(state): State<ConsoleState>,
    uri: http::Uri,
    identified: Identified,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    relay(&state, (&identified, &headers), Method::PUT, &uri, body).await
}

/// `POST /v1/agents/{agent_id}/drain`, relayed.
pub async fn drain(
    State(state): State<ConsoleState>,
    uri: http::Uri,
    identified: Identified,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    relay(&state, (&identified, &headers), Method::POST, &uri, body).await
}

/// `GET`/`PUT`/`DELETE /v1/capabilities/{name}/split` (and `…/policy`, the
/// capability's default selection policy), relayed.
pub async fn split(
    State(state): State<ConsoleState>,
    method: Method,
    uri: http::Uri,
    identified: Identified,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    relay(&state, (&identified, &headers), method, &uri, body).await
}

/// `GET /v1/heartbeats`, relayed: the router learns instances from the
/// `Watch` stream, which carries no heartbeat (only the lease knows it).
pub async fn heartbeats(
    State(state): State<ConsoleState>,
    uri: http::Uri,
    identified: Identified,
    headers: HeaderMap,
) -> Response {
    relay(&state, (&identified, &headers), Method::GET, &uri, Bytes::new()).await
}
