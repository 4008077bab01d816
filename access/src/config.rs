//! The `AUTH` flags of DESIGN §7.1, shared by every service's command
//! line, and the [`AuthConfig`] they make: a shared HS256 secret, a public
//! key, OpenID Connect issuers (alone or beside one of the two), or, for
//! development only, no authentication at all.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::oidc::{ClaimNames, OidcIssuer, OidcSettings};

/// How a service verifies tokens; built from the `AUTH` flags.
#[derive(Debug, Clone)]
pub enum AuthConfig {
    Hs256SecretFile(PathBuf),
    PublicKeyFile(PathBuf),
    /// No verification at all. Development only.
    InsecureNoAuth,
    /// OpenID Connect issuers, alone or beside a key of the two modes above.
    Oidc(OidcAuth),
}

/// A key the service holds itself (the two key modes), beside OIDC issuers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyFile {
    Hs256SecretFile(PathBuf),
    PublicKeyFile(PathBuf),
}

/// OIDC issuers, and the key tried for a token whose `iss` names none of them.
#[derive(Debug, Clone)]
pub struct OidcAuth {
    pub settings: OidcSettings,
    /// The key tried for tokens of no configured issuer (`agent-reach token
    /// issue`'s, say); `None`: such tokens are refused (`unknown_issuer`).
    pub beside: Option<KeyFile>,
    /// The issuers' key caches and refreshers, made by the first
    /// authenticator loaded from this config and shared by every later one
    /// (one per tenant): a service fetches each issuer's keys once.
    pub(crate) shared: Arc<std::sync::OnceLock<crate::oidc::SharedKeys>>,
}

impl OidcAuth {
    pub fn new(settings: OidcSettings, beside: Option<KeyFile>) -> Self {
        Self {
            settings,
            beside,
            shared: Arc::default(),
        }
    }
}

impl AuthConfig {
    /// Picks the mode the flags name: one key mode or `--insecure-no-auth`,
    /// and OIDC issuers alone or beside a key mode.
    pub fn from_flags(
        hs256_secret_file: Option<PathBuf>,
        public_key_file: Option<PathBuf>,
        insecure_no_auth: bool,
    ) -> Result<Self, String> {
        match (hs256_secret_file, public_key_file, insecure_no_auth) {
            (Some(path), None, false) => Ok(Self::Hs256SecretFile(path)),
            (None, Some(path), false) => Ok(Self::PublicKeyFile(path)),
            (None, None, true) => Ok(Self::InsecureNoAuth),
            (None, None, false) => Err("no authentication configured: pass --auth-hs256-secret-file PATH, \
                 --auth-public-key PATH, --auth-oidc-issuer URL --auth-oidc-audience AUD, or (development \
                 only) --insecure-no-auth"
                .to_string()),
            _ => Err("pass only one of --auth-hs256-secret-file, --auth-public-key, --insecure-no-auth".to_string()),
        }
    }

    /// The HS256 secret file this service verifies tokens with, alone or
    /// beside OIDC issuers (the router signs its own registry token with it).
    pub fn hs256_secret_file(&self) -> Option<&Path> {
        match self {
            AuthConfig::Hs256SecretFile(path)
            | AuthConfig::Oidc(OidcAuth {
                beside: Some(KeyFile::Hs256SecretFile(path)),
                ..
            }) => Some(path),
            _ => None,
        }
    }

    /// Whether authentication is switched off (`--insecure-no-auth`).
    pub fn is_insecure(&self) -> bool {
        matches!(self, AuthConfig::InsecureNoAuth)
    }

    /// The claim that names a token's tenant: `--auth-claim-tenant` with
    /// OIDC issuers, else `tenant` (a tenant map routes requests by it).
    pub fn tenant_claim(&self) -> &str {
        match self {
            AuthConfig::Oidc(oidc) => &oidc.settings.claims.tenant,
            _ => "tenant",
        }
    }

    /// The OIDC issuers accepted, in the order configured.
    pub fn oidc_issuers(&self) -> impl Iterator<Item = &str> {
        let issuers = match self {
            AuthConfig::Oidc(oidc) => oidc.settings.issuers.as_slice(),
            _ => &[],
        };
        issuers.iter().map(|issuer| issuer.issuer.as_str())
    }
}

/// The `AUTH` flags of DESIGN §7.1, shared by every service's command line.
#[derive(Debug, Clone, clap::Args)]
pub struct AuthArgs {
    /// File holding the shared HS256 secret (at least 32 bytes) that tokens are signed with.
    #[arg(long, env = "AGENT_REACH_AUTH_HS256_SECRET_FILE", value_name = "PATH")]
    pub auth_hs256_secret_file: Option<PathBuf>,
    /// PEM file with the Ed25519 or RSA public key that verifies tokens (production).
    #[arg(long, env = "AGENT_REACH_AUTH_PUBLIC_KEY", value_name = "PATH")]
    pub auth_public_key: Option<PathBuf>,
    /// An OpenID Connect issuer whose access tokens are accepted (repeatable, each followed by its
    /// --auth-oidc-audience; the environment variable takes a comma-separated list). Its keys come
    /// from its discovery document's `jwks_uri` and are refreshed as they rotate. `https://`, or
    /// `http://` on a loopback address. May stand beside --auth-hs256-secret-file or
    /// --auth-public-key: a token whose `iss` is a configured issuer is verified with that
    /// issuer's keys, any other with the key.
    #[arg(
        long = "auth-oidc-issuer",
        env = "AGENT_REACH_AUTH_OIDC_ISSUER",
        value_delimiter = ',',
        value_name = "URL"
    )]
    pub auth_oidc_issuer: Vec<String>,
    /// The audience (`aud`) the tokens of the --auth-oidc-issuer in the same position must name:
    /// this service's resource identifier at that issuer (for MCP clients, the router's URL).
    /// Name an issuer twice to accept two audiences.
    #[arg(
        long = "auth-oidc-audience",
        env = "AGENT_REACH_AUTH_OIDC_AUDIENCE",
        value_delimiter = ',',
        value_name = "AUD"
    )]
    pub auth_oidc_audience: Vec<String>,
    /// The claim of an OIDC token that names the caller (the name the ACL's `caller:` matches).
    /// A dotted path (`realm_access.name`) reaches into objects when no claim has the whole name.
    #[arg(
        long,
        env = "AGENT_REACH_AUTH_CLAIM_NAME",
        default_value = "sub",
        value_name = "CLAIM"
    )]
    pub auth_claim_name: String,
    /// The claim of an OIDC token that names the caller's tenant (absent: the `default` tenant).
    #[arg(
        long,
        env = "AGENT_REACH_AUTH_CLAIM_TENANT",
        default_value = "tenant",
        value_name = "CLAIM"
    )]
    pub auth_claim_tenant: String,
    /// The claim of an OIDC token that lists the caller's groups: an array of strings, or one
    /// space-separated string (so `scope` works too).
    #[arg(
        long,
        env = "AGENT_REACH_AUTH_CLAIM_GROUPS",
        default_value = "groups",
        value_name = "CLAIM"
    )]
    pub auth_claim_groups: String,
    /// Seconds of clock skew allowed on an OIDC token's `exp` and `nbf` (0..=600).
    #[arg(
        long,
        env = "AGENT_REACH_AUTH_OIDC_CLOCK_SKEW_S",
        default_value_t = crate::oidc::DEFAULT_CLOCK_SKEW_S,
        value_name = "SECONDS"
    )]
    pub auth_oidc_clock_skew_s: u64,
    /// DEVELOPMENT ONLY: accept every request without a token and skip the ACL.
    #[arg(long, env = "AGENT_REACH_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
}

impl Default for AuthArgs {
    /// No mode chosen; the claim names and the skew at their `--help` defaults.
    fn default() -> Self {
        let claims = ClaimNames::default();
        Self {
            auth_hs256_secret_file: None,
            auth_public_key: None,
            auth_oidc_issuer: Vec::new(),
            auth_oidc_audience: Vec::new(),
            auth_claim_name: claims.name,
            auth_claim_tenant: claims.tenant,
            auth_claim_groups: claims.groups,
            auth_oidc_clock_skew_s: crate::oidc::DEFAULT_CLOCK_SKEW_S,
            insecure_no_auth: false,
        }
    }
}

impl AuthArgs {
    /// The configuration the flags name; every problem in one message.
    pub fn config(&self) -> Result<AuthConfig, String> {
        if self.auth_oidc_issuer.is_empty() && self.auth_oidc_audience.is_empty() {
            return AuthConfig::from_flags(
                self.auth_hs256_secret_file.clone(),
                self.auth_public_key.clone(),
                self.insecure_no_auth,
            );
        }
        let mut problems = Vec::new();
        if self.insecure_no_auth {
            problems.push("--insecure-no-auth turns authentication off: it cannot stand beside --auth-oidc-issuer");
        }
        let beside = match (&self.auth_hs256_secret_file, &self.auth_public_key) {
            (Some(path), None) => Some(KeyFile::Hs256SecretFile(path.clone())),
            (None, Some(path)) => Some(KeyFile::PublicKeyFile(path.clone())),
            (None, None) => None,
            (Some(_), Some(_)) => {
                problems.push("pass only one of --auth-hs256-secret-file, --auth-public-key");
                None
            }
        };
        let mut problems: Vec<String> = problems.into_iter().map(str::to_string).collect();
        let settings = OidcSettings::from_pairs(
            &self.auth_oidc_issuer,
            &self.auth_oidc_audience,
            ClaimNames {
                name: self.auth_claim_name.clone(),
                tenant: self.auth_claim_tenant.clone(),
                groups: self.auth_claim_groups.clone(),
            },
            self.auth_oidc_clock_skew_s,
        )
        .unwrap_or_else(|mut more| {
            problems.append(&mut more);
            OidcSettings::default()
        });
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        Ok(AuthConfig::Oidc(OidcAuth::new(settings, beside)))
    }
}

impl OidcSettings {
    /// Settings from the flags' issuer and audience lists, paired by
    /// position (an issuer named twice gathers both audiences).
    pub fn from_pairs(
        issuers: &[String],
        audiences: &[String],
        claims: ClaimNames,
        clock_skew_s: u64,
    ) -> Result<Self, Vec<String>> {
        let mut problems = Vec::new();
        if issuers.len() != audiences.len() {
            problems.push(format!(
                "each --auth-oidc-issuer needs its --auth-oidc-audience: {} issuers, {} audiences",
                issuers.len(),
                audiences.len()
            ));
        }
        let mut settings = OidcSettings {
            issuers: Vec::new(),
            claims,
            clock_skew_s,
        };
        for (issuer, audience) in issuers.iter().zip(audiences) {
            if let Err(why) = crate::oidc::check_issuer_url(issuer) {
                problems.push(format!("--auth-oidc-issuer {why}"));
            }
            if audience.trim().is_empty() {
                problems.push(format!("--auth-oidc-audience for `{issuer}` is empty"));
            }
            match settings.issuers.iter_mut().find(|known| known.issuer == *issuer) {
                Some(known) => known.audiences.push(audience.clone()),
                None => settings.issuers.push(OidcIssuer {
                    issuer: issuer.clone(),
                    audiences: vec![audience.clone()],
                }),
            }
        }
        for (flag, claim) in [
            ("--auth-claim-name", &settings.claims.name),
            ("--auth-claim-tenant", &settings.claims.tenant),
            ("--auth-claim-groups", &settings.claims.groups),
        ] {
            if claim.trim().is_empty() {
                problems.push(format!("{flag} must name a claim"));
            }
        }
        if settings.clock_skew_s > crate::oidc::MAX_CLOCK_SKEW_S {
            problems.push(format!(
                "--auth-oidc-clock-skew-s {} must be within 0..={}",
                settings.clock_skew_s,
                crate::oidc::MAX_CLOCK_SKEW_S
            ));
        }
        if problems.is_empty() {
            Ok(settings)
        } else {
            Err(problems)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        auth: AuthArgs,
    }

    fn parse(args: &[&str]) -> Result<AuthConfig, String> {
        let mut all = vec!["service"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all)
            .map_err(|error| error.to_string())?
            .auth
            .config()
    }

    #[test]
    fn issuers_pair_with_audiences_and_stand_beside_a_key() {
        let config = parse(&[
            "--auth-oidc-issuer",
            "https://idp.example.com/realms/acme",
            "--auth-oidc-audience",
            "https://router.example.com",
            "--auth-oidc-issuer",
            "https://login.example.org/",
            "--auth-oidc-audience",
            "agent-reach",
            "--auth-oidc-issuer",
            "https://idp.example.com/realms/acme",
            "--auth-oidc-audience",
            "agent-reach",
            "--auth-hs256-secret-file",
            "/etc/secret",
            "--auth-claim-name",
            "client_id",
        ])
        .unwrap();
        let AuthConfig::Oidc(oidc) = &config else {
            panic!("{config:?}")
        };
        assert_eq!(oidc.beside, Some(KeyFile::Hs256SecretFile("/etc/secret".into())));
        assert_eq!(
            oidc.settings.issuers,
            vec![
                OidcIssuer {
                    issuer: "https://idp.example.com/realms/acme".into(),
                    audiences: vec!["https://router.example.com".into(), "agent-reach".into()],
                },
                OidcIssuer {
                    issuer: "https://login.example.org/".into(),
                    audiences: vec!["agent-reach".into()],
                },
            ]
        );
        assert_eq!(oidc.settings.claims.name, "client_id");
        assert_eq!(oidc.settings.claims.tenant, "tenant");
        assert_eq!(oidc.settings.claims.groups, "groups");
        assert_eq!(oidc.settings.clock_skew_s, crate::oidc::DEFAULT_CLOCK_SKEW_S);
        assert_eq!(config.hs256_secret_file(), Some(Path::new("/etc/secret")));
        assert_eq!(config.oidc_issuers().count(), 2);
        // Alone: no key beside it.
        let alone = parse(&["--auth-oidc-issuer", "http://127.0.0.1:9/", "--auth-oidc-audience", "a"]).unwrap();
        assert!(matches!(&alone, AuthConfig::Oidc(OidcAuth { beside: None, .. })));
        assert_eq!(alone.hs256_secret_file(), None);
    }

    #[test]
    fn bad_oidc_flags_are_all_reported() {
        let error = parse(&[
            "--auth-oidc-issuer",
            "http://idp.example.com",
            "--auth-oidc-issuer",
            "not a url",
            "--auth-oidc-audience",
            " ",
            "--insecure-no-auth",
            "--auth-claim-name",
            "",
            "--auth-oidc-clock-skew-s",
            "3600",
        ])
        .unwrap_err();
        for expected in [
            "2 issuers, 1 audiences",
            "https://",
            "--auth-oidc-audience for `http://idp.example.com` is empty",
            "--insecure-no-auth",
            "--auth-claim-name must name a claim",
            "--auth-oidc-clock-skew-s 3600",
        ] {
            assert!(error.contains(expected), "`{expected}` not in: {error}");
        }
        let both = parse(&[
            "--auth-oidc-issuer",
            "https://idp.example.com",
            "--auth-oidc-audience",
            "a",
            "--auth-hs256-secret-file",
            "/a",
            "--auth-public-key",
            "/b",
        ])
        .unwrap_err();
        assert!(both.contains("only one of"), "{both}");
        let none = parse(&[]).unwrap_err();
        assert!(none.contains("--auth-oidc-issuer URL"), "{none}");
    }

    #[test]
    fn the_defaults_are_the_help_defaults() {
        let parsed = Cli::try_parse_from(["service"]).unwrap().auth;
        let default = AuthArgs::default();
        assert_eq!(parsed.auth_claim_name, default.auth_claim_name);
        assert_eq!(parsed.auth_claim_tenant, default.auth_claim_tenant);
        assert_eq!(parsed.auth_claim_groups, default.auth_claim_groups);
        assert_eq!(parsed.auth_oidc_clock_skew_s, default.auth_oidc_clock_skew_s);
    }
}
