//! Serving a streaming handler ([`Handler::streaming`](crate::Handler::streaming))
//! as server-sent events (DESIGN §8, "Streaming"): each item one `data:`
//! event, written as it is produced.
//!
//! The first item is awaited before the answer's head: a handler that fails
//! at once answers an ordinary error (its status, which the router's retry
//! rules read). After it, a handler error, a panic or the deadline ends the
//! stream with `event: error` `{code, message}`. The handler runs in a task
//! of its own (a panic is contained) that stops as soon as the router's
//! connection goes away: dropping the caller's request cancels the handler.

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::{FutureExt, StreamExt};
use serde_json::{json, Value};
use tracing::Instrument;

use crate::answer::{error_answer, handler_error, respond, InflightGuard};
use crate::call::now_ms;
use crate::ctx::Ctx;
use crate::handler::{BoxStream, InvokeStream};
use crate::HandlerError;

/// Events buffered between the handler and the connection: enough to keep a
/// fast handler going, few enough that a slow reader holds it back.
const QUEUE: usize = 16;

/// What the next pull of the handler's stream gave.
enum Pulled {
    Item(Value),
    Failed(HandlerError),
    Panicked(String),
    Ended,
    Late,
}

async fn pull(items: &mut BoxStream<Result<Value, HandlerError>>, deadline: tokio::time::Instant) -> Pulled {
    match tokio::time::timeout_at(deadline, AssertUnwindSafe(items.next()).catch_unwind()).await {
        Err(_) => Pulled::Late,
        Ok(Err(panic)) => Pulled::Panicked(panic_text(panic.as_ref())),
        Ok(Ok(None)) => Pulled::Ended,
        Ok(Ok(Some(Ok(value)))) => Pulled::Item(value),
        Ok(Ok(Some(Err(error)))) => Pulled::Failed(error),
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|text| text.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

fn data_event(value: &Value) -> Bytes {
    // Serialised JSON has no raw newline, so one `data:` line carries it.
    Bytes::from(format!("data: {value}\n\n"))
}

fn error_event(code: &str, message: &str) -> Bytes {
    Bytes::from(format!(
        "event: error\ndata: {}\n\n",
        json!({ "code": code, "message": message })
    ))
}

/// The event ending a stream that did not finish, or `None` when it did.
fn ending(pulled: &Pulled) -> Option<Bytes> {
    match pulled {
        Pulled::Item(_) | Pulled::Ended => None,
        Pulled::Failed(error) => Some(error_event(&error.code, &error.message)),
        Pulled::Panicked(why) => {
            tracing::error!(message = "Streaming handler panicked; the agent keeps serving.", panic = %why);
            Some(error_event("HANDLER_PANICKED", &format!("the handler panicked: {why}")))
        }
        Pulled::Late => Some(error_event(
            "DEADLINE_EXCEEDED",
            "the handler did not finish before the deadline",
        )),
    }
}

/// Runs `handler` on `payload` and answers its items as events.
pub(crate) async fn serve(
    handler: Arc<InvokeStream>,
    ctx: Ctx,
    payload: Value,
    deadline_ms: u64,
    guard: InflightGuard,
    span: tracing::Span,
) -> Response {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(deadline_ms.saturating_sub(now_ms()));
    let started = std::panic::catch_unwind(AssertUnwindSafe(|| handler(ctx, payload)));
    let mut items = match started {
        Ok(items) => items,
        Err(panic) => {
            let why = panic_text(panic.as_ref());
            tracing::error!(message = "Streaming handler panicked; the agent keeps serving.", panic = %why);
            return respond(error_answer(
                500,
                "HANDLER_PANICKED",
                format!("the handler panicked: {why}"),
            ));
        }
    };
    let first = match pull(&mut items, deadline).instrument(span.clone()).await {
        Pulled::Item(value) => value,
        Pulled::Failed(error) => return respond(handler_error(&error)),
        Pulled::Panicked(why) => {
            tracing::error!(message = "Streaming handler panicked; the agent keeps serving.", panic = %why);
            return respond(error_answer(
                500,
                "HANDLER_PANICKED",
                format!("the handler panicked: {why}"),
            ));
        }
        Pulled::Late => {
            return respond(error_answer(
                504,
                "DEADLINE_EXCEEDED",
                "the handler did not finish before the deadline",
            ))
        }
        // No item at all: an empty stream, answered as one.
        Pulled::Ended => {
            return (
                StatusCode::OK,
                [(http::header::CONTENT_TYPE, "text/event-stream")],
                axum::body::Body::empty(),
            )
                .into_response()
        }
    };
    let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(QUEUE);
    let feeding = async move {
        // Held until the handler is done or cancelled: the agent's in-flight count.
        let _guard = guard;
        if sender.send(data_event(&first)).await.is_err() {
            return;
        }
        loop {
            let pulled = tokio::select! {
                // The router's connection closed (its caller went away): stop the handler.
                () = sender.closed() => return,
                pulled = pull(&mut items, deadline) => pulled,
            };
            match pulled {
                Pulled::Item(value) => {
                    if sender.send(data_event(&value)).await.is_err() {
                        return;
                    }
                }
                Pulled::Ended => return,
                other => {
                    if let Some(event) = ending(&other) {
                        let _ = sender.send(event).await;
                    }
                    return;
                }
            }
        }
    };
    tokio::spawn(feeding.instrument(span));
    let body =
        axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(receiver).map(Ok::<_, Infallible>));
    (
        StatusCode::OK,
        [
            (http::header::CONTENT_TYPE, "text/event-stream"),
            (http::header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
