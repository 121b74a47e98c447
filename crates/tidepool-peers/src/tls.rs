//! Certificates for TLS tests, made at run time: a CA of its own and a server certificate it
//! signed for `localhost` and `127.0.0.1`, written as PEM files into a temporary directory that
//! goes when the value is dropped. Nothing here is fit to protect anything real.

use crate::{PeerError, TempDir};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use std::fmt;
use std::path::{Path, PathBuf};

/// A test CA and a server certificate signed by it, as files.
pub struct TestCerts {
    dir: TempDir,
}

impl fmt::Debug for TestCerts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestCerts")
            .field("dir", &self.dir.path)
            .finish()
    }
}

fn cert_error(e: rcgen::Error) -> PeerError {
    PeerError::Certificates(e.to_string())
}

impl TestCerts {
    /// A new CA and server certificate (ECDSA P-256), valid for `localhost` and `127.0.0.1`.
    pub fn generate() -> Result<TestCerts, PeerError> {
        let dir = TempDir::new("certs")?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(cert_error)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "tidepool test CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().map_err(cert_error)?;
        let ca = ca_params.self_signed(&ca_key).map_err(cert_error)?;

        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .map_err(cert_error)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "tidepool test server");
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().map_err(cert_error)?;
        let cert = params.signed_by(&key, &ca, &ca_key).map_err(cert_error)?;

        let certs = TestCerts { dir };
        for (path, pem) in [
            (certs.ca(), ca.pem()),
            (certs.cert(), cert.pem()),
            (certs.key(), key.serialize_pem()),
        ] {
            std::fs::write(&path, pem).map_err(|source| PeerError::Write { path, source })?;
        }
        Ok(certs)
    }

    pub fn dir(&self) -> &Path {
        &self.dir.path
    }

    /// The CA's certificate (`ca.pem`): what clients trust.
    pub fn ca(&self) -> PathBuf {
        self.dir.path.join("ca.pem")
    }

    /// The server's certificate (`server.pem`), signed by the CA.
    pub fn cert(&self) -> PathBuf {
        self.dir.path.join("server.pem")
    }

    /// The server certificate's private key (`server.key`, PKCS#8).
    pub fn key(&self) -> PathBuf {
        self.dir.path.join("server.key")
    }
}
