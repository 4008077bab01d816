//! Field names that hold credentials: refused in shared context (the
//! context service) and redacted from recorded payloads (the trail).

/// Field names that would hold credentials (DESIGN §4: credentials and
/// secrets never belong in context). A name matches a pattern when its words
/// (split at `.`, `_`, `-`) end with the pattern's words: with the default
/// patterns `password`, `user.password`, `github_token`, `client_secret` and
/// `openai_api_key` match; `token_count` and `password_hint` do not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialFields {
    patterns: Vec<Vec<String>>,
}

/// The patterns refused unless configured otherwise (`--credential-fields`).
pub const DEFAULT_CREDENTIAL_FIELDS: [&str; 5] = ["password", "secret", "token", "api_key", "authorization"];

impl CredentialFields {
    /// Patterns of lowercase words joined by `_` (`api_key`); an empty list refuses nothing.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, String> {
        let mut parsed = Vec::new();
        for pattern in patterns {
            let pattern = pattern.as_ref().trim();
            let words: Vec<String> = pattern.split(['_', '.', '-']).map(str::to_string).collect();
            if pattern.is_empty()
                || words
                    .iter()
                    .any(|word| word.is_empty() || !word.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
            {
                return Err(format!(
                    "credential field pattern `{pattern}` must be lowercase words joined by `_` (e.g. `api_key`)"
                ));
            }
            parsed.push(words);
        }
        Ok(Self { patterns: parsed })
    }

    /// The pattern `name` matches, if any.
    pub fn matching(&self, name: &str) -> Option<String> {
        let words: Vec<&str> = name.split(['_', '.', '-']).collect();
        self.patterns
            .iter()
            .find(|pattern| {
                words.len() >= pattern.len()
                    && words[words.len() - pattern.len()..]
                        .iter()
                        .zip(pattern.iter())
                        .all(|(word, want)| word == want)
            })
            .map(|pattern| pattern.join("_"))
    }
}

impl Default for CredentialFields {
    fn default() -> Self {
        Self::new(&DEFAULT_CREDENTIAL_FIELDS).unwrap_or(Self { patterns: Vec::new() })
    }
}

/// What a redacted value reads as.
pub const REDACTED: &str = "[redacted]";

impl CredentialFields {
    /// Replaces the value of every member of `value` (at any depth) whose
    /// name matches a pattern with [`REDACTED`]; the names stay.
    pub fn redact(&self, value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(members) => {
                for (name, member) in members.iter_mut() {
                    if self.matching(name).is_some() {
                        *member = serde_json::Value::String(REDACTED.to_string());
                    } else {
                        self.redact(member);
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|item| self.redact(item)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_fields_are_recognised_by_their_last_words() {
        let credentials = CredentialFields::default();
        for name in [
            "password",
            "user.password",
            "github_token",
            "client_secret",
            "openai_api_key",
            "authorization",
            "db.admin-password",
        ] {
            assert!(credentials.matching(name).is_some(), "{name}");
        }
        for name in [
            "token_count",
            "password_hint",
            "intent",
            "order_status",
            "api",
            "key",
            "secretary",
        ] {
            assert_eq!(credentials.matching(name), None, "{name}");
        }
        assert!(CredentialFields::new(&["Bad Pattern"]).is_err());
        assert!(CredentialFields::new(&[""]).is_err());
        assert_eq!(
            CredentialFields::new::<&str>(&[]).unwrap().matching("password"),
            None,
            "none configured"
        );
    }

    #[test]
    fn credentials_are_redacted_at_any_depth_and_nothing_else() {
        let mut value = serde_json::json!({
            "order_id": "SO-1",
            "api_key": "sk-1",
            "user": {"password": "hunter2", "name": "ada", "tokens": [{"github_token": "g"}]},
            "token_count": 12
        });
        CredentialFields::default().redact(&mut value);
        assert_eq!(
            value,
            serde_json::json!({
                "order_id": "SO-1",
                "api_key": REDACTED,
                "user": {"password": REDACTED, "name": "ada", "tokens": [{"github_token": REDACTED}]},
                "token_count": 12
            })
        );
    }
}
