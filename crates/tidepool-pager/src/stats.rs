//! Counters the pager keeps, and the report `tidepool run --stats` prints.

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tidepool_proto::coord::GHOST_BUCKETS;

/// Where a far fetch's time goes on the handler's side, one histogram per stage (nanoseconds),
/// under one lock: a fetch records all its stages at once. Recorded only by fault handlers,
/// inside the fork gate's section (and read inside one), so a fork never copies a held lock.
#[derive(Debug)]
pub(crate) struct Timings(Mutex<Stages>);

#[derive(Debug)]
struct Stages {
    /// From the handler taking the fault to the faulting thread woken: what the handler adds
    /// to a miss.
    serve: Histogram<u64>,
    /// Reading the page from the far store (request, network, the store's work, copy into the
    /// staging buffer).
    store: Histogram<u64>,
    /// Installing it (UFFDIO_COPY or MOVE, which also wakes the faulting thread).
    install: Histogram<u64>,
    /// Evicting inline because the evictor fell behind, before the next fault is taken.
    evict: Histogram<u64>,
    /// Sampled (`cpu::MissProbe`), on every kind of missing fault: from the faulting thread
    /// stopping to a handler taking its fault, and from its wake-up to it running again.
    delivery: Histogram<u64>,
    wake: Histogram<u64>,
}

/// 100 ns .. 100 s at 2 significant digits: a few KiB, allocated once, never grown.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(100, 100_000_000_000, 2).expect("valid bounds")
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    let _ = h.record((d.as_nanos() as u64).clamp(100, 100_000_000_000));
}

fn quantiles(h: &Histogram<u64>) -> StageTimes {
    StageTimes {
        count: h.len(),
        p50_ns: h.value_at_quantile(0.5),
        p99_ns: h.value_at_quantile(0.99),
        mean_ns: h.mean() as u64,
    }
}

impl Timings {
    pub fn new() -> Timings {
        Timings(Mutex::new(Stages {
            serve: histogram(),
            store: histogram(),
            install: histogram(),
            evict: histogram(),
            delivery: histogram(),
            wake: histogram(),
        }))
    }

    /// One far fetch: its store read (none for a page in a frame), install, and the whole.
    pub fn far_fetch(&self, store: Option<Duration>, install: Duration, serve: Duration) {
        let mut s = self.0.lock();
        if let Some(d) = store {
            record(&mut s.store, d);
        }
        record(&mut s.install, install);
        record(&mut s.serve, serve);
    }

    /// One sampled miss's delivery and wake-up, nanoseconds.
    pub fn delivery_and_wake(&self, delivery: u64, wake: u64) {
        let mut s = self.0.lock();
        let _ = s.delivery.record(delivery.clamp(100, 100_000_000_000));
        let _ = s.wake.record(wake.clamp(100, 100_000_000_000));
    }

    pub fn evicted_inline(&self, d: Duration) {
        record(&mut self.0.lock().evict, d);
    }

    pub fn reset(&self) {
        let s = &mut *self.0.lock();
        for h in [
            &mut s.serve,
            &mut s.store,
            &mut s.install,
            &mut s.evict,
            &mut s.delivery,
            &mut s.wake,
        ] {
            h.reset();
        }
    }

    fn snapshot(&self) -> MissTimes {
        let s = self.0.lock();
        MissTimes {
            serve: quantiles(&s.serve),
            store: quantiles(&s.store),
            install: quantiles(&s.install),
            evict: quantiles(&s.evict),
            delivery: quantiles(&s.delivery),
            wake: quantiles(&s.wake),
        }
    }
}

/// Percentiles of one stage, nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageTimes {
    pub count: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// What throughput pays: the tail weighs in.
    pub mean_ns: u64,
}

/// A far fetch's time on the handler's side, by stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MissTimes {
    /// The whole: fault taken to thread woken.
    pub serve: StageTimes,
    pub store: StageTimes,
    pub install: StageTimes,
    /// Inline eviction, in the faults that had to.
    pub evict: StageTimes,
    /// Sampled over all missing faults: from the faulting thread stopping to a handler taking
    /// the fault, and from the thread's wake-up to it running again (see `cpu::MissProbe`).
    pub delivery: StageTimes,
    pub wake: StageTimes,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub missing_faults: AtomicU64,
    pub wp_faults: AtomicU64,
    pub zero_fills: AtomicU64,
    pub far_fetches: AtomicU64,
    pub early_refetches: AtomicU64,
    pub writeback_hits: AtomicU64,
    pub prefetched: AtomicU64,
    pub refilled: AtomicU64,
    pub prefetch_planned: AtomicU64,
    pub prefetch_credited: AtomicU64,
    pub prefetch_dropped: AtomicU64,
    pub prefetch_passed: AtomicU64,
    pub evicted: AtomicU64,
    pub evicted_clean: AtomicU64,
    pub evicted_zero: AtomicU64,
    pub written_back: AtomicU64,
    pub moved_out: AtomicU64,
    pub copied_in: AtomicU64,
    pub frames_repaired: AtomicU64,
    /// Faults of a forking thread served while its fork held the gate closed.
    pub fork_own_faults: AtomicU64,
    /// Faults of other threads held during a fork and served before it ended, because the
    /// forking thread waited for a lock.
    pub fork_late_faults: AtomicU64,
    /// Times the forking thread was parked (`park.rs`) so that held faults could be served.
    pub fork_parks: AtomicU64,
    pub tier_touched: AtomicU64,
    pub tier_spilled: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub discarded: AtomicU64,
    /// Far fetches of pages evicted before, by how many bytes were evicted after them
    /// (`tidepool_proto::coord::ghost_bucket`): with that much more local memory they would
    /// have stayed. The program's miss curve, read by the coordinator.
    pub ghost_fetches: [AtomicU64; GHOST_BUCKETS],
    /// Pages the prefetcher read from the store, and their share of their batches' time.
    pub prefetch_reads: AtomicU64,
    pub prefetch_nanos: AtomicU64,
    /// Of them, pages evicted before, by ghost bucket, and their time.
    pub prefetch_ghosts: [AtomicU64; GHOST_BUCKETS],
    pub prefetch_ghost_nanos: [AtomicU64; GHOST_BUCKETS],
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    /// Starts counting again (a forked child counts what it does itself).
    pub fn reset(&self) {
        let Counters {
            missing_faults,
            wp_faults,
            zero_fills,
            far_fetches,
            early_refetches,
            writeback_hits,
            prefetched,
            refilled,
            prefetch_planned,
            prefetch_credited,
            prefetch_dropped,
            prefetch_passed,
            evicted,
            evicted_clean,
            evicted_zero,
            written_back,
            moved_out,
            copied_in,
            frames_repaired,
            fork_own_faults,
            fork_late_faults,
            fork_parks,
            tier_touched,
            tier_spilled,
            bytes_read,
            bytes_written,
            discarded,
            ghost_fetches,
            prefetch_reads,
            prefetch_nanos,
            prefetch_ghosts,
            prefetch_ghost_nanos,
        } = self;
        for c in [
            missing_faults,
            wp_faults,
            zero_fills,
            far_fetches,
            early_refetches,
            writeback_hits,
            prefetched,
            refilled,
            prefetch_planned,
            prefetch_credited,
            prefetch_dropped,
            prefetch_passed,
            evicted,
            evicted_clean,
            evicted_zero,
            written_back,
            moved_out,
            copied_in,
            frames_repaired,
            fork_own_faults,
            fork_late_faults,
            fork_parks,
            tier_touched,
            tier_spilled,
            bytes_read,
            bytes_written,
            discarded,
            prefetch_reads,
            prefetch_nanos,
        ]
        .into_iter()
        .chain(ghost_fetches)
        .chain(prefetch_ghosts)
        .chain(prefetch_ghost_nanos)
        {
            c.store(0, Relaxed);
        }
    }
}

/// A snapshot of what the pager has done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PagerStats {
    /// Faults on pages that were not mapped.
    pub missing_faults: u64,
    /// First writes to pages installed write-protected (clean tracking).
    pub wp_faults: u64,
    /// Missing faults served with a zero page (first touch, nothing fetched).
    pub zero_fills: u64,
    /// Missing faults served by a read from the far store (or a move from a frame).
    pub far_fetches: u64,
    /// Far fetches of pages evicted less than an eighth of a budget's evictions before: the
    /// replacement's mistakes (an LRU would have kept them; CLOCK here sees faults, not
    /// accesses).
    pub early_refetches: u64,
    /// Missing faults served from the write-back buffer.
    pub writeback_hits: u64,
    /// Pages the prefetcher mapped before they were asked for.
    pub prefetched: u64,
    /// Pages brought back from far memory while the budget had room to spare (see
    /// [`crate::Config::refill`]).
    pub refilled: u64,
    /// Pages in prefetch windows, and those the program was later seen to walk past.
    pub prefetch_planned: u64,
    pub prefetch_credited: u64,
    /// Planned pages not fetched: for want of room (the evictor could not free it in time),
    /// and because they were mapped already or on their way out.
    pub prefetch_dropped: u64,
    pub prefetch_passed: u64,
    /// Pages evicted; of them clean (dropped, far copy valid) and zero (never stored).
    pub evicted: u64,
    pub evicted_clean: u64,
    pub evicted_zero: u64,
    /// Dirty pages written to the far store.
    pub written_back: u64,
    /// Pages moved, not copied, into frames (the in-process backend, or a probation tier).
    pub moved_out: u64,
    /// Framed pages copied back in (UFFDIO_COPY) rather than moved: their frames are dropped
    /// later, many in one call.
    pub copied_in: u64,
    /// Framed pages the kernel moved between a region and its shadow without being asked,
    /// found and taken as they were (see `Inner::adopt_moved`).
    pub frames_repaired: u64,
    /// Faults of a forking thread served during its fork (glibc's fork reads the program's
    /// memory after the fork handlers ran), and faults of other threads served during a fork
    /// because the forking thread waited for a lock (see `late.rs`), and the times the forking
    /// thread was parked for them (`park.rs`).
    pub fork_own_faults: u64,
    pub fork_late_faults: u64,
    pub fork_parks: u64,
    /// The probation tier ([`crate::Config::probation`]): pages the program touched there (a
    /// fault, no store read) and pages spilled to the store; frames held now, and the tier's
    /// share of the budget now (0 with no tier).
    pub tier_touched: u64,
    pub tier_spilled: u64,
    pub tier_pages: u64,
    pub tier_cap_pages: u64,
    /// Bytes fetched from and written to the far store.
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Pages given back by the program (freed memory, munmap, MADV_DONTNEED).
    pub discarded: u64,
    /// Far fetches of pages evicted before, by ghost bucket: bucket `k` counts pages that
    /// fewer than 2^k MiB of evictions had passed (see `tidepool_proto::coord`).
    pub ghost_fetches: [u64; GHOST_BUCKETS],
    /// Pages the prefetcher read from the store, and their share of their batches' time (read
    /// and install): a stream's misses. The prefetcher overlaps them with the program's work,
    /// but only as far as it keeps ahead: a scan faulting on one page in 64 still ran at 0.7 of
    /// its all-local speed.
    pub prefetch_reads: u64,
    pub prefetch_nanos: u64,
    /// Of them, pages evicted before, by ghost bucket, and their time: the stream's part of the
    /// miss curve.
    pub prefetch_ghosts: [u64; GHOST_BUCKETS],
    pub prefetch_ghost_nanos: [u64; GHOST_BUCKETS],
    /// Pages mapped now, and the budget in pages.
    pub resident_pages: u64,
    pub budget_pages: u64,
    /// Where far fetches' time went in the fault handler.
    pub miss: MissTimes,
    /// What the far store says of its own health (memory nodes down, data not yet protected
    /// again), if it has anything to say.
    pub store_health: Option<String>,
    /// What an in-process store holds in this process (none for stores elsewhere).
    pub store_memory: Option<StoreMemory>,
    /// How many times the fault handlers went to sleep (their voluntary context switches):
    /// each sleep is a wake-up paid for, by a fault or by another thread.
    pub handler_sleeps: u64,
    /// Interrupts this machine took, on all its CPUs, since the pager started: the pager's
    /// share shows against a run of the same program without it.
    pub interrupts: Option<crate::cpu::Interrupts>,
    /// How the handlers followed the program's CPU (`None`: they did not try; see `follow.rs`).
    pub follow: Option<crate::follow::FollowReport>,
    /// The sections that saw faults or evictions, busiest first (see `sections.rs`); empty
    /// when no part was named.
    pub sections: Vec<crate::SectionStats>,
}

/// What an in-process far store holds, in this process's memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreMemory {
    /// Bytes held, the store's own overhead included.
    pub held: u64,
    /// Bytes of the pages kept, before compression (a compressing store).
    pub original: Option<u64>,
    /// Bytes of the compressed values themselves, before slot rounding and free slots.
    pub packed: Option<u64>,
    /// Pages kept as one word, and kept whole (they did not compress).
    pub same_filled: Option<u64>,
    pub kept_whole: Option<u64>,
    /// Bytes of chunks compactions drained, and values they moved (a slab store).
    pub compacted: Option<(u64, u64)>,
}

impl PagerStats {
    /// Faults served without a round trip to the far store, over all missing faults.
    pub fn local_hit_ratio(&self) -> f64 {
        if self.missing_faults == 0 {
            return 1.0;
        }
        1.0 - self.far_fetches as f64 / self.missing_faults as f64
    }

    /// Prefetched pages the program was seen to use, over pages planned.
    pub fn prefetch_accuracy(&self) -> Option<f64> {
        (self.prefetch_planned > 0)
            .then(|| (self.prefetch_credited as f64 / self.prefetch_planned as f64).min(1.0))
    }
}

pub(crate) fn snapshot(
    c: &Counters,
    t: &Timings,
    resident: u64,
    budget: u64,
    tier: Option<&crate::tier::Tier>,
) -> PagerStats {
    PagerStats {
        miss: t.snapshot(),
        missing_faults: c.missing_faults.load(Relaxed),
        wp_faults: c.wp_faults.load(Relaxed),
        zero_fills: c.zero_fills.load(Relaxed),
        far_fetches: c.far_fetches.load(Relaxed),
        early_refetches: c.early_refetches.load(Relaxed),
        writeback_hits: c.writeback_hits.load(Relaxed),
        prefetched: c.prefetched.load(Relaxed),
        refilled: c.refilled.load(Relaxed),
        prefetch_planned: c.prefetch_planned.load(Relaxed),
        prefetch_credited: c.prefetch_credited.load(Relaxed),
        prefetch_dropped: c.prefetch_dropped.load(Relaxed),
        prefetch_passed: c.prefetch_passed.load(Relaxed),
        evicted: c.evicted.load(Relaxed),
        evicted_clean: c.evicted_clean.load(Relaxed),
        evicted_zero: c.evicted_zero.load(Relaxed),
        written_back: c.written_back.load(Relaxed),
        moved_out: c.moved_out.load(Relaxed),
        copied_in: c.copied_in.load(Relaxed),
        frames_repaired: c.frames_repaired.load(Relaxed),
        fork_own_faults: c.fork_own_faults.load(Relaxed),
        fork_late_faults: c.fork_late_faults.load(Relaxed),
        fork_parks: c.fork_parks.load(Relaxed),
        tier_touched: c.tier_touched.load(Relaxed),
        tier_spilled: c.tier_spilled.load(Relaxed),
        tier_pages: tier.map_or(0, |t| t.held.load(Relaxed) as u64),
        tier_cap_pages: tier.map_or(0, |t| t.cap.load(Relaxed) as u64),
        bytes_read: c.bytes_read.load(Relaxed),
        bytes_written: c.bytes_written.load(Relaxed),
        discarded: c.discarded.load(Relaxed),
        ghost_fetches: std::array::from_fn(|k| c.ghost_fetches[k].load(Relaxed)),
        prefetch_reads: c.prefetch_reads.load(Relaxed),
        prefetch_nanos: c.prefetch_nanos.load(Relaxed),
        prefetch_ghosts: std::array::from_fn(|k| c.prefetch_ghosts[k].load(Relaxed)),
        prefetch_ghost_nanos: std::array::from_fn(|k| c.prefetch_ghost_nanos[k].load(Relaxed)),
        resident_pages: resident,
        budget_pages: budget,
        store_health: None,
        store_memory: None,
        handler_sleeps: 0,
        follow: None,
        sections: Vec::new(),
        interrupts: None,
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

impl fmt::Display for PagerStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_faults(f)?;
        self.write_tiers(f)?;
        self.write_latency(f)?;
        self.write_cpu(f)?;
        self.write_moved(f)?;
        write_sections(f, &self.sections)
    }
}

impl PagerStats {
    /// Faults, hits, prefetches, refills and evictions.
    fn write_faults(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "faults       {} missing ({} zero-filled, {} from far memory, {} from the write-back buffer), {} first writes",
            self.missing_faults, self.zero_fills, self.far_fetches, self.writeback_hits, self.wp_faults
        )?;
        writeln!(
            f,
            "hits         {:.1}% of missing faults served without a far read; {} far reads of pages \
             evicted within the last eighth of a budget's evictions",
            self.local_hit_ratio() * 100.0,
            self.early_refetches
        )?;
        match self.prefetch_accuracy() {
            Some(a) => writeln!(
                f,
                "prefetch     {} pages mapped ahead, accuracy {:.1}% ({} of {} planned pages used); \
                 {} planned pages dropped for want of room, {} mapped already or on their way out",
                self.prefetched,
                a * 100.0,
                self.prefetch_credited,
                self.prefetch_planned,
                self.prefetch_dropped,
                self.prefetch_passed
            )?,
            None => writeln!(f, "prefetch     no streams detected")?,
        }
        if self.refilled > 0 {
            writeln!(
                f,
                "refill       {} pages brought back while the budget had room",
                self.refilled
            )?;
        }
        writeln!(
            f,
            "evictions    {} pages ({} clean dropped, {} zero, {} written back, {} moved to frames, {} copied back from them), {} discarded by the program",
            self.evicted, self.evicted_clean, self.evicted_zero, self.written_back, self.moved_out, self.copied_in, self.discarded
        )?;
        Ok(())
    }

    /// The probation tier, repaired frames and forks, where they did anything.
    fn write_tiers(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tier_cap_pages > 0 {
            writeln!(
                f,
                "probation    {} pages touched in the tier (a fault, no far read), {} spilled to the store; \
                 {:.1} of {:.1} MiB held",
                self.tier_touched,
                self.tier_spilled,
                mib(self.tier_pages * 4096),
                mib(self.tier_cap_pages * 4096)
            )?;
        }
        if self.frames_repaired > 0 {
            writeln!(
                f,
                "frames       {} pages found moved between region and frame without a request, kept",
                self.frames_repaired
            )?;
        }
        if self.fork_own_faults + self.fork_late_faults > 0 {
            writeln!(
                f,
                "forks        {} faults of forking threads served during their forks, {} of other \
                 threads served then because the forking thread waited for a lock ({} times \
                 parked while they were)",
                self.fork_own_faults, self.fork_late_faults, self.fork_parks
            )?;
        }
        Ok(())
    }

    /// Where a far fetch's time goes.
    fn write_latency(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.miss;
        let us = |ns: u64| ns as f64 / 1e3;
        if m.serve.count > 0 {
            writeln!(
                f,
                "far fetch    handler time p50 {:.1} us, mean {:.1}, p99 {:.1} us: store read p50 {:.1} us \
                 (mean {:.1}, p99 {:.1}), install and wake p50 {:.1} us (p99 {:.1}); inline eviction in {} \
                 faults, p50 {:.1} us",
                us(m.serve.p50_ns),
                us(m.serve.mean_ns),
                us(m.serve.p99_ns),
                us(m.store.p50_ns),
                us(m.store.mean_ns),
                us(m.store.p99_ns),
                us(m.install.p50_ns),
                us(m.install.p99_ns),
                m.evict.count,
                us(m.evict.p50_ns)
            )?;
        }
        if m.delivery.count > 0 {
            writeln!(
                f,
                "miss path    delivery p50 {:.1} us (mean {:.1}), store {:.1}, install {:.1}, wake-up p50 {:.1} us \
                 (mean {:.1}): delivery and wake-up from {} sampled faults",
                us(m.delivery.p50_ns),
                us(m.delivery.mean_ns),
                us(m.store.p50_ns),
                us(m.install.p50_ns),
                us(m.wake.p50_ns),
                us(m.wake.mean_ns),
                m.delivery.count
            )?;
        }
        Ok(())
    }

    /// The handlers' sleeps, the interrupts the machine took, and how the reader followed the
    /// program.
    fn write_cpu(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.missing_faults + self.wp_faults > 0 {
            let faults = (self.missing_faults + self.wp_faults) as f64;
            write!(
                f,
                "cpu          handlers slept {:.2} times a fault ({} sleeps)",
                self.handler_sleeps as f64 / faults,
                self.handler_sleeps
            )?;
            if let Some(i) = self.interrupts {
                write!(
                    f,
                    "; this machine took {} function-call ({:.2} a fault), {} TLB-shootdown ({:.2}) and \
                     {} rescheduling ({:.2}) interrupts while the pager ran",
                    i.function_call,
                    i.function_call as f64 / faults,
                    i.tlb_shootdown,
                    i.tlb_shootdown as f64 / faults,
                    i.reschedule,
                    i.reschedule as f64 / faults
                )?;
            }
            writeln!(f)?;
            if let Some(r) = self.follow {
                writeln!(
                    f,
                    "follow       one handler on the program's CPU served {:.0}% of faults, moving \
                     {} times with the program and {} times off a busy CPU; every handler read \
                     again {} times for a reader kept off its CPU and {} times for threads \
                     faulting on two CPUs",
                    100.0 * (r.alone as f64 / faults).min(1.0),
                    r.moves,
                    r.moved_off,
                    r.starvations,
                    r.two_cpus
                )?;
            }
        }
        Ok(())
    }

    /// Bytes moved, what the far store holds in this process, and its health.
    fn write_moved(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "moved        {:.1} MiB read from far memory, {:.1} MiB written; resident {:.1} of {:.1} MiB",
            mib(self.bytes_read),
            mib(self.bytes_written),
            mib(self.resident_pages * 4096),
            mib(self.budget_pages * 4096)
        )?;
        if let Some(m) = &self.store_memory {
            write!(
                f,
                "\nfar store    {:.1} MiB held in this process",
                mib(m.held)
            )?;
            if let (Some(o), Some(s), Some(w)) = (m.original, m.same_filled, m.kept_whole) {
                write!(
                    f,
                    " for {:.1} MiB of pages ({:.2}x); {s} pages kept as a word, {w} kept whole",
                    mib(o),
                    o as f64 / m.held.max(1) as f64
                )?;
                if let Some(p) = m.packed {
                    write!(f, "; {:.1} MiB of compressed data", mib(p))?;
                }
                if let Some((bytes, values)) = m.compacted.filter(|c| c.0 > 0) {
                    write!(
                        f,
                        "; compactions moved {values} values to give back {:.1} MiB",
                        mib(bytes)
                    )?;
                }
            }
        }
        if let Some(h) = &self.store_health {
            write!(f, "\nstore        {h}")?;
        }
        Ok(())
    }
}

/// Sections shown by name; the rest are summed on one line.
const SECTIONS_SHOWN: usize = 12;

/// The sections, a line each, busiest first.
fn write_sections(f: &mut fmt::Formatter<'_>, sections: &[crate::SectionStats]) -> fmt::Result {
    if sections.is_empty() {
        return Ok(());
    }
    write!(
        f,
        "\nsections     {:<44} {:>10} {:>10} {:>10} {:>10} {:>8} {:>9} {:>12}",
        "name", "faults", "far reads", "evicted", "prefetched", "used", "policy", "local MiB"
    )?;
    let line = |f: &mut fmt::Formatter<'_>, name: &str, s: &crate::SectionStats| {
        // Names come from the program (its symbols): shown as text. A long one keeps its end,
        // the symbol, and its kind.
        let chars: Vec<char> = name
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        let name: String = if chars.len() > 44 {
            let kind = chars
                .iter()
                .position(|&c| c == ' ')
                .map_or(0, |k| k + 1)
                .min(8);
            let tail = &chars[chars.len() - (43 - kind)..];
            chars[..kind]
                .iter()
                .chain(['…'].iter())
                .chain(tail)
                .collect()
        } else {
            chars.into_iter().collect()
        };
        let used = s
            .prefetch_accuracy()
            .map_or("-".to_string(), |a| format!("{:.0}%", a * 100.0));
        let resident = s
            .resident_pages
            .map_or("-".to_string(), |p| format!("{:.1}", mib(p * 4096)));
        write!(
            f,
            "\n             {name:<44} {:>10} {:>10} {:>10} {:>10} {used:>8} {:>9} {resident:>12}",
            s.faults,
            s.far_fetches,
            s.evicted,
            s.prefetch_planned,
            s.policy.to_string()
        )
    };
    for s in sections.iter().take(SECTIONS_SHOWN) {
        line(f, &s.name, s)?;
    }
    if sections.len() > SECTIONS_SHOWN {
        let mut rest = crate::SectionStats::default();
        for s in &sections[SECTIONS_SHOWN..] {
            rest.faults += s.faults;
            rest.far_fetches += s.far_fetches;
            rest.evicted += s.evicted;
            rest.prefetch_planned += s.prefetch_planned;
            rest.prefetch_credited += s.prefetch_credited;
            rest.line_pages += s.line_pages;
            rest.resident_pages = match (rest.resident_pages, s.resident_pages) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
        }
        let name = format!("({} more)", sections.len() - SECTIONS_SHOWN);
        line(f, &name, &rest)?;
    }
    Ok(())
}
