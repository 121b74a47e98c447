//! The policy loop: every tick, memory and pressure are measured; every epoch, utilities from
//! the reports go to the planner, whose budgets are sent; under severe pressure, holes are
//! punched in the coldest segments.

use crate::policy::Candidate;
use crate::registry::{App, Shared, State};
use crate::snapshot::Sample;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidepool_proto::coord::{FromCoord, SegmentRun, MAX_PUNCHED};
use tidepool_soft::budget::{mem_available, memory_stall_us, MemoryView};

/// Memory, pressure, budgets and reclamation, every tick.
pub(crate) fn control_loop(shared: Arc<Shared>) {
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
pub(crate) fn epoch(s: &mut State, _dt: Duration, started: Instant) {
    s.epochs += 1;
    let (policy, epochs, pool) = (s.planner.policy, s.epochs, s.pool);
    for a in s.apps.iter_mut() {
        let probe = s.planner.step(a.id).max(2 * s.planner.segment);
        a.read_epoch(epochs, probe, pool, policy);
    }
    let candidates: Vec<Candidate> = s
        .apps
        .iter()
        .map(|a| a.candidate(s.epochs, s.planner.floor, s.planner.policy))
        .collect();
    let budgets = s.planner.plan(&candidates, s.pool);
    for a in s.apps.iter_mut() {
        a.note_held();
    }
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
pub(crate) fn cut(s: &mut State) {
    let candidates: Vec<Candidate> = s
        .apps
        .iter()
        .map(|a| a.candidate(s.epochs, s.planner.floor, s.planner.policy))
        .collect();
    let mut b: Vec<u64> = s.apps.iter().map(|a| a.budget).collect();
    let over = b.iter().sum::<u64>().saturating_sub(s.pool);
    s.planner.shrink(&candidates, &mut b, over);
    apply(s, &b);
}

/// Sends the budgets that changed; a cut starts the grace period for cooperative reclamation.
pub(crate) fn apply(s: &mut State, budgets: &[u64]) {
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
pub(crate) fn reclaim_directly(
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
        // A paged program gives memory back itself (its pager evicts down to the budget at
        // once); only soft arenas have a memfd to punch.
        if a.memfd.is_none() {
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
pub(crate) fn punch(a: &mut App, bytes: u64) -> Vec<SegmentRun> {
    let seg = a.segment;
    let mut runs = Vec::new();
    let mut freed = 0;
    let Some(fd) = a.memfd.as_ref().map(|f| f.as_fd()) else {
        return runs;
    };
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
        let Ok(data) = rustix::fs::seek(fd, rustix::fs::SeekFrom::Data(at)) else {
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
