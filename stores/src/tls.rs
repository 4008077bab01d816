//! TLS material for the store links, read and checked once at start-up: a CA
//! bundle replacing the system's roots (`--redis-ca-file`, `--etcd-ca-file`)
//! and an optional client certificate and key (mTLS; Redis' `tls-auth-clients`
//! defaults to requiring one). Verification is always on: there is no flag
//! that accepts an unverified server.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// PEM files, as given on the command line, with their contents.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificates trusted instead of the system's roots (PEM).
    pub ca: Option<(PathBuf, Vec<u8>)>,
    /// Client certificate chain and private key (PEM), presented when the server asks.
    pub client: Option<ClientIdentity>,
}

#[derive(Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    pub cert_path: PathBuf,
    pub cert: Vec<u8>,
    pub key_path: PathBuf,
    /// Never printed.
    pub key: Vec<u8>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca.as_ref().map(|(path, _)| path))
            .field(
                "client",
                &self.client.as_ref().map(|client| (&client.cert_path, &client.key_path)),
            )
            .finish()
    }
}

impl TlsFiles {
    /// Reads the files named by the flags; each problem (unreadable, not PEM,
    /// a certificate without its key) is added to `problems`, named by `flag`
    /// prefix (`--redis` or `--etcd`).
    pub fn read(
        flag: &str,
        ca: Option<&Path>,
        client_cert: Option<&Path>,
        client_key: Option<&Path>,
        problems: &mut Vec<String>,
    ) -> Self {
        let mut files = Self::default();
        let read = |path: &Path, what: &str, problems: &mut Vec<String>| match std::fs::read(path) {
            Ok(bytes) => Some(bytes),
            Err(error) => {
                problems.push(format!("cannot read the {what} {}: {error}", path.display()));
                None
            }
        };
        if let Some(path) = ca {
            if let Some(bytes) = read(path, &format!("{flag}-ca-file"), problems) {
                match CertificateDer::pem_slice_iter(&bytes).collect::<Result<Vec<_>, _>>() {
                    Ok(certs) if !certs.is_empty() => files.ca = Some((path.to_path_buf(), bytes)),
                    Ok(_) => problems.push(format!("{flag}-ca-file {} holds no PEM certificate", path.display())),
                    Err(error) => problems.push(format!(
                        "{flag}-ca-file {} is not a PEM certificate bundle: {error}",
                        path.display()
                    )),
                }
            }
        }
        match (client_cert, client_key) {
            (Some(cert_path), Some(key_path)) => {
                let cert = read(cert_path, &format!("{flag}-client-cert"), problems);
                let key = read(key_path, &format!("{flag}-client-key"), problems);
                if let (Some(cert), Some(key)) = (cert, key) {
                    let chain_ok = CertificateDer::pem_slice_iter(&cert)
                        .collect::<Result<Vec<_>, _>>()
                        .is_ok_and(|chain| !chain.is_empty());
                    if !chain_ok {
                        problems.push(format!(
                            "{flag}-client-cert {} holds no PEM certificate",
                            cert_path.display()
                        ));
                    }
                    if PrivateKeyDer::from_pem_slice(&key).is_err() {
                        problems.push(format!(
                            "{flag}-client-key {} holds no PEM private key",
                            key_path.display()
                        ));
                    }
                    files.client = Some(ClientIdentity {
                        cert_path: cert_path.to_path_buf(),
                        cert,
                        key_path: key_path.to_path_buf(),
                        key,
                    });
                }
            }
            (None, None) => {}
            _ => problems.push(format!(
                "{flag}-client-cert and {flag}-client-key go together (a client certificate and its key)"
            )),
        }
        files
    }

    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client.is_none()
    }

    /// A rustls client configuration: the CA bundle (or the system's roots)
    /// and the client identity when there is one.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca {
            Some((path, pem)) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|error| format!("CA bundle {}: {error}", path.display()))?;
                    roots
                        .add(cert)
                        .map_err(|error| format!("CA bundle {}: {error}", path.display()))?;
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                for error in &native.errors {
                    tracing::warn!(message = "Some system CA certificates could not be loaded.", %error);
                }
                let (added, _ignored) = roots.add_parsable_certificates(native.certs);
                if added == 0 {
                    return Err(
                        "no system CA certificates found: install ca-certificates or pass a CA bundle".to_string(),
                    );
                }
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|error| error.to_string())?
            .with_root_certificates(roots);
        let config = match &self.client {
            Some(client) => {
                let chain = CertificateDer::pem_slice_iter(&client.cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|error| format!("client certificate {}: {error}", client.cert_path.display()))?;
                let key = PrivateKeyDer::from_pem_slice(&client.key)
                    .map_err(|error| format!("client key {}: {error}", client.key_path.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|error| format!("client certificate {}: {error}", client.cert_path.display()))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Arc::new(config))
    }

    /// The same material for the `redis` crate (it builds its own rustls
    /// configuration, with the system's roots when no CA is given).
    pub fn redis_certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self.client.as_ref().map(|client| redis::ClientTlsConfig {
                client_cert: client.cert.clone(),
                client_key: client.key.clone(),
            }),
            root_cert: self.ca.as_ref().map(|(_, pem)| pem.clone()),
        }
    }
}

/// An error with every cause it wraps, `outer: inner: innermost`, so a
/// certificate failure deep in a transport error is named in the log line
/// ("invalid peer certificate: UnknownIssuer").
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_are_reported_each_by_its_flag() {
        let dir = tempfile::tempdir().unwrap();
        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let mut problems = Vec::new();
        let files = TlsFiles::read(
            "--redis",
            Some(&not_pem),
            Some(&dir.path().join("missing.pem")),
            None,
            &mut problems,
        );
        assert!(files.is_empty());
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("--redis-ca-file") && problems[0].contains("no PEM certificate"));
        assert!(problems[1].contains("--redis-client-cert and --redis-client-key go together"));
    }
}
