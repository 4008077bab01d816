//! The expression language inside `${…}` (docs/design.md §3.14.2): paths
//! into the run's data (`input.…`, `steps.ID.output.…`, `steps.ID.status`,
//! `steps.ID.error.…`, `item.…`, `index`), JSON literals, comparisons
//! (`==`, `!=`, `<`, `<=`, `>`, `>=`), `&&`, `||`, `!` and parentheses.
//! Nothing else: no calls, no arithmetic, so an expression always ends and
//! never reaches outside the run's own data.
//!
//! Parsed once (at registration and when a router builds its snapshot);
//! evaluated against a [`Scope`] at run time. A path that leads nowhere is
//! `null`, never an error: `when: "${steps.lookup.output.express == true}"`
//! is simply false when the field is absent.

use std::borrow::Cow;
use std::fmt;

use serde_json::Value;

/// The longest expression text accepted (between `${` and `}`).
pub const MAX_EXPRESSION_BYTES: usize = 1024;

/// How deeply parentheses and `!` may nest (bounds the parser's recursion).
const MAX_NESTING: usize = 32;

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Literal(Value),
    Path(Path),
    Not(Box<Expr>),
    Compare(Box<Expr>, Comparison, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A path into the run's data.
#[derive(Debug, Clone, PartialEq)]
pub struct Path {
    pub root: Root,
    /// After the root (for a step: after `steps.ID`, starting with
    /// `output`, `status` or `error`).
    pub segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Root {
    /// The run's input.
    Input,
    /// `steps.ID`: an earlier step's record.
    Step(String),
    /// The current element of the step's `for_each`.
    Item,
    /// The current element's position in the step's `for_each` (from 0).
    Index,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Key(String),
    Index(usize),
}

/// Why an expression does not parse: what, and where (a byte offset into
/// the expression text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExprError {
    pub at: usize,
    pub message: String,
}

impl fmt::Display for ExprError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{} (at character {})", self.message, self.at + 1)
    }
}

/// What a step's record holds, as a path sees it (`steps.ID.…`).
pub const STEP_FIELDS: [&str; 3] = ["output", "status", "error"];

/// What an expression reads at run time.
pub trait Scope {
    fn input(&self) -> &Value;
    /// `steps.ID`: an object `{output, status, error}`, or `None` when the
    /// step has not settled (its paths are then `null`).
    fn step(&self, id: &str) -> Option<&Value>;
    fn item(&self) -> Option<&Value>;
    fn index(&self) -> Option<&Value>;
}

// === Parsing ===

/// Parses the text between `${` and `}`.
pub fn parse(text: &str) -> Result<Expr, ExprError> {
    if text.len() > MAX_EXPRESSION_BYTES {
        return Err(ExprError {
            at: 0,
            message: format!("the expression is {} bytes; at most {MAX_EXPRESSION_BYTES}", text.len()),
        });
    }
    let tokens = lex(text)?;
    let mut parser = Parser {
        tokens,
        position: 0,
        end: text.len(),
        depth: 0,
    };
    let expr = parser.or()?;
    match parser.peek() {
        None => Ok(expr),
        Some((at, token)) => Err(ExprError {
            at,
            message: format!("unexpected {token} after a complete expression"),
        }),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Number(serde_json::Number),
    Str(String),
    Dot,
    LBracket,
    RBracket,
    LParen,
    RParen,
    Compare(Comparison),
    And,
    Or,
    Not,
}

impl fmt::Display for Token {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Ident(name) => write!(formatter, "`{name}`"),
            Token::Number(number) => write!(formatter, "number {number}"),
            Token::Str(_) => write!(formatter, "a string"),
            Token::Dot => write!(formatter, "`.`"),
            Token::LBracket => write!(formatter, "`[`"),
            Token::RBracket => write!(formatter, "`]`"),
            Token::LParen => write!(formatter, "`(`"),
            Token::RParen => write!(formatter, "`)`"),
            Token::Compare(op) => write!(formatter, "`{}`", op.as_str()),
            Token::And => write!(formatter, "`&&`"),
            Token::Or => write!(formatter, "`||`"),
            Token::Not => write!(formatter, "`!`"),
        }
    }
}

impl Comparison {
    pub fn as_str(self) -> &'static str {
        match self {
            Comparison::Eq => "==",
            Comparison::Ne => "!=",
            Comparison::Lt => "<",
            Comparison::Le => "<=",
            Comparison::Gt => ">",
            Comparison::Ge => ">=",
        }
    }
}

fn lex(text: &str) -> Result<Vec<(usize, Token)>, ExprError> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut at = 0;
    let error = |at: usize, message: String| Err(ExprError { at, message });
    while at < bytes.len() {
        let byte = bytes[at];
        let start = at;
        let two = |second: u8| bytes.get(at + 1) == Some(&second);
        let token = match byte {
            b' ' | b'\t' | b'\n' | b'\r' => {
                at += 1;
                continue;
            }
            b'.' => Token::Dot,
            b'[' => Token::LBracket,
            b']' => Token::RBracket,
            b'(' => Token::LParen,
            b')' => Token::RParen,
            b'=' if two(b'=') => Token::Compare(Comparison::Eq),
            b'!' if two(b'=') => Token::Compare(Comparison::Ne),
            b'<' if two(b'=') => Token::Compare(Comparison::Le),
            b'>' if two(b'=') => Token::Compare(Comparison::Ge),
            b'&' if two(b'&') => Token::And,
            b'|' if two(b'|') => Token::Or,
            b'<' => Token::Compare(Comparison::Lt),
            b'>' => Token::Compare(Comparison::Gt),
            b'!' => Token::Not,
            b'\'' | b'"' => {
                let (value, next) = string(text, at)?;
                tokens.push((start, Token::Str(value)));
                at = next;
                continue;
            }
            b'-' | b'0'..=b'9' => {
                let mut end = at + 1;
                while end < bytes.len() && matches!(bytes[end], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-') {
                    // A `.` followed by a letter ends the number (`items.0` is not a thing, but be strict).
                    end += 1;
                }
                let literal = &text[at..end];
                match serde_json::from_str::<serde_json::Number>(literal) {
                    Ok(number) => tokens.push((start, Token::Number(number))),
                    Err(_) => return error(start, format!("`{literal}` is not a number")),
                }
                at = end;
                continue;
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                let mut end = at + 1;
                while end < bytes.len() && matches!(bytes[end], b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_') {
                    end += 1;
                }
                tokens.push((start, Token::Ident(text[at..end].to_string())));
                at = end;
                continue;
            }
            _ => {
                let shown = text[at..].chars().next().unwrap_or('?');
                return error(start, format!("unexpected character `{shown}`"));
            }
        };
        at += match token {
            Token::Compare(Comparison::Eq | Comparison::Ne | Comparison::Le | Comparison::Ge)
            | Token::And
            | Token::Or => 2,
            _ => 1,
        };
        tokens.push((start, token));
    }
    Ok(tokens)
}

/// A quoted string starting at `at` (its quote), with `\\`, `\'`, `\"`,
/// `\n` and `\t` escapes; returns it and the offset after its closing quote.
fn string(text: &str, at: usize) -> Result<(String, usize), ExprError> {
    let quote = text.as_bytes()[at] as char;
    let mut value = String::new();
    let mut chars = text[at + 1..].char_indices();
    while let Some((offset, char)) = chars.next() {
        match char {
            '\\' => match chars.next() {
                Some((_, 'n')) => value.push('\n'),
                Some((_, 't')) => value.push('\t'),
                Some((_, escaped @ ('\\' | '\'' | '"'))) => value.push(escaped),
                Some((_, other)) => {
                    return Err(ExprError {
                        at: at + 1 + offset,
                        message: format!("unknown escape `\\{other}` (use \\\\, \\', \\\", \\n or \\t)"),
                    })
                }
                None => break,
            },
            closing if closing == quote => return Ok((value, at + 1 + offset + 1)),
            other => value.push(other),
        }
    }
    Err(ExprError {
        at,
        message: "a string is not closed".to_string(),
    })
}

struct Parser {
    tokens: Vec<(usize, Token)>,
    position: usize,
    /// The text's length: where "unexpected end" points.
    end: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<(usize, &Token)> {
        self.tokens.get(self.position).map(|(at, token)| (*at, token))
    }

    fn next(&mut self) -> Option<(usize, Token)> {
        let token = self.tokens.get(self.position).cloned();
        self.position += 1;
        token
    }

    fn eat(&mut self, wanted: &Token) -> bool {
        if self.peek().is_some_and(|(_, token)| token == wanted) {
            self.position += 1;
            return true;
        }
        false
    }

    fn here(&self) -> usize {
        self.peek().map_or(self.end, |(at, _)| at)
    }

    fn fail<T>(&self, message: impl Into<String>) -> Result<T, ExprError> {
        Err(ExprError {
            at: self.here(),
            message: message.into(),
        })
    }

    fn nested<T>(&mut self, parse: impl FnOnce(&mut Self) -> Result<T, ExprError>) -> Result<T, ExprError> {
        if self.depth >= MAX_NESTING {
            return self.fail(format!("nested more than {MAX_NESTING} deep"));
        }
        self.depth += 1;
        let parsed = parse(self);
        self.depth -= 1;
        parsed
    }

    fn or(&mut self) -> Result<Expr, ExprError> {
        let mut left = self.and()?;
        while self.eat(&Token::Or) {
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, ExprError> {
        let mut left = self.comparison()?;
        while self.eat(&Token::And) {
            left = Expr::And(Box::new(left), Box::new(self.comparison()?));
        }
        Ok(left)
    }

    fn comparison(&mut self) -> Result<Expr, ExprError> {
        let left = self.unary()?;
        if let Some((_, Token::Compare(op))) = self.peek() {
            let op = *op;
            self.position += 1;
            let right = self.unary()?;
            if let Some((at, Token::Compare(_))) = self.peek() {
                return Err(ExprError {
                    at,
                    message: "comparisons do not chain; use && (e.g. a < b && b < c)".to_string(),
                });
            }
            return Ok(Expr::Compare(Box::new(left), op, Box::new(right)));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, ExprError> {
        if self.eat(&Token::Not) {
            return self.nested(|parser| Ok(Expr::Not(Box::new(parser.unary()?))));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, ExprError> {
        let Some((at, token)) = self.next() else {
            return self.fail("the expression ends where a value was expected");
        };
        match token {
            Token::LParen => {
                let inner = self.nested(Parser::or)?;
                if !self.eat(&Token::RParen) {
                    return self.fail("`(` is not closed by `)`");
                }
                Ok(inner)
            }
            Token::Number(number) => Ok(Expr::Literal(Value::Number(number))),
            Token::Str(text) => Ok(Expr::Literal(Value::String(text))),
            Token::Ident(word) => match word.as_str() {
                "true" => Ok(Expr::Literal(Value::Bool(true))),
                "false" => Ok(Expr::Literal(Value::Bool(false))),
                "null" => Ok(Expr::Literal(Value::Null)),
                _ => self.path(at, word).map(Expr::Path),
            },
            other => Err(ExprError {
                at,
                message: format!("{other} where a value was expected"),
            }),
        }
    }

    fn path(&mut self, at: usize, root: String) -> Result<Path, ExprError> {
        let root = match root.as_str() {
            "input" => Root::Input,
            "item" => Root::Item,
            "index" => Root::Index,
            "steps" => {
                if !self.eat(&Token::Dot) {
                    return self.fail("`steps` is followed by `.` and a step id (steps.ID.output…)");
                }
                match self.next() {
                    Some((_, Token::Ident(id))) => Root::Step(id),
                    _ => {
                        self.position = self.position.saturating_sub(1);
                        return self.fail("a step id follows `steps.`");
                    }
                }
            }
            other => {
                return Err(ExprError {
                    at,
                    message: format!(
                    "`{other}` is not something an expression can read: paths start with input, steps, item or index"
                ),
                })
            }
        };
        let mut segments = Vec::new();
        loop {
            if self.eat(&Token::Dot) {
                match self.next() {
                    Some((_, Token::Ident(key))) => segments.push(Segment::Key(key)),
                    _ => {
                        self.position = self.position.saturating_sub(1);
                        return self.fail("a field name follows `.` (use [\"…\"] for other names)");
                    }
                }
            } else if self.eat(&Token::LBracket) {
                let segment = match self.next() {
                    Some((_, Token::Str(key))) => Segment::Key(key),
                    Some((at, Token::Number(number))) => match number.as_u64().and_then(|n| usize::try_from(n).ok()) {
                        Some(index) => Segment::Index(index),
                        None => {
                            return Err(ExprError {
                                at,
                                message: format!("`[{number}]`: an index is a whole number from 0"),
                            })
                        }
                    },
                    _ => {
                        self.position = self.position.saturating_sub(1);
                        return self.fail("`[` takes an index (0, 1, …) or a quoted field name");
                    }
                };
                if !self.eat(&Token::RBracket) {
                    return self.fail("`[` is not closed by `]`");
                }
                segments.push(segment);
            } else {
                break;
            }
        }
        if let Root::Step(id) = &root {
            match segments.first() {
                Some(Segment::Key(field)) if STEP_FIELDS.contains(&field.as_str()) => {}
                _ => {
                    return Err(ExprError {
                        at,
                        message: format!("`steps.{id}` is followed by .output, .status or .error"),
                    })
                }
            }
            if matches!(segments.first(), Some(Segment::Key(field)) if field == "status") && segments.len() > 1 {
                return Err(ExprError {
                    at,
                    message: format!("`steps.{id}.status` is a string; it has no fields"),
                });
            }
        }
        if root == Root::Index && !segments.is_empty() {
            return Err(ExprError {
                at,
                message: "`index` is a number; it has no fields".to_string(),
            });
        }
        Ok(Path { root, segments })
    }
}

// === What an expression reads ===

impl Expr {
    /// Every path the expression reads, in order.
    pub fn paths(&self) -> Vec<&Path> {
        let mut found = Vec::new();
        self.collect_paths(&mut found);
        found
    }

    fn collect_paths<'a>(&'a self, found: &mut Vec<&'a Path>) {
        match self {
            Expr::Literal(_) => {}
            Expr::Path(path) => found.push(path),
            Expr::Not(inner) => inner.collect_paths(found),
            Expr::Compare(left, _, right) | Expr::And(left, right) | Expr::Or(left, right) => {
                left.collect_paths(found);
                right.collect_paths(found);
            }
        }
    }

    /// Whether it always gives a boolean (comparisons, `!`, `&&`, `||`, `true`/`false`).
    pub fn is_boolean(&self) -> bool {
        match self {
            Expr::Literal(value) => value.is_boolean(),
            Expr::Path(_) => false,
            Expr::Not(_) | Expr::Compare(..) | Expr::And(..) | Expr::Or(..) => true,
        }
    }
}

// === Evaluation ===

impl Expr {
    /// The expression's value in `scope`; paths that lead nowhere are `null`.
    pub fn eval<'s>(&'s self, scope: &'s dyn Scope) -> Cow<'s, Value> {
        match self {
            Expr::Literal(value) => Cow::Borrowed(value),
            Expr::Path(path) => path.lookup(scope).map_or(Cow::Owned(Value::Null), Cow::Borrowed),
            Expr::Not(inner) => Cow::Owned(Value::Bool(!is_true(&inner.eval(scope)))),
            Expr::And(left, right) => {
                Cow::Owned(Value::Bool(is_true(&left.eval(scope)) && is_true(&right.eval(scope))))
            }
            Expr::Or(left, right) => Cow::Owned(Value::Bool(is_true(&left.eval(scope)) || is_true(&right.eval(scope)))),
            Expr::Compare(left, op, right) => {
                Cow::Owned(Value::Bool(compare(&left.eval(scope), *op, &right.eval(scope))))
            }
        }
    }
}

/// The one truth rule: only `true` is true (a `when` that reads a missing
/// field is false, never an error).
pub fn is_true(value: &Value) -> bool {
    value == &Value::Bool(true)
}

fn compare(left: &Value, op: Comparison, right: &Value) -> bool {
    use std::cmp::Ordering;
    let ordering = match (left, right) {
        (Value::Number(a), Value::Number(b)) => match (a.as_f64(), b.as_f64()) {
            (Some(a), Some(b)) => a.partial_cmp(&b),
            _ => None,
        },
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(b)),
        _ => None,
    };
    match op {
        // Numbers compare by value (1 == 1.0); everything else structurally.
        Comparison::Eq => ordering.map_or_else(|| left == right, |ordering| ordering == Ordering::Equal),
        Comparison::Ne => ordering.map_or_else(|| left != right, |ordering| ordering != Ordering::Equal),
        // Ordering across types (or with null) is false, never an error.
        Comparison::Lt => matches!(ordering, Some(Ordering::Less)),
        Comparison::Le => matches!(ordering, Some(Ordering::Less | Ordering::Equal)),
        Comparison::Gt => matches!(ordering, Some(Ordering::Greater)),
        Comparison::Ge => matches!(ordering, Some(Ordering::Greater | Ordering::Equal)),
    }
}

impl Path {
    /// The value the path leads to, if any.
    pub fn lookup<'s>(&self, scope: &'s dyn Scope) -> Option<&'s Value> {
        let mut current = match &self.root {
            Root::Input => scope.input(),
            Root::Step(id) => scope.step(id)?,
            Root::Item => scope.item()?,
            Root::Index => scope.index()?,
        };
        for segment in &self.segments {
            current = match (segment, current) {
                (Segment::Key(key), Value::Object(map)) => map.get(key)?,
                (Segment::Index(index), Value::Array(items)) => items.get(*index)?,
                _ => return None,
            };
        }
        Some(current)
    }

    /// The step a `steps.ID…` path reads.
    pub fn step(&self) -> Option<&str> {
        match &self.root {
            Root::Step(id) => Some(id),
            _ => None,
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.root {
            Root::Input => formatter.write_str("input")?,
            Root::Step(id) => write!(formatter, "steps.{id}")?,
            Root::Item => formatter.write_str("item")?,
            Root::Index => formatter.write_str("index")?,
        }
        for segment in &self.segments {
            match segment {
                Segment::Key(key) => write!(formatter, ".{key}")?,
                Segment::Index(index) => write!(formatter, "[{index}]")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Data {
        input: Value,
        steps: serde_json::Map<String, Value>,
        item: Option<Value>,
        index: Option<Value>,
    }

    impl Scope for Data {
        fn input(&self) -> &Value {
            &self.input
        }
        fn step(&self, id: &str) -> Option<&Value> {
            self.steps.get(id)
        }
        fn item(&self) -> Option<&Value> {
            self.item.as_ref()
        }
        fn index(&self) -> Option<&Value> {
            self.index.as_ref()
        }
    }

    fn data() -> Data {
        Data {
            input: json!({"order_id": "SO-1", "n": 3, "tags": ["a", "b"], "odd key": 1}),
            steps: json!({
                "lookup": {"status": "succeeded", "output": {"paid": true, "total": 12.5, "items": [{"sku": "x"}]}},
                "failed": {"status": "failed", "error": {"code": "AGENT_ERROR"}}
            })
            .as_object()
            .cloned()
            .unwrap(),
            item: Some(json!({"sku": "y"})),
            index: Some(json!(2)),
        }
    }

    fn eval(text: &str) -> Value {
        let data = data();
        parse(text).unwrap().eval(&data).into_owned()
    }

    #[test]
    fn paths_literals_and_operators_evaluate() {
        assert_eq!(eval("input.order_id"), json!("SO-1"));
        assert_eq!(eval("input.tags[1]"), json!("b"));
        assert_eq!(eval("input[\"odd key\"]"), json!(1));
        assert_eq!(eval("steps.lookup.output.items[0].sku"), json!("x"));
        assert_eq!(eval("steps.lookup.status"), json!("succeeded"));
        assert_eq!(eval("steps.failed.error.code"), json!("AGENT_ERROR"));
        assert_eq!(eval("item.sku"), json!("y"));
        assert_eq!(eval("index"), json!(2));
        assert_eq!(eval("input.missing.deeper"), Value::Null);
        assert_eq!(eval("steps.unknown.output"), Value::Null);
        assert_eq!(eval("input.n == 3"), json!(true));
        assert_eq!(eval("input.n == 3.0"), json!(true));
        assert_eq!(eval("input.n != 3"), json!(false));
        assert_eq!(
            eval("steps.lookup.output.total > 10 && steps.lookup.output.paid"),
            json!(true)
        );
        assert_eq!(eval("input.n < 2 || !steps.lookup.output.paid"), json!(false));
        assert_eq!(eval("!(input.n < 2)"), json!(true));
        assert_eq!(eval("input.order_id == 'SO-1'"), json!(true));
        assert_eq!(eval("input.order_id >= \"SO-0\""), json!(true));
        assert_eq!(eval("input.missing == null"), json!(true));
        assert_eq!(eval("input.missing < 3"), json!(false), "ordering with null is false");
        assert_eq!(eval("input.tags == input.tags"), json!(true));
        assert_eq!(eval("-1.5e2"), json!(-150.0));
        assert_eq!(eval("'it\\'s'"), json!("it's"));
    }

    #[test]
    fn only_true_is_true() {
        assert!(is_true(&json!(true)));
        for value in [json!(1), json!("true"), json!(null), json!([true]), json!(false)] {
            assert!(!is_true(&value), "{value}");
        }
        assert_eq!(eval("!input.n"), json!(true), "`!` of a non-boolean is true");
    }

    #[test]
    fn bad_expressions_say_what_and_where() {
        for (text, at, fragment) in [
            ("", 0, "ends where a value"),
            ("input.", 6, "field name follows"),
            ("order.id", 0, "paths start with input"),
            ("steps", 5, "followed by `.`"),
            ("steps.x", 0, ".output, .status or .error"),
            ("steps.x.result", 0, ".output, .status or .error"),
            ("steps.x.status.code", 0, "has no fields"),
            ("index.x", 0, "has no fields"),
            ("input.a ==", 10, "ends where a value"),
            ("input.a == 1 == 2", 13, "do not chain"),
            ("(input.a", 8, "not closed"),
            ("input[1.5]", 6, "whole number"),
            ("input[x]", 6, "takes an index"),
            ("'open", 0, "not closed"),
            ("input.a = 1", 8, "unexpected character"),
            ("input.a input.b", 8, "after a complete expression"),
            ("1..2", 0, "not a number"),
            ("'\\q'", 1, "unknown escape"),
        ] {
            let error = parse(text).unwrap_err();
            assert_eq!(error.at, at, "{text}: {error}");
            assert!(error.message.contains(fragment), "{text}: {error}");
        }
        let deep = format!("{}true{}", "(".repeat(40), ")".repeat(40));
        assert!(parse(&deep).unwrap_err().message.contains("nested"));
        let long = format!("input.{}", "a".repeat(MAX_EXPRESSION_BYTES));
        assert!(parse(&long).unwrap_err().message.contains("at most"));
    }

    #[test]
    fn paths_are_listed_and_shown() {
        let expr = parse("steps.a.output.x[0] == input.y && !item.z").unwrap();
        let shown: Vec<String> = expr.paths().iter().map(|path| path.to_string()).collect();
        assert_eq!(shown, ["steps.a.output.x[0]", "input.y", "item.z"]);
        assert_eq!(expr.paths()[0].step(), Some("a"));
        assert!(expr.is_boolean());
        assert!(!parse("input.x").unwrap().is_boolean());
    }
}
