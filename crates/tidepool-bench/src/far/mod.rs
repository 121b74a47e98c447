//! The `far` suite: far data structures (Mira's runtime) against the transparent pager, Linux
//! swap to zram and native code.
//!
//! (a) Mira's graph traversal (its Figure 4): edges read in order, each adding to its two
//! nodes, chosen at random. The footprint is the edges and the nodes together; local-memory
//! ratios are of it. Systems, each in a fresh process:
//! - `tidepool-far-tuned`: far vectors over the in-process store, in the sections
//!   `tidepool tune` chose: the tuning loop runs first at every ratio (profile, tune, run,
//!   keep the configuration if faster, until it is not; see `graph::tune_loop`), and its steps are
//!   notes of the report; the configurations it kept are written next to the report. The
//!   walk requests the nodes of each line of edges before updating them (the split phase);
//!   nodes given a section of their own size are one plain slice.
//! - `tidepool-far-untuned`: the same program in `Config::untuned` sections: one fully
//!   associative section of 4 KiB lines per vector, the budget split by size.
//! - `tidepool-far-swap`: the same vectors in one fully associative section of 4 KiB lines,
//!   accessed element by element: far memory as a swap system sees it.
//! - `tidepool-pager`: the native program under `tidepool run` (in-process store).
//! - `linux-zram`: the native program in a memory cgroup of the same size, swapping to zram.
//! - `native`: the native program with everything local.
//!
//! Every system's local memory is the ratio times the footprint. zram and the pager get
//! `graph::ALLOWANCE` on top for the rest of the process; the far sections do not, and their line
//! tables count against their share.
//!
//! (b) DataFrame analytics offloaded to a memory node against fetched: see `query.rs`.
//! (c) Each access API's overhead at 100% local against a `Vec`: see `overhead.rs`.

mod graph;
mod graph_worker;
mod overhead;
mod query;
mod sizes;

use crate::harness::{matrix_steps, BenchOpts, Ctx, Suite};
use anyhow::Result;
pub use graph_worker::graph_worker;
use sizes::sizes;

#[derive(Debug)]
pub struct FarSuite;

/// `TIDEPOOL_FAR_PARTS=b` runs only some parts (`a`, `b`, `c`; default all).
fn part(p: &str) -> bool {
    std::env::var("TIDEPOOL_FAR_PARTS").map_or(true, |v| v.split(',').any(|x| x.trim() == p))
}

impl Suite for FarSuite {
    fn name(&self) -> &'static str {
        "far"
    }

    fn about(&self) -> &'static str {
        "far data structures with cache sections: Mira's graph traversal against the \
         transparent pager, Linux swap to zram and native"
    }

    fn steps(&self, opts: &BenchOpts) -> u64 {
        let s = sizes(opts);
        // Tuning, then the rounds.
        let a = if part("a") { graph::RATIOS.len() } else { 0 };
        let b = if part("b") { query::RATIOS.len() } else { 0 };
        let c = usize::from(part("c"));
        matrix_steps(a + b + c, s.rounds) + a as u64
    }

    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        let s = sizes(&ctx.opts);
        if part("a") {
            graph::run(ctx, &s)?;
        }
        if part("b") {
            query::run(ctx, s.rows, s.rounds)?;
        }
        if part("c") {
            overhead::run(ctx, s.rounds)?;
        }
        verdict(ctx);
        Ok(())
    }
}

/// The acceptance ratios, from this run, as notes.
fn verdict(ctx: &mut Ctx) {
    let at = |r: &crate::Report, workload: &str, system: &str, ratio: f64| {
        r.at_ratio(system, workload, ratio)
    };
    let targets = [
        (0.25, "linux-zram", 5.0),
        (0.25, "tidepool-pager", 2.0),
        (1.0, "native", 1.0 / 1.1),
        (0.1, "tidepool-far-untuned", 1.0),
        (0.25, "tidepool-far-untuned", 1.0),
        (0.5, "tidepool-far-untuned", 1.0),
        (0.75, "tidepool-far-untuned", 1.0),
        (1.0, "tidepool-far-untuned", 1.0),
    ];
    let mut notes = Vec::new();
    for (ratio, peer, want) in targets {
        if let (Some(t), Some(p)) = (
            at(&ctx.report, "graph", "tidepool-far-tuned", ratio),
            at(&ctx.report, "graph", peer, ratio),
        ) {
            notes.push(format!(
                "graph at {:.0}% local: tidepool-far-tuned / {peer} = {:.2}x (target >= {want:.2}x)",
                ratio * 100.0,
                t / p
            ));
        }
    }
    if let (Some(o), Some(f)) = (
        at(&ctx.report, "query", "tidepool-far-offload", 0.1),
        at(&ctx.report, "query", "tidepool-far-fetch", 0.1),
    ) {
        notes.push(format!(
            "query at 10% local: offload / fetch = {:.2}x (target >= 2.00x)",
            o / f
        ));
    }
    for n in notes {
        ctx.note(n);
    }
}
