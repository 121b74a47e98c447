//! The paged program of workload `mixed` (`tidepool bench-worker`'s `paged-app` job), run under
//! `tidepool run`: an ordinary heap allocation walked with a locality of its own.

use super::app::{pin_from_env, Pacer, Spinner};
use crate::job::{PagedJob, Walk};
use anyhow::{bail, Context, Result};
use rand::SeedableRng;
use std::io::Write;
use std::time::{Duration, Instant};

/// Allocates the job's bytes, writes every page, then per operation reads and writes a word
/// of one page (chosen by the walk) and spins its work. Prints a JSON line every quarter
/// second: seconds and operations (the warm-up's fill counts none).
pub fn paged_worker(job: &PagedJob) -> Result<()> {
    let PagedJob {
        walk,
        bytes,
        skew,
        work_us,
        seconds,
        seed,
    } = *job;
    pin_from_env()?;
    let start = Instant::now();
    let spinner = Spinner::from_env();
    const PAGE: usize = 4096;
    let pages = bytes / PAGE;
    if pages == 0 {
        bail!("BYTES must be at least a page");
    }
    // Its heap: under `tidepool run`, paged over the far store.
    let mut mem = vec![0u64; pages * PAGE / 8];
    for (i, p) in mem.chunks_mut(PAGE / 8).enumerate() {
        p[0] = i as u64;
    }
    let zipf = rand_distr::Zipf::new(pages as u64, skew).context("Zipf parameters")?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut pacer = Pacer::from_env();
    pacer.start();
    let mut out = std::io::stdout().lock();
    let (mut ops, mut next, mut at) = (0u64, Duration::ZERO, 0usize);
    let mut sum = 0u64;
    loop {
        let el = start.elapsed();
        if el >= next {
            writeln!(out, "{{\"t\":{:.3},\"ops\":{ops}}}", el.as_secs_f64())?;
            out.flush()?;
            next += Duration::from_millis(250);
            if el.as_secs_f64() >= seconds {
                break;
            }
        }
        for _ in 0..16 {
            let page = match walk {
                Walk::Zipf => {
                    use rand_distr::Distribution;
                    let rank = zipf.sample(&mut rng) as u64 - 1;
                    crate::data::scatter(rank, pages as u64) as usize
                }
                Walk::Scan => {
                    at = (at + 1) % pages;
                    at
                }
            };
            let w = &mut mem[page * (PAGE / 8) + (ops as usize % (PAGE / 8))];
            *w = w.wrapping_add(1);
            sum = sum.wrapping_add(*w);
            spinner.spin(work_us);
            ops += 1;
        }
        pacer.batch();
    }
    std::hint::black_box(sum);
    Ok(())
}
