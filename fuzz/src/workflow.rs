//! `workflow`: a workflow definition as `PUT /v1/workflows/{name}` takes it
//! (`workflows/`, design §3.14.1): `definition::parse`, as JSON or YAML by
//! its first byte (what the registry does with a body without a content
//! type), then `check`, without a catalog (as a router does) and against
//! one that registers capabilities with input and output schemas (as the
//! registry does).
//!
//! Holds, for every input:
//! - nothing panics or hangs; a refusal is a [`Problem`] with a non-empty
//!   message, a pointer that is `""` or starts with `/`, and details naming
//!   its reason (and its step when it has one);
//! - an accepted workflow keeps `check`'s promises: 1–64 steps with
//!   distinct ids, `order` holds every step once, each after every step it
//!   depends on (no cycle), `max_parallel` within 1..=64, attempts within
//!   1..=10; every template and expression evaluates against any scope;
//! - what the catalog accepts, the check without it accepts too (the
//!   catalog only adds checks), and the definition written back as JSON
//!   (what the registry stores and routers read) is accepted again, with
//!   the same steps in the same order.

use agent_reach_workflows::definition::{self, Format};
use agent_reach_workflows::{check, Catalog, Offer, Problem, Scope, Workflow};
use serde_json::{json, Value};

/// The workflow's name, as the path gives it.
const NAME: &str = "fuzz.flow";

/// Capabilities as a registry would have them.
struct Registered;

impl Catalog for Registered {
    fn offer(&self, name: &str, requirement: Option<&semver::VersionReq>) -> Offer {
        let version = semver::Version::new(1, 2, 0);
        if requirement.is_some_and(|requirement| !requirement.matches(&version)) {
            return Offer::NoVersion {
                available: vec![version.to_string()],
            };
        }
        let schemas = match name {
            "order.lookup" => (
                json!({"type": "object", "required": ["order_id"], "properties": {"order_id": {"type": "string"}}}),
                json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object"}}, "express": {"type": "boolean"}}}),
            ),
            "stock.check" => (
                json!({"type": "object", "required": ["sku"], "properties": {"sku": {"type": "string"}, "count": {"type": "integer"}}}),
                json!({"type": "object"}),
            ),
            "any.thing" => (json!(true), json!(true)),
            "fuzz.flow" => return Offer::Workflow,
            _ => return Offer::Unknown,
        };
        Offer::Found {
            version: version.to_string(),
            input_schema: Some(schemas.0),
            output_schema: Some(schemas.1),
        }
    }
}

/// A scope that answers every path with something.
struct Anything {
    input: Value,
    step: Value,
    item: Value,
    index: Value,
}

impl Scope for Anything {
    fn input(&self) -> &Value {
        &self.input
    }
    fn step(&self, _id: &str) -> Option<&Value> {
        Some(&self.step)
    }
    fn item(&self) -> Option<&Value> {
        Some(&self.item)
    }
    fn index(&self) -> Option<&Value> {
        Some(&self.index)
    }
}

fn refused(problem: &Problem) {
    assert!(
        !problem.message.trim().is_empty(),
        "a problem without a message: {problem:?}"
    );
    assert!(
        problem.pointer.is_empty() || problem.pointer.starts_with('/'),
        "not a JSON pointer: {problem:?}"
    );
    let details = problem.details();
    assert_eq!(details["reason"], problem.reason.as_str(), "{details}");
    assert_eq!(details["pointer"], problem.pointer.as_str(), "{details}");
    if let Some(step) = &problem.step {
        assert_eq!(details["step"], step.as_str(), "{details}");
    }
}

fn accepted(workflow: &Workflow) {
    let steps = &workflow.steps;
    assert!((1..=64).contains(&steps.len()), "{} steps", steps.len());
    let mut ids: Vec<&str> = steps.iter().map(|step| step.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), steps.len(), "step ids repeat");
    let mut position = vec![usize::MAX; steps.len()];
    for (at, &index) in workflow.order.iter().enumerate() {
        assert_eq!(position[index], usize::MAX, "step {index} twice in the order");
        position[index] = at;
    }
    assert!(
        position.iter().all(|at| *at != usize::MAX),
        "a step missing from the order"
    );
    let scopes = [
        Anything {
            input: Value::Null,
            step: Value::Null,
            item: Value::Null,
            index: json!(0),
        },
        Anything {
            input: json!({"order_id": "SO-1", "items": [{"sku": "a"}], "n": 1.5, "text": "x"}),
            step: json!({"status": "succeeded", "output": {"items": [1, "two", null], "express": true}, "error": null}),
            item: json!({"sku": "a", "count": 2}),
            index: json!(3),
        },
    ];
    for (index, step) in steps.iter().enumerate() {
        for dependency in &step.depends_on {
            assert!(
                position[*dependency] < position[index],
                "`{}` runs before `{}`, which it depends on",
                step.id,
                steps[*dependency].id
            );
        }
        assert!(
            (1..=64).contains(&step.max_parallel),
            "max_parallel {}",
            step.max_parallel
        );
        for scope in &scopes {
            let _ = step.input.eval(scope);
            let _ = step.when.as_ref().map(|when| when.eval(scope));
            let _ = step.for_each.as_ref().map(|for_each| for_each.eval(scope));
            if let agent_reach_workflows::OnFailure::Compensate(compensation) = &step.on_failure {
                let _ = compensation.input.eval(scope);
            }
        }
    }
    for scope in &scopes {
        let _ = workflow.output.eval(scope);
    }
}

pub fn run(data: &[u8]) {
    let definition = match definition::parse(data, Format::of(None, data)) {
        Ok(definition) => definition,
        Err(problem) => return refused(&problem),
    };
    let with_catalog = check(NAME, definition.clone(), Some(&Registered));
    let alone = check(NAME, definition.clone(), None);
    match (&with_catalog, &alone) {
        (Ok(workflow), Ok(_)) => accepted(workflow),
        (Ok(_), Err(problem)) => panic!("accepted with the catalog, refused without it: {problem:?}"),
        (Err(problem), _) => refused(problem),
    }
    let workflow = match alone {
        Ok(workflow) => workflow,
        Err(problem) => return refused(&problem),
    };
    accepted(&workflow);
    // As stored (JSON) and read back by a router: the same workflow.
    let stored = serde_json::to_vec(&workflow.definition).expect("a definition writes as JSON");
    let again = definition::parse(&stored, Format::Json)
        .and_then(|definition| check(NAME, definition, None))
        .unwrap_or_else(|problem| panic!("refused as stored: {problem:?}"));
    let steps = |workflow: &Workflow| -> Vec<(String, Vec<usize>)> {
        workflow
            .steps
            .iter()
            .map(|step| (step.id.clone(), step.depends_on.clone()))
            .collect()
    };
    assert_eq!(steps(&again), steps(&workflow));
    assert_eq!(again.order, workflow.order);
}
