//! Templates: the JSON a step's `input`, a compensation's `input` and the
//! workflow's `output` are written as. Any string may hold `${…}`
//! expressions ([`crate::expr`]): a string that is exactly one expression
//! keeps the expression's JSON type (`"${steps.lookup.output}"` is the
//! whole object); any other string with expressions is text, each value
//! written in (strings as they are, `null` as nothing, everything else as
//! compact JSON). `$${` writes a literal `${`.

use std::fmt::Write as _;

use serde_json::{Map, Value};

use crate::expr::{self, Expr, ExprError, Path, Scope};

/// A parsed template; the parts without expressions are kept as they are.
#[derive(Debug, Clone, PartialEq)]
pub enum Template {
    /// No expression anywhere inside.
    Literal(Value),
    /// A string that is exactly one expression: the expression's value.
    Expr(Expr),
    /// A string with text and expressions: always a string.
    Text(Vec<Piece>),
    Object(Vec<(String, Template)>),
    Array(Vec<Template>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Expr(Expr),
}

/// An expression in a template that does not parse: where (a JSON pointer
/// from the template's root) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    pub pointer: String,
    pub error: ExprError,
}

/// Parses `value` as a template.
pub fn parse(value: &Value) -> Result<Template, TemplateError> {
    parse_at(value, &mut String::new())
}

fn parse_at(value: &Value, pointer: &mut String) -> Result<Template, TemplateError> {
    if !has_expression(value) {
        return Ok(Template::Literal(value.clone()));
    }
    match value {
        Value::String(text) => parse_string(text).map_err(|error| TemplateError {
            pointer: pointer.clone(),
            error,
        }),
        Value::Array(items) => {
            let mut parsed = Vec::with_capacity(items.len());
            for (index, item) in items.iter().enumerate() {
                let length = pointer.len();
                let _ = write!(pointer, "/{index}");
                parsed.push(parse_at(item, pointer)?);
                pointer.truncate(length);
            }
            Ok(Template::Array(parsed))
        }
        Value::Object(map) => {
            let mut parsed = Vec::with_capacity(map.len());
            for (key, item) in map {
                let length = pointer.len();
                pointer.push('/');
                pointer.push_str(&escape_pointer(key));
                parsed.push((key.clone(), parse_at(item, pointer)?));
                pointer.truncate(length);
            }
            Ok(Template::Object(parsed))
        }
        _ => Ok(Template::Literal(value.clone())),
    }
}

/// A JSON pointer token (RFC 6901: `~` → `~0`, `/` → `~1`).
pub fn escape_pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn has_expression(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains("${"),
        Value::Array(items) => items.iter().any(has_expression),
        Value::Object(map) => map.values().any(has_expression),
        _ => false,
    }
}

/// Parses one string: text, `$${` escapes and `${…}` expressions.
pub fn parse_string(text: &str) -> Result<Template, ExprError> {
    let mut pieces = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    let mut offset = 0;
    while let Some(found) = rest.find("${") {
        if found > 0 && rest.as_bytes()[found - 1] == b'$' {
            // `$${`: a literal `${`.
            literal.push_str(&rest[..found - 1]);
            literal.push_str("${");
            rest = &rest[found + 2..];
            offset += found + 2;
            continue;
        }
        literal.push_str(&rest[..found]);
        let start = found + 2;
        let Some(length) = closing_brace(&rest[start..]) else {
            return Err(ExprError {
                at: offset + found,
                message: "`${` is not closed by `}`".to_string(),
            });
        };
        let inner = &rest[start..start + length];
        let expr = expr::parse(inner).map_err(|error| ExprError {
            // Positions count in the whole string.
            at: offset + start + error.at,
            message: error.message,
        })?;
        if !literal.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut literal)));
        }
        pieces.push(Piece::Expr(expr));
        rest = &rest[start + length + 1..];
        offset += start + length + 1;
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        pieces.push(Piece::Text(literal));
    }
    Ok(match pieces.len() {
        0 => Template::Literal(Value::String(String::new())),
        1 => match pieces.remove(0) {
            Piece::Expr(expr) => Template::Expr(expr),
            Piece::Text(text) => Template::Literal(Value::String(text)),
        },
        _ => Template::Text(pieces),
    })
}

/// The length of an expression up to its closing `}`, skipping quoted strings.
fn closing_brace(text: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (index, char) in text.char_indices() {
        match quote {
            Some(open) => {
                if escaped {
                    escaped = false;
                } else if char == '\\' {
                    escaped = true;
                } else if char == open {
                    quote = None;
                }
            }
            None => match char {
                '\'' | '"' => quote = Some(char),
                '}' => return Some(index),
                _ => {}
            },
        }
    }
    None
}

impl Template {
    /// The template's value in `scope`.
    pub fn eval(&self, scope: &dyn Scope) -> Value {
        match self {
            Template::Literal(value) => value.clone(),
            Template::Expr(expr) => expr.eval(scope).into_owned(),
            Template::Text(pieces) => {
                let mut text = String::new();
                for piece in pieces {
                    match piece {
                        Piece::Text(literal) => text.push_str(literal),
                        Piece::Expr(expr) => write_value(&mut text, &expr.eval(scope)),
                    }
                }
                Value::String(text)
            }
            Template::Object(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(key, template)| (key.clone(), template.eval(scope)))
                    .collect::<Map<String, Value>>(),
            ),
            Template::Array(items) => Value::Array(items.iter().map(|item| item.eval(scope)).collect()),
        }
    }

    /// Every path the template reads, each with the JSON pointer (from the
    /// template's root) of the string it is in.
    pub fn paths(&self) -> Vec<(String, &Path)> {
        let mut found = Vec::new();
        self.collect_paths(&mut String::new(), &mut found);
        found
    }

    fn collect_paths<'a>(&'a self, pointer: &mut String, found: &mut Vec<(String, &'a Path)>) {
        match self {
            Template::Literal(_) => {}
            Template::Expr(expr) => found.extend(expr.paths().into_iter().map(|path| (pointer.clone(), path))),
            Template::Text(pieces) => {
                for piece in pieces {
                    if let Piece::Expr(expr) = piece {
                        found.extend(expr.paths().into_iter().map(|path| (pointer.clone(), path)));
                    }
                }
            }
            Template::Object(fields) => {
                for (key, template) in fields {
                    let length = pointer.len();
                    pointer.push('/');
                    pointer.push_str(&escape_pointer(key));
                    template.collect_paths(pointer, found);
                    pointer.truncate(length);
                }
            }
            Template::Array(items) => {
                for (index, item) in items.iter().enumerate() {
                    let length = pointer.len();
                    let _ = write!(pointer, "/{index}");
                    item.collect_paths(pointer, found);
                    pointer.truncate(length);
                }
            }
        }
    }
}

/// How a value is written into text.
fn write_value(text: &mut String, value: &Value) {
    match value {
        Value::Null => {}
        Value::String(inner) => text.push_str(inner),
        Value::Bool(flag) => text.push_str(if *flag { "true" } else { "false" }),
        Value::Number(number) => {
            let _ = write!(text, "{number}");
        }
        other => text.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Input(Value);

    impl Scope for Input {
        fn input(&self) -> &Value {
            &self.0
        }
        fn step(&self, _: &str) -> Option<&Value> {
            None
        }
        fn item(&self) -> Option<&Value> {
            None
        }
        fn index(&self) -> Option<&Value> {
            None
        }
    }

    #[test]
    fn whole_expressions_keep_their_type_and_text_is_text() {
        let template = parse(&json!({
            "order": "${input.order}",
            "label": "order ${input.order.id} x${input.n}: ${input.missing}${input.flag}",
            "fixed": {"a": [1, "two"]},
            "list": ["${input.n}", "#${input.order}"],
            "escaped": "cost: $${input.n}",
            "quoted": "${input.order.id == 'a}b'}",
        }))
        .unwrap();
        let scope = Input(json!({"order": {"id": "SO-1"}, "n": 2, "flag": true}));
        assert_eq!(
            template.eval(&scope),
            json!({
                "order": {"id": "SO-1"},
                "label": "order SO-1 x2: true",
                "fixed": {"a": [1, "two"]},
                "list": [2, "#{\"id\":\"SO-1\"}"],
                "escaped": "cost: ${input.n}",
                "quoted": false,
            })
        );
        assert!(matches!(
            parse(&json!({"a": [1, {"b": "x"}]})).unwrap(),
            Template::Literal(_)
        ));
    }

    #[test]
    fn errors_point_at_the_string_and_the_character() {
        let error = parse(&json!({"a": [0, {"b~/c": "id: ${input.}"}]})).unwrap_err();
        assert_eq!(error.pointer, "/a/1/b~0~1c");
        assert_eq!(error.error.at, 12, "{}", error.error);
        let error = parse(&json!("${input.x")).unwrap_err();
        assert!(error.error.message.contains("not closed"));
        assert_eq!(error.error.at, 0);
    }

    #[test]
    fn paths_come_with_their_pointers() {
        let template = parse(&json!({"x": ["${steps.a.output.v}", "n=${input.n} ${item.k}"]})).unwrap();
        let paths: Vec<(String, String)> = template
            .paths()
            .into_iter()
            .map(|(pointer, path)| (pointer, path.to_string()))
            .collect();
        assert_eq!(
            paths,
            [
                ("/x/0".to_string(), "steps.a.output.v".to_string()),
                ("/x/1".to_string(), "input.n".to_string()),
                ("/x/1".to_string(), "item.k".to_string()),
            ]
        );
    }
}
