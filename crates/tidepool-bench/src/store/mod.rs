//! The `store` suite: the memory node against Redis and memcached on 4 KiB values, and Sharry's
//! sharing experiment.
//!
//! Every system is reached through the same [`FarStore`](tidepool_store::FarStore) code a
//! Tidepool user runs, each with its best batched command (node GET_MANY / PUT_MANY, Redis MGET
//! / pipelined SET, memcached pipelined meta `mg` / `ms`), at the same number of requests in
//! flight:
//!
//! - `get-unpipelined`, `put-unpipelined`: one client, one request at a time: p50/p99 latency,
//!   every system timed in the same stretch, 32 requests each in turn.
//! - `get-batched`, `put-batched`: `threads` clients with `batch` requests in flight each:
//!   throughput (`kv`).
//! - `node-loss`: a node of a replicated or erasure-coded store killed under load (`loss`).
//! - `share-unique`, `share-keep`: three client processes, each caching half of its objects
//!   locally and swapping the rest with the node (evict-and-fetch on every miss), either all on
//!   one node or on three nodes of their own. Unique copy takes fetched objects off the node;
//!   keep copy leaves them there. Reports far bytes against the live data held far, and
//!   aggregate throughput (`share`).

mod data;
mod kv;
mod loss;
mod share;
mod systems;
pub(crate) use systems::cpu_seconds;

use crate::harness::wanted;
use crate::harness::{matrix_steps, BenchOpts, Ctx, Suite};
use anyhow::Result;
use data::share_ratios;
pub use data::{value, VALUE_BYTES};
pub use share::share_worker;

#[derive(Debug)]
pub struct StoreSuite;

impl Suite for StoreSuite {
    fn name(&self) -> &'static str {
        "store"
    }

    fn about(&self) -> &'static str {
        "memory node vs Redis vs memcached on 4 KiB values; Sharry's sharing experiment"
    }

    fn steps(&self, opts: &BenchOpts) -> u64 {
        let r = opts.rounds();
        systems::StoreKind::ALL.len() as u64
            + matrix_steps(kv::workloads(opts).len(), r)
            + matrix_steps(loss::LAYOUTS.len(), r)
            + matrix_steps(2 * share_ratios(opts).len(), r)
    }

    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        let systems = systems::start(ctx)?;
        kv::run(ctx, &systems)?;
        drop(systems);
        loss::run(ctx)?;
        if wanted("tidepool-node") {
            share::run(ctx)?;
        }
        Ok(())
    }
}
