//! "Can my order ship today?" — the seeds' scenario as four agents:
//!
//! `intent_parser` → `order_query` (three instances, weights 3:2:1) →
//! `shipping_rules` → `reply_writer`, each calling the next through the
//! router, passing `user_id`, `intent` and `order_status` through the context
//! service. Every agent returns the chain below it, so the caller sees each
//! hop (instance, attempts, latency, trace id).

pub mod stack;

use agent_reach_sdk::{handler, Agent, CallError, Ctx, HandlerError, StartError, Usage};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// === Wire types of the scenario ===

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Question {
    pub user_id: String,
    pub text: String,
}

/// One call in the chain, as seen by its caller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Hop {
    pub capability: String,
    pub agent_id: String,
    pub attempts: u32,
    pub duration_ms: u64,
    /// The trace id the called agent saw (one trace across the chain).
    pub trace_id: String,
}

/// The answer and the hops that produced it, innermost last.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Chain {
    pub reply: String,
    pub ships_today: bool,
    pub trace: Vec<Hop>,
    /// The trace id this agent saw.
    pub trace_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct OrderQuery {
    pub order_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OrderStatus {
    pub order_id: String,
    pub status: String,
    pub warehouse: String,
    /// Hour of day (0-23) the order was placed.
    pub placed_at_hour: u8,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ShippingQuestion {
    pub order: OrderStatus,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ReplyRequest {
    pub ships_today: bool,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Reply {
    pub reply: String,
    pub trace_id: String,
}

/// Orders placed before this hour ship the same day.
pub const CUTOFF_HOUR: u8 = 15;

fn trace_id(ctx: &Ctx) -> String {
    ctx.traceparent()
        .and_then(|header| header.split('-').nth(1))
        .unwrap_or("none")
        .to_string()
}

/// Calls `capability` and prepends its hop to the chain it returns.
async fn call_chain(ctx: &Ctx, capability: &str, input: impl Serialize) -> Result<Chain, HandlerError> {
    let envelope = ctx.call_envelope(capability, input).await?;
    let chain: Chain = serde_json::from_value(envelope.output.unwrap_or_default())
        .map_err(|error| HandlerError::new("BAD_DOWNSTREAM_OUTPUT", error.to_string()).with_status(502))?;
    let mut trace = vec![Hop {
        capability: capability.to_string(),
        agent_id: envelope.agent_id.unwrap_or_default(),
        attempts: envelope.attempts,
        duration_ms: envelope.duration_ms,
        trace_id: chain.trace_id.clone(),
    }];
    trace.extend(chain.trace);
    Ok(Chain {
        trace,
        trace_id: trace_id(ctx),
        ..chain
    })
}

// === The agents ===

/// Understands the question, records who asks and what they want, and asks
/// `order.query` about the order it mentions.
#[handler(
    capability = "intent.parse",
    version = "1.0.0",
    description = "Parse a customer question"
)]
pub async fn intent_parse(ctx: Ctx, input: Question) -> Result<Chain, HandlerError> {
    let text = input.text.to_lowercase();
    let intent = if text.contains("ship") && text.contains("today") {
        "ask_ship_today"
    } else {
        "unknown"
    };
    let order_id = input
        .text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .find(|word| word.starts_with("SO-"))
        .ok_or_else(|| HandlerError::new("NO_ORDER_ID", "the question names no order (e.g. SO-2024001)"))?
        .to_string();
    ctx.context()
        .patch()
        .set("user_id", &input.user_id)
        .set("intent", intent)
        .send()
        .await?;
    call_chain(&ctx, "order.query", OrderQuery { order_id }).await
}

/// Looks the order up (a fixed table stands in for the order database) and
/// asks `shipping.rules` whether it ships today.
#[handler(capability = "order.query", version = "1.2.0", description = "Look up an order")]
pub async fn order_query(ctx: Ctx, input: OrderQuery) -> Result<Chain, HandlerError> {
    let order = lookup_order(&input.order_id)
        .ok_or_else(|| HandlerError::new("ORDER_NOT_FOUND", format!("no order {}", input.order_id)).with_status(404))?;
    ctx.context().patch().set("order_status", &order).send().await?;
    call_chain(&ctx, "shipping.rules", ShippingQuestion { order }).await
}

/// The order table of the example.
pub fn lookup_order(order_id: &str) -> Option<OrderStatus> {
    let (status, warehouse, hour) = match order_id {
        "SO-2024001" => ("paid", "SH-01", 10),
        "SO-2024002" => ("paid", "SZ-02", 17),
        "SO-2024003" => ("pending_payment", "SH-01", 9),
        _ => return None,
    };
    Some(OrderStatus {
        order_id: order_id.to_string(),
        status: status.to_string(),
        warehouse: warehouse.to_string(),
        placed_at_hour: hour,
    })
}

/// Applies the shipping rules, then has `reply.write` phrase the answer.
#[handler(
    capability = "shipping.rules",
    version = "1.0.0",
    description = "Same-day shipping rules"
)]
pub async fn shipping_rules(ctx: Ctx, input: ShippingQuestion) -> Result<Chain, HandlerError> {
    let (ships_today, reason) = decide(&input.order);
    let envelope = ctx
        .call_envelope("reply.write", ReplyRequest { ships_today, reason })
        .await?;
    let reply: Reply = serde_json::from_value(envelope.output.unwrap_or_default())
        .map_err(|error| HandlerError::new("BAD_DOWNSTREAM_OUTPUT", error.to_string()).with_status(502))?;
    Ok(Chain {
        reply: reply.reply,
        ships_today,
        trace: vec![Hop {
            capability: "reply.write".to_string(),
            agent_id: envelope.agent_id.unwrap_or_default(),
            attempts: envelope.attempts,
            duration_ms: envelope.duration_ms,
            trace_id: reply.trace_id,
        }],
        trace_id: trace_id(&ctx),
    })
}

// === The same steps for the workflow (examples/workflows/ship-today.yaml) ===
//
// The hand-written chain has each agent call the next; as a workflow the
// router calls each step and passes outputs on. These are the chain's own
// decisions without the onward call.

/// What `intent.classify` makes of a question.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Intent {
    pub intent: String,
    pub order_id: String,
}

/// What `shipping.decide` says.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Decision {
    pub ships_today: bool,
    pub reason: String,
}

/// The intent and the order a question names; records who asks and what they want.
#[handler(
    capability = "intent.classify",
    version = "1.0.0",
    description = "Classify a customer question (a workflow step)"
)]
pub async fn intent_classify(ctx: Ctx, input: Question) -> Result<Intent, HandlerError> {
    let text = input.text.to_lowercase();
    let intent = if text.contains("ship") && text.contains("today") {
        "ask_ship_today"
    } else {
        "unknown"
    };
    let order_id = input
        .text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .find(|word| word.starts_with("SO-"))
        .ok_or_else(|| HandlerError::new("NO_ORDER_ID", "the question names no order (e.g. SO-2024001)"))?
        .to_string();
    ctx.context()
        .patch()
        .set("user_id", &input.user_id)
        .set("intent", intent)
        .send()
        .await?;
    Ok(Intent {
        intent: intent.to_string(),
        order_id,
    })
}

/// The order, looked up (a workflow step).
#[handler(
    capability = "order.lookup",
    version = "1.0.0",
    description = "Look up an order (a workflow step)"
)]
pub async fn order_lookup(ctx: Ctx, input: OrderQuery) -> Result<OrderStatus, HandlerError> {
    let order = lookup_order(&input.order_id)
        .ok_or_else(|| HandlerError::new("ORDER_NOT_FOUND", format!("no order {}", input.order_id)).with_status(404))?;
    ctx.context().patch().set("order_status", &order).send().await?;
    Ok(order)
}

/// The shipping rules' decision (a workflow step).
#[handler(
    capability = "shipping.decide",
    version = "1.0.0",
    description = "Decide same-day shipping (a workflow step)"
)]
pub async fn shipping_decide(_ctx: Ctx, input: ShippingQuestion) -> Result<Decision, HandlerError> {
    let (ships_today, reason) = decide(&input.order);
    Ok(Decision { ships_today, reason })
}

/// The shipping rules, once for the chain and the workflow.
fn decide(order: &OrderStatus) -> (bool, String) {
    if order.status != "paid" {
        (false, format!("it is not paid yet ({})", order.status))
    } else if order.placed_at_hour >= CUTOFF_HOUR {
        (
            false,
            format!("it was placed after the {CUTOFF_HOUR}:00 cutoff; it ships tomorrow"),
        )
    } else {
        (
            true,
            format!("it is paid and leaves warehouse {} before the cutoff", order.warehouse),
        )
    }
}

/// The workflow of the example: the chain declared (`agent-reach demo` registers and runs it).
pub const SHIP_TODAY_WORKFLOW: &str = include_str!("../workflows/ship-today.yaml");

/// The model `reply.write` reports its usage under (DESIGN §3.5 `usage`).
pub const REPLY_MODEL: &str = "reply-template-1";

/// Writes the customer-facing reply from what the context says (it may read
/// `user_id`, `intent` and `order_status`, nothing else).
#[handler(capability = "reply.write", version = "1.0.0", description = "Phrase the reply")]
pub async fn reply_write(ctx: Ctx, input: ReplyRequest) -> Result<Reply, HandlerError> {
    let context = ctx.context().get(&["user_id", "intent", "order_status"]).await?;
    let user = context
        .fields
        .get("user_id")
        .and_then(|value| value.as_str())
        .unwrap_or("there");
    let order_id = context
        .fields
        .get("order_status")
        .and_then(|status| status.get("order_id"))
        .and_then(|value| value.as_str())
        .unwrap_or("your order");
    let reply = if input.ships_today {
        format!("Hi {user}, good news: order {order_id} ships today ({}).", input.reason)
    } else {
        format!("Hi {user}, order {order_id} does not ship today: {}.", input.reason)
    };
    // Phrasing is where a real agent would call a model: report what it cost,
    // as one would (here the template's words stand in for tokens).
    let words = |text: &str| text.split_whitespace().count() as u64;
    ctx.report_usage(Usage::tokens(REPLY_MODEL, words(&input.reason) + 8, words(&reply)));
    Ok(Reply {
        reply,
        trace_id: trace_id(&ctx),
    })
}

// === Running the scenario ===

/// One instance to run: which agent, its instance id and weight.
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    pub name: &'static str,
    pub agent_id: String,
    pub weight: u32,
}

/// The scenario's instances: order_query runs three times, weights 3:2:1.
pub fn scenario_instances() -> Vec<InstanceSpec> {
    let one = |name: &'static str, agent_id: &str, weight: u32| InstanceSpec {
        name,
        agent_id: agent_id.to_string(),
        weight,
    };
    vec![
        one("intent_parser", "intent_parser-1", 1),
        one("order_query", "order_query-1", 3),
        one("order_query", "order_query-2", 2),
        one("order_query", "order_query-3", 1),
        one("shipping_rules", "shipping_rules-1", 1),
        one("reply_writer", "reply_writer-1", 1),
    ]
}

/// Where an agent finds the services, and how it proves who it is.
#[derive(Debug, Clone)]
pub struct Services {
    pub registry: String,
    pub router: String,
    /// gRPC URL of the context service.
    pub context: String,
}

/// Where an instance listens and the URL the router reaches it at.
#[derive(Debug, Clone)]
pub struct Placement {
    pub listen: std::net::SocketAddr,
    /// Externally reachable base URL; `None` registers the bound address,
    /// which is right only when the router runs on the same host.
    pub endpoint: Option<String>,
}

impl Default for Placement {
    /// A free loopback port, registered as is (one host: `dev`, tests).
    fn default() -> Self {
        Self {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            endpoint: None,
        }
    }
}

/// Starts one instance, ready for traffic. `token` must be a JWT whose `sub` is `spec.name`.
pub async fn start_instance(spec: &InstanceSpec, services: &Services, token: String) -> Result<Agent, StartError> {
    start_instance_at(spec, services, token, &Placement::default()).await
}

/// [`start_instance`] listening and reachable where `placement` says
/// (containers: `0.0.0.0:PORT`, reached by the service's DNS name).
pub async fn start_instance_at(
    spec: &InstanceSpec,
    services: &Services,
    token: String,
    placement: &Placement,
) -> Result<Agent, StartError> {
    let builder = Agent::builder(spec.name, &spec.agent_id).listen(placement.listen);
    let builder = match &placement.endpoint {
        Some(endpoint) => builder.endpoint(endpoint),
        None => builder,
    };
    let builder = builder
        .registry(&services.registry)
        .router(&services.router)
        .context_service(&services.context)
        .token(token)
        .weight(spec.weight);
    let builder = match spec.name {
        "intent_parser" => builder.handler(intent_parse).handler(intent_classify),
        "order_query" => builder.handler(order_query).handler(order_lookup),
        "shipping_rules" => builder.handler(shipping_rules).handler(shipping_decide),
        "reply_writer" => builder.handler(reply_write),
        other => return Err(StartError::Config(format!("unknown example agent `{other}`"))),
    };
    let agent = builder.start().await?;
    agent.mark_ready();
    Ok(agent)
}

/// The names of the example agents.
pub const AGENT_NAMES: [&str; 4] = ["intent_parser", "order_query", "shipping_rules", "reply_writer"];

/// A call failed in a way the example cannot recover from.
pub fn describe(error: &CallError) -> String {
    format!("{} ({})", error.message, error.code)
}

/// The policy the example needs, exactly: these calls, providers and reads.
pub const EXAMPLE_ACL: &str = include_str!("../acl.yaml");
