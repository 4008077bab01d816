//! Handlers: typed async functions and the capability descriptors derived
//! from their types, so the registered schema always matches the code.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::{Ctx, HandlerError};

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
pub(crate) type BoxStream<T> = Pin<Box<dyn Stream<Item = T> + Send>>;
type Invoke = dyn Fn(Ctx, Value) -> BoxFuture<Result<Value, HandlerError>> + Send + Sync;
/// A streaming handler: the payload in, its items out (each one event).
pub(crate) type InvokeStream = dyn Fn(Ctx, Value) -> BoxStream<Result<Value, HandlerError>> + Send + Sync;

/// What an instance registers for one capability.
#[derive(Debug, Clone, PartialEq)]
pub struct Descriptor {
    pub capability: String,
    pub version: String,
    pub description: String,
    pub input_schema: Value,
    pub output_schema: Value,
    pub timeout_ms: Option<u64>,
    /// Whether the router checks this handler's answers against `output_schema` (default yes).
    pub check_output: bool,
    /// Whether its deliveries may be paused for higher-priority work ([`Handler::preemptible`]).
    pub preemptible: bool,
}

/// A capability implementation: its descriptor and the type-erased function.
#[derive(Clone)]
pub struct Handler {
    pub(crate) descriptor: Descriptor,
    pub(crate) invoke: Arc<Invoke>,
    /// Set for a streaming handler ([`Handler::streaming`]): served as
    /// server-sent events to a caller that asks for them.
    pub(crate) stream: Option<Arc<InvokeStream>>,
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler").field("descriptor", &self.descriptor).finish()
    }
}

impl Handler {
    /// Wraps `function` as the handler of `capability` at `version`; the input
    /// and output JSON Schemas come from `I` and `O`.
    ///
    /// ```
    /// use agent_reach_sdk::{Ctx, Handler, HandlerError};
    /// #[derive(serde::Deserialize, schemars::JsonSchema)]
    /// struct Ping { text: String }
    /// #[derive(serde::Serialize, schemars::JsonSchema)]
    /// struct Pong { echo: String }
    ///
    /// let handler = Handler::new("demo.echo", "1.0.0", |_ctx: Ctx, input: Ping| async move {
    ///     Ok::<_, HandlerError>(Pong { echo: input.text })
    /// });
    /// assert_eq!(handler.descriptor().capability, "demo.echo");
    /// assert_eq!(handler.descriptor().input_schema["properties"]["text"]["type"], "string");
    /// ```
    pub fn new<I, O, F, Fut>(capability: &str, version: &str, function: F) -> Self
    where
        I: DeserializeOwned + JsonSchema + Send + 'static,
        O: Serialize + JsonSchema + 'static,
        F: Fn(Ctx, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, HandlerError>> + Send + 'static,
    {
        let descriptor = Descriptor {
            capability: capability.to_string(),
            version: version.to_string(),
            description: String::new(),
            input_schema: schema_of::<I>(),
            output_schema: schema_of::<O>(),
            timeout_ms: None,
            check_output: true,
            preemptible: false,
        };
        let function = Arc::new(function);
        let invoke = move |ctx: Ctx, payload: Value| -> BoxFuture<Result<Value, HandlerError>> {
            let input = match serde_json::from_value::<I>(payload) {
                Ok(input) => input,
                Err(error) => {
                    let error = HandlerError::invalid_input(format!("payload does not match the input type: {error}"));
                    return Box::pin(async move { Err(error) });
                }
            };
            let running = function(ctx, input);
            Box::pin(async move {
                let output = running.await?;
                serde_json::to_value(output)
                    .map_err(|error| HandlerError::new("OUTPUT_ENCODING", error.to_string()).with_status(500))
            })
        };
        Self {
            descriptor,
            invoke: Arc::new(invoke),
            stream: None,
        }
    }

    /// Wraps `function`, which returns a [`Stream`] of items, as the
    /// streaming handler of `capability` at `version` (DESIGN §8,
    /// "Streaming"). A caller asking for `text/event-stream` gets each item
    /// as one event as it is produced, then the router's `event: result`;
    /// an error after the first item ends the stream as `event: error`
    /// (before it, it is an ordinary error answer). A caller that did not
    /// ask for events gets the items collected as an array, which is what
    /// the registered `output_schema` describes (an array of `O`).
    ///
    /// ```
    /// use agent_reach_sdk::{Ctx, Handler, HandlerError};
    /// #[derive(serde::Deserialize, schemars::JsonSchema)]
    /// struct Prompt { text: String }
    /// #[derive(serde::Serialize, schemars::JsonSchema)]
    /// struct Token { token: String }
    ///
    /// let handler = Handler::streaming("demo.tokens", "1.0.0", |_ctx: Ctx, input: Prompt| {
    ///     let words: Vec<String> = input.text.split(' ').map(str::to_string).collect();
    ///     futures::stream::iter(words.into_iter().map(|token| Ok::<_, HandlerError>(Token { token })))
    /// });
    /// assert_eq!(handler.descriptor().output_schema["type"], "array");
    /// ```
    pub fn streaming<I, O, F, S>(capability: &str, version: &str, function: F) -> Self
    where
        I: DeserializeOwned + JsonSchema + Send + 'static,
        O: Serialize + JsonSchema + 'static,
        F: Fn(Ctx, I) -> S + Send + Sync + 'static,
        S: Stream<Item = Result<O, HandlerError>> + Send + 'static,
    {
        let item_schema = schema_of::<O>();
        let mut output_schema = serde_json::json!({ "type": "array", "items": item_schema });
        // The item's `$defs` (named subschemas, `#/$defs/..` refs) and `$schema`
        // belong at the root of the array's schema.
        for key in ["$defs", "$schema"] {
            if let Some(value) = output_schema["items"]
                .as_object_mut()
                .and_then(|items| items.remove(key))
            {
                output_schema[key] = value;
            }
        }
        let descriptor = Descriptor {
            capability: capability.to_string(),
            version: version.to_string(),
            description: String::new(),
            input_schema: schema_of::<I>(),
            output_schema,
            timeout_ms: None,
            check_output: true,
            preemptible: false,
        };
        let function = Arc::new(function);
        let stream = move |ctx: Ctx, payload: Value| -> BoxStream<Result<Value, HandlerError>> {
            let input = match serde_json::from_value::<I>(payload) {
                Ok(input) => input,
                Err(error) => {
                    let error = HandlerError::invalid_input(format!("payload does not match the input type: {error}"));
                    return Box::pin(futures::stream::once(async move { Err(error) }));
                }
            };
            Box::pin(function(ctx, input).map(|item| {
                item.and_then(|output| {
                    serde_json::to_value(output)
                        .map_err(|error| HandlerError::new("OUTPUT_ENCODING", error.to_string()).with_status(500))
                })
            }))
        };
        let stream: Arc<InvokeStream> = Arc::new(stream);
        let collect = stream.clone();
        let invoke = move |ctx: Ctx, payload: Value| -> BoxFuture<Result<Value, HandlerError>> {
            let mut items = collect(ctx, payload);
            Box::pin(async move {
                let mut all = Vec::new();
                while let Some(item) = items.next().await {
                    all.push(item?);
                }
                Ok(Value::Array(all))
            })
        };
        Self {
            descriptor,
            invoke: Arc::new(invoke),
            stream: Some(stream),
        }
    }

    /// A human description shown by `agent-reach capabilities show`.
    pub fn description(mut self, text: &str) -> Self {
        self.descriptor.description = text.to_string();
        self
    }

    /// The capability's default deadline when a caller gives none.
    pub fn timeout_ms(mut self, timeout_ms: u64) -> Self {
        self.descriptor.timeout_ms = Some(timeout_ms);
        self
    }

    /// Asks the router not to check answers against the output schema (for a
    /// handler whose output type cannot describe all it sends; the default,
    /// checked, catches an agent whose answers changed shape).
    pub fn without_output_check(mut self) -> Self {
        self.descriptor.check_output = false;
        self
    }

    /// Declares the capability preemptible (DESIGN §9): when higher-priority
    /// work waits for this agent's room, the router may ask a running task's
    /// handler to pause. The handler looks at [`Ctx::pause_requested`] at its
    /// checkpoints and, when asked, returns [`HandlerError::paused`] with a
    /// checkpoint; the task is resumed later (on any instance) with a delivery
    /// whose [`Ctx::checkpoint`] is that value. Only task deliveries are ever
    /// paused; a handler that never checks simply runs to its end.
    pub fn preemptible(mut self) -> Self {
        self.descriptor.preemptible = true;
        self
    }

    pub fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }
}

fn schema_of<T: JsonSchema>() -> Value {
    let schema = schemars::schema_for!(T);
    serde_json::to_value(&schema).unwrap_or(Value::Bool(true))
}

/// Anything that can become a [`Handler`]: a `Handler` itself, or a function
/// annotated with [`handler`](crate::handler).
pub trait IntoHandler {
    fn into_handler(self) -> Handler;
}

impl IntoHandler for Handler {
    fn into_handler(self) -> Handler {
        self
    }
}
