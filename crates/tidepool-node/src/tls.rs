//! The node's TLS settings: a certificate chain and its key from PEM files, rustls with the
//! ring provider, TLS 1.2 and 1.3, no client certificates (clients prove who they are with
//! their tenant token, inside the encrypted connection).

use crate::config::TlsFiles;
use crate::NodeError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use std::sync::Arc;

/// What every TLS connection of the node is set up from. Its Debug form names the files only.
#[derive(Clone)]
pub(crate) struct TlsServer {
    pub config: Arc<ServerConfig>,
    files: TlsFiles,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServer")
            .field("cert", &self.files.cert)
            .field("key", &self.files.key)
            .finish()
    }
}

impl TlsServer {
    /// Reads the certificate chain and key; every error names the file at fault.
    pub fn load(files: &TlsFiles) -> Result<TlsServer, NodeError> {
        let bad = |path: &std::path::Path, reason: String| NodeError::Tls {
            path: path.to_path_buf(),
            reason,
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
            .and_then(|it| it.collect())
            .map_err(|e| bad(&files.cert, e.to_string()))?;
        if chain.is_empty() {
            return Err(bad(
                &files.cert,
                "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
            ));
        }
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
            bad(
                &files.key,
                format!("holds no usable private key (PKCS#8, PKCS#1 or SEC1 PEM): {e}"),
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&files.cert, e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| NodeError::TlsPair {
                cert: files.cert.clone(),
                key: files.key.clone(),
                reason: e.to_string(),
            })?;
        Ok(TlsServer {
            config: Arc::new(config),
            files: files.clone(),
        })
    }
}
