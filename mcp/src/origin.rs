//! Streamable HTTP's `Origin` rule (a security MUST, against DNS
//! rebinding): a request with no `Origin` (every non-browser client) passes;
//! one whose `Origin` is a loopback origin (`localhost`, `127.0.0.0/8`,
//! `[::1]`) or is listed in `--mcp-allowed-origin` passes; any other is 403
//! before anything else is read, with a JSON-RPC error without id
//! (`data.code` `FORBIDDEN`, `data.details.origin`).

use super::*;

/// Refuses a request whose `Origin` is neither loopback nor allowed (403).
pub(crate) async fn check_origin(
    State(service): State<Arc<RouterService>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(origin) = request.headers().get(http::header::ORIGIN) else {
        return next.run(request).await;
    };
    let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
    if origin_allowed(&origin, &service.tuning().mcp_allowed_origins) {
        return next.run(request).await;
    }
    answer(
        StatusCode::FORBIDDEN,
        rpc_error(
            Value::Null,
            INVALID_REQUEST,
            &format!(
                "Origin `{origin}` may not use this MCP server (DNS rebinding guard): \
                 only loopback origins and those given with --mcp-allowed-origin may"
            ),
            Some(json!({ "code": "FORBIDDEN", "details": { "origin": origin } })),
        ),
    )
}

/// `scheme://host[:port]` lowercased, without a default port or a trailing slash.
pub(crate) fn normalized_origin(origin: &str) -> Option<(String, String, String)> {
    let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
    let (scheme, rest) = origin.split_once("://")?;
    if rest.is_empty() || rest.contains('/') || rest.contains('@') {
        return None;
    }
    // `[v6]:port` or `host:port`, the port optional.
    let (host, port) = match rest.strip_prefix('[') {
        Some(v6) => {
            let (address, after) = v6.split_once(']')?;
            (
                format!("[{address}]"),
                after.strip_prefix(':').unwrap_or(after).to_string(),
            )
        }
        None => match rest.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), port.to_string()),
            None => (rest.to_string(), String::new()),
        },
    };
    if host.is_empty() || host == "[]" || !port.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let port = match (scheme, port.as_str()) {
        ("http", "80") | ("https", "443") => String::new(),
        _ => port,
    };
    Some((scheme.to_string(), host, port))
}

/// Whether a browser page at `origin` may call: a loopback origin, or one of `allowed` (`*`: any).
pub(crate) fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    if allowed.iter().any(|entry| entry == "*") {
        return true;
    }
    if origin.trim() == "null" {
        return allowed.iter().any(|entry| entry == "null");
    }
    let Some(seen) = normalized_origin(origin) else {
        return false;
    };
    let host = seen.1.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback());
    loopback
        || allowed
            .iter()
            .any(|entry| normalized_origin(entry).as_ref() == Some(&seen))
}

#[cfg(test)]
mod tests {
    use super::origin_allowed;

    #[test]
    fn loopback_and_listed_origins_pass_and_others_do_not() {
        let none: Vec<String> = Vec::new();
        for origin in [
            "http://localhost:3000",
            "http://127.0.0.1:7500",
            "http://[::1]:8080",
            "https://LOCALHOST",
        ] {
            assert!(origin_allowed(origin, &none), "{origin}");
        }
        for origin in [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example",
            "null",
            "not an origin",
            "http://user@localhost",
        ] {
            assert!(!origin_allowed(origin, &none), "{origin}");
        }
        let listed = vec![
            "https://app.example.com".to_string(),
            "http://tools.example:8080/".to_string(),
        ];
        assert!(origin_allowed("https://app.example.com:443", &listed));
        assert!(origin_allowed("http://TOOLS.example:8080", &listed));
        assert!(!origin_allowed("http://app.example.com", &listed), "the scheme counts");
        assert!(!origin_allowed("http://tools.example:8081", &listed), "the port counts");
        assert!(origin_allowed("null", &["null".to_string()]));
        assert!(origin_allowed("http://evil.example", &["*".to_string()]));
    }
}
