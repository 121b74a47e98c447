//! Peer servers on loopback, for tests and benchmarks: one Redis, a Redis Cluster, one memcached;
//! and the shared libraries those runs load (an installed peer allocator, or the workspace's own
//! `libtidepool_malloc.so` and `libtidepool_preload.so`, built on request).
//!
//! Each server runs as a child process on `127.0.0.1`, on a port nobody else was using, with its
//! files in a temporary directory of its own. Starting returns only once the server answers its
//! protocol's liveness command, so a caller can connect at once. Dropping the value kills the
//! process(es) and removes the directory, so a failing test leaves nothing running.
//!
//! Ports are found by binding `127.0.0.1:0` and closing the socket again; another process can
//! take the port in between, so a server that exits because its address is in use is started
//! again on a new port.
#![forbid(unsafe_code)]

mod error;
pub mod libs;
mod memcached;
mod process;
mod redis;
pub mod tls;

pub use error::PeerError;
pub use libs::shared_library;
pub use memcached::Memcached;
use process::TempDir;
pub use redis::{RedisCluster, RedisServer};
