//! The `soft` suite: soft memory (Midas) against what a program would do without it.
//!
//! - `read-latency` / `write-latency` (Midas Table 2): a SoftBox against a `Box` copy, for
//!   32 B, 4 KiB and 4 MiB objects. Small objects are read in a chain (each read's next index
//!   comes from the value read) over a working set far larger than the caches, so every read
//!   is one dependent memory access, as Midas measured; writes go to random objects.
//! - `reclaim` (Midas Table 3): cooperative reclamation (the evacuator compacting segments at
//!   live ratios 10-90%, net MiB/s given back) and direct reclamation (punching 2 MiB
//!   segments, GiB/s), the latter with 4 KiB pages and, where the machine allows switching
//!   shmem huge pages on for the run, with 2 MiB pages.
//! - `efficiency` (Midas Fig. 11): a synthetic application (Zipf 0.99 requests over 4 KiB
//!   objects, about 80 us of work each: see [`work_us`]) at 20, 50 and 80% soft memory, as a fraction of its
//!   throughput with everything cached, for reconstruction costs of 1 us to 4 ms. The miss
//!   rate and access time are measured; each cost's throughput follows from them (one thread:
//!   a request takes its work, its read, and a reconstruction if it missed), and one point is
//!   also run with work and reconstructions spun for real, as a check on that arithmetic.
//!   Beside it, computed, what the best static cache of the same size would reach (the
//!   hottest objects kept forever): the ceiling any replacement policy has.
//! - `cache`: 1 KiB values in Redis (the slow source) read Zipf(0.99) through a cache holding
//!   a quarter of them: an LRU map in the process, memcached on loopback, a SoftMap of the same
//!   budget, and a SoftMap whose budget is `auto` (it may grow into idle memory); Redis alone
//!   for reference.

mod cache;
mod efficiency;
mod latency;
mod reclaim;
mod shared;

use crate::harness::{matrix_steps, BenchOpts, Ctx, Suite};
use anyhow::Result;
use efficiency::{RECONSTRUCT_US, SOFT_RATIOS};
use reclaim::{LIVE_RATIOS, MIDAS_COOPERATIVE, MIDAS_DIRECT_MIB_S};

#[derive(Debug)]
pub struct SoftSuite;

impl Suite for SoftSuite {
    fn name(&self) -> &'static str {
        "soft"
    }

    fn about(&self) -> &'static str {
        "soft memory: SoftBox read/write latency against a Box (32 B, 4 KiB, 4 MiB); cooperative \
         and direct reclamation throughput (Midas Tables 2 and 3); efficiency against \
         reconstruction cost (Fig. 11); a soft cache in front of Redis against an LRU map and \
         memcached"
    }

    fn steps(&self, opts: &BenchOpts) -> u64 {
        // Latency; reclamation (each live ratio, 4 KiB and 2 MiB pages); efficiency (the
        // ideal, each ratio, the spot check); the cache (starting, then one pass).
        matrix_steps(latency::SIZES.len(), opts.rounds())
            + (LIVE_RATIOS.len() + 2) as u64
            + (SOFT_RATIOS.len() + 2) as u64
            + 1
            + matrix_steps(1, 1)
    }

    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        latency::run(ctx)?;
        reclaim::run(ctx)?;
        efficiency::run(ctx)?;
        cache::run(ctx)?;
        verdict(ctx);
        Ok(())
    }
}

/// The targets, as notes.
fn verdict(ctx: &mut Ctx) {
    let r = &ctx.report;
    let get = |sys: &str, w: &str, k: &str, v: f64| {
        r.results
            .iter()
            .find(|x| x.system == sys && x.workload == w && x.params.get(k) == Some(&v))
            .map(|x| x.value)
    };
    let mut notes = Vec::new();
    for (size, target) in [(32.0, 1.2), (4194304.0, 1.5)] {
        if let (Some(b), Some(s)) = (
            get("native", "read-latency", "object_bytes", size),
            get("tidepool-soft", "read-latency", "object_bytes", size),
        ) {
            let ratio = s / b;
            notes.push(format!(
                "read latency at {size} B: SoftBox {s:.3} us vs Box {b:.3} us = {ratio:.2}x \
                 (target at most {target}x): {}",
                if ratio <= target { "met" } else { "NOT met" }
            ));
        }
    }
    for (i, &live) in LIVE_RATIOS.iter().enumerate() {
        if let Some(v) = get("tidepool-soft", "reclaim-cooperative", "live_ratio", live) {
            let target = 2.0 * MIDAS_COOPERATIVE[i];
            notes.push(format!(
                "cooperative reclamation at {:.0}% live: {v:.0} MiB/s (Midas {:.1}; target at least \
                 twice, {target:.0}): {}",
                live * 100.0,
                MIDAS_COOPERATIVE[i],
                if v >= target { "met" } else { "NOT met" }
            ));
        }
    }
    for huge in [0.0, 1.0] {
        if let Some(v) = get("tidepool-soft", "reclaim-direct", "huge_pages", huge) {
            notes.push(format!(
                "direct reclamation with {}: {v:.1} GiB/s (Midas {:.1} GiB/s{})",
                if huge == 1.0 {
                    "2 MiB shmem pages"
                } else {
                    "4 KiB pages"
                },
                MIDAS_DIRECT_MIB_S / 1024.0,
                if huge == 1.0 {
                    if v >= 64.0 {
                        "; target 64 GiB/s: met"
                    } else {
                        "; target 64 GiB/s: NOT met"
                    }
                } else {
                    ""
                }
            ));
        }
    }
    let mut worst: Option<(f64, f64)> = None;
    for &c in RECONSTRUCT_US.iter().filter(|&&c| c <= 256.0) {
        let e = r.results.iter().find(|x| {
            x.system == "tidepool-soft"
                && x.workload == "efficiency"
                && x.params.get("soft_ratio") == Some(&0.5)
                && x.params.get("reconstruct_us") == Some(&c)
        });
        if let Some(e) = e {
            if worst.is_none_or(|(_, w)| e.value < w) {
                worst = Some((c, e.value));
            }
        }
    }
    if let Some((c, e)) = worst {
        notes.push(format!(
            "efficiency at 50% soft memory for reconstruction costs up to 256 us: lowest {e:.3} \
             (at {c} us; target at least 0.8): {}",
            if e >= 0.8 { "met" } else { "NOT met" }
        ));
    }
    for n in notes {
        ctx.note(n);
    }
}
