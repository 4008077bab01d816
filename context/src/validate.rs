//! Request checks with stable codes, run before anything touches the store so
//! a bad request writes nothing.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::error::{Code, ContextError};
use crate::model::Fields;

/// Longest field name and context id accepted.
pub const MAX_NAME_LEN: usize = 128;

/// Per-request limits (the per-context ones are enforced by the store, atomically).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest JSON text of one field value.
    pub max_field_bytes: usize,
    /// Most field names one request may name (the store limits what a context holds).
    pub max_fields: usize,
}

pub use agent_reach_access::credentials::CredentialFields;

/// Refuses the first of `names` that would hold a credential (`section`
/// names where they came from in the error).
pub fn refuse_credentials<'a>(
    credentials: &CredentialFields,
    names: impl IntoIterator<Item = &'a String>,
    section: &str,
) -> Result<(), ContextError> {
    for name in names {
        if let Some(pattern) = credentials.matching(name) {
            return Err(ContextError::field(
                Code::CredentialField,
                format!("{section}.{name}"),
                format!(
                    "`{name}` looks like a credential (it ends with `{pattern}`); credentials and secrets never \
                     belong in shared context: pass a reference (e.g. a secret's name) instead"
                ),
            )
            .with_details(serde_json::json!({ "pattern": pattern })));
        }
    }
    Ok(())
}

/// Context ids: 1..=128 of `A-Z a-z 0-9 _ - . :` (they become part of a Redis key).
pub fn context_id(text: &str) -> Result<(), ContextError> {
    let valid = !text.is_empty()
        && text.len() <= MAX_NAME_LEN
        && text
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b'.' | b':'));
    if valid {
        Ok(())
    } else {
        Err(ContextError::field(
            Code::InvalidContextId,
            "context_id",
            format!("`{text}` is not a context id: use 1..={MAX_NAME_LEN} of A-Z a-z 0-9 _ - . :"),
        ))
    }
}

/// Field names follow the ACL's dotted-name rules (`[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*`),
/// so every name can be matched by a whitelist pattern, and no name can collide with
/// the store's reserved `_`-prefixed entries.
/// `path` names the field in an error; it is built only then.
pub fn field_name(name: &str, path: impl FnOnce() -> String) -> Result<(), ContextError> {
    if name.len() > MAX_NAME_LEN {
        return Err(ContextError::field(
            Code::InvalidFieldName,
            path(),
            format!("field names are at most {MAX_NAME_LEN} bytes"),
        ));
    }
    agent_reach_access::acl::check_dotted(name).map_err(|why| {
        ContextError::field(
            Code::InvalidFieldName,
            path(),
            format!("`{name}` is not a field name ({why}); use lowercase dotted words like `order.status`"),
        )
    })
}

/// Names and value sizes of fields to write; returns their compact JSON text.
pub fn fields(values: BTreeMap<String, Value>, limits: &Limits, section: &str) -> Result<Fields, ContextError> {
    if values.len() > limits.max_fields {
        return Err(ContextError::field(
            Code::TooManyFields,
            section,
            format!(
                "{} fields in one request; a context holds at most {}",
                values.len(),
                limits.max_fields
            ),
        ));
    }
    let mut out = Fields::new();
    for (name, value) in values {
        let path = || format!("{section}.{name}");
        field_name(&name, path)?;
        // The compact JSON text, written directly (`Display` goes through the formatter).
        let text = serde_json::to_string(&value).map_err(|error| {
            ContextError::field(
                Code::InvalidFieldValue,
                path(),
                format!("the value cannot be stored: {error}"),
            )
        })?;
        if text.len() > limits.max_field_bytes {
            return Err(ContextError::field(
                Code::FieldTooLarge,
                path(),
                format!(
                    "the value is {} bytes of JSON; a field holds at most {}",
                    text.len(),
                    limits.max_field_bytes
                ),
            ));
        }
        out.insert(name, text);
    }
    Ok(out)
}

/// Names to delete: valid, unique, and not also set by the same patch.
pub fn deletions(names: Vec<String>, set: &Fields, limits: &Limits) -> Result<Vec<String>, ContextError> {
    if names.len() > limits.max_fields {
        return Err(ContextError::field(
            Code::TooManyFields,
            "delete",
            format!(
                "{} deletions in one request; the limit is {}",
                names.len(),
                limits.max_fields
            ),
        ));
    }
    let mut seen = BTreeSet::new();
    for (index, name) in names.iter().enumerate() {
        let path = || format!("delete[{index}]");
        field_name(name, path)?;
        if set.contains_key(name) {
            return Err(ContextError::field(
                Code::ConflictingPatch,
                path(),
                format!("`{name}` is both set and deleted by this patch"),
            ));
        }
        if !seen.insert(name.as_str()) {
            return Err(ContextError::field(
                Code::ConflictingPatch,
                path(),
                format!("`{name}` is listed twice"),
            ));
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_field_is_refused_with_its_field() {
        let error =
            refuse_credentials(&CredentialFields::default(), [&"user.password".to_string()], "set").unwrap_err();
        assert_eq!(
            (error.code, error.field.as_deref()),
            (Code::CredentialField, Some("set.user.password"))
        );
    }

    const LIMITS: Limits = Limits {
        max_field_bytes: 16,
        max_fields: 3,
    };

    #[test]
    fn context_ids() {
        assert!(context_id("ctx_42").is_ok());
        assert!(context_id("session:001.a-b").is_ok());
        assert_eq!(context_id("").unwrap_err().code, Code::InvalidContextId);
        assert_eq!(context_id("a b").unwrap_err().code, Code::InvalidContextId);
        assert_eq!(context_id("a{b}").unwrap_err().code, Code::InvalidContextId);
        assert_eq!(context_id(&"x".repeat(129)).unwrap_err().code, Code::InvalidContextId);
    }

    #[test]
    fn field_names_follow_acl_rules() {
        assert!(field_name("order.status", || "f".into()).is_ok());
        assert!(field_name("user_id", || "f".into()).is_ok());
        for bad in ["", "_version", "Order", "a..b", "a b", "é"] {
            let error = field_name(bad, || "set.x".into()).unwrap_err();
            assert_eq!(error.code, Code::InvalidFieldName, "{bad}");
            assert_eq!(error.field.as_deref(), Some("set.x"));
        }
    }

    #[test]
    fn field_values_are_measured_as_json() {
        let ok = fields(
            BTreeMap::from([("a".to_string(), serde_json::json!({"k": [1, 2]}))]),
            &LIMITS,
            "set",
        )
        .unwrap();
        assert_eq!(ok["a"], r#"{"k":[1,2]}"#);
        let error = fields(
            BTreeMap::from([("big".to_string(), serde_json::json!("x".repeat(20)))]),
            &LIMITS,
            "set",
        )
        .unwrap_err();
        assert_eq!(
            (error.code, error.field.as_deref()),
            (Code::FieldTooLarge, Some("set.big"))
        );
        let many = (0..4).map(|i| (format!("f{i}"), Value::Null)).collect();
        assert_eq!(fields(many, &LIMITS, "set").unwrap_err().code, Code::TooManyFields);
    }

    #[test]
    fn deletions_must_be_unambiguous() {
        let set = Fields::from([("a".to_string(), "1".to_string())]);
        assert!(deletions(vec!["b".into()], &set, &LIMITS).is_ok());
        assert_eq!(
            deletions(vec!["a".into()], &set, &LIMITS).unwrap_err().code,
            Code::ConflictingPatch
        );
        assert_eq!(
            deletions(vec!["b".into(), "b".into()], &set, &LIMITS).unwrap_err().code,
            Code::ConflictingPatch
        );
        assert_eq!(
            deletions(vec!["B".into()], &set, &LIMITS).unwrap_err().field.as_deref(),
            Some("delete[0]")
        );
    }
}
