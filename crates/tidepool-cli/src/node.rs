//! `tidepool node`: a memory node, one server whose memory many compute processes share.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;
use tidepool_node::{format_size, NodeConfig, Server, TlsFiles, TokensFile};

#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    /// Address to listen on, e.g. 0.0.0.0:7070 (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: String,
    /// Memory to serve, e.g. 512M, 8G.
    #[arg(long, value_parser = crate::parse_size_arg)]
    capacity: u64,
    /// TOML file of tenants: [[tenant]] name = "web" token = "..." quota = "2G".
    /// Without it any tenant name is accepted (open mode: for trusted hosts only).
    #[arg(long)]
    tokens: Option<PathBuf>,
    /// Memory sections (one allocator thread each); default: one per CPU.
    #[arg(long)]
    sections: Option<usize>,
    /// Event-loop threads serving connections; default: half the CPUs, at least one.
    #[arg(long)]
    io_threads: Option<usize>,
    /// Microseconds an I/O thread keeps polling after its last request before it sleeps.
    /// Saves a wake-up per request (tens of microseconds on VMs). The poll yields between
    /// tries, so other processes on the node's CPUs still run, but the CPU does not idle
    /// while it polls.
    #[arg(long, default_value_t = 0)]
    busy_poll_us: u64,
    /// Most simultaneous client connections.
    #[arg(long, default_value_t = 4096)]
    max_connections: usize,
    /// Largest object (and frame) accepted.
    #[arg(long, default_value = "16M", value_parser = crate::parse_size_arg)]
    max_object: u64,
    /// Answers a connection may have waiting for its client to read them; past this the
    /// node stops reading its requests until it drains (at least 64K).
    #[arg(long, default_value = "4M", value_parser = crate::parse_size_arg)]
    max_outstanding: u64,
    /// PEM file of the node's certificate chain: accept only TLS connections.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM file of the private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9464 (port 0 picks a
    /// free port; the first line of output names it).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
}

/// Starts a memory node as the arguments say and serves until it is told to stop.
pub fn run(args: NodeArgs) -> Result<()> {
    let (cfg, mode) = config(args)?;
    serve(cfg, &mode)
}

/// The node's configuration from its arguments, and how it admits tenants (for the first
/// line of output).
fn config(a: NodeArgs) -> Result<(NodeConfig, String)> {
    let mut cfg = NodeConfig::new(a.listen, a.capacity)
        .busy_poll(std::time::Duration::from_micros(a.busy_poll_us))
        .max_connections(a.max_connections)
        .max_body(u32::try_from(a.max_object + 64).context("--max-object must be below 4 GiB")?)
        .max_outstanding(
            usize::try_from(a.max_outstanding)
                .context("--max-outstanding does not fit this machine's address space")?,
        );
    if let Some(s) = a.sections {
        cfg = cfg.sections(s);
    }
    if let Some(n) = a.io_threads {
        cfg = cfg.io_threads(n);
    }
    if let (Some(cert), Some(key)) = (a.tls_cert, a.tls_key) {
        cfg = cfg.tls(TlsFiles { cert, key });
    }
    if let Some(addr) = a.metrics {
        if !addr.ip().is_loopback() {
            eprintln!(
                "tidepool node: the metrics at {addr} are reachable from other machines \
                 and name every tenant and what it holds; bind 127.0.0.1 unless that is meant"
            );
        }
        cfg = cfg.metrics(addr);
    }
    let mode = match &a.tokens {
        Some(path) => {
            let f = TokensFile::load(path)?;
            let n = f.tenants.len();
            cfg = cfg.tokens(f);
            format!("{n} tenants from {}", path.display())
        }
        None => "open mode: any tenant accepted; use --tokens FILE on shared networks".to_string(),
    };
    Ok((cfg, mode))
}

/// Starts the node, says where it listens, and serves until SIGTERM or SIGINT, then stops it
/// in order.
fn serve(cfg: NodeConfig, mode: &str) -> Result<()> {
    // SIGTERM and SIGINT stop the server in order (below) rather than kill it.
    tidepool_sys::block_stop_signals()?;
    let server = Server::start(cfg)?;
    let tls = if server.uses_tls() { ", TLS only" } else { "" };
    let metrics = server
        .metrics_addr()
        .map(|a| format!("; metrics at http://{a}/metrics"))
        .unwrap_or_default();
    // The first line names the address: scripts and `tidepool bench` read it.
    println!(
        "tidepool node listening on {} with {} in {} sections ({mode}){tls}{metrics}",
        server.local_addr(),
        format_size(server.capacity()),
        server.sections()
    );
    std::io::stdout().flush()?;
    let signal = tidepool_sys::wait_for_stop()?;
    eprintln!("tidepool node: {signal}: closing every connection and stopping");
    let addr = server.local_addr();
    server.shutdown();
    eprintln!("tidepool node: stopped ({addr} is free)");
    Ok(())
}
