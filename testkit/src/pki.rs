//! A throwaway public-key infrastructure for TLS tests: a CA, server
//! certificates for `127.0.0.1` and `localhost`, client certificates, and a
//! self-signed certificate no CA vouches for and an expired one, all as PEM
//! files in a temp dir.
//!
//! Certificates are ECDSA P-256 (rcgen's default), valid from now for a day.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A certificate and its private key, as PEM files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A test CA and the directory its files live in (removed on drop).
pub struct Pki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate (PEM): what clients trust.
    pub ca_file: PathBuf,
}

/// Panics with what failed: these are tests' fixtures.
fn must<T, E: std::fmt::Display>(result: Result<T, E>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("test PKI: {what}: {error}"),
    }
}

impl Pki {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Self {
        let dir = must(tempfile::tempdir(), "temp dir");
        let mut params = must(CertificateParams::new(Vec::<String>::new()), "CA params");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = must(
            CertifiedIssuer::self_signed(params, must(KeyPair::generate(), "CA key")),
            "CA certificate",
        );
        let ca_file = dir.path().join("ca.pem");
        must(std::fs::write(&ca_file, ca.pem()), "write ca.pem");
        Self { dir, ca, ca_file }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A server certificate for `127.0.0.1` and `localhost`, signed by this CA.
    pub fn server(&self, name: &str) -> CertFiles {
        self.issue(name, ExtendedKeyUsagePurpose::ServerAuth, true)
    }

    /// A client certificate whose common name is `name`, signed by this CA.
    pub fn client(&self, name: &str) -> CertFiles {
        self.issue(name, ExtendedKeyUsagePurpose::ClientAuth, false)
    }

    /// A server certificate for `127.0.0.1` and `localhost` that signs itself:
    /// no CA vouches for it.
    pub fn self_signed(&self, name: &str) -> CertFiles {
        let key = must(KeyPair::generate(), "key");
        let mut params = server_params(name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = must(params.self_signed(&key), "self-signed certificate");
        self.write(name, &cert.pem(), &key.serialize_pem())
    }

    /// A server certificate for `127.0.0.1` and `localhost`, signed by this
    /// CA, that expired at the start of 2021.
    pub fn expired_server(&self, name: &str) -> CertFiles {
        let key = must(KeyPair::generate(), "key");
        let mut params = server_params(name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let cert = must(params.signed_by(&key, &self.ca), "expired certificate");
        self.write(name, &cert.pem(), &key.serialize_pem())
    }

    fn issue(&self, name: &str, usage: ExtendedKeyUsagePurpose, server: bool) -> CertFiles {
        let key = must(KeyPair::generate(), "key");
        let mut params = if server {
            server_params(name)
        } else {
            let mut params = must(CertificateParams::new(Vec::<String>::new()), "params");
            params.distinguished_name.push(DnType::CommonName, name);
            params
        };
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = must(params.signed_by(&key, &self.ca), "certificate");
        self.write(name, &cert.pem(), &key.serialize_pem())
    }

    fn write(&self, name: &str, cert: &str, key: &str) -> CertFiles {
        let files = CertFiles {
            cert: self.dir.path().join(format!("{name}.crt")),
            key: self.dir.path().join(format!("{name}.key")),
        };
        must(std::fs::write(&files.cert, cert), "write certificate");
        must(std::fs::write(&files.key, key), "write key");
        files
    }
}

fn server_params(name: &str) -> CertificateParams {
    let mut params = must(
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]),
        "server params",
    );
    params.distinguished_name.push(DnType::CommonName, name);
    params
}
