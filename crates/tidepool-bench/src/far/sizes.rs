//! How big the far suite's parts are, quick or full.

use crate::harness::BenchOpts;
use crate::job::{GraphJob, GraphSystem, Job};

/// Sizes of a run.
pub(super) struct Sizes {
    pub(super) nodes: u64,
    pub(super) edges: u64,
    pub(super) seconds: f64,
    pub(super) rounds: usize,
    /// Rows of part (b)'s table.
    pub(super) rows: usize,
}

impl Sizes {
    /// The graph worker's job at these sizes, on `system` with `local` bytes of sections.
    pub(super) fn job(&self, system: GraphSystem, local: u64) -> Job {
        Job::FarGraph(GraphJob {
            system,
            nodes: self.nodes,
            edges: self.edges,
            seconds: self.seconds,
            local,
        })
    }
}

pub(super) fn sizes(opts: &BenchOpts) -> Sizes {
    if opts.quick {
        Sizes {
            nodes: 2 << 20,
            edges: 2 << 20,
            seconds: 0.5,
            rounds: 1,
            rows: 2 << 20,
        }
    } else {
        Sizes {
            nodes: 8 << 20,
            edges: 8 << 20,
            seconds: 2.0,
            rounds: 3,
            rows: 8 << 20,
        }
    }
}
