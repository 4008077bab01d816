//! Model usage an agent reports beside its output (DESIGN §3.5: `usage:
//! {cost, input_tokens?, output_tokens?, model?}`): put on the call's request
//! span under the OpenTelemetry GenAI conventions' names
//! (`gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`,
//! `gen_ai.request.model`) and counted in
//! `agent_reach_model_tokens_total{capability,model,type}`.
//!
//! The model name is the agent's to choose, so its label is bounded: at most
//! [`MODELS_PER_CAPABILITY`] names per capability (later ones count under
//! `_other`), each cut to [`MODEL_LABEL_BYTES`]. The counters of a model are
//! looked up in a short list per capability, locked only by calls that
//! report usage; the family is never searched per call.

use std::sync::{Arc, Mutex, PoisonError};

use agent_reach_proto::envelope::Usage;
use agent_reach_telemetry::spans::{KeyValue, RequestSpan};
use prometheus::{IntCounter, IntCounterVec};
use serde_json::value::RawValue;

/// Distinct model labels one capability may add to the token metric.
pub const MODELS_PER_CAPABILITY: usize = 16;
/// The longest model label kept (longer names are cut at a character boundary).
pub const MODEL_LABEL_BYTES: usize = 64;

/// The `usage` of an agent's answer, when it sent one the router can read. A
/// malformed one is logged and left out: the output still stands.
pub(crate) fn parse(raw: Option<&RawValue>, agent_id: &str) -> Option<Usage> {
    let raw = raw?;
    match serde_json::from_str::<Usage>(raw.get()) {
        Ok(usage) => Some(usage),
        Err(error) => {
            tracing::warn!(
                message = "An agent's usage is not {cost, input_tokens?, output_tokens?, model?}; left out.",
                agent_id, %error
            );
            None
        }
    }
}

/// `usage` on the request's span (a call's `invoke_agent` or `execute_tool` span) and in the token metric.
pub(crate) fn record(usage: &Usage, tokens: &ModelTokens, span: Option<&RequestSpan>) {
    tokens.count(usage);
    let Some(span) = span else { return };
    if let Some(input) = usage.input_tokens {
        span.set(KeyValue::new("gen_ai.usage.input_tokens", saturating_i64(input)));
    }
    if let Some(output) = usage.output_tokens {
        span.set(KeyValue::new("gen_ai.usage.output_tokens", saturating_i64(output)));
    }
    if let Some(model) = &usage.model {
        span.set(KeyValue::new("gen_ai.request.model", model.clone()));
    }
    span.set(KeyValue::new("usage.cost", usage.cost));
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A model label and its `[input, output]` counters.
type ModelSeries = (Box<str>, [IntCounter; 2]);

/// One capability's series of `agent_reach_model_tokens_total`.
#[derive(Clone)]
pub struct ModelTokens {
    family: IntCounterVec,
    capability: Arc<str>,
    /// At most `MODELS_PER_CAPABILITY + 1` entries (`_other` last).
    seen: Arc<Mutex<Vec<ModelSeries>>>,
}

impl ModelTokens {
    pub fn new(family: IntCounterVec, capability: &str) -> Self {
        Self {
            family,
            capability: capability.into(),
            seen: Arc::default(),
        }
    }

    fn count(&self, usage: &Usage) {
        if usage.input_tokens.is_none() && usage.output_tokens.is_none() {
            return;
        }
        let [input, output] = self.counters(usage.model.as_deref().unwrap_or("unknown"));
        input.inc_by(usage.input_tokens.unwrap_or(0));
        output.inc_by(usage.output_tokens.unwrap_or(0));
    }

    fn counters(&self, model: &str) -> [IntCounter; 2] {
        let model = label(model);
        // A panic while holding the lock leaves a valid list behind.
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, counters)) = seen.iter().find(|(known, _)| &**known == model) {
            return counters.clone();
        }
        let model = if seen.len() >= MODELS_PER_CAPABILITY {
            "_other"
        } else {
            model
        };
        if let Some((_, counters)) = seen.iter().find(|(known, _)| &**known == model) {
            return counters.clone();
        }
        let counters = ["input", "output"].map(|kind| self.family.with_label_values(&[&self.capability, model, kind]));
        seen.push((model.into(), counters.clone()));
        counters
    }
}

/// `model` cut to [`MODEL_LABEL_BYTES`] at a character boundary.
fn label(model: &str) -> &str {
    if model.len() <= MODEL_LABEL_BYTES {
        return model;
    }
    let mut end = MODEL_LABEL_BYTES;
    while !model.is_char_boundary(end) {
        end -= 1;
    }
    &model[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Opts;

    fn family() -> IntCounterVec {
        IntCounterVec::new(
            Opts::new("agent_reach_model_tokens_total", "t"),
            &["capability", "model", "type"],
        )
        .unwrap()
    }

    #[test]
    fn tokens_are_counted_by_model_and_type_with_a_bounded_label_set() {
        let family = family();
        let tokens = ModelTokens::new(family.clone(), "text.summarize");
        tokens.count(&Usage::tokens("m-1", 10, 4));
        tokens.count(&Usage::tokens("m-1", 1, 1));
        let value = |model: &str, kind: &str| family.with_label_values(&["text.summarize", model, kind]).get();
        assert_eq!((value("m-1", "input"), value("m-1", "output")), (11, 5));
        // Cost alone counts no tokens.
        tokens.count(&Usage {
            cost: 2.0,
            ..Usage::default()
        });
        for index in 0..MODELS_PER_CAPABILITY + 5 {
            tokens.count(&Usage::tokens(format!("model-{index}"), 1, 0));
        }
        assert_eq!(value("_other", "input"), 6, "models past the bound count as _other");
        let long = "é".repeat(40);
        assert_eq!(label(&long).len(), 64);
        assert!(parse(Some(&RawValue::from_string("{\"cost\":\"x\"}".into()).unwrap()), "a").is_none());
        assert_eq!(
            parse(Some(&RawValue::from_string("{\"cost\":1}".into()).unwrap()), "a").map(|usage| usage.cost),
            Some(1.0)
        );
    }
}
