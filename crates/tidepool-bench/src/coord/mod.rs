//! The `coord` suite: the soft-memory coordinator with several applications (Midas §7).
//!
//! (a) **Coordination** (Midas §7.1, in small): four synthetic applications, each a process
//! of its own, serve Zipfian requests over 4 KiB objects that cost something to rebuild, with
//! different skews and reconstruction costs (a storage server, a skewed social feed, an image
//! search whose features are dear to recompute, a cheap lookup), sharing idle memory worth 30%
//! of what caching everything would take (Midas: 20 of 67.5 GiB). Overall throughput is the
//! mean of each application's throughput normalised to its throughput with memory for all its
//! state (the *ideal* run: the same four processes at once, each with room for everything),
//! for the `midas`, `hitrate` and `static` policies, with the time the budgets took to settle.
//!
//! Work per request and reconstruction costs are spun on the CPU for a calibrated number of
//! iterations, not for wall-clock time: four processes share two CPUs here, and a spin timed
//! by the clock would count the time a process waited for a CPU as work.

mod app;
mod cgroup;
mod coordinate;
mod mixed;
mod paged;
mod pressure;

use crate::harness::{matrix_steps, BenchOpts, Ctx, Suite};
use anyhow::{Context, Result};
pub use app::{antagonist_worker, worker};
use cgroup::pressure_scale;
pub use cgroup::Cgroup;
pub use paged::paged_worker;

#[derive(Debug)]
pub struct CoordSuite;

impl Suite for CoordSuite {
    fn name(&self) -> &'static str {
        "coord"
    }
    fn about(&self) -> &'static str {
        "the soft-memory coordinator: four applications sharing idle memory, midas vs hitrate vs static, against the ideal"
    }
    fn steps(&self, _opts: &BenchOpts) -> u64 {
        // (a) as one matrix (one workload, one round), then (b) and (c), then mixed's search
        // and rounds.
        matrix_steps(1, 1) + 2 + 1 + matrix_steps(1, mixed::ROUNDS)
    }
    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        // The applications on every CPU, as processes of a server would be (the harness pins
        // clients to CPU 0).
        let all: Vec<usize> = (0..tidepool_sys::online_cpus()).collect();
        tidepool_sys::set_affinity(0, &all).context("cannot unpin the applications")?;
        // TIDEPOOL_BENCH_PARTS=bc runs only some parts (a: coordinate, b: harvest, c: pressure,
        // m: mixed).
        let parts = std::env::var("TIDEPOOL_BENCH_PARTS").unwrap_or_else(|_| "abcm".into());
        if parts.contains('a') {
            coordinate::run(ctx)?;
        }
        if parts.contains('b') {
            match Cgroup::create("harvest", pressure_scale(&ctx.opts).limit) {
                Ok(cg) => pressure::harvest(ctx, &cg)?,
                Err(e) => ctx.note(format!("coord (b) skipped: {e:#}")),
            }
        }
        ctx.advance();
        if parts.contains('c') {
            match Cgroup::create("pressure", pressure_scale(&ctx.opts).limit) {
                Ok(cg) => pressure::pressure(ctx, &cg)?,
                Err(e) => ctx.note(format!("coord (c) skipped: {e:#}")),
            }
        }
        ctx.advance();
        if parts.contains('m') {
            match Cgroup::create("mixed-probe", 64 << 20) {
                Ok(probe) => {
                    drop(probe);
                    mixed::run(ctx)?;
                }
                Err(e) => ctx.note(format!("coord mixed skipped: {e:#}")),
            }
        }
        Ok(())
    }
}
