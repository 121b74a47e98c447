//! Far stores: where Tidepool keeps memory that does not fit locally.
//!
//! [`FarStore`] is a batched key-value interface shaped for both 4 KiB pages (the pager) and
//! objects of any size (far data structures). Keys are `u64`s chosen by the caller (a page
//! number, an object id). Every operation comes in a batched form, because a far store is worth
//! using only when round trips are amortised; single-item helpers are thin wrappers.
//!
//! Backends are chosen by URL with [`open`]:
//!
//! | URL | backend |
//! |---|---|
//! | `local:[?compress=lz4\|zstd\|none]` | in-process, compressed (the embedded default: saves memory like zram) or, with `none`, pages kept whole (the pager alone: saves no memory) |
//! | `node://[tenant[:token]@]host:port[?tls=1[&ca=FILE]][&poll_us=N][&timeout_ms=N]` | a `tidepool node` memory node |
//! | `node://[tenant[:token]@]h1:p1,h2:p2,...?replicas=R` or `?ec=K+M` | several memory nodes as one store: whole copies on R nodes, or Reed-Solomon pieces ([`NodeSet`]) |
//! | `redis://[:password@]host:port[/DB][?prefix=P]` | one Redis server |
//! | `redis+cluster://h1:p1,h2:p2,...[?prefix=P][&wait=N][&failover_ms=MS]` | a Redis Cluster: writes wait for N replicas; calls retry through a failover for MS (default 15000) |
//! | `rediss://...`, `rediss+cluster://...` `[?ca=FILE]` | the same over TLS |
//! | `memcached://host:port[?prefix=P]` | a memcached server |
//!
//! With TLS, `ca=FILE` names a PEM file of CA certificates to trust (a private CA); without it
//! the system's root certificates are trusted. The server's certificate must name the URL's
//! host (DNS name or IP address).
// The one exception: the packed store's slots (backends/slots/).
#![deny(unsafe_code)]

mod backends;
#[cfg(feature = "conformance")]
pub mod conformance;
mod error;
mod tls;
mod url;

use bytes::Bytes;
use std::fmt;
use std::sync::Arc;
use tidepool_proto::scan::{Column, Scan};

pub use backends::local::LocalStore;
pub use backends::memcached::MemcachedStore;
pub use backends::node::{NodeClient, NodeOptions, NodeStore, DEFAULT_POLL as NODE_DEFAULT_POLL};
pub use backends::node_set::NodeSet;
pub use backends::packed::{Compression, PackedStore};
pub use backends::redis::{ClusterOptions, RedisStore};
pub use error::StoreError;
pub use tls::{ClientTls, TlsOptions};
pub use url::{redact, Redundancy, StoreUrl, MAX_PIECES};

/// Entry points for the fuzz targets in `fuzz/`; not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    /// Parses memcached replies until the input ends or one is refused; returns how many.
    pub fn memcached_replies(data: &[u8], max_value: usize) -> usize {
        crate::backends::memcached::parse_replies(data, max_value)
    }
}

/// A caller-chosen name for one far value.
pub type Key = u64;

/// What happens to the far copy when a value is fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FetchMode {
    /// Keep the far copy (a clean page can later be dropped without writing it back).
    Keep,
    /// Free the far copy (Sharry's unique copy: far memory holds only what is not local).
    Take,
}

/// Counters a backend can report about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Bytes the backend holds on this store's behalf, allocation overhead included where the
    /// backend knows it.
    pub far_bytes: Option<u64>,
    /// Values currently stored.
    pub objects: Option<u64>,
    /// Backend-specific counters.
    pub extra: Vec<(String, u64)>,
}

/// A place to keep values that do not fit in local memory.
///
/// Implementations are shared between threads; every method may be called concurrently.
/// A missing key reads as `None`. Errors mean the operation may not have happened: a caller must
/// never treat an error as "the value was zero".
pub trait FarStore: Send + Sync + fmt::Debug {
    /// A short description for messages and reports, e.g. `redis://127.0.0.1:6379`.
    fn describe(&self) -> String;

    /// Stores each value under its key, replacing any earlier value.
    fn write_many(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError>;

    /// Reads each key, keeping the far copy.
    fn read_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError>;

    /// Reads each key into its own `chunk` bytes of `out` (key `i` into
    /// `out[i * chunk..]`), setting `lens[i]` to the value's length, or to `None` if the key is
    /// missing. A value longer than `chunk` is an error. The same as [`FarStore::read_many`]
    /// without its allocations where the backend can do that (the in-process store copies
    /// straight out of its map); the default reads with `read_many` and copies.
    fn read_many_into(
        &self,
        keys: &[Key],
        chunk: usize,
        out: &mut [u8],
        lens: &mut [Option<usize>],
    ) -> Result<(), StoreError> {
        assert!(out.len() >= keys.len() * chunk && lens.len() >= keys.len());
        for (i, v) in self.read_many(keys)?.into_iter().enumerate() {
            lens[i] = copy_into_chunk(v.as_deref(), chunk, &mut out[i * chunk..])?;
        }
        Ok(())
    }

    /// Reads each key and removes it from the store.
    fn take_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError>;

    /// Removes each key; removing a missing key is not an error.
    fn remove_many(&self, keys: &[Key]) -> Result<(), StoreError>;

    /// Writes `evict` out and fetches `fetch` in, in one round trip where the backend can.
    /// A fetched key that is also evicted in the same call sees the evicted value.
    fn evict_fetch(
        &self,
        evict: &[(Key, &[u8])],
        fetch: &[Key],
        mode: FetchMode,
    ) -> Result<Vec<Option<Bytes>>, StoreError> {
        if !evict.is_empty() {
            self.write_many(evict)?;
        }
        match mode {
            FetchMode::Keep => self.read_many(fetch),
            FetchMode::Take => self.take_many(fetch),
        }
    }

    /// [`FarStore::evict_fetch`] with [`FetchMode::Keep`], reading into `out` as
    /// [`FarStore::read_many_into`] does. The default makes one `evict_fetch` round trip and
    /// copies; a store in this process ([`FarStore::private_to_process`]) has no round trip to
    /// save, so it writes, then reads straight into `out`.
    fn evict_fetch_into(
        &self,
        evict: &[(Key, &[u8])],
        fetch: &[Key],
        chunk: usize,
        out: &mut [u8],
        lens: &mut [Option<usize>],
    ) -> Result<(), StoreError> {
        assert!(out.len() >= fetch.len() * chunk && lens.len() >= fetch.len());
        if evict.is_empty() || self.private_to_process() {
            if !evict.is_empty() {
                self.write_many(evict)?;
            }
            return self.read_many_into(fetch, chunk, out, lens);
        }
        let values = self.evict_fetch(evict, fetch, FetchMode::Keep)?;
        for (i, v) in values.into_iter().enumerate() {
            lens[i] = copy_into_chunk(v.as_deref(), chunk, &mut out[i * chunk..])?;
        }
        Ok(())
    }

    /// Scans and gathers where the data is, if this backend computes next to its data
    /// (a memory node does); `None` (the default): the caller fetches and computes itself.
    fn offload(&self) -> Option<&dyn Offload> {
        None
    }

    /// Membership and health, if this store spans several servers it manages itself (a set of
    /// memory nodes); `None` (the default) otherwise.
    fn topology(&self) -> Option<&dyn Topology> {
        None
    }

    /// What a forked child must do before it uses the store, if the store holds connections
    /// or sessions (every store on a server); `None` (the default): nothing.
    fn fork_aware(&self) -> Option<&dyn ForkAware> {
        None
    }

    /// How much longer than a pager's fault deadline one call may take on a store that works:
    /// a store that rides out failures waits for them (a Redis Cluster failover, a memory
    /// node of a set that went silent and is declared down after its timeout). A pager's
    /// watchdog allows this on top of its deadline while it waits for the store. A store that
    /// has not answered within the deadline otherwise is silent, and the program is stopped
    /// saying so; the default, zero, says that.
    fn patience(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// What the backend can tell about its use.
    fn stats(&self) -> Result<StoreStats, StoreError> {
        Ok(StoreStats::default())
    }

    /// True if the values live in this process's own memory (the in-process store), so that a
    /// forked child gets a copy of them with its address space, and the parent's later writes
    /// never reach the child's. False (the default) for stores on a server, which parent and
    /// child share: whoever forks must keep the values the other side may still read.
    fn private_to_process(&self) -> bool {
        false
    }

    fn write(&self, key: Key, value: &[u8]) -> Result<(), StoreError> {
        self.write_many(&[(key, value)])
    }

    fn read(&self, key: Key) -> Result<Option<Bytes>, StoreError> {
        Ok(self.read_many(&[key])?.pop().flatten())
    }

    fn take(&self, key: Key) -> Result<Option<Bytes>, StoreError> {
        Ok(self.take_many(&[key])?.pop().flatten())
    }

    fn remove(&self, key: Key) -> Result<(), StoreError> {
        self.remove_many(&[key])
    }
}

/// A store that computes next to its data ([`FarStore::offload`]).
pub trait Offload {
    /// Runs an offloaded scan (aggregations over far vectors, see [`tidepool_proto::scan`])
    /// where the data is, over lines named by keys (a missing key is a line of zeros).
    fn scan(&self, scan: &Scan<Key>) -> Result<Vec<u64>, StoreError>;

    /// The elements at `indices` of one far vector, concatenated, gathered where the data is.
    fn gather(&self, column: &Column<Key>, indices: &[u64]) -> Result<Bytes, StoreError>;
}

/// A store over several servers that it manages itself ([`FarStore::topology`]).
pub trait Topology {
    /// Adds a memory node (`host:port`) while the store is in use.
    fn add_node(&self, addr: &str) -> Result<(), StoreError>;

    /// One line on the store's health for people, from what the client knows without asking
    /// the servers (memory nodes down, data not yet protected again); `None` when there is
    /// nothing to say.
    fn health(&self) -> Option<String>;
}

/// A store holding connections or sessions that a forked child must not share
/// ([`FarStore::fork_aware`]).
pub trait ForkAware {
    /// Called in a forked child before its first use of the store: connections inherited from
    /// the parent are shared with it (a request from the child would interleave with the
    /// parent's on the same socket), so the child must open its own. What the parent stored
    /// stays readable from the child.
    fn after_fork_in_child(&self);
}

/// Adds memory node `addr` to `store` if it is a set of memory nodes; any other store refuses,
/// saying what it is.
pub fn add_node(store: &dyn FarStore, addr: &str) -> Result<(), StoreError> {
    match store.topology() {
        Some(t) => t.add_node(addr),
        None => Err(StoreError::Backend {
            backend: "far store",
            message: format!(
                "cannot add {addr}: {} is not a store over several memory nodes \
                 (node://h1:p1,h2:p2,...)",
                store.describe()
            ),
            source: None,
        }),
    }
}

/// Copies a value read for [`FarStore::read_many_into`] into its chunk.
pub(crate) fn copy_into_chunk(
    value: Option<&[u8]>,
    chunk: usize,
    out: &mut [u8],
) -> Result<Option<usize>, StoreError> {
    let Some(v) = value else { return Ok(None) };
    if v.len() > chunk {
        return Err(StoreError::ValueTooLarge {
            backend: "the reader's buffer",
            len: v.len(),
            max: chunk,
        });
    }
    out[..v.len()].copy_from_slice(v);
    Ok(Some(v.len()))
}

/// Opens the backend a URL names (see the crate docs for the forms).
pub fn open(url: &str) -> Result<Arc<dyn FarStore>, StoreError> {
    Ok(match StoreUrl::parse(url)? {
        StoreUrl::Local {
            compression: Compression::None,
        } => Arc::new(LocalStore::new()),
        StoreUrl::Local { compression } => Arc::new(PackedStore::new(compression)),
        node @ StoreUrl::Node { .. } => Arc::new(open_node(node, "")?),
        StoreUrl::Nodes { nodes, redundancy } => {
            let addrs: Vec<String> = nodes
                .iter()
                .map(|n| match n {
                    StoreUrl::Node { addr, .. } => addr.clone(),
                    other => unreachable!("a node set of {other:?}"),
                })
                .collect();
            let layout = backends::node_set::Layout::new(
                redundancy,
                &addrs.iter().map(String::as_str).collect::<Vec<_>>(),
            );
            // Nodes added later are opened like the first one listed (tenant, token, options).
            let template = nodes[0].clone();
            let connect: backends::node_set::Connect = Box::new(move |addr, layout| {
                let mut node = template.clone();
                if let StoreUrl::Node { addr: a, .. } = &mut node {
                    *a = addr.to_string();
                }
                open_node(node, &layout.to_string())
            });
            let mut stores = Vec::with_capacity(nodes.len());
            let settings = layout.to_string();
            for (node, addr) in nodes.into_iter().zip(addrs) {
                stores.push((addr, open_node(node, &settings)?));
            }
            Arc::new(NodeSet::new(
                stores,
                redundancy,
                url.to_string(),
                Some(connect),
            )?)
        }
        StoreUrl::Redis { addr, prefix, tls } => {
            Arc::new(RedisStore::connect_with(&addr, prefix, tls.as_ref())?)
        }
        StoreUrl::RedisCluster {
            nodes,
            prefix,
            tls,
            wait,
            failover_ms,
        } => {
            let mut options = ClusterOptions::default();
            if let Some(n) = wait {
                options = options.wait(n);
            }
            if let Some(ms) = failover_ms {
                options = options.failover(std::time::Duration::from_millis(ms));
            }
            Arc::new(RedisStore::connect_cluster_with_options(
                &nodes,
                prefix,
                tls.as_ref(),
                options,
            )?)
        }
        StoreUrl::Memcached { addr, prefix } => Arc::new(MemcachedStore::connect(&addr, prefix)?),
    })
}

/// Connects to the memory node a [`StoreUrl::Node`] names, as one of the store `store` says
/// (empty: the store is this node alone).
fn open_node(url: StoreUrl, store: &str) -> Result<NodeStore, StoreError> {
    let StoreUrl::Node {
        addr,
        tenant,
        token,
        tls,
        poll_us,
        timeout_ms,
    } = url
    else {
        unreachable!("not a node URL: {url:?}");
    };
    let tls = tls
        .map(|t| ClientTls::from_options(&addr, &t))
        .transpose()?;
    let mut options = NodeOptions::default().store(store);
    if let Some(us) = poll_us {
        options = options.poll(std::time::Duration::from_micros(us));
    }
    if let Some(ms) = timeout_ms {
        options = options.timeout(std::time::Duration::from_millis(ms));
    }
    Ok(NodeStore::with_client(NodeClient::connect_with_options(
        &addr, &tenant, &token, tls, options,
    )?))
}

/// A key prefix unique to this process and store instance, so that several programs sharing
/// one Redis or memcached never see each other's values.
pub(crate) fn default_prefix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "tp:{}:{:x}:{}:",
        std::process::id(),
        nanos,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
