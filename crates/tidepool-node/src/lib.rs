//! The Tidepool memory node (`tidepool node`): one server whose memory many compute processes
//! share, after Sharry (DAC'24).
//!
//! - One unified address space: a single `--capacity` mapping ([`arena`]) holding every tenant's
//!   objects, addressed by server-issued handles.
//! - Split into sections, each with a dedicated allocator thread that alone touches the
//!   section's allocation metadata ([`section`], [`spans`]); the metadata lives apart from the
//!   data ([`slots`]). A scheduler spreads allocation over sections; frees are batched.
//! - Per-tenant tokens and quotas; handles carry tenant, epoch and generation, so forged and
//!   stale handles are refused; a client's objects are released when its session ends.
//! - Optionally TLS ([`tls`]: rustls in the event loop) and Prometheus metrics ([`metrics`],
//!   served by [`http`]).
#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod arena;
pub mod config;
mod conn;
mod counters;
mod error;
pub mod http;
mod io;
mod metrics;
mod section;
mod server;
mod shared;
mod slots;
pub mod spans;
mod tenants;
mod tls;

pub use config::{
    format_size, parse_size, NodeConfig, TenantSpec, TlsFiles, TokensFile, DEFAULT_MAX_OUTSTANDING,
    MIN_MAX_OUTSTANDING,
};
pub use error::NodeError;
pub use server::Server;
