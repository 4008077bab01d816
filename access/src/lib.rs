//! Who is calling, and what they may do: bearer-token verification
//! ([`token`], configured by the `AUTH` flags of [`config`]; OpenID Connect
//! issuers in [`oidc`]), the `acl.yaml` policy with hot reload ([`acl`]), the hop
//! assertions the router signs and agents verify ([`assertion`]), and the
//! router's signer with its key files ([`signer`]), and the signatures of
//! the A2A cards the router serves ([`card_signature`], over RFC 8785's
//! canonical JSON, [`jcs`]).
//!
//! Every service (registry, router, context) enforces its own part of the same
//! file, so the rules and their parsing live here once.

pub mod acl;
pub mod assertion;
pub mod caller;
pub mod card_signature;
pub mod config;
pub mod credentials;
pub mod delegation;
pub mod jcs;
pub mod kept;
pub mod signer;
pub mod token;
// OpenID Connect issuers, beside `token` (whose authenticator uses them).
pub mod oidc;

pub use acl::{Acl, AclError, AclHandle, Pattern};
pub use assertion::{Actor, AssertionClaims, AssertionError, AssertionKey, AssertionVerifier, BudgetClaim};
pub use delegation::Delegation;
pub use signer::{AssertionSettings, Assertions, SigningKey};
pub use token::{AuthArgs, AuthConfig, AuthError, Authenticator, Caller};
pub use token::{KeyFile, OidcAuth};
