//! Joining `tidepool coord` (Midas §4.3): the coordinator decides the arena's budget.
//!
//! When a coordinator is configured (`TIDEPOOL_COORD=/path/to/socket`, or
//! [`crate::SoftRuntime::join_coordinator`]), a thread per arena connects over a Unix `SOCK_SEQPACKET`
//! socket, hands over the arena's memfd (`SCM_RIGHTS`), and reports every heartbeat: budget,
//! usage, hits and misses, reconstruction time, ghost hits ([`crate::demand`]) and the closed
//! segments coldest first. It follows the budgets it is sent — shrinking *cooperatively*: the
//! evacuator drops the coldest objects and compacts the rest before segments are given back
//! — and retires the segments the coordinator punched itself (*direct* reclamation, when the
//! runtime is too slow or pressure too severe). The coordinator may punch any page at any
//! time: the resilient copy makes that safe; being told only keeps the accounting exact.
//!
//! If the coordinator is not there or goes away, the arena follows memory pressure on its
//! own (the `auto` budget) and tries again every second.

use crate::arena::{SoftArena, SEGMENT};
use crate::budget::{AutoBudget, AutoStepper};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tidepool_proto::coord::{AppKind, FromCoord, Report, ToCoord, MAX_COLD, MAX_MESSAGE};

/// The environment variable naming the coordinator's socket.
pub const ENV_SOCKET: &str = "TIDEPOOL_COORD";

pub use tidepool_sys::seqpacket::{Channel, Listener, Peer};

// ---- the runtime's side -------------------------------------------------------------------------

/// Where the coordinator is and how this arena introduces itself: [`CoordConfig::new`] with the
/// socket (or [`CoordConfig::from_env`]), then the setters below for what differs from the
/// defaults each one names.
#[derive(Debug, Clone)]
pub struct CoordConfig {
    /// The coordinator's socket.
    pub(crate) socket: PathBuf,
    /// Shown on the dashboard (default: the program's name).
    pub(crate) name: String,
    /// The operator's weight (default 1).
    pub(crate) weight: f64,
}

impl CoordConfig {
    /// The coordinator listening at `socket`, joined under the program's name with weight 1.
    pub fn new(socket: impl Into<PathBuf>) -> CoordConfig {
        CoordConfig {
            socket: socket.into(),
            name: program_name(),
            weight: 1.0,
        }
    }

    /// From the environment: `TIDEPOOL_COORD` (the socket; nothing without it),
    /// `TIDEPOOL_APP` (the name), `TIDEPOOL_WEIGHT`.
    pub fn from_env() -> Option<CoordConfig> {
        let socket = std::env::var_os(ENV_SOCKET).filter(|s| !s.is_empty())?;
        let mut config = CoordConfig::new(socket);
        if let Ok(name) = std::env::var("TIDEPOOL_APP") {
            config = config.name(name);
        }
        if let Some(weight) = std::env::var("TIDEPOOL_WEIGHT")
            .ok()
            .and_then(|w| w.parse().ok())
            .filter(|w: &f64| w.is_finite() && *w > 0.0)
        {
            config = config.weight(weight);
        }
        Some(config)
    }

    /// The name the dashboard shows for this arena.
    /// Default: the program's name (`/proc/self/comm`; `soft` where that cannot be read).
    pub fn name(mut self, value: impl Into<String>) -> CoordConfig {
        self.name = value.into();
        self
    }

    /// The operator's weight: a share of memory in proportion to it, other things equal (the
    /// coordinator clamps it to what it accepts).
    /// Default: 1.
    pub fn weight(mut self, value: f64) -> CoordConfig {
        self.weight = value;
        self
    }
}

/// The program's name as the kernel has it, or `soft`.
fn program_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "soft".into())
}

/// How an arena's link to the coordinator stands.
#[derive(Debug, Default)]
pub struct CoordLink {
    connected: AtomicBool,
    app: AtomicU32,
    budgets: AtomicU64,
    punched_segments: AtomicU64,
    reports: AtomicU64,
}

impl CoordLink {
    /// Registered, and the coordinator is answering.
    pub fn connected(&self) -> bool {
        self.connected.load(Acquire)
    }
    /// The id the coordinator gave this arena.
    pub fn app(&self) -> u32 {
        self.app.load(Relaxed)
    }
    /// Budgets received so far (the welcome's included).
    pub fn budgets(&self) -> u64 {
        self.budgets.load(Relaxed)
    }
    /// Segments the coordinator said it punched.
    pub fn punched_segments(&self) -> u64 {
        self.punched_segments.load(Relaxed)
    }
    /// Reports sent.
    pub fn reports(&self) -> u64 {
        self.reports.load(Relaxed)
    }
}

enum Ended {
    ArenaGone,
    Lost(io::Error),
}

/// Hands `arena`'s budget to the coordinator at `config.socket` (see the module docs); a
/// thread keeps the link until the arena is dropped or `stop` is set.
pub(crate) fn join(
    arena: &Arc<SoftArena>,
    config: CoordConfig,
    stop: Arc<AtomicBool>,
) -> io::Result<Arc<CoordLink>> {
    let link = Arc::new(CoordLink::default());
    arena.track_dropped_segments();
    let weak = Arc::downgrade(arena);
    let l = link.clone();
    std::thread::Builder::new()
        .name("tp-soft-coord".into())
        .spawn(move || keep_link(Held { weak, stop }, config, l))?;
    Ok(link)
}

/// What the coordinator is told every heartbeat about `arena`.
pub fn report(arena: &SoftArena) -> Report {
    let d = arena.demand();
    Report {
        budget: arena.budget() as u64,
        usage: arena.usage() as u64,
        hits: d.hits,
        misses: d.misses,
        reconstructions: d.reconstructions,
        reconstruct_nanos: d.reconstruct_nanos,
        ghost_hits: d.ghost_hits,
        ghost_nanos: d.ghost_nanos,
        bytes_dropped: d.bytes_dropped,
        cold: arena.cold_runs(MAX_COLD),
    }
}

/// The arena a link serves, while it lives and the runtime wants the link.
struct Held {
    weak: Weak<SoftArena>,
    stop: Arc<AtomicBool>,
}

impl Held {
    fn get(&self) -> Option<Arc<SoftArena>> {
        if self.stop.load(Acquire) {
            return None;
        }
        self.weak.upgrade()
    }
}

/// The link thread: sessions with the coordinator, and the arena on its own in between.
fn keep_link(held: Held, config: CoordConfig, link: Arc<CoordLink>) {
    let mut outage_said = false;
    let mut alone = AutoStepper::new(AutoBudget::default());
    loop {
        match session(&held, &config, &link, &mut outage_said) {
            Ended::ArenaGone => return,
            Ended::Lost(e) => {
                link.connected.store(false, Release);
                if !outage_said {
                    tracing::warn!(
                        socket = %config.socket.display(),
                        "soft memory: no coordinator ({e}); following memory pressure alone \
                         and trying again every second (start one with `tidepool coord`)"
                    );
                    outage_said = true;
                }
            }
        }
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            let Some(arena) = held.get() else { return };
            alone.step(&arena);
            drop(arena);
            std::thread::sleep(alone.interval());
        }
    }
}

/// One session with the coordinator: the hello and its welcome, then a report every heartbeat
/// and the coordinator's orders in between, until the link is lost or the arena gone.
fn session(held: &Held, config: &CoordConfig, link: &CoordLink, outage_said: &mut bool) -> Ended {
    let ch = match Channel::connect(&config.socket) {
        Ok(ch) => ch,
        Err(e) => return Ended::Lost(e),
    };
    if let Err(ended) = hello(held, config, &ch) {
        return ended;
    }
    let mut buf = vec![0u8; MAX_MESSAGE];
    let heartbeat = match welcome(held, link, &ch, &mut buf) {
        Ok(heartbeat) => heartbeat,
        Err(ended) => return ended,
    };
    link.connected.store(true, Release);
    if *outage_said {
        tracing::info!(socket = %config.socket.display(), "soft memory: coordinator is back");
        *outage_said = false;
    }
    loop {
        if let Err(ended) = send_report(held, link, &ch) {
            return ended;
        }
        let due = Instant::now() + heartbeat;
        if let Err(ended) = follow_orders(held, link, &ch, &mut buf, due) {
            return ended;
        }
    }
}

/// Introduces the arena to the coordinator, handing over its memfd.
fn hello(held: &Held, config: &CoordConfig, ch: &Channel) -> Result<(), Ended> {
    let Some(arena) = held.get() else {
        return Err(Ended::ArenaGone);
    };
    let msg = ToCoord::Hello {
        kind: AppKind::Soft,
        pid: std::process::id(),
        weight: config.weight,
        segment: SEGMENT as u32,
        capacity: arena.capacity() as u64,
        min: 0,
        budget: arena.budget() as u64,
        name: config.name.clone(),
    };
    ch.send_with_fd(&msg.encode(), arena.memfd())
        .map_err(Ended::Lost)
}

/// Waits up to 5 s for the coordinator's welcome, follows the budget it sets, and returns the
/// heartbeat it asks for.
fn welcome(held: &Held, link: &CoordLink, ch: &Channel, buf: &mut [u8]) -> Result<Duration, Ended> {
    let lost = Ended::Lost;
    match ch.recv(buf, Some(Duration::from_secs(5))) {
        Ok(Some((n, _))) => match FromCoord::decode(&buf[..n]) {
            Ok(FromCoord::Welcome {
                app,
                budget,
                heartbeat_ms,
            }) => {
                link.app.store(app, Relaxed);
                let Some(arena) = held.get() else {
                    return Err(Ended::ArenaGone);
                };
                arena.follow_budget(budget as usize);
                link.budgets.fetch_add(1, Relaxed);
                Ok(Duration::from_millis(heartbeat_ms.clamp(1, 10_000) as u64))
            }
            Ok(FromCoord::Error { message }) => {
                Err(lost(io::Error::other(format!("refused: {message}"))))
            }
            Ok(other) => Err(lost(io::Error::other(format!(
                "expected a welcome, got {other:?}"
            )))),
            Err(e) => Err(lost(io::Error::new(io::ErrorKind::InvalidData, e))),
        },
        Ok(None) => Err(lost(io::Error::other("no welcome within 5 s"))),
        Err(e) => Err(lost(e)),
    }
}

/// Sends this heartbeat's report, or says goodbye if the arena is gone.
fn send_report(held: &Held, link: &CoordLink, ch: &Channel) -> Result<(), Ended> {
    let Some(arena) = held.get() else {
        let _ = ch.send(&ToCoord::Bye.encode());
        return Err(Ended::ArenaGone);
    };
    ch.send(&ToCoord::Report(Box::new(report(&arena))).encode())
        .map_err(Ended::Lost)?;
    link.reports.fetch_add(1, Relaxed);
    Ok(())
}

/// Follows the budgets and punched segments the coordinator sends until `due`.
fn follow_orders(
    held: &Held,
    link: &CoordLink,
    ch: &Channel,
    buf: &mut [u8],
    due: Instant,
) -> Result<(), Ended> {
    let lost = Ended::Lost;
    loop {
        let n = match ch.recv_until(buf, due) {
            Ok(Some(n)) => n,
            Ok(None) => return Ok(()),
            Err(e) => return Err(lost(e)),
        };
        let Some(arena) = held.get() else {
            let _ = ch.send(&ToCoord::Bye.encode());
            return Err(Ended::ArenaGone);
        };
        match FromCoord::decode(&buf[..n]) {
            Ok(FromCoord::Budget { budget }) => {
                arena.follow_budget(budget as usize);
                link.budgets.fetch_add(1, Relaxed);
            }
            Ok(FromCoord::Punched { runs }) => {
                let n: u64 = runs.iter().map(|r| r.len as u64).sum();
                arena.punched(&runs);
                link.punched_segments.fetch_add(n, Relaxed);
            }
            Ok(FromCoord::Weight { .. } | FromCoord::Welcome { .. }) => {}
            Ok(FromCoord::Error { message }) => {
                return Err(lost(io::Error::other(format!(
                    "the coordinator said: {message}"
                ))))
            }
            Err(e) => return Err(lost(io::Error::new(io::ErrorKind::InvalidData, e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ArenaConfig, SoftVec};

    #[test]
    fn segments_the_coordinator_punched_are_retired_and_their_objects_rebuilt() {
        let arena =
            SoftArena::new(ArenaConfig::default().budget(32 << 20).max_bytes(1 << 30)).unwrap();
        let v: SoftVec<[u8; 4096]> = SoftVec::new(&arena, 4000, |i| [i as u8; 4096]);
        for i in 0..4000 {
            assert_eq!(v.get(i)[0], i as u8);
        }
        let cold = arena.cold_runs(MAX_COLD);
        assert!(cold.len() >= 4, "closed segments to punch: {cold:?}");
        let before = arena.usage();
        let victims = &cold[..3];
        for r in victims {
            tidepool_sys::memfd::punch_hole(
                arena.memfd(),
                r.first as usize * SEGMENT,
                r.len as usize * SEGMENT,
            )
            .unwrap();
        }
        arena.punched(victims);
        assert_eq!(arena.usage(), before - 3 * SEGMENT, "retired at once");
        assert!(arena
            .cold_runs(MAX_COLD)
            .iter()
            .all(|r| !victims.contains(r)));
        // Told twice (a stale list): nothing changes.
        arena.punched(victims);
        assert_eq!(arena.usage(), before - 3 * SEGMENT);
        let misses = v.stats().misses;
        for i in 0..4000 {
            assert_eq!(v.get(i)[0], i as u8, "value {i} after the punch");
        }
        assert!(v.stats().misses > misses, "punched objects were rebuilt");
    }

    #[test]
    fn a_report_says_what_the_arena_holds() {
        let arena =
            SoftArena::new(ArenaConfig::default().budget(16 << 20).max_bytes(1 << 30)).unwrap();
        let v: SoftVec<[u8; 4096]> = SoftVec::new(&arena, 100, |i| [i as u8; 4096]);
        for i in 0..100 {
            v.get(i);
            v.get(i);
        }
        let r = report(&arena);
        assert_eq!(r.budget, 16 << 20);
        assert_eq!(r.usage, arena.usage() as u64);
        assert_eq!((r.hits, r.misses, r.reconstructions), (100, 100, 100));
        assert!(r.reconstruct_nanos > 0);
    }
}
