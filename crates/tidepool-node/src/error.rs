use std::path::PathBuf;

/// Why the node could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    #[error("cannot listen on {addr} (is another server using that port?)")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot reserve {capacity} bytes of address space for the node (try a smaller --capacity)"
    )]
    Map {
        capacity: u64,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "--capacity {capacity} is too small: each of {sections} sections needs at least 64 KiB"
    )]
    CapacityTooSmall { capacity: u64, sections: usize },
    #[error("cannot read tokens file {path}")]
    TokensRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tokens file {path} is invalid: {reason}")]
    TokensInvalid { path: PathBuf, reason: String },
    #[error("TLS file {path}: {reason}")]
    Tls { path: PathBuf, reason: String },
    #[error("TLS certificate {cert} and key {key} do not go together: {reason}")]
    TlsPair {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("cannot serve metrics on {addr} (is another server using that port?)")]
    Metrics {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("--max-outstanding {given} is too small: at least {min} bytes")]
    MaxOutstandingTooSmall { given: usize, min: usize },
    #[error("cannot start a node thread")]
    Thread(#[source] std::io::Error),
}
