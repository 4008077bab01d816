//! TLS for every link (rustls with ring; verification always on).
//!
//! Servers: [`ServerTls`] loads a certificate chain and key from PEM files
//! (and, for mutual TLS, a CA whose client certificates it requires), offers
//! `h2` and `http/1.1` by ALPN, and reloads the files when their contents
//! change ([`ServerTls::watch`]), as Kubernetes rotates a mounted Secret: new
//! connections get the new certificate, open ones keep theirs. A file that
//! stops parsing is logged and the last good configuration kept, so a
//! half-written rotation never takes a listener down.
//!
//! Clients: [`client_config`] trusts the system's roots, or only the PEM CA
//! file given (e.g. `--agent-ca-file`), and may present a client certificate.
//! There is no switch to skip verification: a self-signed agent is reached
//! by putting its certificate (or its CA) in the CA file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// How often [`ServerTls::watch`] rereads the files (Kubernetes updates a
/// mounted Secret within about a minute; a reread of two small files is cheap).
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// A TLS problem a person can act on: which file, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

/// The files a TLS listener is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, every client must present a certificate this CA signed (mTLS).
    pub client_ca: Option<PathBuf>,
}

/// A listener's TLS configuration, shared by every worker thread and swapped
/// whole when its files change.
#[derive(Clone)]
pub struct ServerTls {
    live: Arc<Live>,
}

/// The files and the configuration made from them.
struct Live {
    files: ServerFiles,
    current: ArcSwap<ServerConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.live.files)
            .finish_non_exhaustive()
    }
}

impl agent_reach_reload::Follow for Live {
    type Value = ServerConfig;

    fn parse(&self, contents: &[Vec<u8>]) -> Result<ServerConfig, String> {
        server_config(&self.files, contents).map_err(|error| error.to_string())
    }

    fn apply(&self, config: ServerConfig) -> bool {
        self.current.store(Arc::new(config));
        true
    }
}

impl ServerTls {
    /// Loads the files now: a service refuses to start on a listener it cannot serve.
    pub fn load(files: ServerFiles) -> Result<Self, TlsError> {
        let contents = read_all(&files)?;
        let config = server_config(&files, &contents)?;
        Ok(Self {
            live: Arc::new(Live {
                files,
                current: ArcSwap::from_pointee(config),
            }),
        })
    }

    /// The acceptor for the next connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.live.current.load_full())
    }

    pub fn files(&self) -> &ServerFiles {
        &self.live.files
    }

    /// Rereads the files every `every` while any clone is alive: a change
    /// that makes a usable certificate applies to new connections, one that
    /// does not is logged and the previous configuration kept
    /// ([`agent_reach_reload`]).
    pub fn watch(&self, every: Duration) {
        let files = &self.live.files;
        let mut paths = vec![files.cert.clone(), files.key.clone()];
        paths.extend(files.client_ca.clone());
        let reload = agent_reach_reload::Reload {
            what: "TLS certificate",
            paths,
            every,
        };
        // What the configuration was made from (a change since is seen at the first look).
        let seen = reload.read().map(agent_reach_reload::Seen::applied).unwrap_or_default();
        reload.spawn(Arc::downgrade(&self.live), seen);
    }
}

fn read_all(files: &ServerFiles) -> Result<Vec<Vec<u8>>, TlsError> {
    let mut paths = vec![&files.cert, &files.key];
    paths.extend(files.client_ca.as_ref());
    paths.into_iter().map(|path| read(path)).collect()
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError(format!("cannot read `{}`: {error}", path.display())))
}

fn server_config(files: &ServerFiles, contents: &[Vec<u8>]) -> Result<ServerConfig, TlsError> {
    let chain = certificates(&files.cert, &contents[0])?;
    let key = private_key(&files.key, &contents[1])?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError(format!("TLS protocol versions: {error}")))?;
    let builder = match (&files.client_ca, contents.get(2)) {
        (Some(path), Some(pem)) => {
            let roots = Arc::new(roots_from(path, pem)?);
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|error| TlsError(format!("client CA `{}`: {error}", path.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|error| {
        TlsError(format!(
            "`{}` and `{}` do not make a usable certificate: {error}",
            files.cert.display(),
            files.key.display()
        ))
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The files a TLS client is made from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientFiles {
    /// Trust only these CAs (PEM, one or more); `None`: the system's roots.
    pub ca: Option<PathBuf>,
    /// A client certificate chain and its key, for servers that require mTLS.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// A client configuration for `files` offering `alpn` (e.g. `http/1.1`).
pub fn client_config(files: &ClientFiles, alpn: &[&[u8]]) -> Result<ClientConfig, TlsError> {
    let roots = match &files.ca {
        Some(path) => roots_from(path, &read(path)?)?,
        None => system_roots()?,
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError(format!("TLS protocol versions: {error}")))?
        .with_root_certificates(roots);
    let mut config = match &files.identity {
        Some((cert, key)) => {
            let chain = certificates(cert, &read(cert)?)?;
            let private = private_key(key, &read(key)?)?;
            builder.with_client_auth_cert(chain, private).map_err(|error| {
                TlsError(format!(
                    "`{}` and `{}` do not make a usable client certificate: {error}",
                    cert.display(),
                    key.display()
                ))
            })?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
    Ok(config)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsError(format!("`{}` is not a PEM certificate file: {error}", path.display())))?;
    if chain.is_empty() {
        return Err(TlsError(format!("`{}` holds no PEM certificate", path.display())));
    }
    Ok(chain)
}

fn private_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|error| {
        TlsError(format!(
            "`{}` holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {error}",
            path.display()
        ))
    })
}

fn roots_from(path: &Path, pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates(path, pem)? {
        roots.add(certificate).map_err(|error| {
            TlsError(format!(
                "`{}` holds an unusable CA certificate: {error}",
                path.display()
            ))
        })?;
    }
    Ok(roots)
}

fn system_roots() -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(TlsError(format!(
            "no system CA certificates found ({} error(s) reading them); give a CA file",
            found.errors.len()
        )));
    }
    Ok(roots)
}

/// A service listener's TLS flags (every service takes the same three).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ListenerArgs {
    /// Serve TLS with this certificate chain (PEM); needs --tls-key-file. Reread every
    /// 10 s: a rotated certificate is served to new connections without a restart.
    #[arg(long, env = "AGENT_REACH_TLS_CERT_FILE", value_name = "PATH")]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key of --tls-cert-file (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "AGENT_REACH_TLS_KEY_FILE", value_name = "PATH")]
    pub tls_key_file: Option<PathBuf>,
    /// Require every client to present a certificate signed by this CA (mutual TLS).
    #[arg(long, env = "AGENT_REACH_TLS_CLIENT_CA_FILE", value_name = "PATH")]
    pub tls_client_ca_file: Option<PathBuf>,
}

impl ListenerArgs {
    /// The listener's files, `None` for plain TCP; a half-given pair is a problem.
    pub fn files(&self, problems: &mut Vec<String>) -> Option<ServerFiles> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Some(ServerFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca_file.clone(),
            }),
            (None, None) => {
                if self.tls_client_ca_file.is_some() {
                    problems.push("--tls-client-ca-file needs --tls-cert-file and --tls-key-file".to_string());
                }
                None
            }
            _ => {
                problems.push("--tls-cert-file and --tls-key-file go together".to_string());
                None
            }
        }
    }
}

/// Loads a listener's TLS (a service's start-up check) and starts its reload
/// watcher on the current runtime; `None` for plain TCP.
pub fn listener(files: Option<&ServerFiles>) -> Result<Option<ServerTls>, TlsError> {
    let Some(files) = files else {
        return Ok(None);
    };
    let tls = ServerTls::load(files.clone())?;
    tls.watch(RELOAD_EVERY);
    Ok(Some(tls))
}

/// gRPC's TLS for `files` (tonic's own rustls configuration, same roots and identity).
pub fn grpc_client(files: &ClientFiles) -> Result<tonic::transport::ClientTlsConfig, TlsError> {
    let mut config = tonic::transport::ClientTlsConfig::new();
    config = match &files.ca {
        Some(path) => {
            let pem = read(path)?;
            certificates(path, &pem)?;
            config.ca_certificate(tonic::transport::Certificate::from_pem(pem))
        }
        None => config.with_native_roots(),
    };
    if let Some((cert, key)) = &files.identity {
        let (cert_pem, key_pem) = (read(cert)?, read(key)?);
        certificates(cert, &cert_pem)?;
        private_key(key, &key_pem)?;
        config = config.identity(tonic::transport::Identity::from_pem(cert_pem, key_pem));
    }
    Ok(config)
}

/// The gRPC endpoint for `url`: TLS by `files` when it is `https://`.
pub fn grpc_endpoint(url: &str, files: &ClientFiles) -> Result<tonic::transport::Endpoint, TlsError> {
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_string())
        .map_err(|error| TlsError(format!("`{url}` is not a usable URL: {error}")))?;
    if url.starts_with("https://") {
        return endpoint
            .tls_config(grpc_client(files)?)
            .map_err(|error| TlsError(format!("TLS for `{url}`: {error}")));
    }
    Ok(endpoint)
}
