//! Test certificates (rcgen, ring): a CA, a server certificate for
//! 127.0.0.1 and localhost, and a client certificate, written as PEM files
//! to a temp dir, so TLS tests run against real servers with verification on.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// PEM files of one test PKI. Removed on drop.
pub struct TestCerts {
    dir: tempfile::TempDir,
}

impl TestCerts {
    /// A fresh CA and the certificates it signs.
    pub fn generate() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("agent-reach-certs-")
            .tempdir()
            .unwrap_or_else(|error| panic!("cannot create a temp dir for certificates: {error}"));
        let fail = |error: rcgen::Error| -> ! { panic!("cannot generate test certificates: {error}") };
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|error| fail(error));
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "agent-reach test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().unwrap_or_else(|error| fail(error));
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key).unwrap_or_else(|error| fail(error));

        let leaf = |name: &str, purpose: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .unwrap_or_else(|error| fail(error));
            params.distinguished_name.push(DnType::CommonName, name);
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
            params.extended_key_usages = vec![purpose];
            let key = KeyPair::generate().unwrap_or_else(|error| fail(error));
            let cert = params.signed_by(&key, &ca).unwrap_or_else(|error| fail(error));
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf("agent-reach test server", ExtendedKeyUsagePurpose::ServerAuth);
        let (client_cert, client_key) = leaf("agent-reach test client", ExtendedKeyUsagePurpose::ClientAuth);
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text)
                .unwrap_or_else(|error| panic!("cannot write the test certificate {name}: {error}"));
        };
        write("ca.pem", &ca.pem());
        write("server.pem", &server_cert);
        write("server-key.pem", &server_key);
        write("client.pem", &client_cert);
        write("client-key.pem", &client_key);
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA certificate (PEM) that signed the others.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    pub fn server_cert(&self) -> PathBuf {
        self.path("server.pem")
    }

    pub fn server_key(&self) -> PathBuf {
        self.path("server-key.pem")
    }

    pub fn client_cert(&self) -> PathBuf {
        self.path("client.pem")
    }

    pub fn client_key(&self) -> PathBuf {
        self.path("client-key.pem")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
