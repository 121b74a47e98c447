//! `tidepool bench SUITE [--quick] [--out DIR]`: end-to-end comparisons against the peers a user
//! would pick instead, run side by side on the same machine, in the same run.
//!
//! The [`harness`] runs a suite: a suite implements [`Suite`], declares its systems (typed
//! values implementing [`harness::System`]) and workloads, and says how to measure one system
//! on one workload; the harness's [`Matrix`] measures every pair round after round
//! (alternating systems round by round, so drift on a shared machine hits all of them alike),
//! pins servers where the [`Placement`] puts them, shows progress, and turns the rounds into
//! rows of a [`Report`]. It then writes `DIR/SUITE.json`, draws `DIR/SUITE.png` with
//! matplotlib and prints a table.
//!
//! Below the suites sit what several of them start: memory nodes ([`node`]), swap to zram in a
//! memory cgroup ([`zram`]), worker processes (the [`job`] each is given, and [`worker`] to run one
//! and read its report), reproducible data ([`data`]) and the workspace's shared libraries
//! ([`libs`]).
#![forbid(unsafe_code)]

pub mod alloc;
pub mod apps;
pub mod cache;
pub mod coord;
pub mod data;
pub mod env;
pub mod far;
pub mod harness;
pub mod job;
pub mod libs;
pub mod meter;
pub mod node;
pub mod pager;
pub mod report;
pub mod soft;
pub mod store;
pub mod worker;
pub mod zram;

use anyhow::{bail, Result};
pub use harness::{median, plot, BenchOpts, Ctx, Matrix, Placement, Suite};
pub use report::{Report, Row};

/// Every suite `tidepool bench` knows.
pub fn suites() -> Vec<Box<dyn Suite>> {
    vec![
        Box::new(store::StoreSuite),
        Box::new(alloc::AllocSuite),
        Box::new(pager::PagerSuite),
        Box::new(soft::SoftSuite),
        Box::new(coord::CoordSuite),
        Box::new(far::FarSuite),
        Box::new(apps::AppsSuite),
        Box::new(cache::CacheSuite),
    ]
}

/// Sent to its suite's worker from here, above every suite: [`job`] holds the messages only,
/// and the suites build them.
impl job::Job {
    /// Runs the job in this process, printing what its worker prints.
    pub fn run(self) -> Result<()> {
        use job::Job;
        match self {
            Job::Alloc(j) => alloc::worker(&j),
            Job::AllocStress { seconds } => alloc::stress(seconds),
            Job::AllocExec(launch) => alloc::exec_worker(&launch),
            Job::Pager(j) => pager::worker(&j),
            Job::Verify(j) => pager::verify_worker(&j),
            Job::FarGraph(j) => far::graph_worker(j),
            Job::CoordApp(j) => coord::worker(&j),
            Job::PagedApp(j) => coord::paged_worker(&j),
            Job::Antagonist(j) => coord::antagonist_worker(&j),
            Job::Share(j) => store::share_worker(j),
        }
    }
}

/// Runs the suite called `name` end to end and writes its JSON and PNG. Returns the report.
pub fn run(name: &str, opts: BenchOpts) -> Result<Report> {
    let all = suites();
    let Some(suite) = all.iter().find(|s| s.name() == name) else {
        let names: Vec<_> = all.iter().map(|s| s.name()).collect();
        bail!("unknown suite '{name}'; available: {}", names.join(", "));
    };
    harness::run(suite.as_ref(), opts)
}
