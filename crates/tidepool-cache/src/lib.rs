//! `tidepool cache`: a memcached-compatible cache server whose items live in soft memory.
//!
//! memcached is given a fixed `-m`: too small and idle memory is wasted, too large and the
//! host swaps or the OOM killer takes it. Here the values live in a soft-memory arena
//! (`tidepool-soft`) whose budget a coordinator sets, or an `auto` budget that follows the
//! host's free memory: the cache grows into what is idle and gives it back in milliseconds
//! under pressure, and what it gave back reads as a miss, as an evicted item would. Every
//! memcached client works unchanged: the text protocol and the meta commands, with
//! memcached's limits and error replies.
//!
//! - [`proto`] and [`meta`] (over `lex`): requests parsed from a connection's buffer (no I/O;
//!   fuzzed).
//! - [`store`]: the items, an index in normal memory over values in soft memory.
//! - [`exec`]: a request run on the items, and its reply.
//! - [`server`]: the acceptor and the worker threads' event loops.
//! - [`far`]: `--far URL`, the second tier values come back from after soft memory let them go.
//! - [`stats`] and [`metrics`]: the counters as `stats` under memcached's names, and as
//!   Prometheus metrics.
//! - [`fuzzing`]: what the fuzz target runs.

#![forbid(unsafe_code)]

mod clock;
mod counters;
pub mod exec;
pub mod far;
pub mod fuzzing;
mod lex;
pub mod meta;
pub mod metrics;
pub mod proto;
pub mod server;
pub mod stats;
pub mod store;

pub use proto::{parse, Limits, Parsed, Request};
pub use server::{Server, ServerConfig};
pub use stats::Settings;
pub use store::Items;

/// What `version` answers: the memcached release whose protocol this speaks, then ours
/// (clients that parse `major.minor.patch` read the first part).
pub const VERSION: &str = concat!("1.6.18-tidepool-", env!("CARGO_PKG_VERSION"));
