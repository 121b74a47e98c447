//! The `pager` suite: programs whose working set does not fit their local memory.
//!
//! Workloads (each run in a fresh process, over incompressible random data):
//! `seq-scan` (sum every word, pass after pass), `uniform-rmw` (increment a word at a uniformly
//! random place), `uniform-rmw-4t` (the same from four threads over one working set: misses
//! that can be in flight together), `zipf-0.99` (pages chosen Zipfian, hot pages scattered),
//! and one real unmodified program, `python-dict` (CPython building and summing a dict of
//! strings).
//!
//! Systems, at local-memory ratios 25, 50, 75 and 100% of the working set (each plus the same
//! 16 MiB allowance for the rest of the process): `tidepool-default` (`tidepool run` as a user
//! types it: pages compressed in process), `tidepool-local` (pages kept whole in process: the
//! pager alone, saving no memory), `tidepool-node` and `tidepool-node-x6-ec4+2` (on a
//! `tidepool node` process, or erasure-coded 4+2 over six node processes), `linux-zram` (the
//! program in a cgroup v1 memory group limited to the same local size, swapping to zram), and
//! `native` (everything local, once). Every run reports `machine_mib`, the bytes its system
//! held on this machine for it at their peak, and runs on memory nodes `far_mib`, what the
//! nodes held, and `unpaged_mib`, the program's memory the pager does not page
//! ([`crate::meter`]): a node's `machine_mib` should be its budget plus that, within 10%.

mod systems;
mod verdict;
mod verify;
mod worker;
mod workloads;

use crate::harness::{matrix_steps, BenchOpts, Ctx, Matrix, Suite, Turns};
use anyhow::Result;
use std::time::Instant;
use systems::{Pager, Runner};
pub use verify::verify_worker;
pub use worker::worker;
pub use workloads::ALLOWANCE;
use workloads::{sizes, Programs, MISS_METRICS, RATIOS, WORKLOADS};

#[derive(Debug)]
pub struct PagerSuite;

fn rounds(opts: &BenchOpts) -> usize {
    if opts.quick {
        1
    } else {
        3
    }
}

impl Suite for PagerSuite {
    fn name(&self) -> &'static str {
        "pager"
    }

    fn about(&self) -> &'static str {
        "working sets larger than local memory: scan, random and Zipfian read-modify-write, \
         CPython; tidepool run (local and node stores) vs Linux swap to zram vs native"
    }

    fn steps(&self, opts: &BenchOpts) -> u64 {
        matrix_steps((WORKLOADS.len() + 1) * RATIOS.len(), rounds(opts))
    }

    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        let s = sizes(&ctx.opts);
        let mut runner = Runner::start(ctx, s.wss)?;
        // The wire's floor in this run: one 4 KiB get at a time from the same node.
        ctx.step("the node's unpipelined 4 KiB get");
        let get = node_get_latency(&runner.node_url("bench-get"))?;
        for (metric, v) in [("p50_us", get.0), ("p99_us", get.1)] {
            ctx.report
                .push("tidepool-node", "get-4k-unpipelined", metric, v, "us", &[]);
        }
        runner.start_zram(ctx, s.wss * 2);
        ctx.note(
            "programs run on any CPU, as a user's would, except node-backed ones, which stay off \
             the nodes' CPU",
        );
        let programs = Programs::new(ctx, &s)?;
        let workloads = programs.workloads();
        let systems = runner.systems();
        let samples = Matrix::new(&systems, &workloads, rounds(&ctx.opts))
            .turns(Turns::Rotate)
            .only(|w, &sys| sys != Pager::Native || w.ratio == 1.0)
            .note_failures()
            .run(ctx, |_, _, w, &sys| {
                let local = (w.footprint as f64 * w.ratio) as u64 + ALLOWANCE;
                programs.measure(runner.command(sys, local)?, w, |pid| runner.watch(sys, pid))
            })?;
        // Each program's figure by system, workload and ratio; then what its misses cost.
        samples.report_by(ctx, |r| {
            (
                MISS_METRICS.contains(&r.metric.as_str()),
                r.system.clone(),
                r.workload.clone(),
                r.params.get("local_ratio").map(|x| (x * 100.0) as u64),
                r.metric.clone(),
            )
        });
        verdict::verdict(ctx);
        Ok(())
    }
}

/// The node's latency for one 4 KiB page read at a time through the store client the pager
/// uses (p50, p99 microseconds), after a warm-up.
fn node_get_latency(url: &str) -> Result<(f64, f64)> {
    let store = tidepool_store::open(url)?;
    let page = vec![0x5au8; 4096];
    let keys: Vec<tidepool_store::Key> = (0..1024u64).collect();
    let items: Vec<(tidepool_store::Key, &[u8])> = keys.iter().map(|k| (*k, &page[..])).collect();
    store.write_many(&items)?;
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(100, 10_000_000_000, 3)?;
    for i in 0..30_000usize {
        let t = Instant::now();
        let got = store.read_many(&keys[i % keys.len()..][..1])?;
        let ns = t.elapsed().as_nanos() as u64;
        anyhow::ensure!(
            got[0].as_deref() == Some(&page[..]),
            "the node returned a wrong page"
        );
        if i >= 5_000 {
            hist.record(ns.clamp(100, 10_000_000_000))?;
        }
    }
    store.remove_many(&keys)?;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1e3;
    Ok((us(0.5), us(0.99)))
}
