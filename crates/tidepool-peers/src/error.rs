//! Why a peer server could not be started (or a workspace library built).

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// Why a peer server could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    #[error("{binary} not found on PATH; install it (apt-get install {package}) or run .ci/run")]
    NotInstalled {
        binary: &'static str,
        package: &'static str,
    },

    #[error("cannot create a temporary directory under {parent} (check that it exists and is writable, or set TMPDIR)")]
    TempDir {
        parent: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("cannot find a free port on 127.0.0.1")]
    NoFreePort {
        #[source]
        source: io::Error,
    },

    #[error("cannot run {binary}")]
    Spawn {
        binary: &'static str,
        #[source]
        source: io::Error,
    },

    #[error("{binary} exited during startup ({status}); the end of its log {log}:\n{tail}")]
    Exited {
        binary: &'static str,
        status: ExitStatus,
        log: PathBuf,
        tail: String,
    },

    #[error("{binary} did not answer on {addr} within {}s; the end of its log {log}:\n{tail}", timeout.as_secs())]
    NotAnswering {
        binary: &'static str,
        addr: String,
        timeout: Duration,
        log: PathBuf,
        tail: String,
    },

    #[error("{binary} lost its port to another process {attempts} times in a row; is something grabbing loopback ports?")]
    PortsTaken {
        binary: &'static str,
        attempts: usize,
    },

    #[error("'redis-cli --cluster create' failed ({status}):\n{output}")]
    ClusterCreate { status: ExitStatus, output: String },

    #[error("Redis Cluster node {addr} did not report cluster_state:ok within {}s; it last said: {last}", timeout.as_secs())]
    ClusterNotReady {
        addr: String,
        timeout: Duration,
        last: String,
    },

    #[error("cannot make test certificates: {0}")]
    Certificates(String),

    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("cannot find this executable's directory, where {file} belongs")]
    NoExeDir {
        file: String,
        #[source]
        source: Option<io::Error>,
    },

    #[error("running cargo to build {file}")]
    Cargo {
        file: String,
        #[source]
        source: io::Error,
    },

    #[error("building {file} failed{}", if stderr.is_empty() { " (see cargo's output above)".to_string() } else { format!(":\n{stderr}") })]
    BuildFailed { file: String, stderr: String },

    #[error("{} missing after the build", path.display())]
    BuiltNothing { path: PathBuf },

    #[error("{} not found; build it with `cargo build --profile {profile} -p {package}`", path.display())]
    LibraryNotFound {
        path: PathBuf,
        package: String,
        /// The profile to build it in: the package's own or `release`.
        profile: String,
    },
}
