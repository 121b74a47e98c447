//! A paged program under `tidepool coord`: the coordinator sizes its local memory beside
//! soft-memory applications, in the same currency (time a miss costs).
//!
//! A thread connects to the coordinator's socket, says hello as a paged program (no memfd:
//! its pages are the pager's to give back), and reports every heartbeat:
//!
//! - `usage`: the bytes it maps now (resident pages and the probation tier's frames);
//! - `misses`: far fetches, and `reconstruct_nanos` the time they took (fault taken to thread
//!   woken, as the fault handlers measure it); and pages the prefetcher read, each at its
//!   share of its batch's time (a stream's misses: the prefetcher hides them only as far as
//!   it keeps ahead, and a scan it could not keep ahead of looked nearly free);
//! - ghost hits: far fetches of pages evicted fewer than a bucket's bytes of evictions ago
//!   (each would have stayed with that much more memory), and their time, at the mean fault
//!   cost of the heartbeat they happened in (its miss curve); prefetched pages evicted before
//!   likewise, at their own time;
//! - `bytes_dropped`: bytes evicted (it wanted more than it had).
//!
//! The thread joins after the program's first second: shell scripts and wrappers (a pyenv
//! shim starts a dozen processes before the interpreter) would otherwise each take a share
//! from everyone for the milliseconds they live.
//!
//! Budgets the coordinator sends apply at once, as `tidepool resize` does. If the coordinator
//! goes away, the program keeps its last budget and the thread tries again every second.

use crate::{Pager, PagerStats, PAGE};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering::*};
use std::time::{Duration, Instant};
use tidepool_proto::coord::{AppKind, FromCoord, Report, ToCoord, GHOST_BUCKETS, MAX_MESSAGE};
use tidepool_sys::seqpacket::Channel;

/// How a paged program introduces itself.
#[derive(Debug, Clone)]
pub struct Registration {
    pub socket: PathBuf,
    /// Shown on the dashboard.
    pub name: String,
    pub weight: f64,
    /// Bounds on its local memory (bytes); `min` 0 leaves the floor to the coordinator.
    pub min: u64,
    pub max: u64,
}

/// The least budget the coordinator may set: what the pager needs to run at all.
pub const MIN_BUDGET: u64 = 4 << 20;

/// Granularity of budgets (the coordinator rounds to it).
const SEGMENT: u32 = 2 << 20;

/// The connection of this process, if one is open (a forked child closes its copy of the
/// parent's: the coordinator would otherwise see the parent live on after it exits).
static CONNECTED: AtomicI32 = AtomicI32::new(-1);

/// Starts the thread that keeps `pager` registered with the coordinator. In a forked child,
/// call it again: the child registers as a program of its own.
pub fn join(pager: &Pager, reg: Registration) -> io::Result<()> {
    let inherited = CONNECTED.swap(-1, AcqRel);
    if inherited >= 0 && crate::in_forked_child() {
        crate::sys::close_inherited(inherited);
    }
    let pager = pager.clone();
    let thread_start = pager.thread_start();
    tidepool_sys::spawn_raw("tp-coord-link", move || {
        crate::pager::thread_begins(thread_start);
        keep_link(&pager, &reg);
    })?;
    Ok(())
}

/// How long a program runs before it joins.
const JOIN_AFTER: Duration = Duration::from_secs(1);

fn keep_link(pager: &Pager, reg: &Registration) {
    std::thread::sleep(JOIN_AFTER);
    let mut said = false;
    let mut totals = Totals::default();
    loop {
        let e = session(pager, reg, &mut totals, &mut said);
        CONNECTED.store(-1, Release);
        if !said {
            eprintln!(
                "tidepool run: coordinator at {}: {e}; keeping the local budget of {} MiB and \
                 trying again every second",
                reg.socket.display(),
                pager.local_budget() >> 20
            );
            said = true;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Counters carried over heartbeats: ghost time is summed at each heartbeat's fault cost.
#[derive(Debug, Default)]
struct Totals {
    fetches: u64,
    serve_nanos: u64,
    ghost_fetches: [u64; GHOST_BUCKETS],
    ghost_nanos: [u64; GHOST_BUCKETS],
    /// Mean fault cost so far, for heartbeats without a fault.
    fault_nanos: u64,
    /// Pages evicted so far.
    evicted: u64,
    /// The prefetcher's misses so far (see `PagerStats::prefetch_reads`).
    prefetch_reads: u64,
    prefetch_nanos: u64,
    prefetch_ghosts: [u64; GHOST_BUCKETS],
    prefetch_ghost_nanos: [u64; GHOST_BUCKETS],
}

impl Totals {
    /// Folds in the pager's counters now; the report to send.
    fn report(&mut self, s: &PagerStats, budget: u64) -> Report {
        // The fault handlers' histogram gives a mean and a count; their product is the time.
        let serve_nanos = s.miss.serve.mean_ns.saturating_mul(s.miss.serve.count);
        let (df, dn) = (
            s.miss.serve.count.saturating_sub(self.fetches),
            serve_nanos.saturating_sub(self.serve_nanos),
        );
        if let Some(mean) = dn.checked_div(df) {
            self.fault_nanos = mean;
        }
        (self.fetches, self.serve_nanos) = (
            s.miss.serve.count.max(self.fetches),
            serve_nanos.max(self.serve_nanos),
        );
        for k in 0..GHOST_BUCKETS {
            let d = s.ghost_fetches[k].saturating_sub(self.ghost_fetches[k]);
            self.ghost_fetches[k] = s.ghost_fetches[k].max(self.ghost_fetches[k]);
            self.ghost_nanos[k] += d * self.fault_nanos;
            self.prefetch_ghosts[k] = s.prefetch_ghosts[k].max(self.prefetch_ghosts[k]);
            self.prefetch_ghost_nanos[k] =
                s.prefetch_ghost_nanos[k].max(self.prefetch_ghost_nanos[k]);
        }
        self.prefetch_reads = s.prefetch_reads.max(self.prefetch_reads);
        self.prefetch_nanos = s.prefetch_nanos.max(self.prefetch_nanos);
        // A pager that evicted since the last report is using its whole budget, though it
        // maps a little less: it keeps a margin free (1/32 of the budget) and pages in flight
        // to the store. Reported as less, that gap looked unused to the planner, which then
        // would not grow a program whose misses were the costliest.
        let local = (s.resident_pages + s.tier_pages) * PAGE as u64;
        let evicting = s.evicted > self.evicted;
        self.evicted = s.evicted.max(self.evicted);
        Report {
            budget,
            usage: if evicting { local.max(budget) } else { local },
            hits: 0,
            misses: s.far_fetches + self.prefetch_reads,
            reconstructions: s.far_fetches + self.prefetch_reads,
            reconstruct_nanos: self.serve_nanos + self.prefetch_nanos,
            ghost_hits: std::array::from_fn(|k| self.ghost_fetches[k] + self.prefetch_ghosts[k]),
            ghost_nanos: std::array::from_fn(|k| {
                self.ghost_nanos[k] + self.prefetch_ghost_nanos[k]
            }),
            bytes_dropped: s.evicted * PAGE as u64,
            cold: Vec::new(),
        }
    }
}

/// One connection, until it fails: the reason.
fn session(pager: &Pager, reg: &Registration, totals: &mut Totals, said: &mut bool) -> String {
    let ch = match Channel::connect(&reg.socket) {
        Ok(ch) => ch,
        Err(e) => return format!("cannot connect ({e})"),
    };
    {
        use std::os::fd::{AsFd, AsRawFd};
        CONNECTED.store(ch.as_fd().as_raw_fd(), Release);
    }
    let hello = ToCoord::Hello {
        kind: AppKind::Paged,
        pid: std::process::id(),
        weight: reg.weight,
        segment: SEGMENT,
        capacity: reg.max.max(MIN_BUDGET),
        min: reg.min,
        budget: pager.local_budget() as u64,
        name: reg.name.clone(),
    };
    if let Err(e) = ch.send(&hello.encode()) {
        return format!("hello failed ({e})");
    }
    let mut buf = vec![0u8; MAX_MESSAGE];
    let heartbeat = match ch.recv(&mut buf, Some(Duration::from_secs(5))) {
        Ok(Some((n, _))) => match FromCoord::decode(&buf[..n]) {
            Ok(FromCoord::Welcome {
                budget,
                heartbeat_ms,
                ..
            }) => {
                follow(pager, reg, budget);
                Duration::from_millis(heartbeat_ms.clamp(1, 10_000) as u64)
            }
            Ok(FromCoord::Error { message }) => return format!("refused: {message}"),
            Ok(other) => return format!("expected a welcome, got {other:?}"),
            Err(e) => return format!("bad welcome: {e}"),
        },
        Ok(None) => return "no welcome within 5 s".into(),
        Err(e) => return format!("{e}"),
    };
    if *said {
        eprintln!(
            "tidepool run: joined the coordinator at {} again",
            reg.socket.display()
        );
        *said = false;
    }
    loop {
        let report = totals.report(&pager.stats(), pager.local_budget() as u64);
        if let Err(e) = ch.send(&ToCoord::Report(Box::new(report)).encode()) {
            return format!("report failed ({e})");
        }
        let due = Instant::now() + heartbeat;
        loop {
            let n = match ch.recv_until(&mut buf, due) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(e) => return format!("{e}"),
            };
            match FromCoord::decode(&buf[..n]) {
                Ok(FromCoord::Budget { budget }) => follow(pager, reg, budget),
                Ok(FromCoord::Punched { .. } | FromCoord::Weight { .. }) => {}
                Ok(FromCoord::Welcome { .. }) => {}
                Ok(FromCoord::Error { message }) => return format!("it said: {message}"),
                Err(e) => return format!("a bad message: {e}"),
            }
        }
    }
}

/// Applies a budget from the coordinator, within what the pager can run with.
fn follow(pager: &Pager, reg: &Registration, budget: u64) {
    let b = budget.clamp(MIN_BUDGET, reg.max.max(MIN_BUDGET));
    pager.set_local_budget(b as usize);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten far fetches of 1000 ns each, four of them ghost hits in bucket 3.
    fn ten_faults() -> PagerStats {
        let mut s = PagerStats::default();
        s.miss.serve.count = 10;
        s.miss.serve.mean_ns = 1000;
        s.far_fetches = 10;
        s.ghost_fetches[3] = 4;
        s
    }

    #[test]
    fn ghost_time_is_each_heartbeats_fault_cost_and_only_grows() {
        let mut t = Totals::default();
        let mut s = ten_faults();
        let r = t.report(&s, 64 << 20);
        assert_eq!(r.reconstruct_nanos, 10_000);
        assert_eq!(r.ghost_nanos[3], 4000);
        // Faults got dearer: new ghost hits cost the new heartbeat's mean (3000 ns).
        s.miss.serve.count = 20;
        s.miss.serve.mean_ns = 2000;
        s.ghost_fetches[3] = 6;
        let r = t.report(&s, 64 << 20);
        assert_eq!(r.ghost_nanos[3], 4000 + 2 * 3000);
        // Counters reset (a forked child): nothing goes backwards.
        s.miss.serve.count = 1;
        s.ghost_fetches[3] = 0;
        let r = t.report(&s, 64 << 20);
        assert_eq!(r.ghost_nanos[3], 10_000);
        assert_eq!(r.reconstruct_nanos, 40_000);
    }

    #[test]
    fn prefetched_misses_count_at_their_own_time() {
        let mut t = Totals::default();
        let mut s = ten_faults();
        s.prefetch_reads = 640;
        s.prefetch_nanos = 640 * 5;
        s.prefetch_ghosts[3] = 600;
        s.prefetch_ghost_nanos[3] = 600 * 5;
        let r = t.report(&s, 64 << 20);
        assert_eq!(r.misses, 650);
        assert_eq!(r.reconstruct_nanos, 10_000 + 3200);
        assert_eq!(r.ghost_hits[3], 604);
        assert_eq!(r.ghost_nanos[3], 4000 + 3000);
    }
}
