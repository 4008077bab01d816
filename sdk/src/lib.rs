//! The Agent-Reach Rust SDK: plain async functions become capability handlers
//! that register themselves, stay alive, report their load, serve the router,
//! call other capabilities and share session context; [`Client`] calls the
//! router from programs that are not agents.
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

mod access;
mod agent;
mod answer;
mod call;
mod client;
mod ctx;
mod dedup;
mod error;
mod handler;
mod registries;
mod report;
mod server;
mod state;
mod stream;
mod verify;

pub use access::AccessRequest;
pub use agent::{Agent, AgentBuilder, LoadReporter};
pub use agent_reach_proto::envelope::{BudgetGiven, BudgetLeft, ResultEnvelope, TargetPolicy, Usage};
pub use agent_reach_proto::Priority;
pub use agent_reach_sdk_macros::handler;
pub use call::CallOptions;
pub use client::{
    verify_callback, Callback, Client, SessionResult, SessionResults, TaskAccepted, TaskEvent, TaskStatus, TaskView,
    Transition,
};
pub use ctx::{ContextHandle, ContextPatch, ContextSnapshot, ContextTier, Ctx, Turn};
pub use error::{CallError, HandlerError, RouterCode, StartError};
pub use handler::{Descriptor, Handler, IntoHandler};
pub use state::{Load, LoadThresholds, Status};
pub use verify::INSECURE_ACCEPT_UNVERIFIED_ENV;
