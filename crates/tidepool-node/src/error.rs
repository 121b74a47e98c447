use std::path::PathBuf;

/// Why the node could not start.
#[derive(Debug, thiserror::Error)]
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
    #[error("cannot start a node thread")]
    Thread(#[source] std::io::Error),
}
