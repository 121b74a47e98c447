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
pub mod http;
mod metrics;
pub mod policy;

pub use access::default_token_file;
pub use policy::{Candidate, Planner, Policy};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{HashSet, VecDeque};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidepool_proto::coord::{
    ghost_bucket_limit, FromCoord, Report, SegmentRun, ToCoord, GHOST_BUCKETS, MAX_MESSAGE,
    MAX_PUNCHED,
};
use tidepool_soft::budget::{mem_available, memory_stall_us, MemoryView};
use tidepool_soft::coord::{Channel, Listener};

/// How the coordinator runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub socket: PathBuf,
    /// Members of this group may join too (socket 0660, directory 0750); else only the owner.
    pub group: Option<u32>,
    /// The HTTP token's file [default: beside the socket, `.token`].
    pub token_file: Option<PathBuf>,
    pub policy: Policy,
    /// Headroom always left to everything else (bytes).
    pub reserve: u64,
    /// Soft memory in all never exceeds this.
    pub max: u64,
    /// How often runtimes report.
    pub heartbeat: Duration,
    /// How often budgets are planned.
    pub epoch: Duration,
    /// How often memory is looked at.
    pub tick: Duration,
    /// No budget is cut under this while the pool allows.
    pub floor: u64,
    /// A runtime has this long to give memory back itself before holes are punched.
    pub grace: Duration,
    /// Epochs of history kept for the dashboard.
    pub history: usize,
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

/// One application as the dashboard shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AppSnapshot {
    pub id: u32,
    pub name: String,
    pub pid: u32,
    /// The user it runs as.
    pub uid: u32,
    pub weight: f64,
    pub budget: u64,
    /// Bytes its memfd holds (measured).
    pub held: u64,
    pub hits: u64,
    pub misses: u64,
    /// Objects rebuilt, and the time that took, since it joined.
    pub reconstructions: u64,
    pub reconstruction_seconds: f64,
    /// Over the last epoch.
    pub hit_rate: f64,
    /// Reads per second over the last epoch.
    pub reads_per_s: f64,
    /// Share of time spent reconstructing over the last epoch (CPU-seconds per second).
    pub rebuild_share: f64,
    /// Marginal utility: what a MiB more would save per second (reconstruction ms for
    /// midas, hits for hitrate).
    pub utility_per_mib: f64,
    pub punched_bytes: u64,
    pub seconds: f64,
}

/// The coordinator's state as the dashboard and `tidepool top` show it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub seconds: f64,
    pub policy: Policy,
    pub reserve: u64,
    pub mem_available: u64,
    /// The least headroom of MemAvailable and the coordinator's memory cgroups.
    pub headroom: u64,
    /// Idle memory for soft memory: headroom + what soft memory holds − reserve.
    pub pool: u64,
    pub granted: u64,
    pub held: u64,
    /// Share of the last 100 ms some task stalled on memory (PSI).
    pub pressure: f64,
    /// Time some task on the host stalled on memory since boot (PSI's total), seconds.
    pub memory_stall_seconds: f64,
    /// Longest time the headroom stayed under the reserve, milliseconds.
    pub longest_below_reserve_ms: f64,
    pub punched_bytes: u64,
    pub apps: Vec<AppSnapshot>,
}

/// One epoch of history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    pub seconds: f64,
    pub pool: u64,
    pub headroom: u64,
    pub held: u64,
    /// (id, budget, held, utility per MiB, hit rate) per application.
    pub apps: Vec<(u32, u64, u64, f64, f64)>,
}

struct App {
    id: u32,
    name: String,
    /// As the kernel saw it connect (SO_PEERCRED), not as it said.
    pid: u32,
    uid: u32,
    weight: f64,
    segment: u64,
    capacity: u64,
    memfd: OwnedFd,
    chan: Arc<Channel>,
    budget: u64,
    held: u64,
    report: Report,
    base: Report,
    base_at: Instant,
    last_report: Instant,
    joined: Instant,
    utility: f64,
    demand: bool,
    /// The last epoch in which it dropped objects to make room, and the last in which its
    /// budget grew (a drop counts as wanting more only if it came after the growth).
    dropped_epoch: Option<u64>,
    grown_epoch: u64,
    hit_rate: f64,
    reads_per_s: f64,
    rebuild_share: f64,
    punched_since_report: HashSet<u32>,
    shrink_deadline: Option<Instant>,
    punched_bytes: u64,
}

impl App {
    fn measure(&mut self) {
        if let Ok(st) = rustix::fs::fstat(&self.memfd) {
            self.held = st.st_blocks as u64 * 512;
        }
    }

    /// What the planner sees of it (`epochs`: the coordinator's count).
    fn candidate(&self, epochs: u64) -> Candidate {
        // Budget given in the last seconds is being rebuilt into, not unused.
        let settled = !self.demand && epochs > self.grown_epoch + 2 * DEMAND_EPOCHS;
        Candidate {
            unused: if settled {
                self.budget.saturating_sub(self.held + 2 * self.segment)
            } else {
                0
            },
            id: self.id,
            weight: self.weight,
            budget: self.budget,
            capacity: self.capacity,
            utility: self.utility,
            demand: self.demand,
        }
    }

    fn send(&self, m: &FromCoord) {
        // A failed send means the runtime is gone; its own thread notices and removes it.
        let _ = self.chan.send(&m.encode());
    }

    fn snapshot(&self, policy: Policy) -> AppSnapshot {
        AppSnapshot {
            id: self.id,
            name: self.name.clone(),
            pid: self.pid,
            uid: self.uid,
            weight: self.weight,
            budget: self.budget,
            held: self.held,
            hits: self.report.hits,
            misses: self.report.misses,
            reconstructions: self.report.reconstructions,
            reconstruction_seconds: self.report.reconstruct_nanos as f64 / 1e9,
            hit_rate: self.hit_rate,
            reads_per_s: self.reads_per_s,
            rebuild_share: self.rebuild_share,
            utility_per_mib: self.utility
                * (1 << 20) as f64
                * if policy == Policy::Midas { 1e-6 } else { 1.0 },
            punched_bytes: self.punched_bytes,
            seconds: self.joined.elapsed().as_secs_f64(),
        }
    }
}

struct State {
    apps: Vec<App>,
    /// Soft memory in all never exceeds this (the operator may change it).
    max: u64,
    next_id: u32,
    planner: Planner,
    mem_available: u64,
    headroom: u64,
    pool: u64,
    pressure: f64,
    below_since: Option<Instant>,
    longest_below: Duration,
    punched_bytes: u64,
    epoch_due: bool,
    /// Epochs so far.
    epochs: u64,
    history: VecDeque<Sample>,
}

/// Epochs a drop counts as wanting more. Evacuation drops in bursts: an application that
/// holds nearly all it uses drops a few objects every second or two, not every epoch.
const DEMAND_EPOCHS: u64 = 8;

struct Shared {
    config: Config,
    /// The user the coordinator runs as: it (and root) may change any registration.
    owner_uid: u32,
    /// Bearer token for changes over HTTP.
    token: String,
    /// The token's file, and whether this coordinator made it (then it goes at stop).
    token_file: PathBuf,
    made_token: bool,
    latencies: metrics::Latencies,
    state: Mutex<State>,
    stop: AtomicBool,
    started: Instant,
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

impl Shared {
    fn snapshot(&self) -> Snapshot {
        let s = self.state.lock();
        let below = s
            .below_since
            .map(|t| t.elapsed())
            .unwrap_or_default()
            .max(s.longest_below);
        Snapshot {
            seconds: self.started.elapsed().as_secs_f64(),
            policy: s.planner.policy,
            reserve: self.config.reserve,
            mem_available: s.mem_available,
            headroom: s.headroom,
            pool: s.pool,
            granted: s.apps.iter().map(|a| a.budget).sum(),
            held: s.apps.iter().map(|a| a.held).sum(),
            pressure: s.pressure,
            memory_stall_seconds: memory_stall_us().unwrap_or(0) as f64 / 1e6,
            longest_below_reserve_ms: below.as_secs_f64() * 1e3,
            punched_bytes: s.punched_bytes,
            apps: s
                .apps
                .iter()
                .map(|a| a.snapshot(s.planner.policy))
                .collect(),
        }
    }

    /// A weight change asked for over the socket by `peer` (from application `own`'s connection,
    /// if it has registered): the answer to send back.
    fn command_set_weight(
        &self,
        peer: tidepool_soft::coord::Peer,
        own: Option<u32>,
        app: u32,
        weight: f64,
    ) -> FromCoord {
        let app_uid = self
            .state
            .lock()
            .apps
            .iter()
            .find(|a| a.id == app)
            .map(|a| a.uid);
        let Some(app_uid) = app_uid else {
            return FromCoord::Error {
                message: format!("no application {app}"),
            };
        };
        if !access::may_change(peer, self.owner_uid, app_uid, own == Some(app)) {
            tracing::warn!(
                app,
                uid = peer.uid,
                pid = peer.pid,
                "coordinator: refused a weight change from another user"
            );
            return FromCoord::Error {
                message: format!(
                    "refused: uid {} may change only applications that run as uid {0}, and \
                     application {app} does not; ask the coordinator's owner (uid {}) or root",
                    peer.uid, self.owner_uid
                ),
            };
        }
        if self.set_weight(app, weight) {
            FromCoord::Weight { weight }
        } else {
            FromCoord::Error {
                message: format!("no application {app}"),
            }
        }
    }

    fn set_weight(&self, app: u32, weight: f64) -> bool {
        if !(weight.is_finite() && weight > 0.0) {
            return false;
        }
        let mut s = self.state.lock();
        let Some(a) = s.apps.iter_mut().find(|a| a.id == app) else {
            return false;
        };
        a.weight = weight;
        a.send(&FromCoord::Weight { weight });
        tracing::info!(app, name = %a.name, weight, "weight changed");
        s.epoch_due = true;
        true
    }
}

fn accept_loop(shared: Arc<Shared>, listener: Arc<Listener>) {
    loop {
        let ch = match listener.accept() {
            Ok(ch) => ch,
            Err(e) => {
                tracing::warn!("coordinator: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if shared.stop.load(Acquire) {
            return;
        }
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("tp-coord-app".into())
            .spawn(move || serve_app(s, Arc::new(ch)));
        if let Err(e) = spawned {
            tracing::warn!("coordinator: cannot start a thread for an application: {e}");
        }
    }
}

/// One application's connection: registration, then reports until it leaves.
fn serve_app(shared: Arc<Shared>, ch: Arc<Channel>) {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let refuse = |why: String| {
        tracing::warn!("coordinator: refused an application: {why}");
        let _ = ch.send(&FromCoord::Error { message: why }.encode());
    };
    let peer = match ch.peer() {
        Ok(p) => p,
        Err(e) => return refuse(format!("its credentials cannot be read: {e}")),
    };
    let (msg, memfd) = match ch.recv(&mut buf, Some(Duration::from_secs(5))) {
        Ok(Some((n, fd))) => (ToCoord::decode(&buf[..n]), fd),
        Ok(None) => return refuse("no hello within 5 s".into()),
        Err(_) => return,
    };
    let (weight, segment, capacity, name) = match msg {
        Ok(ToCoord::Hello {
            weight,
            segment,
            capacity,
            name,
            ..
        }) => (weight, segment as u64, capacity, name),
        Ok(ToCoord::SetWeight { app, weight }) => {
            return serve_commands(&shared, &ch, peer, app, weight, &mut buf)
        }
        Ok(other) => return refuse(format!("expected hello first, got {other:?}")),
        Err(e) => return refuse(format!("bad hello: {e}")),
    };
    // The process as the kernel knows it: a pid in the hello could name anyone.
    let (pid, uid) = (peer.pid, peer.uid);
    let Some(memfd) = memfd else {
        return refuse("the hello carried no memfd (SCM_RIGHTS)".into());
    };
    if !segment.is_power_of_two() || !(4096..=1 << 30).contains(&segment) {
        return refuse(format!(
            "segment size {segment} is not a power of two in 4K-1G"
        ));
    }
    if let Err(e) = rustix::fs::fstat(&memfd) {
        return refuse(format!("the memfd cannot be inspected: {e}"));
    }
    let id = {
        let mut s = shared.state.lock();
        let id = s.next_id;
        s.next_id += 1;
        // An even share of the pool; the others give it up in proportion to their budgets
        // (so applications that start together start even, as in Midas §7.1).
        let n = s.apps.len() as u64 + 1;
        let share = (s.pool / n / segment * segment).max(shared.config.floor.min(s.pool));
        let share = share.min(capacity);
        let granted: u64 = s.apps.iter().map(|a| a.budget).sum();
        if granted + share > s.pool && granted > 0 {
            let keep = s.pool.saturating_sub(share) as f64 / granted as f64;
            let cut: Vec<u64> = s
                .apps
                .iter()
                .map(|a| ((a.budget as f64 * keep) as u64 / a.segment * a.segment).max(a.segment))
                .collect();
            apply(&mut s, &cut);
        }
        let mean_utility = if s.apps.is_empty() {
            0.0
        } else {
            s.apps.iter().map(|a| a.utility).sum::<f64>() / s.apps.len() as f64
        };
        let now = Instant::now();
        let mut app = App {
            id,
            name: name.clone(),
            pid,
            uid,
            weight,
            segment,
            capacity,
            memfd,
            chan: ch.clone(),
            budget: share,
            held: 0,
            report: Report::default(),
            base: Report::default(),
            base_at: now,
            last_report: now,
            joined: now,
            utility: mean_utility,
            demand: false,
            dropped_epoch: None,
            grown_epoch: 0,
            hit_rate: 0.0,
            reads_per_s: 0.0,
            rebuild_share: 0.0,
            punched_since_report: HashSet::new(),
            shrink_deadline: None,
            punched_bytes: 0,
        };
        app.measure();
        app.send(&FromCoord::Welcome {
            app: id,
            budget: share,
            heartbeat_ms: shared.config.heartbeat.as_millis() as u32,
        });
        s.apps.push(app);
        s.epoch_due = true;
        id
    };
    tracing::info!(app = id, %name, pid, uid, weight, "application joined");
    let quiet = shared.config.heartbeat * 50;
    let why = loop {
        let n = match ch.recv(&mut buf, Some(quiet)) {
            Ok(Some((n, _))) => n,
            Ok(None) => break format!("no report for {quiet:?}"),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break "it exited".into(),
            Err(e) => break format!("{e}"),
        };
        match ToCoord::decode(&buf[..n]) {
            Ok(ToCoord::Report(r)) => {
                let mut s = shared.state.lock();
                if let Some(a) = s.apps.iter_mut().find(|a| a.id == id) {
                    a.report = *r;
                    a.last_report = Instant::now();
                    a.punched_since_report.clear();
                }
            }
            Ok(ToCoord::SetWeight { app, weight }) => {
                let reply = shared.command_set_weight(peer, Some(id), app, weight);
                if app != id {
                    let _ = ch.send(&reply.encode());
                }
            }
            Ok(ToCoord::Bye) => break "it said goodbye".into(),
            Ok(ToCoord::Hello { .. }) => break "a second hello".into(),
            Err(e) => break format!("a bad message: {e}"),
        }
    };
    let mut s = shared.state.lock();
    if let Some(i) = s.apps.iter().position(|a| a.id == id) {
        let a = s.apps.remove(i); // closes its memfd: its memory goes with the process
        tracing::info!(app = id, name = %a.name, budget = a.budget, "application left: {why}");
        s.epoch_due = true;
    }
}

/// A connection that only sends commands (`tidepool weight`): the first has come; answers it
/// and any that follow within 5 s each.
fn serve_commands(
    shared: &Shared,
    ch: &Channel,
    peer: tidepool_soft::coord::Peer,
    app: u32,
    weight: f64,
    buf: &mut [u8],
) {
    let mut next = Some((app, weight));
    while let Some((app, weight)) = next.take() {
        let reply = shared.command_set_weight(peer, None, app, weight);
        if ch.send(&reply.encode()).is_err() {
            return;
        }
        if let Ok(Some((n, _))) = ch.recv(buf, Some(Duration::from_secs(5))) {
            if let Ok(ToCoord::SetWeight { app, weight }) = ToCoord::decode(&buf[..n]) {
                next = Some((app, weight));
            }
        }
    }
}

/// Memory, pressure, budgets and reclamation, every tick.
fn control_loop(shared: Arc<Shared>) {
    let cfg = &shared.config;
    let view = MemoryView::of_this_process();
    let mut stall = (memory_stall_us(), Instant::now());
    let mut last_epoch = Instant::now();
    while !shared.stop.load(Acquire) {
        std::thread::sleep(cfg.tick);
        let tick_start = Instant::now();
        let available = mem_available();
        let headroom = view.headroom_under(available) as u64;
        let mem_available = available.unwrap_or(0) as u64;
        // PSI over the last 100 ms or so.
        let span = stall.1.elapsed();
        let mut pressure = None;
        if span >= Duration::from_millis(100) {
            let now = memory_stall_us();
            if let (Some(a), Some(b)) = (stall.0, now) {
                pressure = Some(b.saturating_sub(a) as f64 / span.as_micros().max(1) as f64);
            }
            stall = (now, Instant::now());
        }
        let mut s = shared.state.lock();
        let s = &mut *s;
        for a in s.apps.iter_mut() {
            a.measure();
        }
        if let Some(p) = pressure {
            s.pressure = p;
        }
        s.headroom = headroom;
        s.mem_available = mem_available;
        match (headroom < cfg.reserve, s.below_since) {
            (true, None) => s.below_since = Some(Instant::now()),
            (false, Some(t)) => {
                s.longest_below = s.longest_below.max(t.elapsed());
                s.below_since = None;
            }
            _ => {}
        }
        let held: u64 = s.apps.iter().map(|a| a.held).sum();
        let severe = headroom < cfg.reserve || s.pressure > 0.10;
        let mut pool = (headroom + held).saturating_sub(cfg.reserve).min(s.max);
        if severe {
            // Below the reserve: give back the shortfall and a quarter of the reserve more.
            pool = pool.saturating_sub(cfg.reserve / 4);
        }
        s.pool = pool;
        let granted: u64 = s.apps.iter().map(|a| a.budget).sum();
        if s.epoch_due || last_epoch.elapsed() >= cfg.epoch {
            let dt = last_epoch.elapsed();
            last_epoch = Instant::now();
            s.epoch_due = false;
            epoch(s, dt, shared.started);
        } else if granted > pool {
            cut(s);
        }
        reclaim_directly(s, severe, cfg.grace, &shared.latencies.reclaim);
        if s.history.len() > cfg.history {
            s.history.pop_front();
        }
        shared
            .latencies
            .tick
            .observe(tick_start.elapsed().as_secs_f64());
    }
}

/// Utilities from the last epoch's reports, then a plan.
fn epoch(s: &mut State, _dt: Duration, started: Instant) {
    s.epochs += 1;
    let policy = s.planner.policy;
    for a in s.apps.iter_mut() {
        let probe = s.planner.step(a.id).max(2 * s.planner.segment);
        // The smallest ghost bucket that covers the probe.
        let k = (0..GHOST_BUCKETS)
            .find(|&k| ghost_bucket_limit(k) >= probe)
            .unwrap_or(GHOST_BUCKETS - 1);
        let (r, b) = (&a.report, &a.base);
        let secs = a.last_report.duration_since(a.base_at).as_secs_f64();
        if secs <= 0.0 {
            continue;
        }
        let d = |x: u64, y: u64| x.saturating_sub(y) as f64;
        let hits = d(r.hits, b.hits);
        let misses = d(r.misses, b.misses);
        a.hit_rate = if hits + misses > 0.0 {
            hits / (hits + misses)
        } else {
            a.hit_rate
        };
        a.reads_per_s = (hits + misses) / secs;
        a.rebuild_share = d(r.reconstruct_nanos, b.reconstruct_nanos) / secs / 1e9;
        let gain: f64 = (0..=k)
            .map(|i| match policy {
                Policy::Hitrate => d(r.ghost_hits[i], b.ghost_hits[i]),
                _ => d(r.ghost_nanos[i], b.ghost_nanos[i]),
            })
            .sum();
        let u = gain / ghost_bucket_limit(k) as f64 / secs;
        a.utility = 0.5 * a.utility + 0.5 * u;
        // Dropping objects to make room is wanting more. (Not also "holds its whole budget":
        // an arena keeps a few segments of its budget unpopulated as it evacuates, so that
        // test starved every application of grants.)
        if r.bytes_dropped > b.bytes_dropped {
            a.dropped_epoch = Some(s.epochs);
        }
        a.demand = a
            .dropped_epoch
            .is_some_and(|e| e > a.grown_epoch && s.epochs - e < DEMAND_EPOCHS);
        tracing::debug!(
            app = a.id,
            name = %a.name,
            budget = a.budget >> 20,
            held = a.held >> 20,
            dropped = d(r.bytes_dropped, b.bytes_dropped) as u64 >> 20,
            utility = a.utility,
            demand = a.demand,
            secs,
            "epoch"
        );
        a.base = r.clone();
        a.base_at = a.last_report;
    }
    let candidates: Vec<Candidate> = s.apps.iter().map(|a| a.candidate(s.epochs)).collect();
    let budgets = s.planner.plan(&candidates, s.pool);
    apply(s, &budgets);
    s.history.push_back(Sample {
        seconds: started.elapsed().as_secs_f64(),
        pool: s.pool,
        headroom: s.headroom,
        held: s.apps.iter().map(|a| a.held).sum(),
        apps: s
            .apps
            .iter()
            .map(|a| {
                let snap = a.snapshot(policy);
                (a.id, a.budget, a.held, snap.utility_per_mib, a.hit_rate)
            })
            .collect(),
    });
}

/// Between epochs: budgets over the pool are cut at once (unused budget, then those that
/// would lose least, first).
fn cut(s: &mut State) {
    let candidates: Vec<Candidate> = s.apps.iter().map(|a| a.candidate(s.epochs)).collect();
    let mut b: Vec<u64> = s.apps.iter().map(|a| a.budget).collect();
    let over = b.iter().sum::<u64>().saturating_sub(s.pool);
    s.planner.shrink(&candidates, &mut b, over);
    apply(s, &b);
}

/// Sends the budgets that changed; a cut starts the grace period for cooperative reclamation.
fn apply(s: &mut State, budgets: &[u64]) {
    for (a, &b) in s.apps.iter_mut().zip(budgets) {
        if b == a.budget {
            continue;
        }
        if b < a.budget {
            a.shrink_deadline.get_or_insert(Instant::now());
        } else {
            a.grown_epoch = s.epochs;
        }
        a.budget = b;
        a.send(&FromCoord::Budget { budget: b });
    }
}

/// Punches holes in applications holding more than their budget: at once when pressure is
/// severe, else once their grace period is over (they were too slow).
fn reclaim_directly(
    s: &mut State,
    severe: bool,
    grace: Duration,
    latency: &prometheus_client::metrics::histogram::Histogram,
) {
    let mut punched_total = 0;
    for a in s.apps.iter_mut() {
        let slack = 2 * a.segment;
        let excess = a.held.saturating_sub(a.budget + slack);
        if excess == 0 {
            if let Some(t) = a.shrink_deadline.take() {
                latency.observe(t.elapsed().as_secs_f64());
            }
            continue;
        }
        // The grace period runs from the cut, or from when the excess was first seen.
        let late = a.shrink_deadline.get_or_insert_with(Instant::now).elapsed() > grace;
        if !(severe || late) {
            continue;
        }
        let runs = punch(a, excess);
        if !runs.is_empty() {
            let bytes: u64 = runs.iter().map(|r| r.len as u64 * a.segment).sum();
            a.punched_bytes += bytes;
            punched_total += bytes;
            tracing::debug!(app = a.id, bytes, severe, "punched");
            for chunk in runs.chunks(MAX_PUNCHED) {
                a.send(&FromCoord::Punched {
                    runs: chunk.to_vec(),
                });
            }
            a.measure();
        }
    }
    s.punched_bytes += punched_total;
}

/// Punches at least `bytes` out of an application's memfd: its coldest closed segments
/// first (as it last reported them), then whatever it still holds.
fn punch(a: &mut App, bytes: u64) -> Vec<SegmentRun> {
    let seg = a.segment;
    let mut runs = Vec::new();
    let mut freed = 0;
    let fd = a.memfd.as_fd();
    for r in &a.report.cold {
        if freed >= bytes {
            break;
        }
        if a.punched_since_report.contains(&r.first) {
            continue;
        }
        let len = r.len.max(1) as u64 * seg;
        if tidepool_soft::sys::punch_hole(fd, (r.first as u64 * seg) as usize, len as usize).is_ok()
        {
            a.punched_since_report.insert(r.first);
            runs.push(*r);
            freed += len;
        }
    }
    // The cold list ran out: whatever is populated (free segments, allocation heads).
    let mut at = 0u64;
    while freed < bytes {
        let Ok(data) = rustix::fs::seek(&a.memfd, rustix::fs::SeekFrom::Data(at)) else {
            break; // ENXIO: nothing populated past `at`
        };
        let first = data / seg;
        let start = first * seg;
        if tidepool_soft::sys::punch_hole(fd, start as usize, seg as usize).is_err() {
            break;
        }
        a.punched_since_report.insert(first as u32);
        runs.push(SegmentRun {
            first: first as u32,
            len: 1,
        });
        freed += seg;
        at = start + seg;
    }
    runs
}
