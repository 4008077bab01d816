//! Who is calling: the verified identity every check uses (its name, tenant
//! and groups), and the rules of tenant names.

use std::sync::Arc;

/// The tenant of a token without a `tenant` claim, and of every request when
/// authentication is off.
pub const DEFAULT_TENANT: &str = "default";

/// The groups a caller belongs to, as its token lists them.
pub type Groups = Arc<[Arc<str>]>;

/// The verified identity of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A verified token's caller name, tenant and groups (shared: every
    /// request of a cached token clones them).
    Agent {
        name: Arc<str>,
        tenant: Arc<str>,
        groups: Groups,
    },
    /// Authentication is switched off (`--insecure-no-auth`): every request is
    /// trusted, in the `default` tenant.
    Unauthenticated,
}

impl Caller {
    /// A caller of the `default` tenant (tests, the task worker's replays).
    pub fn agent(name: &str) -> Self {
        Self::in_tenant(name, DEFAULT_TENANT)
    }

    pub fn in_tenant(name: &str, tenant: &str) -> Self {
        Caller::Agent {
            name: name.into(),
            tenant: tenant.into(),
            groups: Arc::new([]),
        }
    }

    /// This caller, in `groups` instead of the groups it had (none for the
    /// unauthenticated caller).
    pub fn with_groups<S: AsRef<str>>(self, groups: &[S]) -> Self {
        match self {
            Caller::Agent { name, tenant, .. } => Caller::Agent {
                name,
                tenant,
                groups: groups.iter().map(|group| Arc::from(group.as_ref())).collect(),
            },
            Caller::Unauthenticated => Caller::Unauthenticated,
        }
    }

    /// The verified name, if any.
    pub fn name(&self) -> Option<&str> {
        match self {
            Caller::Agent { name, .. } => Some(name),
            Caller::Unauthenticated => None,
        }
    }

    /// The verified tenant (`default` without authentication).
    pub fn tenant(&self) -> &str {
        match self {
            Caller::Agent { tenant, .. } => tenant,
            Caller::Unauthenticated => DEFAULT_TENANT,
        }
    }

    /// The groups the verified token lists (its `groups` claim, or the OIDC
    /// issuer's claim that `--auth-claim-groups` names); none without
    /// authentication.
    pub fn groups(&self) -> &[Arc<str>] {
        match self {
            Caller::Agent { groups, .. } => groups,
            Caller::Unauthenticated => &[],
        }
    }

    /// Whether the verified token lists `group`.
    pub fn in_group(&self, group: &str) -> bool {
        self.groups().iter().any(|own| **own == *group)
    }
}

/// A tenant name (DESIGN §8): 1 to 63 lowercase letters, digits, `-` and `_`,
/// starting with a letter, so that it fits a key segment, a metric label and
/// a Kubernetes namespace alike.
pub fn check_tenant_name(tenant: &str) -> Result<(), String> {
    let mut chars = tenant.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    if tenant.len() > 63
        || !first_ok
        || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    {
        return Err(format!(
            "tenant `{}` is not a tenant name: 1 to 63 lowercase letters, digits, `-` and `_`, starting with a letter",
            tenant.escape_debug()
        ));
    }
    Ok(())
}
