//! A definition checked into a [`Workflow`]: names and bounds, every
//! expression parsed, every referenced step present, the steps a DAG (a
//! `steps.ID` path is a dependency as much as a `depends_on` entry), the
//! schemas valid and compiled; and, given the registered capabilities
//! ([`Catalog`]), every step's capability known and every input mapping
//! able to satisfy its capability's input schema ([`crate::mapping`]). The
//! first problem found is returned; a refused definition is stored nowhere.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::definition::{CompensationDefinition, Definition, StepDefinition};
use crate::expr::{self, Expr, Root};
use crate::mapping::{self, Sources, StepSource, Types};
use crate::problem::{Problem, Reason};
use crate::template::{self, Template};
use crate::{Compensation, OnFailure, Retry, Step, Workflow};

/// Steps one workflow may have.
pub const MAX_STEPS: usize = 64;
/// Calls of one step's `for_each` that may run at once (its default: 10).
pub const MAX_PARALLEL: u64 = 64;
/// The default `max_parallel`.
pub const DEFAULT_PARALLEL: usize = 10;
/// The longest step timeout (a day).
pub const MAX_TIMEOUT_MS: u64 = 24 * 3600 * 1000;
/// Attempts of one step at most (`retry.max_attempts`).
pub const MAX_ATTEMPTS: u64 = 10;
/// The longest first backoff between attempts.
pub const MAX_BACKOFF_MS: u64 = 600_000;
/// The default first backoff.
pub const DEFAULT_BACKOFF_MS: u64 = 1000;
/// A description's length at most.
pub const MAX_DESCRIPTION_BYTES: usize = 4096;
/// A step id's length at most.
const MAX_STEP_ID: usize = 64;

/// What the registration knows of a capability a step calls.
pub enum Offer {
    /// No agent offers it.
    Unknown,
    /// It is a workflow's name (workflows do not call workflows).
    Workflow,
    /// Registered, but no version matches the step's requirement.
    NoVersion { available: Vec<String> },
    /// The version a call would reach, and its schemas (`None`: any).
    Found {
        version: String,
        input_schema: Option<Value>,
        output_schema: Option<Value>,
    },
}

/// The registered capabilities, as the registry's catalog knows them.
pub trait Catalog {
    /// `name` at the highest version matching `requirement` (any, when `None`).
    fn offer(&self, name: &str, requirement: Option<&semver::VersionReq>) -> Offer;
}

/// Checks `definition` as workflow `name`; with `catalog`, against the
/// registered capabilities too (the registry does; a router rebuilding its
/// snapshot trusts what the registry stored).
pub fn check(name: &str, definition: Definition, catalog: Option<&dyn Catalog>) -> Result<Workflow, Problem> {
    if let Err(why) = dotted(name) {
        return Err(Problem::new(
            Reason::InvalidName,
            "",
            format!("workflow name `{name}`: {why}"),
        ));
    }
    if let Some(written) = &definition.name {
        if written != name {
            return Err(Problem::new(
                Reason::InvalidField,
                "/name",
                format!("the definition names `{written}` but is registered as `{name}`"),
            ));
        }
    }
    let version = semver::Version::parse(&definition.version).map_err(|error| {
        Problem::new(
            Reason::InvalidField,
            "/version",
            format!("`{}` is not a semver version (e.g. 1.0.0): {error}", definition.version),
        )
    })?;
    if definition
        .description
        .as_ref()
        .is_some_and(|text| text.len() > MAX_DESCRIPTION_BYTES)
    {
        return Err(Problem::new(
            Reason::TooLarge,
            "/description",
            format!("the description is longer than {MAX_DESCRIPTION_BYTES} bytes"),
        ));
    }
    let input_validator = Arc::new(schema(&definition.input_schema, "/input_schema")?);
    let output_validator = match &definition.output_schema {
        Some(output_schema) => Some(Arc::new(schema(output_schema, "/output_schema")?)),
        None => None,
    };
    if definition.steps.is_empty() {
        return Err(Problem::new(
            Reason::InvalidField,
            "/steps",
            "a workflow has at least one step",
        ));
    }
    if definition.steps.len() > MAX_STEPS {
        return Err(Problem::new(
            Reason::TooLarge,
            "/steps",
            format!("{} steps; a workflow has at most {MAX_STEPS}", definition.steps.len()),
        ));
    }
    let mut ids = HashMap::new();
    for (index, step) in definition.steps.iter().enumerate() {
        step_id(&step.id).map_err(|why| {
            Problem::new(
                Reason::InvalidField,
                format!("/steps/{index}/id"),
                format!("step id `{}`: {why}", step.id),
            )
        })?;
        if ids.insert(step.id.clone(), index).is_some() {
            return Err(Problem::new(
                Reason::InvalidField,
                format!("/steps/{index}/id"),
                format!("two steps are called `{}`", step.id),
            )
            .in_step(&step.id));
        }
    }
    let mut steps = Vec::with_capacity(definition.steps.len());
    for (index, written) in definition.steps.iter().enumerate() {
        let step = step(index, written, &ids, name).map_err(|problem| problem.in_step(&written.id))?;
        steps.push(step);
    }
    let output = template::parse(&definition.output).map_err(|error| {
        Problem::new(
            Reason::BadExpression,
            format!("/output{}", error.pointer),
            error.error.to_string(),
        )
    })?;
    for (pointer, path) in output.paths() {
        match &path.root {
            Root::Step(id) if !ids.contains_key(id) => {
                return Err(Problem::new(
                    Reason::UnknownStep,
                    format!("/output{pointer}"),
                    format!("`{path}` names no step of this workflow"),
                ))
            }
            Root::Item | Root::Index => {
                return Err(Problem::new(
                    Reason::BadExpression,
                    format!("/output{pointer}"),
                    format!("`{path}`: item and index exist only in a step with for_each"),
                ))
            }
            _ => {}
        }
    }
    let order = order(&steps)?;
    let workflow = Workflow {
        name: name.to_string(),
        version,
        description: definition.description.clone().unwrap_or_default(),
        definition,
        input_validator,
        output_validator,
        steps,
        order,
        output,
    };
    if let Some(catalog) = catalog {
        against_catalog(&workflow, catalog)?;
    }
    Ok(workflow)
}

/// A lowercase dotted name (DESIGN §2: capabilities and workflows share the name space).
pub fn dotted(text: &str) -> Result<(), String> {
    if text.is_empty() || text.len() > 128 {
        return Err("a name is 1 to 128 characters".to_string());
    }
    agent_reach_access::acl::check_dotted(text)
}

fn step_id(id: &str) -> Result<(), String> {
    let mut chars = id.chars();
    match chars.next() {
        Some(first) if first.is_ascii_lowercase() => {}
        _ => return Err("starts with a lowercase letter".to_string()),
    }
    if id.len() > MAX_STEP_ID {
        return Err(format!("at most {MAX_STEP_ID} characters"));
    }
    if let Some(bad) = chars.find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')) {
        return Err(format!("character `{bad}` is not allowed (use a-z, 0-9 and _)"));
    }
    Ok(())
}

fn schema(schema: &Value, pointer: &str) -> Result<jsonschema::Validator, Problem> {
    let invalid = |why: String| Problem::new(Reason::InvalidSchema, pointer, why);
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(invalid("a JSON Schema is an object or a boolean".to_string()));
    }
    jsonschema::draft202012::meta::validate(schema).map_err(|error| {
        invalid(format!(
            "not a valid JSON Schema (draft 2020-12): {error} at `{}`",
            error.instance_path()
        ))
    })?;
    jsonschema::draft202012::new(schema).map_err(|error| invalid(format!("the schema does not compile: {error}")))
}

fn whole_expression(text: &str, pointer: &str) -> Result<Expr, Problem> {
    match template::parse_string(text) {
        Ok(Template::Expr(expr)) => Ok(expr),
        Ok(_) => Err(Problem::new(
            Reason::BadExpression,
            pointer,
            format!("`{text}` is not one expression: write it as \"${{…}}\""),
        )),
        Err(error) => Err(Problem::new(Reason::BadExpression, pointer, error.to_string())),
    }
}

fn timeout(value: Option<u64>, pointer: &str) -> Result<Option<u64>, Problem> {
    match value {
        Some(ms) if !(1..=MAX_TIMEOUT_MS).contains(&ms) => Err(Problem::new(
            Reason::InvalidField,
            pointer,
            format!("timeout_ms {ms} is outside 1..={MAX_TIMEOUT_MS}"),
        )),
        other => Ok(other),
    }
}

fn version_req(text: Option<&str>, pointer: &str) -> Result<Option<semver::VersionReq>, Problem> {
    match text.map(str::trim) {
        None | Some("" | "*") => Ok(None),
        Some(text) => semver::VersionReq::parse(text).map(Some).map_err(|error| {
            Problem::new(
                Reason::InvalidField,
                pointer,
                format!("`{text}` is not a semver requirement (e.g. ^1.2): {error}"),
            )
        }),
    }
}

fn capability_name(name: &str, workflow: &str, pointer: &str) -> Result<(), Problem> {
    dotted(name).map_err(|why| Problem::new(Reason::InvalidName, pointer, format!("capability `{name}`: {why}")))?;
    if name == workflow {
        return Err(Problem::new(
            Reason::UnknownCapability,
            pointer,
            format!("`{name}` is this workflow: a step calls a capability"),
        ));
    }
    Ok(())
}

fn step(index: usize, written: &StepDefinition, ids: &HashMap<String, usize>, workflow: &str) -> Result<Step, Problem> {
    let at = |field: &str| format!("/steps/{index}/{field}");
    capability_name(&written.capability, workflow, &at("capability"))?;
    let version = version_req(written.version.as_deref(), &at("version"))?;
    let input = template::parse(&written.input).map_err(|error| {
        Problem::new(
            Reason::BadExpression,
            format!("{}{}", at("input"), error.pointer),
            error.error.to_string(),
        )
    })?;
    let for_each = match &written.for_each {
        Some(text) => Some(whole_expression(text, &at("for_each"))?),
        None => None,
    };
    let when = match &written.when {
        Some(text) => Some(whole_expression(text, &at("when"))?),
        None => None,
    };
    let max_parallel = match written.max_parallel {
        None => DEFAULT_PARALLEL,
        Some(_) if for_each.is_none() => {
            return Err(Problem::new(
                Reason::InvalidField,
                at("max_parallel"),
                "max_parallel bounds a for_each step's calls; this step has no for_each",
            ))
        }
        Some(parallel) if (1..=MAX_PARALLEL).contains(&parallel) => parallel as usize,
        Some(parallel) => {
            return Err(Problem::new(
                Reason::InvalidField,
                at("max_parallel"),
                format!("max_parallel {parallel} is outside 1..={MAX_PARALLEL}"),
            ))
        }
    };
    let timeout_ms = timeout(written.timeout_ms, &at("timeout_ms"))?;
    let retry = match &written.retry {
        None => Retry::once(),
        Some(retry) => {
            if !(1..=MAX_ATTEMPTS).contains(&retry.max_attempts) {
                return Err(Problem::new(
                    Reason::InvalidField,
                    at("retry/max_attempts"),
                    format!("max_attempts {} is outside 1..={MAX_ATTEMPTS}", retry.max_attempts),
                ));
            }
            let backoff_ms = retry.backoff_ms.unwrap_or(DEFAULT_BACKOFF_MS);
            if backoff_ms > MAX_BACKOFF_MS {
                return Err(Problem::new(
                    Reason::InvalidField,
                    at("retry/backoff_ms"),
                    format!("backoff_ms {backoff_ms} is above {MAX_BACKOFF_MS}"),
                ));
            }
            Retry {
                max_attempts: retry.max_attempts as u32,
                backoff_ms,
                codes: retry.codes.clone().unwrap_or_default(),
            }
        }
    };
    let on_failure = on_failure(index, written.on_failure.as_ref(), workflow)?;
    // Dependencies: those written, and every step an expression reads.
    let mut depends_on = Vec::new();
    for (position, dependency) in written.depends_on.iter().enumerate() {
        match ids.get(dependency) {
            Some(&other) if other == index => {
                return Err(Problem::new(
                    Reason::Cycle,
                    format!("{}/{position}", at("depends_on")),
                    format!("step `{dependency}` depends on itself"),
                ))
            }
            Some(&other) => depends_on.push(other),
            None => {
                return Err(Problem::new(
                    Reason::UnknownStep,
                    format!("{}/{position}", at("depends_on")),
                    format!("`{dependency}` names no step of this workflow"),
                ))
            }
        }
    }
    let mut read: Vec<(String, &expr::Path, bool)> = Vec::new();
    read.extend(
        input
            .paths()
            .into_iter()
            .map(|(pointer, path)| (format!("{}{pointer}", at("input")), path, true)),
    );
    if let Some(expr) = &for_each {
        read.extend(expr.paths().into_iter().map(|path| (at("for_each"), path, false)));
    }
    if let Some(expr) = &when {
        read.extend(expr.paths().into_iter().map(|path| (at("when"), path, false)));
    }
    let compensation_paths = match &on_failure {
        OnFailure::Compensate(compensation) => compensation.input.paths(),
        _ => Vec::new(),
    };
    for (pointer, path) in &compensation_paths {
        let pointer = format!("{}{pointer}", at("on_failure/compensate/input"));
        match &path.root {
            // A compensation reads the failed step's own error.
            Root::Step(id) if id == &written.id => {}
            Root::Item | Root::Index if for_each.is_some() => {}
            _ => read.push((pointer, path, false)),
        }
    }
    for (pointer, path, item_allowed) in read {
        match &path.root {
            Root::Step(id) => match ids.get(id) {
                Some(&other) if other == index => {
                    return Err(Problem::new(
                        Reason::Cycle,
                        pointer,
                        format!("`{path}`: a step cannot read its own output"),
                    ))
                }
                Some(&other) => depends_on.push(other),
                None => {
                    return Err(Problem::new(
                        Reason::UnknownStep,
                        pointer,
                        format!("`{path}` names no step of this workflow"),
                    ))
                }
            },
            Root::Item | Root::Index if !(item_allowed && for_each.is_some()) => {
                return Err(Problem::new(
                    Reason::BadExpression,
                    pointer,
                    format!("`{path}`: item and index exist only in the input of a step with for_each"),
                ))
            }
            _ => {}
        }
    }
    depends_on.sort_unstable();
    depends_on.dedup();
    Ok(Step {
        id: written.id.clone(),
        capability: written.capability.clone(),
        version,
        input,
        depends_on,
        for_each,
        max_parallel,
        when,
        timeout_ms,
        retry,
        on_failure,
    })
}

fn on_failure(index: usize, written: Option<&Value>, workflow: &str) -> Result<OnFailure, Problem> {
    let pointer = format!("/steps/{index}/on_failure");
    match written {
        None => Ok(OnFailure::Fail),
        Some(Value::String(word)) if word == "fail" => Ok(OnFailure::Fail),
        Some(Value::String(word)) if word == "continue" => Ok(OnFailure::Continue),
        Some(Value::Object(map)) if map.len() == 1 && map.contains_key("compensate") => {
            let at = format!("{pointer}/compensate");
            let written: CompensationDefinition =
                serde_path_to_error::deserialize(map["compensate"].clone()).map_err(|error| {
                    let field = error.path().to_string();
                    let pointer = if field == "." {
                        at.clone()
                    } else {
                        format!("{at}/{field}")
                    };
                    Problem::new(Reason::Malformed, pointer, error.inner().to_string())
                })?;
            capability_name(&written.capability, workflow, &format!("{at}/capability"))?;
            Ok(OnFailure::Compensate(Compensation {
                version: version_req(written.version.as_deref(), &format!("{at}/version"))?,
                input: template::parse(&written.input).map_err(|error| {
                    Problem::new(
                        Reason::BadExpression,
                        format!("{at}/input{}", error.pointer),
                        error.error.to_string(),
                    )
                })?,
                timeout_ms: timeout(written.timeout_ms, &format!("{at}/timeout_ms"))?,
                capability: written.capability,
            }))
        }
        Some(other) => Err(Problem::new(
            Reason::InvalidField,
            pointer,
            format!("on_failure is `fail`, `continue` or {{compensate: {{capability, input}}}}, not {other}"),
        )),
    }
}

/// A topological order of the steps (Kahn's, the declared order among the
/// ready ones), or the steps of a cycle.
fn order(steps: &[Step]) -> Result<Vec<usize>, Problem> {
    let mut waiting: Vec<usize> = steps.iter().map(|step| step.depends_on.len()).collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
    for (index, step) in steps.iter().enumerate() {
        for &dependency in &step.depends_on {
            dependents[dependency].push(index);
        }
    }
    let mut ready: std::collections::BTreeSet<usize> = (0..steps.len()).filter(|index| waiting[*index] == 0).collect();
    let mut order = Vec::with_capacity(steps.len());
    while let Some(next) = ready.pop_first() {
        order.push(next);
        for &dependent in &dependents[next] {
            waiting[dependent] -= 1;
            if waiting[dependent] == 0 {
                ready.insert(dependent);
            }
        }
    }
    if order.len() == steps.len() {
        return Ok(order);
    }
    // Walk back along unfinished dependencies until a step repeats: that loop is a cycle.
    let placed: HashSet<usize> = order.iter().copied().collect();
    let mut current = (0..steps.len()).find(|index| !placed.contains(index)).unwrap_or(0);
    let mut path: Vec<usize> = Vec::new();
    while !path.contains(&current) {
        path.push(current);
        current = steps[current]
            .depends_on
            .iter()
            .copied()
            .find(|dependency| !placed.contains(dependency))
            .unwrap_or(current);
    }
    let start = path.iter().position(|index| *index == current).unwrap_or(0);
    let mut cycle: Vec<String> = path[start..]
        .iter()
        .rev()
        .map(|index| steps[*index].id.clone())
        .collect();
    cycle.push(cycle[0].clone());
    let first = &steps[current];
    Err(Problem::new(
        Reason::Cycle,
        format!("/steps/{current}/depends_on"),
        format!("the steps depend on each other in a circle: {}", cycle.join(" → ")),
    )
    .in_step(&first.id)
    .with_extra(json!({ "cycle": cycle })))
}

/// Every capability a step (or a compensation) calls is registered at a
/// matching version, and every input can satisfy its input schema; the
/// output can satisfy the output schema.
fn against_catalog(workflow: &Workflow, catalog: &dyn Catalog) -> Result<(), Problem> {
    let mut found: HashMap<String, (Option<Value>, Option<Value>)> = HashMap::new();
    let lookup = |capability: &str, version: Option<&semver::VersionReq>, pointer: String| match catalog
        .offer(capability, version)
    {
        Offer::Found {
            input_schema,
            output_schema,
            ..
        } => Ok((input_schema, output_schema)),
        Offer::Unknown => Err(Problem::new(
            Reason::UnknownCapability,
            format!("{pointer}/capability"),
            format!("no agent offers capability `{capability}`; register it before the workflow"),
        )),
        Offer::Workflow => Err(Problem::new(
            Reason::UnknownCapability,
            format!("{pointer}/capability"),
            format!("`{capability}` is a workflow; a step calls a capability (workflows do not call workflows)"),
        )),
        Offer::NoVersion { available } => Err(Problem::new(
            Reason::UnknownVersion,
            format!("{pointer}/version"),
            format!(
                "no registered version of `{capability}` matches `{}`; available: {}",
                version.map(ToString::to_string).unwrap_or_default(),
                available.join(", ")
            ),
        )),
    };
    for (index, step) in workflow.steps.iter().enumerate() {
        let schemas = lookup(&step.capability, step.version.as_ref(), format!("/steps/{index}"))
            .map_err(|problem| problem.in_step(&step.id))?;
        found.insert(step.id.clone(), schemas);
        if let OnFailure::Compensate(compensation) = &step.on_failure {
            lookup(
                &compensation.capability,
                compensation.version.as_ref(),
                format!("/steps/{index}/on_failure/compensate"),
            )
            .map_err(|problem| problem.in_step(&step.id))?;
        }
    }
    let sources: HashMap<String, StepSource<'_>> = workflow
        .steps
        .iter()
        .map(|step| {
            let source = StepSource {
                output_schema: found.get(&step.id).and_then(|(_, output)| output.as_ref()),
                for_each: step.for_each.is_some(),
                may_be_null: step.when.is_some() || matches!(step.on_failure, OnFailure::Continue),
            };
            (step.id.clone(), source)
        })
        .collect();
    let input_schema = &workflow.definition.input_schema;
    for (index, step) in workflow.steps.iter().enumerate() {
        let mut context = Sources {
            input_schema,
            steps: &sources,
            item_schema: None,
        };
        if let Some(Expr::Path(path)) = &step.for_each {
            let types = mapping::types_of_path(path, &context);
            if !types.meets_array() {
                return Err(Problem::new(
                    Reason::Mapping,
                    format!("/steps/{index}/for_each"),
                    format!("`${{{path}}}` is {} where for_each needs an array", types.describe()),
                )
                .in_step(&step.id));
            }
            context.item_schema = item_schema(path, &context);
        }
        let Some((Some(target), _)) = found.get(&step.id) else {
            continue;
        };
        mapping::check(&step.input, target, &context).map_err(|mismatch| {
            Problem::new(
                Reason::Mapping,
                format!("/steps/{index}/input{}", mismatch.pointer),
                format!("{} (the input schema of `{}`)", mismatch.message, step.capability),
            )
            .in_step(&step.id)
        })?;
    }
    if let Some(output_schema) = &workflow.definition.output_schema {
        let context = Sources {
            input_schema,
            steps: &sources,
            item_schema: None,
        };
        mapping::check(&workflow.output, output_schema, &context).map_err(|mismatch| {
            Problem::new(
                Reason::Mapping,
                format!("/output{}", mismatch.pointer),
                format!("{} (the workflow's output schema)", mismatch.message),
            )
        })?;
    }
    Ok(())
}

/// The schema of one element of the array a `for_each` path reads, when known.
fn item_schema<'s>(path: &expr::Path, sources: &Sources<'s>) -> Option<&'s Value> {
    let array = match &path.root {
        Root::Input => mapping::walk(sources.input_schema, &path.segments)?,
        Root::Step(id) => {
            let source = sources.steps.get(id)?;
            let (_, rest) = path.segments.split_first()?;
            if source.for_each {
                return None;
            }
            mapping::walk(source.output_schema?, rest)?
        }
        _ => return None,
    };
    array.get("items").filter(|items| items.is_object())
}

impl Types {
    fn meets_array(self) -> bool {
        self.union(Types::ARRAY) == self
    }
}
