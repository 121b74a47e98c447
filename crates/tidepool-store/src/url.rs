//! Store URLs. Parsed by hand: `redis+cluster://h1:p1,h2:p2` is not a URL the `url` crate
//! accepts, and the grammar is small.

use crate::tls::TlsOptions;
use crate::{Compression, StoreError};
// The tests (`use super::*`) build TLS options from paths.
#[cfg(test)]
use std::path::PathBuf;

mod parse;

/// How a store over several memory nodes keeps each value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Redundancy {
    /// Whole copies on this many nodes (1: no redundancy, the nodes share the data).
    Replicas(usize),
    /// Reed-Solomon: the value cut into `data` pieces, plus `parity` pieces computed from them,
    /// each on its own node; any `data` of them give the value back.
    Erasure { data: usize, parity: usize },
}

/// The most pieces one value is kept in (copies, or data and parity pieces).
pub const MAX_PIECES: usize = 16;

impl Redundancy {
    /// Pieces stored per value, each on a different node.
    pub fn pieces(self) -> usize {
        match self {
            Redundancy::Replicas(r) => r,
            Redundancy::Erasure { data, parity } => data + parity,
        }
    }

    /// Pieces a read needs.
    pub fn needed(self) -> usize {
        match self {
            Redundancy::Replicas(_) => 1,
            Redundancy::Erasure { data, .. } => data,
        }
    }

    /// Nodes that can be lost without losing data.
    pub fn tolerates(self) -> usize {
        self.pieces() - self.needed()
    }

    /// `K+M` as written in `ec=K+M`.
    fn parse_ec(v: &str) -> Result<Redundancy, String> {
        let parsed = v.split_once('+').and_then(|(k, m)| {
            Some((
                k.trim().parse::<usize>().ok()?,
                m.trim().parse::<usize>().ok()?,
            ))
        });
        match parsed {
            Some((k, m)) if k >= 2 && m >= 1 && k + m <= MAX_PIECES => {
                Ok(Redundancy::Erasure { data: k, parity: m })
            }
            Some((1, _)) => Err(format!(
                "ec={v}: one data piece is a copy; write replicas=R instead"
            )),
            _ => Err(format!(
                "ec={v}: write ec=K+M with K >= 2 data pieces, M >= 1 parity pieces and \
                 K+M <= {MAX_PIECES} (for example ec=4+2)"
            )),
        }
    }
}

impl std::fmt::Display for Redundancy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Redundancy::Replicas(r) => write!(f, "replicas={r}"),
            Redundancy::Erasure { data, parity } => write!(f, "ec={data}+{parity}"),
        }
    }
}

/// A parsed store URL. Its Debug form hides tokens and passwords.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// `local:[?compress=lz4|zstd|none]`: in this process, compressed (by default
    /// [`Compression::DEFAULT`]) or, with `none`, whole.
    Local { compression: Compression },
    /// `node://[tenant[:token]@]host:port[?tls=1[&ca=FILE]][&poll_us=N][&timeout_ms=N]`
    Node {
        addr: String,
        tenant: String,
        token: String,
        tls: Option<TlsOptions>,
        /// Microseconds a request polls for its answer before sleeping (`None`: the default).
        poll_us: Option<u64>,
        /// Milliseconds the node may take to answer before requests fail (`None`: the default).
        timeout_ms: Option<u64>,
    },
    /// `node://[tenant[:token]@]host1:port,host2:port,...[?replicas=R|?ec=K+M]`: several
    /// memory nodes as one store, each key kept as `redundancy` says. `nodes` are `Node`s, one
    /// per host, with the URL's tenant, token and options.
    Nodes {
        nodes: Vec<StoreUrl>,
        redundancy: Redundancy,
    },
    /// `redis://` or, with `tls`, `rediss://[:password@]host:port[/DB][?ca=FILE]`
    Redis {
        addr: String,
        prefix: Option<String>,
        tls: Option<TlsOptions>,
    },
    /// `redis+cluster://h1:p1,...[?wait=N&failover_ms=MS]` or, with `tls`, `rediss+cluster://`
    RedisCluster {
        nodes: Vec<String>,
        prefix: Option<String>,
        tls: Option<TlsOptions>,
        /// Replicas each write must reach (Redis `WAIT`) before it is acknowledged.
        wait: Option<u32>,
        /// How long a call keeps retrying while the cluster fails over (`None`: the default).
        failover_ms: Option<u64>,
    },
    Memcached {
        addr: String,
        prefix: Option<String>,
    },
}

const FORMS: &str =
    "expected one of local:[?compress=lz4|zstd|none], node://[tenant[:token]@]host:port[?tls=1], \
                     redis://[:password@]host:port[/DB], rediss://... (TLS), \
                     redis+cluster://h1:p1,h2:p2,..., rediss+cluster://..., memcached://host:port";

impl StoreUrl {
    /// Parses a store URL of one of the [`FORMS`]; the error says what is wrong with it.
    pub fn parse(url: &str) -> Result<StoreUrl, StoreError> {
        parse::Parser::new(url)?.parse()
    }
}

/// A store URL, or the `[user[:password]@]host:port[,...]` part of one, fit to print: every
/// password and token becomes `***` (the `:password` of each userinfo, and the values of
/// `token`, `password` and `auth` query parameters). Every message and description of a store
/// goes through this.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let hosts: Vec<String> = authority
        .split(',')
        .map(|h| match h.rsplit_once('@') {
            Some((user, host)) => match user.split_once(':') {
                Some((name, _)) => format!("{name}:***@{host}"),
                None => h.to_string(),
            },
            None => h.to_string(),
        })
        .collect();
    let mut out = format!("{scheme}{}{path}", hosts.join(","));
    if let Some(q) = query {
        let pairs: Vec<String> = q
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if matches!(k, "token" | "password" | "auth") => format!("{k}=***"),
                _ => p.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Local { compression } => f
                .debug_struct("Local")
                .field("compression", compression)
                .finish(),
            StoreUrl::Node {
                addr,
                tenant,
                token,
                tls,
                poll_us,
                timeout_ms,
            } => f
                .debug_struct("Node")
                .field("poll_us", poll_us)
                .field("timeout_ms", timeout_ms)
                .field("addr", addr)
                .field("tenant", tenant)
                .field("token", &if token.is_empty() { "" } else { "***" })
                .field("tls", tls)
                .finish(),
            StoreUrl::Nodes { nodes, redundancy } => f
                .debug_struct("Nodes")
                .field("nodes", nodes)
                .field("redundancy", redundancy)
                .finish(),
            StoreUrl::Redis { addr, prefix, tls } => f
                .debug_struct("Redis")
                .field("addr", &redact(addr))
                .field("prefix", prefix)
                .field("tls", tls)
                .finish(),
            StoreUrl::RedisCluster {
                nodes,
                prefix,
                tls,
                wait,
                failover_ms,
            } => f
                .debug_struct("RedisCluster")
                .field(
                    "nodes",
                    &nodes.iter().map(|n| redact(n)).collect::<Vec<_>>(),
                )
                .field("prefix", prefix)
                .field("tls", tls)
                .field("wait", wait)
                .field("failover_ms", failover_ms)
                .finish(),
            StoreUrl::Memcached { addr, prefix } => f
                .debug_struct("Memcached")
                .field("addr", &redact(addr))
                .field("prefix", prefix)
                .finish(),
        }
    }
}

/// A URL of a scheme that names one server, given several.
fn one_host(addr: &str, scheme: &str, hint: &str) -> Result<(), String> {
    if addr.contains(',') {
        return Err(format!(
            "a {scheme} URL names one server, not several{hint}"
        ));
    }
    Ok(())
}

pub(crate) fn check_addr(addr: &str) -> Result<(), String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("'{addr}' has no port; write host:port"))?;
    if host.is_empty() {
        return Err(format!("'{addr}' has no host"));
    }
    port.parse::<u16>()
        .map_err(|_| format!("'{port}' in '{addr}' is not a port number"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_and_tokens_never_print() {
        for (url, want) in [
            (
                "node://web:s3cret@127.0.0.1:7070",
                "node://web:***@127.0.0.1:7070",
            ),
            ("node://web@h:1?token=s3cret", "node://web@h:1?token=***"),
            ("redis://:s3cret@h:6379/2", "redis://:***@h:6379/2"),
            (
                "redis+cluster://u:s3cret@a:1,:s3cret@b:2",
                "redis+cluster://u:***@a:1,:***@b:2",
            ),
            ("u:s3cret@h:1", "u:***@h:1"),
            (
                "memcached://h:11211?prefix=x",
                "memcached://h:11211?prefix=x",
            ),
        ] {
            assert_eq!(redact(url), want);
        }
        let e = StoreUrl::parse("node://web:s3cret@nowhere").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let u = StoreUrl::parse("node://web:s3cret@127.0.0.1:7070").unwrap();
        assert!(!format!("{u:?}").contains("s3cret"), "{u:?}");
        let u = StoreUrl::parse("redis://:s3cret@127.0.0.1:7070").unwrap();
        assert!(!format!("{u:?}").contains("s3cret"), "{u:?}");
    }

    #[test]
    fn a_redis_database_number_is_kept_and_several_hosts_are_explained() {
        assert_eq!(
            StoreUrl::parse("redis://:pw@127.0.0.1:6379/3").unwrap(),
            StoreUrl::Redis {
                addr: ":pw@127.0.0.1:6379/3".into(),
                prefix: None,
                tls: None,
            }
        );
        let e = StoreUrl::parse("redis://h:1/x").unwrap_err().to_string();
        assert!(e.contains("not a database number"), "{e}");
        let e = StoreUrl::parse("redis://a:1,b:2").unwrap_err().to_string();
        assert!(
            e.contains("one server") && e.contains("redis+cluster://"),
            "{e}"
        );
    }

    #[test]
    fn several_memory_nodes_with_replicas() {
        let StoreUrl::Nodes { nodes, redundancy } =
            StoreUrl::parse("node://web:s3cret@a:1,b:2,c:3?replicas=2&poll_us=5").unwrap()
        else {
            panic!("not several nodes");
        };
        assert_eq!(redundancy, Redundancy::Replicas(2));
        for (n, addr) in nodes.iter().zip(["a:1", "b:2", "c:3"]) {
            let StoreUrl::Node {
                addr: a,
                tenant,
                token,
                poll_us,
                ..
            } = n
            else {
                panic!("{n:?}");
            };
            assert_eq!(
                (a.as_str(), tenant.as_str(), token.as_str()),
                (addr, "web", "s3cret")
            );
            assert_eq!(*poll_us, Some(5));
        }
        assert!(matches!(
            StoreUrl::parse("node://a:1,b:2").unwrap(),
            StoreUrl::Nodes {
                redundancy: Redundancy::Replicas(1),
                ..
            }
        ));
        assert!(matches!(
            StoreUrl::parse("node://a:1,b:2,c:3,d:4,e:5,f:6?ec=4+2").unwrap(),
            StoreUrl::Nodes {
                redundancy: Redundancy::Erasure { data: 4, parity: 2 },
                ..
            }
        ));
        assert!(matches!(
            StoreUrl::parse("node://a:1?replicas=1").unwrap(),
            StoreUrl::Node { .. }
        ));
        for (url, needle) in [
            ("node://a:1,b:2?replicas=3", "add nodes"),
            ("node://a:1?replicas=2", "lists 1"),
            ("node://a:1,b:2?replicas=0", "replicas=0"),
            ("node://a:1,a:1", "listed twice"),
            ("node://a:1,b", "no port"),
            ("node://a:1,b:2,c:3?ec=3+1", "needs at least 4 memory nodes"),
            ("node://a:1,b:2,c:3?ec=1+1", "write replicas=R"),
            ("node://a:1,b:2,c:3?ec=2", "write ec=K+M"),
            ("node://a:1,b:2,c:3?ec=2+0", "M >= 1"),
            ("node://a:1,b:2,c:3?ec=2+1&replicas=2", "not both"),
        ] {
            let e = StoreUrl::parse(url).unwrap_err().to_string();
            assert!(e.contains(needle), "{url}: {e}");
        }
        let u = StoreUrl::parse("node://web:s3cret@a:1,b:2").unwrap();
        assert!(!format!("{u:?}").contains("s3cret"), "{u:?}");
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(
            StoreUrl::parse("local:").unwrap(),
            StoreUrl::Local {
                compression: Compression::DEFAULT
            }
        );
        for c in [Compression::None, Compression::Lz4, Compression::Zstd] {
            assert_eq!(
                StoreUrl::parse(&format!("local:?compress={}", c.name())).unwrap(),
                StoreUrl::Local { compression: c }
            );
        }
        assert_eq!(
            StoreUrl::parse("node://web:s3cret@127.0.0.1:7070").unwrap(),
            StoreUrl::Node {
                addr: "127.0.0.1:7070".into(),
                tenant: "web".into(),
                token: "s3cret".into(),
                tls: None,
                poll_us: None,
                timeout_ms: None,
            }
        );
        assert_eq!(
            StoreUrl::parse("redis+cluster://a:1,b:2,c:3?prefix=x").unwrap(),
            StoreUrl::RedisCluster {
                nodes: vec!["a:1".into(), "b:2".into(), "c:3".into()],
                prefix: Some("x".into()),
                tls: None,
                wait: None,
                failover_ms: None,
            }
        );
        assert!(matches!(
            StoreUrl::parse("redis+cluster://a:1,b:2,c:3?wait=1&failover_ms=20000").unwrap(),
            StoreUrl::RedisCluster {
                wait: Some(1),
                failover_ms: Some(20000),
                ..
            }
        ));
        for url in [
            "redis+cluster://a:1?wait=0",
            "redis+cluster://a:1?failover_ms=x",
        ] {
            assert!(StoreUrl::parse(url).is_err(), "{url}");
        }
        assert_eq!(
            StoreUrl::parse("memcached://localhost:11211").unwrap(),
            StoreUrl::Memcached {
                addr: "localhost:11211".into(),
                prefix: None
            }
        );
    }

    #[test]
    fn tls_is_asked_for_by_query_or_scheme() {
        let ca = Some(TlsOptions {
            ca: Some(PathBuf::from("/etc/tp/ca.pem")),
        });
        assert_eq!(
            StoreUrl::parse("node://web:s3cret@10.0.0.5:7070?tls=1&ca=/etc/tp/ca.pem").unwrap(),
            StoreUrl::Node {
                addr: "10.0.0.5:7070".into(),
                tenant: "web".into(),
                token: "s3cret".into(),
                tls: ca.clone(),
                poll_us: None,
                timeout_ms: None,
            }
        );
        assert!(matches!(
            StoreUrl::parse("node://web@h:1?tls=1").unwrap(),
            StoreUrl::Node {
                tls: Some(TlsOptions { ca: None }),
                ..
            }
        ));
        assert!(matches!(
            StoreUrl::parse("node://web@h:1?tls=0").unwrap(),
            StoreUrl::Node { tls: None, .. }
        ));
        assert!(matches!(
            StoreUrl::parse("node://web@h:1?poll_us=0").unwrap(),
            StoreUrl::Node {
                poll_us: Some(0),
                ..
            }
        ));
        let e = StoreUrl::parse("node://web:SECRET@h:1?poll_us=soon")
            .unwrap_err()
            .to_string();
        assert!(e.contains("poll_us=soon") && !e.contains("SECRET"), "{e}");
        assert!(matches!(
            StoreUrl::parse("node://web@h:1?timeout_ms=1500").unwrap(),
            StoreUrl::Node {
                timeout_ms: Some(1500),
                ..
            }
        ));
        assert!(StoreUrl::parse("node://web@h:1?timeout_ms=0").is_err());
        assert_eq!(
            StoreUrl::parse("rediss://:pw@h:6380/2?ca=/etc/tp/ca.pem").unwrap(),
            StoreUrl::Redis {
                addr: ":pw@h:6380/2".into(),
                prefix: None,
                tls: ca.clone(),
            }
        );
        assert!(matches!(
            StoreUrl::parse("rediss+cluster://a:1,b:2").unwrap(),
            StoreUrl::RedisCluster { tls: Some(_), .. }
        ));
        for (url, needle) in [
            ("node://w@h:1?ca=/x.pem", "add tls=1"),
            ("node://w@h:1?tls=maybe", "tls=1 or tls=0"),
            ("redis://h:1?ca=/x.pem", "rediss://"),
            ("redis+cluster://h:1?ca=/x.pem", "rediss+cluster://"),
            ("rediss://a:1,b:2", "rediss+cluster://"),
        ] {
            let e = StoreUrl::parse(url).unwrap_err().to_string();
            assert!(e.contains(needle), "{url}: {e}");
        }
        let u = StoreUrl::parse("rediss://:s3cret@h:6380").unwrap();
        assert!(!format!("{u:?}").contains("s3cret"), "{u:?}");
        assert_eq!(
            redact("rediss://:s3cret@h:6380/1"),
            "rediss://:***@h:6380/1"
        );
    }

    #[test]
    fn refuses_bad_urls_with_a_reason() {
        for (url, needle) in [
            ("ftp://x:1", "unknown scheme"),
            ("redis://localhost", "no port"),
            ("redis://localhost:http", "not a port"),
            ("local:?compress=brotli", "unknown compression"),
            ("redis://h:1?colour=blue", "unknown query parameter"),
            ("nothing", "no scheme"),
        ] {
            let e = StoreUrl::parse(url).unwrap_err().to_string();
            assert!(e.contains(needle), "{url}: {e}");
        }
    }
}
