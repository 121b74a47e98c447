//! The worker side of the pager suite: `tidepool bench-worker`'s `pager` job, the program whose
//! working set does not fit its local memory.

use crate::job::PagerJob;
use anyhow::{bail, Context, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::Distribution;
use std::sync::atomic::{compiler_fence, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// An access slower than this is a miss (a local access, TLB miss and all, takes well under
/// a microsecond here; a fault served from anywhere takes more).
const MISS_NS: u64 = 1500;
/// One access in this many is timed (two clock reads cost about as much as a local access).
const TIME_EVERY: u64 = 8;

/// Fills the working set with random data, reads it once, then runs the workload for its
/// seconds and prints `{"value": ..., "checksum": ...}` (GB/s for the scan, ops/s otherwise).
pub fn worker(job: &PagerJob) -> Result<()> {
    let workload = &job.workload;
    let words = job.wss as usize / 8;
    let run_for = Duration::from_secs_f64(job.seconds);
    if workload == "uniform-rmw-4t" {
        return threaded_rmw(words, run_for);
    }
    let mut rng = SmallRng::seed_from_u64(7);
    let mut mem: Vec<u64> = vec![0; words];
    // Incompressible: zram would flatter itself on patterns.
    for w in mem.iter_mut() {
        *w = rng.gen();
    }
    let mut checksum = mem.iter().fold(0u64, |a, &w| a.wrapping_add(w));
    let start = Instant::now();
    // The throughput, and what the program saw of misses (the random workloads).
    let (value, misses) = match workload.as_str() {
        "seq-scan" => {
            let mut bytes = 0u64;
            let chunk = (1 << 20) / 8;
            let mut at = 0;
            while start.elapsed() < run_for {
                let end = (at + chunk).min(words);
                checksum = mem[at..end]
                    .iter()
                    .fold(checksum, |a, &w| a.wrapping_add(w));
                bytes += ((end - at) * 8) as u64;
                at = if end == words { 0 } else { end };
            }
            (
                bytes as f64 / start.elapsed().as_secs_f64() / 1e9,
                String::new(),
            )
        }
        "uniform-rmw" | "zipf-0.99" => {
            let zipfian = workload == "zipf-0.99";
            let pages = (words / 512) as u64;
            let (ops, miss_ns) = rmw(pages, zipfian, 7, start, run_for, |i| {
                mem[i] = mem[i].wrapping_add(1)
            })?;
            (
                ops as f64 / start.elapsed().as_secs_f64(),
                miss_json(&miss_ns),
            )
        }
        other => bail!("unknown pager workload '{other}'"),
    };
    println!("{{\"value\": {value}, \"checksum\": {checksum}{misses}}}");
    Ok(())
}

fn miss_histogram() -> Result<hdrhistogram::Histogram<u64>> {
    hdrhistogram::Histogram::<u64>::new_with_bounds(100, 10_000_000_000, 2).context("histogram")
}

/// The miss times as the JSON fields the suite reads (none if nothing missed).
fn miss_json(miss_ns: &hdrhistogram::Histogram<u64>) -> String {
    if miss_ns.is_empty() {
        return String::new();
    }
    format!(
        ", \"miss_us_p50\": {}, \"miss_us_p99\": {}, \"miss_us_mean\": {:.3}, \"misses_timed\": {}",
        miss_ns.value_at_quantile(0.5) as f64 / 1e3,
        miss_ns.value_at_quantile(0.99) as f64 / 1e3,
        miss_ns.mean() / 1e3,
        miss_ns.len()
    )
}

/// `uniform-rmw-4t`: four threads incrementing words at uniformly random places of one shared
/// working set (relaxed atomic loads and stores: racing increments may be lost, which the
/// workload does not mind), so up to four misses are outstanding at once.
fn threaded_rmw(words: usize, run_for: Duration) -> Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let mut rng = SmallRng::seed_from_u64(7);
    let mem: Vec<AtomicU64> = (0..words).map(|_| AtomicU64::new(rng.gen())).collect();
    let checksum = mem
        .iter()
        .fold(0u64, |a, w| a.wrapping_add(w.load(Relaxed)));
    let pages = (words / 512) as u64;
    let start = Instant::now();
    let results: Vec<Result<(u64, hdrhistogram::Histogram<u64>)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let mem = &mem;
                scope.spawn(move || {
                    rmw(pages, false, 7 + t, start, run_for, |i| {
                        mem[i].store(mem[i].load(Relaxed).wrapping_add(1), Relaxed)
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a worker thread panicked"))
            .collect()
    });
    let mut ops = 0;
    let mut miss_ns = miss_histogram()?;
    for r in results {
        let (n, h) = r?;
        ops += n;
        miss_ns.add(h).context("histogram")?;
    }
    let value = ops as f64 / start.elapsed().as_secs_f64();
    println!(
        "{{\"value\": {value}, \"checksum\": {checksum}{}}}",
        miss_json(&miss_ns)
    );
    Ok(())
}

/// Calls `access` on a word at a random place of `pages` pages (chosen uniformly or Zipfian)
/// until `run_for` after `start`; returns how many, and the times of the accesses that missed
/// (one in [`TIME_EVERY`] timed).
fn rmw(
    pages: u64,
    zipfian: bool,
    seed: u64,
    start: Instant,
    run_for: Duration,
    mut access: impl FnMut(usize),
) -> Result<(u64, hdrhistogram::Histogram<u64>)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let zipf = rand_distr::Zipf::new(pages, 0.99).context("zipf")?;
    let mut ops = 0u64;
    let mut miss_ns = miss_histogram()?;
    while start.elapsed() < run_for {
        for k in 0..1024u64 {
            let page = if zipfian {
                // Rank 1 is hottest; scatter ranks over the working set.
                let rank = zipf.sample(&mut rng) as u64 - 1;
                crate::data::scatter(rank, pages)
            } else {
                rng.gen_range(0..pages)
            };
            let i = page as usize * 512 + rng.gen_range(0..512);
            if k % TIME_EVERY == 0 {
                // The fences keep the access between the clock reads.
                let t = Instant::now();
                compiler_fence(SeqCst);
                access(i);
                compiler_fence(SeqCst);
                let ns = t.elapsed().as_nanos() as u64;
                if ns > MISS_NS {
                    let _ = miss_ns.record(ns.min(10_000_000_000));
                }
            } else {
                access(i);
            }
        }
        ops += 1024;
    }
    Ok((ops, miss_ns))
}
