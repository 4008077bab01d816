//! The checks of whole definitions: what passes, and each refusal's reason,
//! step and pointer.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::check::{Catalog, Offer};
use crate::{check, definition, OnFailure, Reason};

/// Registered capabilities: name → (versions, input schema, output schema).
struct Registered(HashMap<&'static str, (Vec<&'static str>, Value, Value)>);

impl Catalog for Registered {
    fn offer(&self, name: &str, requirement: Option<&semver::VersionReq>) -> Offer {
        if name == "other.workflow" {
            return Offer::Workflow;
        }
        let Some((versions, input, output)) = self.0.get(name) else {
            return Offer::Unknown;
        };
        let matching = versions
            .iter()
            .filter_map(|text| semver::Version::parse(text).ok())
            .filter(|version| requirement.is_none_or(|requirement| requirement.matches(version)))
            .max();
        match matching {
            Some(version) => Offer::Found {
                version: version.to_string(),
                input_schema: Some(input.clone()),
                output_schema: Some(output.clone()),
            },
            None => Offer::NoVersion {
                available: versions.iter().map(ToString::to_string).collect(),
            },
        }
    }
}

fn catalog() -> Registered {
    let order_in = json!({"type": "object", "required": ["order_id"], "properties": {"order_id": {"type": "string"}}});
    let order_out = json!({"type": "object", "properties": {
        "status": {"type": "string"}, "paid": {"type": "boolean"},
        "items": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}}}}
    }});
    let sku_in = json!({"type": "object", "required": ["sku"], "properties": {"sku": {"type": "string"}}, "additionalProperties": false});
    let stock_out = json!({"type": "object", "properties": {"in_stock": {"type": "boolean"}}});
    let reply_in = json!({"type": "object", "properties": {"text": {"type": "string"}, "stock": {"type": "array"}}});
    Registered(HashMap::from([
        ("order.query", (vec!["1.2.0", "2.0.0"], order_in.clone(), order_out)),
        ("stock.check", (vec!["1.0.0"], sku_in, stock_out)),
        ("reply.write", (vec!["1.0.0"], reply_in, json!({"type": "object"}))),
        ("order.release", (vec!["1.0.0"], order_in, json!({}))),
    ]))
}

/// Order → stock per item (fan-out) → reply (fan-in); a `when`; a compensation.
fn good() -> Value {
    json!({
        "version": "1.0.0",
        "description": "Can my order ship today?",
        "input_schema": {"type": "object", "required": ["order_id"], "properties": {"order_id": {"type": "string"}}},
        "output_schema": {"type": "object", "required": ["reply"]},
        "steps": [
            {"id": "order", "capability": "order.query", "version": "^1", "input": {"order_id": "${input.order_id}"},
             "retry": {"max_attempts": 3, "backoff_ms": 10, "codes": ["AGENT_ERROR"]},
             "on_failure": {"compensate": {"capability": "order.release", "input": {"order_id": "${input.order_id}"}}}},
            {"id": "stock", "capability": "stock.check", "for_each": "${steps.order.output.items}",
             "max_parallel": 4, "input": {"sku": "${item.sku}"}, "when": "${steps.order.output.paid == true}"},
            {"id": "reply", "capability": "reply.write", "depends_on": ["stock"],
             "input": {"text": "order ${input.order_id} is ${steps.order.output.status}", "stock": "${steps.stock.output}"},
             "on_failure": "continue"}
        ],
        "output": {"reply": "${steps.reply.output}", "stock": "${steps.stock.output}"}
    })
}

fn checked(definition: Value) -> Result<crate::Workflow, crate::Problem> {
    check::check(
        "order.ship_today",
        definition::from_value(definition)?,
        Some(&catalog()),
    )
}

#[test]
fn a_good_definition_is_ordered_with_its_implied_dependencies() {
    let workflow = checked(good()).unwrap();
    assert_eq!(workflow.version.to_string(), "1.0.0");
    let ids: Vec<&str> = workflow
        .order
        .iter()
        .map(|index| workflow.steps[*index].id.as_str())
        .collect();
    assert_eq!(ids, ["order", "stock", "reply"]);
    assert_eq!(workflow.steps[1].depends_on, [0], "read by for_each and when");
    assert_eq!(workflow.steps[2].depends_on, [0, 1], "written and read");
    assert_eq!(workflow.steps[1].max_parallel, 4);
    assert_eq!(workflow.steps[0].retry.max_attempts, 3);
    assert!(matches!(workflow.steps[0].on_failure, OnFailure::Compensate(_)));
    assert!(matches!(workflow.steps[2].on_failure, OnFailure::Continue));
    assert!(workflow.input_validator.is_valid(&json!({"order_id": "SO-1"})));
    assert!(!workflow.input_validator.is_valid(&json!({})));
    // A router trusts what the registry stored: no catalog needed.
    let stored = crate::Workflow::from_stored("order.ship_today", good()).unwrap();
    assert_eq!(stored.steps.len(), 3);
}

/// Each bad definition: (what to change, reason, step, pointer).
#[test]
fn each_bad_definition_has_its_reason_step_and_pointer() {
    type Change = fn(&mut Value);
    let cases: Vec<(&str, Change, Reason, Option<&str>, &str)> = vec![
        (
            "a cycle",
            |d| d["steps"][0]["depends_on"] = json!(["reply"]),
            Reason::Cycle,
            Some("order"),
            "/steps/0/depends_on",
        ),
        (
            "a self dependency",
            |d| d["steps"][1]["depends_on"] = json!(["stock"]),
            Reason::Cycle,
            Some("stock"),
            "/steps/1/depends_on/0",
        ),
        (
            "an unknown step in depends_on",
            |d| d["steps"][2]["depends_on"] = json!(["stock", "nope"]),
            Reason::UnknownStep,
            Some("reply"),
            "/steps/2/depends_on/1",
        ),
        (
            "an unknown step in an expression",
            |d| d["steps"][2]["input"]["text"] = json!("${steps.nope.output}"),
            Reason::UnknownStep,
            Some("reply"),
            "/steps/2/input/text",
        ),
        (
            "an unknown step in the output",
            |d| d["output"]["x"] = json!("${steps.nope.output}"),
            Reason::UnknownStep,
            None,
            "/output/x",
        ),
        (
            "an expression that does not parse",
            |d| d["steps"][0]["input"]["order_id"] = json!("${input.order_id ==}"),
            Reason::BadExpression,
            Some("order"),
            "/steps/0/input/order_id",
        ),
        (
            "a when that is not one expression",
            |d| d["steps"][1]["when"] = json!("yes"),
            Reason::BadExpression,
            Some("stock"),
            "/steps/1/when",
        ),
        (
            "item outside for_each",
            |d| d["steps"][2]["input"]["text"] = json!("${item}"),
            Reason::BadExpression,
            Some("reply"),
            "/steps/2/input/text",
        ),
        (
            "an unknown capability",
            |d| d["steps"][2]["capability"] = json!("reply.nobody"),
            Reason::UnknownCapability,
            Some("reply"),
            "/steps/2/capability",
        ),
        (
            "a workflow as a step",
            |d| d["steps"][2]["capability"] = json!("other.workflow"),
            Reason::UnknownCapability,
            Some("reply"),
            "/steps/2/capability",
        ),
        (
            "an unknown compensation",
            |d| d["steps"][0]["on_failure"]["compensate"]["capability"] = json!("no.such"),
            Reason::UnknownCapability,
            Some("order"),
            "/steps/0/on_failure/compensate/capability",
        ),
        (
            "no matching version",
            |d| d["steps"][0]["version"] = json!("^3"),
            Reason::UnknownVersion,
            Some("order"),
            "/steps/0/version",
        ),
        (
            "a mapping of the wrong type",
            |d| d["steps"][0]["input"]["order_id"] = json!("${input}"),
            Reason::Mapping,
            Some("order"),
            "/steps/0/input/order_id",
        ),
        (
            "a required field missing",
            |d| d["steps"][1]["input"] = json!({}),
            Reason::Mapping,
            Some("stock"),
            "/steps/1/input",
        ),
        (
            "a field the schema forbids",
            |d| d["steps"][1]["input"]["qty"] = json!(1),
            Reason::Mapping,
            Some("stock"),
            "/steps/1/input/qty",
        ),
        (
            "for_each over a non-array",
            |d| d["steps"][1]["for_each"] = json!("${steps.order.output.status}"),
            Reason::Mapping,
            Some("stock"),
            "/steps/1/for_each",
        ),
        (
            "an output that never fits",
            |d| d["output"] = json!("${steps.order.output.status}"),
            Reason::Mapping,
            None,
            "/output",
        ),
        (
            "a bad name in a step",
            |d| d["steps"][0]["capability"] = json!("Order.Query"),
            Reason::InvalidName,
            Some("order"),
            "/steps/0/capability",
        ),
        (
            "a duplicate id",
            |d| d["steps"][1]["id"] = json!("order"),
            Reason::InvalidField,
            Some("order"),
            "/steps/1/id",
        ),
        (
            "a bad id",
            |d| d["steps"][1]["id"] = json!("Stock-1"),
            Reason::InvalidField,
            None,
            "/steps/1/id",
        ),
        (
            "a bad version",
            |d| d["version"] = json!("one"),
            Reason::InvalidField,
            None,
            "/version",
        ),
        (
            "a bad requirement",
            |d| d["steps"][0]["version"] = json!("^^1"),
            Reason::InvalidField,
            Some("order"),
            "/steps/0/version",
        ),
        (
            "max_parallel without for_each",
            |d| d["steps"][0]["max_parallel"] = json!(2),
            Reason::InvalidField,
            Some("order"),
            "/steps/0/max_parallel",
        ),
        (
            "max_parallel too large",
            |d| d["steps"][1]["max_parallel"] = json!(1000),
            Reason::InvalidField,
            Some("stock"),
            "/steps/1/max_parallel",
        ),
        (
            "too many attempts",
            |d| d["steps"][0]["retry"]["max_attempts"] = json!(11),
            Reason::InvalidField,
            Some("order"),
            "/steps/0/retry/max_attempts",
        ),
        (
            "a zero timeout",
            |d| d["steps"][0]["timeout_ms"] = json!(0),
            Reason::InvalidField,
            Some("order"),
            "/steps/0/timeout_ms",
        ),
        (
            "a bad on_failure",
            |d| d["steps"][0]["on_failure"] = json!("retry"),
            Reason::InvalidField,
            Some("order"),
            "/steps/0/on_failure",
        ),
        (
            "an invalid input schema",
            |d| d["input_schema"] = json!({"type": "strange"}),
            Reason::InvalidSchema,
            None,
            "/input_schema",
        ),
        (
            "no steps",
            |d| d["steps"] = json!([]),
            Reason::InvalidField,
            None,
            "/steps",
        ),
        (
            "too many steps",
            |d| {
                d["steps"] = Value::Array(
                    (0..65)
                        .map(
                            |i| json!({"id": format!("s{i}"), "capability": "order.query", "input": {"order_id": "x"}}),
                        )
                        .collect(),
                );
            },
            Reason::TooLarge,
            None,
            "/steps",
        ),
        (
            "another name in the body",
            |d| d["name"] = json!("other.name"),
            Reason::InvalidField,
            None,
            "/name",
        ),
        (
            "an unknown field",
            |d| d["steps"][0]["inputs"] = json!({}),
            Reason::Malformed,
            Some("order"),
            "/steps/0/inputs",
        ),
    ];
    for (what, change, reason, step, pointer) in cases {
        let mut definition = good();
        change(&mut definition);
        let problem = match checked(definition) {
            Ok(_) => panic!("{what}: accepted"),
            Err(problem) => problem,
        };
        assert_eq!(
            (problem.reason, problem.step.as_deref(), problem.pointer.as_str()),
            (reason, step, pointer),
            "{what}: {problem}"
        );
        assert_eq!(problem.details()["reason"], reason.as_str(), "{what}");
    }
}

#[test]
fn a_cycle_names_its_steps() {
    let mut definition = good();
    definition["steps"][0]["input"]["order_id"] = json!("${steps.reply.output.text}");
    let problem = checked(definition).unwrap_err();
    assert_eq!(problem.reason, Reason::Cycle);
    let cycle: Vec<String> = serde_json::from_value(problem.details()["cycle"].clone()).unwrap();
    assert_eq!(cycle.first(), cycle.last(), "{cycle:?}");
    assert!(
        cycle.contains(&"order".to_string()) && cycle.contains(&"reply".to_string()),
        "{cycle:?}"
    );
}

#[test]
fn workflow_names_share_the_capability_rule() {
    let problem = check::check("Bad Name", definition::from_value(good()).unwrap(), None).unwrap_err();
    assert_eq!(problem.reason, Reason::InvalidName);
    let mut own = good();
    own["steps"][0]["capability"] = json!("order.ship_today");
    assert_eq!(checked(own).unwrap_err().reason, Reason::UnknownCapability);
}

#[test]
fn retries_follow_their_codes_and_back_off() {
    let workflow = checked(good()).unwrap();
    let retry = &workflow.steps[0].retry;
    assert!(retry.retries(1, &["AGENT_ERROR", "ORDER_LOCKED"]));
    assert!(!retry.retries(1, &["DEADLINE_EXCEEDED"]));
    assert!(!retry.retries(3, &["AGENT_ERROR"]));
    assert_eq!((retry.delay_ms(2), retry.delay_ms(3), retry.delay_ms(4)), (10, 20, 40));
    assert!(
        !workflow.steps[1].retry.retries(1, &["AGENT_ERROR"]),
        "no retry by default"
    );
}
