//! The Agent-Reach Rust SDK: plain async functions become capability handlers
//! that register themselves, stay alive, serve the router, call other
//! capabilities and share session context.
//!
//! ```no_run
//! use agent_reach_sdk::{handler, Agent, Ctx, HandlerError};
//! use schemars::JsonSchema;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Deserialize, JsonSchema)]
//! struct OrderQuery { order_id: String }
//!
//! #[derive(Serialize, JsonSchema)]
//! struct OrderStatus { status: String, ships_today: bool }
//!
//! /// Look up an order.
//! #[handler(capability = "order.query", version = "1.2.0")]
//! async fn order_query(ctx: Ctx, input: OrderQuery) -> Result<OrderStatus, HandlerError> {
//!     if input.order_id.is_empty() {
//!         return Err(HandlerError::new("ORDER_NOT_FOUND", "empty order id"));
//!     }
//!     Ok(OrderStatus { status: "paid".into(), ships_today: true })
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let agent = Agent::builder("order_query", "order_query-1")
//!     .registry("http://127.0.0.1:7400")
//!     .token(std::env::var("AGENT_REACH_TOKEN")?)
//!     .handler(order_query)
//!     .start()
//!     .await?;
//! agent.mark_ready();
//! agent.run_until_signal().await;
//! # Ok(()) }
//! ```

mod agent;
mod ctx;
mod dedup;
mod error;
mod handler;
mod server;
mod state;
mod stream;
mod verify;

pub use agent::{Agent, AgentBuilder};
pub use agent_reach_sdk_macros::handler;
pub use ctx::{ContextHandle, ContextPatch, ContextSnapshot, Ctx};
pub use error::{CallError, HandlerError, StartError};
pub use handler::{Descriptor, Handler, IntoHandler};
pub use state::Status;
pub use verify::INSECURE_ACCEPT_UNVERIFIED_ENV;
