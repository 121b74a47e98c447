//! `tidepool coord`: the global soft-memory coordinator (Midas §4.3, decision 12).
//!
//! ```text
//! runtime (tidepool-soft) ──Hello + memfd (SCM_RIGHTS)──► accept thread ─► one thread per app
//!         ◄──Welcome / Budget / Punched / Weight──────── control thread (every 5 ms):
//!         ──Report every heartbeat (100 ms)───────────►    headroom = MemAvailable and cgroups
//!                                                           pool = headroom + Σ held − reserve
//!                                                           each epoch (250 ms): utilities from
//!                                                           ghost hits ─► Planner ─► budgets
//!                                                           over the pool: budgets cut (coop.);
//!                                                           severe or too slow: holes punched in
//!                                                           the coldest segments (direct)
//! HTTP (--http): dashboard, /api/state, /metrics, weights
//! ```
//!
//! Memory an application holds is measured, not reported: the blocks of its memfd (fstat).
//! An application that exits or dies closes its socket; its memfd is closed at once, and its
//! budget goes to the others at the next epoch.

mod access;
mod control;
pub mod http;
mod metrics;
pub mod policy;
mod reading;
mod registry;
mod snapshot;
mod transport;

pub use access::default_token_file;
pub use policy::{Candidate, Planner, Policy};
pub use snapshot::{AppSnapshot, CurvePoint, Sample, Snapshot};

use control::control_loop;
use registry::{Shared, State};
use transport::accept_loop;

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidepool_soft::budget::MemoryView;
use tidepool_soft::coord::{Channel, Listener};

/// How the coordinator runs: [`Config::default`], then the setters below for what differs from
/// the defaults each one names.
#[derive(Debug, Clone)]
pub struct Config {
    /// The socket runtimes join at.
    pub(crate) socket: PathBuf,
    /// Members of this group may join too (socket 0660, directory 0750); else only the owner.
    pub(crate) group: Option<u32>,
    /// The HTTP token's file [default: beside the socket, `.token`].
    pub(crate) token_file: Option<PathBuf>,
    /// How budgets are planned.
    pub(crate) policy: Policy,
    /// Headroom always left to everything else (bytes).
    pub(crate) reserve: u64,
    /// Soft memory in all never exceeds this.
    pub(crate) max: u64,
    /// How often runtimes report.
    pub(crate) heartbeat: Duration,
    /// How often budgets are planned.
    pub(crate) epoch: Duration,
    /// How often memory is looked at.
    pub(crate) tick: Duration,
    /// No budget is cut under this while the pool allows.
    pub(crate) floor: u64,
    /// A runtime has this long to give memory back itself before holes are punched.
    pub(crate) grace: Duration,
    /// Epochs of history kept for the dashboard.
    pub(crate) history: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: default_socket(),
            group: None,
            token_file: None,
            policy: Policy::Midas,
            reserve: 512 << 20,
            max: u64::MAX,
            heartbeat: Duration::from_millis(100),
            epoch: Duration::from_millis(250),
            tick: Duration::from_millis(5),
            floor: 8 << 20,
            grace: Duration::from_millis(500),
            history: 2400,
        }
    }
}

impl Config {
    /// The socket runtimes join at.
    /// Default: [`default_socket`].
    pub fn socket(mut self, value: PathBuf) -> Config {
        self.socket = value;
        self
    }

    /// Members of this group may join too (socket 0660, directory 0750).
    /// Default: only the owner may join (socket 0600, directory 0700).
    pub fn group(mut self, value: u32) -> Config {
        self.group = Some(value);
        self
    }

    /// The file of the token that changes over HTTP need (made if missing).
    /// Default: beside the socket ([`default_token_file`]).
    pub fn token_file(mut self, value: PathBuf) -> Config {
        self.token_file = Some(value);
        self
    }

    /// How budgets are planned.
    /// Default: [`Policy::Midas`].
    pub fn policy(mut self, value: Policy) -> Config {
        self.policy = value;
        self
    }

    /// Headroom always left to everything else, in bytes.
    /// Default: 512 MiB.
    pub fn reserve(mut self, value: u64) -> Config {
        self.reserve = value;
        self
    }

    /// Soft memory in all never exceeds this, in bytes.
    /// Default: no limit (`u64::MAX`).
    pub fn max(mut self, value: u64) -> Config {
        self.max = value;
        self
    }

    /// How often runtimes report.
    /// Default: 100 ms.
    pub fn heartbeat(mut self, value: Duration) -> Config {
        self.heartbeat = value;
        self
    }

    /// How often budgets are planned.
    /// Default: 250 ms.
    pub fn epoch(mut self, value: Duration) -> Config {
        self.epoch = value;
        self
    }

    /// How often memory is looked at.
    /// Default: 5 ms.
    pub fn tick(mut self, value: Duration) -> Config {
        self.tick = value;
        self
    }

    /// No budget is cut under this (bytes) while the pool allows.
    /// Default: 8 MiB.
    pub fn floor(mut self, value: u64) -> Config {
        self.floor = value;
        self
    }

    /// A runtime has this long to give memory back itself before holes are punched.
    /// Default: 500 ms.
    pub fn grace(mut self, value: Duration) -> Config {
        self.grace = value;
        self
    }

    /// Epochs of history kept for the dashboard.
    /// Default: 2400 (ten minutes of 250 ms epochs).
    pub fn history(mut self, value: usize) -> Config {
        self.history = value;
        self
    }
}

/// Where `tidepool coord` listens unless told otherwise: `$XDG_RUNTIME_DIR/tidepool/coord.sock`,
/// else `/tmp/tidepool-UID/coord.sock` (a directory of this user's, mode 0700).
pub fn default_socket() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("tidepool"),
        None => PathBuf::from(format!(
            "/tmp/tidepool-{}",
            rustix::process::geteuid().as_raw()
        )),
    }
    .join("coord.sock")
}

/// A running coordinator; it stops when dropped.
pub struct Coordinator {
    shared: Arc<Shared>,
    listener: Arc<Listener>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("socket", &self.listener.path())
            .finish()
    }
}

impl Coordinator {
    /// Listens at `config.socket` and starts the accept and control threads.
    pub fn start(config: Config) -> io::Result<Coordinator> {
        access::prepare_dir(
            &config.socket,
            config.group,
            config.socket == default_socket(),
        )?;
        let listener = Arc::new(Listener::bind(&config.socket, config.group)?);
        let token_file = config
            .token_file
            .clone()
            .unwrap_or_else(|| default_token_file(&config.socket));
        let (token, made) = access::load_or_create_token(&token_file).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("the HTTP token at {}: {e}", token_file.display()),
            )
        })?;
        let segment = 2 << 20;
        // The pool before the first tick, so that the first application to join gets a share.
        let pool = (MemoryView::of_this_process().headroom() as u64)
            .saturating_sub(config.reserve)
            .min(config.max);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                apps: Vec::new(),
                max: config.max,
                next_id: 1,
                planner: Planner::new(config.policy, segment, config.floor),
                mem_available: 0,
                headroom: 0,
                pool,
                pressure: 0.0,
                below_since: None,
                longest_below: Duration::ZERO,
                punched_bytes: 0,
                epoch_due: true,
                epochs: 0,
                history: VecDeque::new(),
            }),
            config,
            owner_uid: rustix::process::geteuid().as_raw(),
            token,
            token_file,
            made_token: made,
            latencies: metrics::Latencies::default(),
            stop: AtomicBool::new(false),
            started: Instant::now(),
        });
        let (s, l) = (shared.clone(), listener.clone());
        std::thread::Builder::new()
            .name("tp-coord-accept".into())
            .spawn(move || accept_loop(s, l))?;
        let s = shared.clone();
        std::thread::Builder::new()
            .name("tp-coord-control".into())
            .spawn(move || control_loop(s))?;
        Ok(Coordinator { shared, listener })
    }

    pub fn socket(&self) -> &std::path::Path {
        self.listener.path()
    }

    /// The state now.
    pub fn snapshot(&self) -> Snapshot {
        self.shared.snapshot()
    }

    /// Where the token that changes over HTTP need is kept.
    pub fn token_file(&self) -> &std::path::Path {
        &self.shared.token_file
    }

    /// The history the dashboard charts.
    pub fn history(&self) -> Vec<Sample> {
        self.shared.state.lock().history.iter().cloned().collect()
    }

    /// Changes an application's weight; `false` if there is no such application.
    pub fn set_weight(&self, app: u32, weight: f64) -> bool {
        self.shared.set_weight(app, weight)
    }

    /// Changes the most soft memory all applications may hold together; lowering it cuts
    /// budgets at once.
    pub fn set_max(&self, bytes: u64) {
        self.shared.state.lock().max = bytes;
    }

    /// Serves the dashboard, the JSON API and Prometheus metrics at `addr` (a thread of its
    /// own); the address it bound.
    pub fn serve_http(&self, addr: std::net::SocketAddr) -> io::Result<std::net::SocketAddr> {
        http::serve(self.shared.clone(), addr)
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.shared.stop.store(true, Release);
        if self.shared.made_token {
            let _ = std::fs::remove_file(&self.shared.token_file);
        }
        // Wake the accept thread.
        let _ = Channel::connect(self.listener.path());
    }
}
