//! What `tidepool bench` asks of a worker process: one typed [`Job`], written as a single JSON
//! argument of the hidden `tidepool bench-worker` subcommand and read back with serde. The
//! bench and its workers share one definition of every setting; nothing is a positional
//! string that one side formats and the other parses by hand. The messages only: each suite
//! builds its jobs and runs its workers, and [`Job::run`] (in the crate's root, above every
//! suite) sends a job to its suite's worker.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The hidden subcommand of `tidepool` that runs one [`Job`].
pub const SUBCOMMAND: &str = "bench-worker";

/// One worker process's work. Each variant's fields are documented on its type.
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
}

/// One workload of the alloc suite ([`Job::Alloc`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocJob {
    /// The workload's name, as the suite lists it (`serverless-burst`, `large-objects`, ...).
    pub workload: String,
    /// How many times its base size to run (1 for `--quick`).
    pub scale: usize,
}

/// What to run, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    /// Standard input (None: /dev/null).
    pub stdin: Option<PathBuf>,
    /// The allocator to preload (None: glibc's own malloc, nothing preloaded).
    pub preload: Option<PathBuf>,
    /// CPUs to run on (None: the worker's own).
    pub cpus: Option<Vec<usize>>,
    /// Killed after this long.
    pub timeout_s: u64,
}

/// The pager suite's program ([`Job::Pager`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PagerJob {
    /// The workload, as the suite names it (`seq-scan`, `uniform-rmw`, `zipf-0.99`, ...).
    pub workload: String,
    /// The working set, in bytes.
    pub wss: u64,
    /// How long to run the workload once the working set is written and read once.
    pub seconds: f64,
}

/// What the verification program is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyJob {
    /// The heap allocation it writes and checks, in bytes.
    pub bytes: usize,
    /// Threads writing and checking it.
    pub threads: usize,
    /// Rounds of writing and checking.
    pub rounds: u64,
    /// After the first round, wait for a line on standard input (a test forks or stops the
    /// program meanwhile).
    pub wait: bool,
}

/// The far suite's graph walk ([`Job::FarGraph`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphJob {
    /// What holds the graph.
    pub system: GraphSystem,
    /// Nodes of the graph (1 to 2^32).
    pub nodes: u64,
    /// Edges of the graph (at least one).
    pub edges: u64,
    /// How long to walk the edges, over and over, once the graph is built.
    pub seconds: f64,
    /// Local bytes of the far vectors' sections (unused by `native`).
    pub local: u64,
}

/// What holds the graph of a [`GraphJob`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GraphSystem {
    /// Plain vectors.
    Native,
    /// Far vectors over the in-process store, with the section configuration in `config`;
    /// with `profile_out`, the run's access profile is written there.
    Far {
        config: PathBuf,
        profile_out: Option<PathBuf>,
    },
    /// Far vectors over the in-process store, every section a plain swap cache.
    FarSwap,
}

/// One synthetic soft-memory application ([`Job::CoordApp`], run by [`worker`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppJob {
    /// Its name (for the reader of `ps`; the coordinator knows it by TIDEPOOL_APP).
    pub name: String,
    /// Objects it caches.
    pub objects: u64,
    /// The Zipf skew of its requests.
    pub skew: f64,
    /// CPU microseconds to rebuild an object on a miss.
    pub rebuild_us: f64,
    /// CPU microseconds of work per request.
    pub work_us: f64,
    /// How long it runs.
    pub seconds: f64,
    /// Its soft-memory budget in bytes until a coordinator sets one (0: 8 MiB).
    pub budget: u64,
    /// The seed of its requests.
    pub seed: u64,
}

/// A process that takes memory from the others ([`Job::Antagonist`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AntagonistJob {
    /// Bytes it takes.
    pub bytes: u64,
    /// How fast it takes them, in MiB/s (0: as fast as it can).
    pub mib_per_s: f64,
    /// Seconds it waits before it starts.
    pub delay_s: f64,
    /// Seconds it holds them before it exits.
    pub hold_s: f64,
}

/// A paged application of workload `mixed` ([`Job::PagedApp`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PagedJob {
    /// How it walks its memory.
    pub walk: Walk,
    /// Bytes it allocates (at least a page).
    pub bytes: usize,
    /// The Zipf skew of a `zipf` walk.
    pub skew: f64,
    /// CPU microseconds of work per operation.
    pub work_us: f64,
    /// How long it runs.
    pub seconds: f64,
    /// The seed of its walk.
    pub seed: u64,
}

/// How a paged program walks its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Walk {
    /// Pages drawn from a Zipf distribution (hot pages spread over the allocation): more
    /// local memory keeps more of the hot set.
    Zipf,
    /// Pages in order, round and round: any budget smaller than the allocation keeps
    /// nothing a pass comes back to.
    Scan,
}

/// One sharing client process ([`Job::Share`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShareJob {
    /// The store it shares (a memory node's URL).
    pub url: String,
    /// Objects it owns.
    pub objects: u64,
    /// Objects it keeps locally.
    pub local: u64,
    /// Unique copies (an object is either local or far), or local copies kept far as well.
    pub unique: bool,
    /// How long it runs once told to go.
    pub seconds: f64,
    /// The seed of its accesses.
    pub seed: u64,
}

impl Walk {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Walk::Zipf => "zipf",
            Walk::Scan => "scan",
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
