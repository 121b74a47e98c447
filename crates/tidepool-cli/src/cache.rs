//! `tidepool cache`: the memcached-compatible server on soft memory.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::sync::Arc;
use tidepool_cache::far::Spill;
use tidepool_cache::{Items, Limits, Server, ServerConfig, Settings};
use tidepool_node::format_size;
use tidepool_soft::coord::CoordConfig;
use tidepool_soft::{ArenaConfig, AutoBudget, SoftRuntime, SEGMENT};

#[derive(Debug, clap::Args)]
pub struct CacheArgs {
    /// Address to listen on (port 0 picks a free port; the first line of output names it).
    #[arg(long, default_value = "127.0.0.1:11211")]
    listen: String,
    /// Worker threads serving connections (memcached's -t).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// The most memory items may hold [default: no limit but the host's: the cache grows
    /// into idle memory].
    #[arg(long, value_parser = crate::parse_size_arg)]
    max: Option<u64>,
    /// Far store for a second tier, e.g. node://cache@10.0.0.5:7070?timeout_ms=200: every
    /// value is also written there (in the background, in batches), and a value soft memory
    /// gave back comes from there on its next hit instead of being a miss. A store that fails
    /// is a miss, and is left alone for a while (1 s, doubling); timeout_ms bounds how long a
    /// miss waits on one that hangs.
    #[arg(long, value_name = "URL")]
    far: Option<String>,
    /// Largest item, key and data together (memcached's -I).
    #[arg(long, default_value = "1M", value_parser = crate::parse_size_arg)]
    item_max: u64,
    /// Most simultaneous connections (memcached's -c); more are refused with an error line.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// A fixed budget, as memcached's -m: soft memory neither grows into idle memory nor gives
    /// way to pressure on the host (no coordinator, no `auto` budget): for when the cache
    /// must keep what it stores as memcached does.
    #[arg(long, value_parser = crate::parse_size_arg, conflicts_with_all = ["coord", "max"])]
    memory: Option<u64>,
    /// Memory left to everything else when no coordinator runs: the `auto` budget grows into
    /// the host's available memory minus this, and gives back at once when it shrinks.
    #[arg(long, default_value = "256M", value_parser = crate::parse_size_arg)]
    reserve: u64,
    /// Join the coordinator at this socket [default: $TIDEPOOL_COORD, else `tidepool coord`'s
    /// default socket; joined if a coordinator answers there].
    #[arg(long, value_name = "SOCKET", conflicts_with = "no_coord")]
    coord: Option<PathBuf>,
    /// Do not join a coordinator: the `auto` budget sizes the cache.
    #[arg(long)]
    no_coord: bool,
    /// The coordinator's weight for this cache (its gains count this many times).
    #[arg(long, default_value_t = 1.0)]
    weight: f64,
    /// Serve Prometheus metrics (the `stats` counters) at http://ADDR/metrics, e.g.
    /// 127.0.0.1:9465 (port 0 picks a free port; the output names it).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Its name on the coordinator's dashboard.
    #[arg(long, default_value = "tidepool-cache")]
    name: String,
}

/// Where the cache's soft-memory budget comes from.
enum Sizing {
    /// `--memory`: set once, as memcached's -m.
    Fixed,
    /// The coordinator at this socket.
    Coordinator(PathBuf),
    /// The host's available memory and stalls (the `auto` budget).
    Auto,
}

/// Starts the cache as the arguments say and serves until it is told to stop.
pub fn run(args: CacheArgs) -> Result<()> {
    let (item_max, max_bytes) = check(&args)?;
    // Before any thread starts, so that all inherit the mask and the signal comes here.
    tidepool_sys::block_stop_signals()?;
    let (listener, addr) = listen(&args.listen)?;
    let (runtime, sizing) = soft_memory(&args, max_bytes)?;
    let spill = far_tier(args.far.as_deref())?;
    let items = Arc::new(Items::new(runtime.arena(), spill.clone()));
    let mut settings = Settings::new(args.threads, item_max, args.max_connections);
    if let Some(max) = args.max {
        settings = settings.max_bytes(max);
    }
    let config = ServerConfig::default()
        .threads(args.threads)
        .limits(Limits::default().item_max(item_max))
        .max_connections(args.max_connections);
    let metrics = args
        .metrics
        .map(|addr| serve_metrics(addr, &items, &settings))
        .transpose()?;
    let _server = Server::start(listener, items, settings, &config)?;
    // One write, and none of it fatal: whoever started us may read only the first line
    // and close the pipe.
    let mut said = format!("tidepool cache listening on {addr}\n");
    said += &memory_line(&args, &sizing, max_bytes);
    if let Some(s) = &spill {
        said += &format!("  far tier: {}\n", s.describe());
    }
    if let Some(m) = &metrics {
        said += &format!("  metrics: http://{}/metrics\n", m.addr);
    }
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(said.as_bytes()).and_then(|()| out.flush());
    }
    let signal = tidepool_sys::wait_for_stop()?;
    eprintln!("tidepool cache: {signal}: stopping");
    Ok(())
}

/// Checks the arguments; returns the largest item and the most memory items may hold.
fn check(args: &CacheArgs) -> Result<(usize, u64)> {
    if !(args.weight.is_finite() && args.weight > 0.0) {
        bail!("--weight {} must be a positive number", args.weight);
    }
    if args.threads == 0 {
        bail!("--threads must be at least 1");
    }
    let item_max = usize::try_from(args.item_max).context("--item-max is too large")?;
    if !(1024..=(1 << 30)).contains(&item_max) {
        bail!("--item-max must be between 1K and 1G (memcached's -I limits)");
    }
    let (limit, flag) = match args.memory {
        Some(m) => (Some(m), "--memory"),
        None => (args.max, "--max"),
    };
    let max_bytes = match limit {
        Some(m) if m < 2 * SEGMENT as u64 => bail!(
            "{flag} {} is too small: soft memory comes in {} segments, give at least two",
            format_size(m),
            format_size(SEGMENT as u64)
        ),
        Some(m) => m.next_multiple_of(SEGMENT as u64).min(64 << 30),
        None => 64 << 30,
    };
    Ok((item_max, max_bytes))
}

/// The listening socket, and its address; a warning if other machines can reach it.
fn listen(at: &str) -> Result<(std::net::TcpListener, std::net::SocketAddr)> {
    let listener =
        std::net::TcpListener::bind(at).with_context(|| format!("cannot listen on {at}"))?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        // memcached's protocol has no authentication: say so once.
        eprintln!(
            "tidepool cache: listening on {addr}, reachable from other machines; memcached's \
             protocol has no authentication, so anyone who can connect can read and change \
             every item (bind 127.0.0.1, or keep the port behind a firewall)"
        );
    }
    Ok((listener, addr))
}

/// Soft memory for the items: a fixed budget, else one from the coordinator, else one that
/// follows the host, starting at memcached's default -m and growing as items arrive.
fn soft_memory(args: &CacheArgs, max_bytes: u64) -> Result<(SoftRuntime, Sizing)> {
    let sizing = match args.memory {
        Some(_) => Sizing::Fixed,
        None => match crate::run::coord_socket(args.coord.as_deref(), args.no_coord)? {
            Some(socket) => Sizing::Coordinator(socket),
            None => Sizing::Auto,
        },
    };
    let start_budget = match sizing {
        Sizing::Fixed => max_bytes,
        _ => (64u64 << 20).min(max_bytes),
    } as usize;
    let runtime = SoftRuntime::new(
        tidepool_soft::SoftArena::new(
            ArenaConfig::default()
                .budget(start_budget)
                .max_bytes(max_bytes as usize),
        )
        .context("cannot create the soft-memory arena")?,
    );
    runtime
        .start_evacuator(0.02, 0.05)
        .context("cannot start the evacuator")?;
    match &sizing {
        Sizing::Fixed => {}
        Sizing::Coordinator(socket) => {
            runtime
                .join_coordinator(
                    CoordConfig::new(socket.clone())
                        .name(args.name.clone())
                        .weight(args.weight),
                )
                .context("cannot start the coordinator link")?;
        }
        Sizing::Auto => {
            runtime
                .start_auto_budget(
                    AutoBudget::default()
                        .reserve(args.reserve as usize)
                        .max(max_bytes as usize),
                )
                .context("cannot start the auto budget")?;
        }
    }
    Ok((runtime, sizing))
}

/// The far tier's writer, if `--far` names a store.
fn far_tier(far: Option<&str>) -> Result<Option<Arc<Spill>>> {
    let Some(url) = far else {
        return Ok(None);
    };
    let store = tidepool_store::open(url)
        .with_context(|| format!("cannot open the far store {}", tidepool_store::redact(url)))?;
    Ok(Some(
        Spill::start(store).context("cannot start the far tier's writer")?,
    ))
}

/// Serves the `stats` counters as Prometheus metrics at `addr`.
fn serve_metrics(
    addr: std::net::SocketAddr,
    items: &Arc<Items>,
    settings: &Settings,
) -> Result<tidepool_node::http::MetricsServer> {
    if !addr.ip().is_loopback() {
        eprintln!(
            "tidepool cache: the metrics at {addr} are reachable from other machines; \
             bind 127.0.0.1 unless that is meant"
        );
    }
    let (items, settings) = (items.clone(), settings.clone());
    tidepool_node::http::MetricsServer::start(
        Arc::new(move || tidepool_cache::metrics::render(&items, &settings)),
        addr,
    )
    .with_context(|| format!("cannot serve metrics on {addr}"))
}

/// The line of the greeting that says how soft memory is sized.
fn memory_line(args: &CacheArgs, sizing: &Sizing, max_bytes: u64) -> String {
    let most = args
        .max
        .map(|m| format!(", at most {}", format_size(m)))
        .unwrap_or_default();
    match sizing {
        Sizing::Fixed => format!(
            "  memory: soft, a fixed budget of {}\n",
            format_size(max_bytes)
        ),
        Sizing::Coordinator(s) => format!(
            "  memory: soft, sized by the coordinator at {}{most}\n",
            s.display()
        ),
        Sizing::Auto => format!(
            "  memory: soft, `auto` budget: the host's available memory minus {}{most}\n",
            format_size(args.reserve)
        ),
    }
}
