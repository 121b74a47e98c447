use tidepool_proto::ErrorCode;

/// Why a far-store operation failed. Every message names the backend and says what to check.
/// Debug prints the message too, so that neither form shows a password.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("bad store URL '{url}': {reason}")]
    BadUrl { url: String, reason: String },

    // The cause is part of these messages (callers often print only the top level), so it is
    // not also exposed as source(), which would print it twice in a chain.
    #[error(
        "cannot reach {backend} at {}: {cause} (is the server running and listening there?)",
        crate::url::redact(.addr)
    )]
    Connect {
        backend: &'static str,
        addr: String,
        cause: std::io::Error,
    },

    #[error("cannot set up TLS: {reason}")]
    TlsSetup { reason: String },

    #[error("TLS with {backend} at {} failed: {reason}", crate::url::redact(.addr))]
    Tls {
        backend: &'static str,
        addr: String,
        reason: String,
    },

    #[error("{backend} connection failed during {op}: {cause}")]
    Io {
        backend: &'static str,
        op: &'static str,
        cause: std::io::Error,
    },

    #[error("{backend} sent something this client cannot understand: {detail}")]
    Protocol {
        backend: &'static str,
        detail: String,
    },

    #[error("memory node refused {op}: {message} ({code})")]
    Node {
        op: &'static str,
        code: ErrorCode,
        message: String,
    },

    #[error("{backend} failed: {message}")]
    Backend {
        backend: &'static str,
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    #[error("value of {len} bytes is larger than {backend} accepts ({max} bytes)")]
    ValueTooLarge {
        backend: &'static str,
        len: usize,
        max: usize,
    },
}

impl StoreError {
    /// The memory node's error code, when the node refused the operation.
    pub fn node_code(&self) -> Option<ErrorCode> {
        match self {
            StoreError::Node { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl std::fmt::Debug for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoreError({self})")
    }
}
