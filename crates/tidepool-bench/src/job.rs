//! What `tidepool bench` asks of a worker process: one typed [`Job`], written as a single JSON
//! argument of the hidden `tidepool bench-worker` subcommand and read back with serde. The
//! bench and its workers share one definition of every setting; nothing is a positional
//! string that one side formats and the other parses by hand.

use crate::alloc::{AllocJob, Launch};
use crate::coord::{AntagonistJob, AppJob, PagedJob};
use crate::far::GraphJob;
use crate::pager::{PagerJob, VerifyJob};
use crate::store::ShareJob;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::Command;

/// The hidden subcommand of `tidepool` that runs one [`Job`].
pub const SUBCOMMAND: &str = "bench-worker";

/// One worker process's work. Each variant's fields are documented on its type, next to the
/// worker that runs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "job", rename_all = "kebab-case")]
pub enum Job {
    /// One workload of the alloc suite, under whichever allocator is preloaded.
    Alloc(AllocJob),
    /// The allocator's stress test: threads allocating and freeing for `seconds`.
    AllocStress { seconds: u64 },
    /// A program of the alloc suite, started and measured by the worker.
    AllocExec(Launch),
    /// The pager suite's program: a working set bigger than its local memory.
    Pager(PagerJob),
    /// The paging verification workload (every byte checked), for running under `tidepool run`.
    Verify(VerifyJob),
    /// The far suite's graph walk.
    FarGraph(GraphJob),
    /// A soft-memory application of the coordinator suites.
    CoordApp(AppJob),
    /// A paged application of the coordinator's mixed workload.
    PagedApp(PagedJob),
    /// A process that takes memory away from the others.
    Antagonist(AntagonistJob),
    /// A client of the store suite's sharing workload.
    Share(ShareJob),
}

impl Job {
    /// The arguments after the executable: the subcommand and the job as JSON.
    pub fn args(&self) -> [String; 2] {
        [
            SUBCOMMAND.to_owned(),
            serde_json::to_string(self).expect("a job is plain data and always serialises"),
        ]
    }

    /// `exe bench-worker JOB`, to be given its environment and pipes by the caller.
    pub fn command(&self, exe: &Path) -> Command {
        let mut c = Command::new(exe);
        c.args(self.args());
        c
    }

    /// The job a `bench-worker` argument describes.
    pub fn parse(arg: &str) -> Result<Job> {
        serde_json::from_str(arg).with_context(|| {
            format!(
                "`tidepool {SUBCOMMAND}` takes one job as JSON, as `tidepool bench` writes it; \
                 cannot read {arg:?}"
            )
        })
    }

    /// Runs the job in this process, printing what its worker prints.
    pub fn run(self) -> Result<()> {
        match self {
            Job::Alloc(j) => crate::alloc::worker(&j),
            Job::AllocStress { seconds } => crate::alloc::stress(seconds),
            Job::AllocExec(launch) => crate::alloc::exec_worker(&launch),
            Job::Pager(j) => crate::pager::worker(&j),
            Job::Verify(j) => crate::pager::verify_worker(&j),
            Job::FarGraph(j) => crate::far::graph_worker(j),
            Job::CoordApp(j) => crate::coord::worker(&j),
            Job::PagedApp(j) => crate::coord::paged_worker(&j),
            Job::Antagonist(j) => crate::coord::antagonist_worker(&j),
            Job::Share(j) => crate::store::share_worker(j),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_comes_back_as_it_was_written() {
        let jobs = [
            Job::AllocStress { seconds: 5 },
            Job::Verify(VerifyJob {
                bytes: 64 << 20,
                threads: 2,
                rounds: 3,
                wait: true,
            }),
            Job::Antagonist(AntagonistJob {
                bytes: 1 << 30,
                mib_per_s: 256.0,
                delay_s: 1.5,
                hold_s: 8.0,
            }),
        ];
        for job in jobs {
            let [sub, arg] = job.args();
            assert_eq!(sub, SUBCOMMAND);
            assert_eq!(Job::parse(&arg).unwrap(), job);
        }
    }

    #[test]
    fn a_bad_job_is_refused_with_what_was_expected() {
        let e = Job::parse("verify 64M 2 3").unwrap_err();
        assert!(format!("{e:#}").contains("takes one job as JSON"), "{e:#}");
        let e = Job::parse(r#"{"job":"verify","bytes":1,"threads":1,"rounds":1}"#).unwrap_err();
        assert!(format!("{e:#}").contains("wait"), "{e:#}");
        let e = Job::parse(r#"{"job":"dance"}"#).unwrap_err();
        assert!(format!("{e:#}").contains("dance"), "{e:#}");
    }
}
