//! Who is calling, and what they may do: bearer-token verification
//! ([`token`]) and the `acl.yaml` policy with hot reload ([`acl`]).
//!
//! Every service (registry, router, context) enforces its own part of the same
//! file, so the rules and their parsing live here once.

pub mod acl;
pub mod assertion;
pub mod token;

pub use acl::{Acl, AclError, AclHandle, Pattern};
pub use assertion::{AssertionClaims, AssertionError, AssertionKey, AssertionVerifier};
pub use token::{AuthArgs, AuthConfig, AuthError, Authenticator, Caller};
