//! The registration check of a template against the schema it must satisfy
//! (a step's input against its capability's input schema, the output
//! against the workflow's output schema): refused only when the value can
//! *never* satisfy it — a type no value of the expression can have, a
//! required field the template does not write, a field
//! `additionalProperties: false` forbids, a literal outside `enum`/`const`.
//! What an expression gives is known from the schemas it reads (the
//! workflow's input schema, the earlier steps' output schemas, the
//! `for_each` array's items); where a schema says nothing (no `type`,
//! `$ref`, combinators) anything goes. Values are checked in full at run
//! time by the router's admission, as every call's are.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::Value;

use crate::expr::{Expr, Path, Root, Segment};
use crate::template::{escape_pointer, Template};

/// A set of JSON types (integers apart from other numbers, as JSON Schema tells them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Types(u8);

impl Types {
    pub const NULL: Types = Types(1);
    pub const BOOLEAN: Types = Types(2);
    pub const INTEGER: Types = Types(4);
    /// A number with a fraction.
    pub const FRACTION: Types = Types(8);
    pub const STRING: Types = Types(16);
    pub const ARRAY: Types = Types(32);
    pub const OBJECT: Types = Types(64);
    pub const ANY: Types = Types(127);
    const NONE: Types = Types(0);

    pub fn union(self, other: Types) -> Types {
        Types(self.0 | other.0)
    }

    fn meets(self, other: Types) -> bool {
        self.0 & other.0 != 0
    }

    /// The type of one value.
    pub fn of_value(value: &Value) -> Types {
        match value {
            Value::Null => Types::NULL,
            Value::Bool(_) => Types::BOOLEAN,
            Value::Number(number) if number.is_i64() || number.is_u64() => Types::INTEGER,
            Value::Number(number) if number.as_f64().is_some_and(|float| float.fract() == 0.0) => Types::INTEGER,
            Value::Number(_) => Types::FRACTION,
            Value::String(_) => Types::STRING,
            Value::Array(_) => Types::ARRAY,
            Value::Object(_) => Types::OBJECT,
        }
    }

    /// What a schema allows, as far as `type`, `const` and `enum` tell.
    pub fn of_schema(schema: &Value) -> Types {
        let Value::Object(map) = schema else {
            return match schema {
                Value::Bool(false) => Types::NONE,
                _ => Types::ANY,
            };
        };
        let mut allowed = match map.get("type") {
            Some(Value::String(name)) => Types::named(name),
            Some(Value::Array(names)) => names
                .iter()
                .filter_map(Value::as_str)
                .fold(Types::NONE, |types, name| types.union(Types::named(name))),
            _ => Types::ANY,
        };
        if let Some(value) = map.get("const") {
            allowed = Types(allowed.0 & Types::of_value(value).0);
        }
        if let Some(Value::Array(values)) = map.get("enum") {
            let listed = values
                .iter()
                .fold(Types::NONE, |types, value| types.union(Types::of_value(value)));
            allowed = Types(allowed.0 & listed.0);
        }
        allowed
    }

    fn named(name: &str) -> Types {
        match name {
            "null" => Types::NULL,
            "boolean" => Types::BOOLEAN,
            "integer" => Types::INTEGER,
            "number" => Types::INTEGER.union(Types::FRACTION),
            "string" => Types::STRING,
            "array" => Types::ARRAY,
            "object" => Types::OBJECT,
            _ => Types::ANY,
        }
    }

    /// "a string", "an integer or null", …
    pub fn describe(self) -> String {
        if self == Types::ANY {
            return "any value".to_string();
        }
        if self == Types::NONE {
            return "no value".to_string();
        }
        let mut words = Vec::new();
        for (types, word) in [
            (Types::NULL, "null"),
            (Types::BOOLEAN, "a boolean"),
            (Types::INTEGER.union(Types::FRACTION), "a number"),
            (Types::INTEGER, "an integer"),
            (Types::FRACTION, "a number with a fraction"),
            (Types::STRING, "a string"),
            (Types::ARRAY, "an array"),
            (Types::OBJECT, "an object"),
        ] {
            let numbers = Types::INTEGER.union(Types::FRACTION);
            let covered = self.0 & types.0 == types.0;
            let is_number_part = types == Types::INTEGER || types == Types::FRACTION;
            if covered && !(is_number_part && self.0 & numbers.0 == numbers.0) {
                words.push(word);
            }
        }
        words.join(" or ")
    }
}

/// What a step's output looks like to the steps after it.
#[derive(Debug, Clone, Copy)]
pub struct StepSource<'a> {
    /// The output schema of one call of the step's capability, when registered.
    pub output_schema: Option<&'a Value>,
    /// A `for_each` step's output is the array of its calls' outputs.
    pub for_each: bool,
    /// Skipped (`when`) or failed and continued (`on_failure: continue`): `null`.
    pub may_be_null: bool,
}

/// The schemas expressions read, for one template.
pub struct Sources<'a> {
    pub input_schema: &'a Value,
    pub steps: &'a HashMap<String, StepSource<'a>>,
    /// The schema of one element of the step's `for_each` array, when known.
    pub item_schema: Option<&'a Value>,
}

/// A template that can never satisfy its schema: where (a pointer from the
/// template's root) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub pointer: String,
    pub message: String,
}

/// Checks `template` against `schema`.
pub fn check(template: &Template, schema: &Value, sources: &Sources<'_>) -> Result<(), Mismatch> {
    check_node(Node::Template(template), schema, sources, &mut String::new())
}

/// The types a path can have, from the schemas it reads.
pub fn types_of_path(path: &Path, sources: &Sources<'_>) -> Types {
    match &path.root {
        Root::Input => walk(sources.input_schema, &path.segments).map_or(Types::ANY, Types::of_schema),
        Root::Index => Types::INTEGER,
        Root::Item => sources
            .item_schema
            .and_then(|schema| walk(schema, &path.segments))
            .map_or(Types::ANY, Types::of_schema),
        Root::Step(id) => {
            let Some(source) = sources.steps.get(id) else {
                return Types::ANY;
            };
            let nullable = if source.may_be_null { Types::NULL } else { Types::NONE };
            let (field, rest) = match path.segments.split_first() {
                Some((Segment::Key(field), rest)) => (field.as_str(), rest),
                _ => return Types::ANY,
            };
            match field {
                "status" => Types::STRING,
                "error" if rest.is_empty() => Types::OBJECT.union(Types::NULL),
                "output" => {
                    let Some(schema) = source.output_schema else {
                        return Types::ANY;
                    };
                    let found = if source.for_each {
                        match rest.split_first() {
                            None => return Types::ARRAY.union(nullable),
                            Some((Segment::Index(_), inner)) => walk(schema, inner),
                            Some((Segment::Key(_), _)) => None,
                        }
                    } else {
                        walk(schema, rest)
                    };
                    found.map_or(Types::ANY, |schema| Types::of_schema(schema).union(nullable))
                }
                _ => Types::ANY,
            }
        }
    }
}

/// The subschema `segments` lead to, when the schema says plainly.
pub fn walk<'s>(mut schema: &'s Value, segments: &[Segment]) -> Option<&'s Value> {
    for segment in segments {
        let map = schema.as_object()?;
        if ["$ref", "anyOf", "oneOf", "allOf", "if", "$dynamicRef"]
            .iter()
            .any(|keyword| map.contains_key(*keyword))
        {
            return None;
        }
        schema = match segment {
            Segment::Key(key) => match map.get("properties").and_then(|properties| properties.get(key)) {
                Some(property) => property,
                None if map.contains_key("patternProperties") => return None,
                None => map.get("additionalProperties").filter(|extra| extra.is_object())?,
            },
            Segment::Index(index) => match map.get("prefixItems").and_then(|prefix| prefix.get(*index)) {
                Some(item) => item,
                None => map.get("items").filter(|items| items.is_object())?,
            },
        };
    }
    Some(schema)
}

/// A template, or a literal value inside one.
#[derive(Clone, Copy)]
enum Node<'a> {
    Template(&'a Template),
    Value(&'a Value),
}

impl<'a> Node<'a> {
    fn known(self) -> Option<&'a Value> {
        match self {
            Node::Value(value) | Node::Template(Template::Literal(value)) => Some(value),
            Node::Template(Template::Expr(Expr::Literal(value))) => Some(value),
            _ => None,
        }
    }

    fn types(self, sources: &Sources<'_>) -> Types {
        if let Some(value) = self.known() {
            return Types::of_value(value);
        }
        match self {
            Node::Template(Template::Expr(Expr::Path(path))) => types_of_path(path, sources),
            Node::Template(Template::Expr(expr)) if expr.is_boolean() => Types::BOOLEAN,
            Node::Template(Template::Text(_)) => Types::STRING,
            Node::Template(Template::Object(_)) => Types::OBJECT,
            Node::Template(Template::Array(_)) => Types::ARRAY,
            _ => Types::ANY,
        }
    }

    /// How a mismatch names the value.
    fn describe(self) -> String {
        match self {
            Node::Template(Template::Expr(Expr::Path(path))) => format!("`${{{path}}}`"),
            Node::Template(Template::Text(_)) => "the text".to_string(),
            _ => "the value".to_string(),
        }
    }

    fn fields(self) -> Option<Vec<(&'a str, Node<'a>)>> {
        match self {
            Node::Template(Template::Object(fields)) => Some(
                fields
                    .iter()
                    .map(|(key, template)| (key.as_str(), Node::Template(template)))
                    .collect(),
            ),
            _ => match self.known() {
                Some(Value::Object(map)) => Some(
                    map.iter()
                        .map(|(key, value)| (key.as_str(), Node::Value(value)))
                        .collect(),
                ),
                _ => None,
            },
        }
    }

    fn items(self) -> Option<Vec<Node<'a>>> {
        match self {
            Node::Template(Template::Array(items)) => Some(items.iter().map(Node::Template).collect()),
            _ => match self.known() {
                Some(Value::Array(items)) => Some(items.iter().map(Node::Value).collect()),
                _ => None,
            },
        }
    }
}

fn mismatch(pointer: &str, message: String) -> Mismatch {
    Mismatch {
        pointer: pointer.to_string(),
        message,
    }
}

fn check_node(node: Node<'_>, schema: &Value, sources: &Sources<'_>, pointer: &mut String) -> Result<(), Mismatch> {
    let map = match schema {
        Value::Object(map) => map,
        Value::Bool(false) => return Err(mismatch(pointer, "the schema accepts no value here".to_string())),
        _ => return Ok(()),
    };
    if map.contains_key("$ref") || map.contains_key("$dynamicRef") {
        return Ok(());
    }
    for keyword in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = map.get(keyword) {
            let mut first = None;
            let passes = branches.iter().any(|branch| {
                // A failed branch returns mid-way: the pointer is put back for the next.
                let length = pointer.len();
                let checked = check_node(node, branch, sources, pointer);
                pointer.truncate(length);
                match checked {
                    Ok(()) => true,
                    Err(error) => {
                        first.get_or_insert(error);
                        false
                    }
                }
            });
            if !passes {
                if let Some(error) = first {
                    return Err(error);
                }
            }
        }
    }
    if let Some(Value::Array(all)) = map.get("allOf") {
        for branch in all {
            check_node(node, branch, sources, pointer)?;
        }
    }
    let wanted = Types::of_schema(schema);
    let have = node.types(sources);
    if !have.meets(wanted) {
        return Err(mismatch(
            pointer,
            format!(
                "{} is {} where the schema wants {}",
                node.describe(),
                have.describe(),
                wanted.describe()
            ),
        ));
    }
    if let Some(value) = node.known() {
        if let Some(constant) = map.get("const") {
            if !same(value, constant) {
                return Err(mismatch(
                    pointer,
                    format!("{value} is not the schema's const {constant}"),
                ));
            }
        }
        if let Some(Value::Array(values)) = map.get("enum") {
            if !values.iter().any(|allowed| same(value, allowed)) {
                return Err(mismatch(
                    pointer,
                    format!("{value} is not one of the schema's enum values"),
                ));
            }
        }
    }
    if let Some(fields) = node.fields() {
        if let Some(Value::Array(required)) = map.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if !fields.iter().any(|(key, _)| *key == name) {
                    return Err(mismatch(
                        pointer,
                        format!("the input lacks `{name}`, which the schema requires"),
                    ));
                }
            }
        }
        for (key, field) in fields {
            let length = pointer.len();
            pointer.push('/');
            pointer.push_str(&escape_pointer(key));
            let property = map.get("properties").and_then(|properties| properties.get(key));
            let checked = match property {
                Some(property) => check_node(field, property, sources, pointer),
                None if map.contains_key("patternProperties") => Ok(()),
                None => match map.get("additionalProperties") {
                    Some(Value::Bool(false)) => Err(mismatch(
                        pointer,
                        format!("`{key}` is not a field the schema allows (additionalProperties: false)"),
                    )),
                    Some(extra @ Value::Object(_)) => check_node(field, extra, sources, pointer),
                    _ => Ok(()),
                },
            };
            checked?;
            pointer.truncate(length);
        }
    }
    if let Some(items) = node.items() {
        for (index, item) in items.into_iter().enumerate() {
            let length = pointer.len();
            let _ = write!(pointer, "/{index}");
            let schema = map
                .get("prefixItems")
                .and_then(|prefix| prefix.get(index))
                .or_else(|| map.get("items"));
            if let Some(schema) = schema {
                check_node(item, schema, sources, pointer)?;
            }
            pointer.truncate(length);
        }
    }
    Ok(())
}

/// JSON equality with numbers compared by value (1 and 1.0 are the same).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template;
    use serde_json::json;

    fn check_with(input: Value, step_output: Value, target: Value) -> Result<(), Mismatch> {
        let input_schema = json!({"type": "object", "properties": {
            "order_id": {"type": "string"}, "count": {"type": "integer"}, "any": {}
        }});
        let mut steps = HashMap::new();
        steps.insert(
            "lookup".to_string(),
            StepSource {
                output_schema: Some(&step_output),
                for_each: false,
                may_be_null: false,
            },
        );
        let sources = Sources {
            input_schema: &input_schema,
            steps: &steps,
            item_schema: None,
        };
        check(&template::parse(&input).unwrap(), &target, &sources)
    }

    fn order_output() -> Value {
        json!({"type": "object", "properties": {"total": {"type": "number"}, "paid": {"type": "boolean"}, "items": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}}}}}})
    }

    fn target() -> Value {
        json!({
            "type": "object", "required": ["order_id"], "additionalProperties": false,
            "properties": {
                "order_id": {"type": "string"}, "amount": {"type": "number"}, "flag": {"type": "boolean"},
                "mode": {"enum": ["fast", "slow"]}, "skus": {"type": "array", "items": {"type": "string"}}
            }
        })
    }

    #[test]
    fn mappings_that_can_satisfy_pass() {
        for input in [
            json!({"order_id": "${input.order_id}"}),
            json!({"order_id": "SO-${input.count}", "amount": "${steps.lookup.output.total}"}),
            json!({"order_id": "${input.any}", "flag": "${steps.lookup.output.total > 3}"}),
            json!({"order_id": "x", "mode": "fast", "skus": ["${steps.lookup.output.items[0].sku}"]}),
            json!({"order_id": "${input.order_id}", "amount": "${input.count}"}),
            json!({"order_id": "${steps.lookup.output.unknown}"}),
        ] {
            assert_eq!(check_with(input.clone(), order_output(), target()), Ok(()), "{input}");
        }
    }

    #[test]
    fn mappings_that_never_satisfy_are_refused_with_their_pointer() {
        for (input, pointer, fragment) in [
            (
                json!({"order_id": "${input.count}"}),
                "/order_id",
                "`${input.count}` is an integer where the schema wants a string",
            ),
            (json!({"amount": 1}), "", "lacks `order_id`"),
            (json!({"order_id": "x", "extra": 1}), "/extra", "additionalProperties"),
            (json!({"order_id": "x", "mode": "medium"}), "/mode", "enum"),
            (
                json!({"order_id": "x", "amount": "${steps.lookup.output.paid}"}),
                "/amount",
                "is a boolean where the schema wants a number",
            ),
            (
                json!({"order_id": "x", "skus": ["${steps.lookup.output.items}"]}),
                "/skus/0",
                "is an array",
            ),
            (
                json!({"order_id": "x", "amount": "n=${input.count}"}),
                "/amount",
                "the text is a string",
            ),
            (json!("${input.order_id}"), "", "wants an object"),
        ] {
            let error = check_with(input.clone(), order_output(), target()).unwrap_err();
            assert_eq!(error.pointer, pointer, "{input}: {}", error.message);
            assert!(error.message.contains(fragment), "{input}: {}", error.message);
        }
    }

    #[test]
    fn combinators_and_refs_are_lenient() {
        let any_of = json!({"anyOf": [{"type": "string"}, {"type": "integer"}]});
        assert_eq!(
            check_with(json!("${input.count}"), order_output(), any_of.clone()),
            Ok(())
        );
        assert!(check_with(json!(true), order_output(), any_of).is_err());
        assert_eq!(
            check_with(json!(1), order_output(), json!({"$ref": "#/$defs/x"})),
            Ok(())
        );
        assert!(check_with(json!(1), order_output(), json!(false)).is_err());
        assert_eq!(
            Types::of_schema(&json!({"type": ["integer", "null"]})).describe(),
            "null or an integer"
        );
        assert_eq!(Types::of_schema(&json!({"type": "number"})).describe(), "a number");
    }
}
