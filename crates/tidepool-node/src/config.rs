//! Node configuration: sizes, the tokens file, TLS files. Debug forms never show a token.

use crate::NodeError;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;

pub use tidepool_sys::size::{format_size, parse_size};

/// One tenant as the tokens file declares it. Its Debug form leaves the token out.
#[derive(Clone, PartialEq, Eq)]
pub struct TenantSpec {
    pub token: String,
    /// Bytes the tenant may hold; `None`: up to the node's capacity.
    pub quota: Option<u64>,
}

impl std::fmt::Debug for TenantSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantSpec")
            .field("token", &"***")
            .field("quota", &self.quota)
            .finish()
    }
}

/// The node's certificate chain and private key, PEM files (`--tls-cert`, `--tls-key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

/// The tokens file: which tenants may connect, with what token and quota.
///
/// ```toml
/// [[tenant]]
/// name = "web"
/// token = "s3cret"
/// quota = "2GiB"   # optional
/// ```
#[derive(Debug, Clone, Default)]
pub struct TokensFile {
    pub tenants: HashMap<String, TenantSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    tenant: Vec<RawTenant>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    name: String,
    token: String,
    quota: Option<String>,
}

impl TokensFile {
    pub fn load(path: &Path) -> Result<TokensFile, NodeError> {
        let text = std::fs::read_to_string(path).map_err(|source| NodeError::TokensRead {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|reason| NodeError::TokensInvalid {
            path: path.to_path_buf(),
            reason,
        })
    }

    pub fn parse(text: &str) -> Result<TokensFile, String> {
        let raw: RawFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut tenants = HashMap::new();
        for t in raw.tenant {
            if t.name.is_empty() || t.token.is_empty() {
                return Err("every tenant needs a non-empty name and token".into());
            }
            let quota = t.quota.as_deref().map(parse_size).transpose()?;
            if tenants
                .insert(
                    t.name.clone(),
                    TenantSpec {
                        token: t.token,
                        quota,
                    },
                )
                .is_some()
            {
                return Err(format!("tenant '{}' is declared twice", t.name));
            }
        }
        if tenants.is_empty() {
            return Err("no [[tenant]] entries; declare at least one".into());
        }
        Ok(TokensFile { tenants })
    }
}

/// Everything `tidepool node` needs to start: [`NodeConfig::new`] with an address and a
/// capacity, then the setters below for what differs from the defaults each one names.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Address to listen on (port 0 picks a free port).
    pub(crate) listen: String,
    /// Memory to serve, in bytes.
    pub(crate) capacity: u64,
    /// Memory sections, each with its own allocator thread.
    pub(crate) sections: usize,
    /// Event-loop threads serving connections.
    pub(crate) io_threads: usize,
    /// How long an I/O worker keeps polling after its last work before sleeping. Wake-ups cost
    /// tens of microseconds on VMs; a short spin saves some when the node has CPUs of its own,
    /// and steals from its neighbours when it does not (measured: three spinning nodes on one
    /// vCPU lost 60% of their throughput). Zero, the default: always sleep.
    pub(crate) busy_poll: std::time::Duration,
    /// `None`: open mode, any tenant name and token accepted (for a trusted host).
    pub(crate) tokens: Option<TokensFile>,
    /// Most simultaneous client connections.
    pub(crate) max_connections: usize,
    /// Largest frame body accepted, and so the largest object.
    pub(crate) max_body: u32,
    /// Answers a connection may have waiting for its client to read them before the node stops
    /// reading its requests (one answer may take it past this once).
    pub(crate) max_outstanding: usize,
    /// `Some`: accept only TLS connections, with this certificate and key.
    pub(crate) tls: Option<TlsFiles>,
    /// `Some`: serve Prometheus metrics at `http://ADDR/metrics`.
    pub(crate) metrics: Option<std::net::SocketAddr>,
}

/// The default of [`NodeConfig::max_outstanding`].
pub const DEFAULT_MAX_OUTSTANDING: usize = 4 << 20;
/// The least [`NodeConfig::max_outstanding`] accepted: room for a few answers, so a client
/// that pipelines a handful of requests before reading is never stalled by its own answers.
pub const MIN_MAX_OUTSTANDING: usize = 64 << 10;

impl NodeConfig {
    /// A node listening at `listen` (`host:port`; port 0 picks a free port) and serving
    /// `capacity` bytes of memory (rounded down to whole pages in every section).
    pub fn new(listen: impl Into<String>, capacity: u64) -> NodeConfig {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        NodeConfig {
            listen: listen.into(),
            capacity,
            sections: cpus.clamp(1, 16),
            // Half the CPUs: the other half serve the allocators and the kernel's network stack.
            io_threads: (cpus / 2).clamp(1, 16),
            busy_poll: std::time::Duration::ZERO,
            tokens: None,
            max_connections: 4096,
            max_body: 16 << 20,
            max_outstanding: DEFAULT_MAX_OUTSTANDING,
            tls: None,
            metrics: None,
        }
    }

    /// Memory sections, each with its own allocator thread (zero counts as one).
    /// Default: one per CPU this process may run on, at most 16.
    pub fn sections(mut self, value: usize) -> NodeConfig {
        self.sections = value;
        self
    }

    /// Event-loop threads serving connections (zero counts as one).
    /// Default: half the CPUs this process may run on, at least 1 and at most 16.
    pub fn io_threads(mut self, value: usize) -> NodeConfig {
        self.io_threads = value;
        self
    }

    /// How long an I/O worker keeps polling after its last work before sleeping. Wake-ups cost
    /// tens of microseconds on VMs; a short spin saves some when the node has CPUs of its own,
    /// and steals from its neighbours when it does not (measured: three spinning nodes on one
    /// vCPU lost 60% of their throughput).
    /// Default: zero, always sleep.
    pub fn busy_poll(mut self, value: std::time::Duration) -> NodeConfig {
        self.busy_poll = value;
        self
    }

    /// The tenants that may connect, with their tokens and quotas.
    /// Default: none, open mode: any tenant name and token accepted (for a trusted host).
    pub fn tokens(mut self, value: TokensFile) -> NodeConfig {
        self.tokens = Some(value);
        self
    }

    /// Most simultaneous client connections.
    /// Default: 4096.
    pub fn max_connections(mut self, value: usize) -> NodeConfig {
        self.max_connections = value;
        self
    }

    /// Largest frame body accepted, and so the largest object, in bytes.
    /// Default: 16 MiB.
    pub fn max_body(mut self, value: u32) -> NodeConfig {
        self.max_body = value;
        self
    }

    /// Answers a connection may have waiting for its client to read them, in bytes, before the
    /// node stops reading its requests (one answer may take it past this once); at least
    /// [`MIN_MAX_OUTSTANDING`], or [`Server::start`](crate::Server::start) refuses it.
    /// Default: [`DEFAULT_MAX_OUTSTANDING`].
    pub fn max_outstanding(mut self, value: usize) -> NodeConfig {
        self.max_outstanding = value;
        self
    }

    /// Accept only TLS connections, with this certificate and key.
    /// Default: plain TCP.
    pub fn tls(mut self, value: TlsFiles) -> NodeConfig {
        self.tls = Some(value);
        self
    }

    /// Serve Prometheus metrics at `http://ADDR/metrics` (port 0 picks a free port).
    /// Default: no metrics served.
    pub fn metrics(mut self, value: std::net::SocketAddr) -> NodeConfig {
        self.metrics = Some(value);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_file() {
        let f = TokensFile::parse(
            "[[tenant]]\nname = \"web\"\ntoken = \"a\"\nquota = \"1M\"\n\
             [[tenant]]\nname = \"batch\"\ntoken = \"b\"\n",
        )
        .unwrap();
        assert_eq!(f.tenants["web"].quota, Some(1 << 20));
        assert_eq!(f.tenants["batch"].quota, None);
        assert!(TokensFile::parse("").unwrap_err().contains("at least one"));
        assert!(TokensFile::parse(
            "[[tenant]]\nname=\"x\"\ntoken=\"a\"\n[[tenant]]\nname=\"x\"\ntoken=\"b\"\n"
        )
        .unwrap_err()
        .contains("twice"));
        assert!(TokensFile::parse("[[tenant]]\nname=\"x\"\ntoken=\"a\"\ncolour=1\n").is_err());
    }

    #[test]
    fn debug_forms_never_show_a_token() {
        let cfg = NodeConfig::new("127.0.0.1:0", 1 << 20)
            .tokens(
                TokensFile::parse("[[tenant]]\nname = \"web\"\ntoken = \"s3cret-token\"\n")
                    .unwrap(),
            )
            .tls(TlsFiles {
                cert: "/etc/tp/node.pem".into(),
                key: "/etc/tp/node.key".into(),
            });
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("s3cret-token"), "{shown}");
        assert!(
            shown.contains("web") && shown.contains("node.key"),
            "{shown}"
        );
    }
}
