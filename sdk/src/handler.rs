//! Handlers: typed async functions and the capability descriptors derived
//! from their types, so the registered schema always matches the code.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::{Ctx, HandlerError};

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Invoke = dyn Fn(Ctx, Value) -> BoxFuture<Result<Value, HandlerError>> + Send + Sync;

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
}

/// A capability implementation: its descriptor and the type-erased function.
#[derive(Clone)]
pub struct Handler {
    pub(crate) descriptor: Descriptor,
    pub(crate) invoke: Arc<Invoke>,
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
