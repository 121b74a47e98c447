//! The pager suite's programs: four workloads of `tidepool bench-worker`'s `pager` job over random
//! data and CPython building a dict, each at every local-memory ratio, and how a run of one is
//! read.

use crate::harness::{BenchOpts, Ctx, Sample, Workload};
use crate::job::{Job, PagerJob};
use crate::meter::{run_metered, Held, Watch};
use crate::worker::{python_report, run_python, worker_report, DICT_SCRIPT};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub(super) const WORKLOADS: [&str; 4] = ["seq-scan", "uniform-rmw", "uniform-rmw-4t", "zipf-0.99"];
const PYTHON_WORKLOAD: &str = "python-dict";
pub(super) const RATIOS: [f64; 4] = [0.25, 0.5, 0.75, 1.0];
/// Local memory every system gets on top of its share of the working set: for zram's cgroup
/// the process itself (binary, stacks, libraries), for tidepool's budget the heap besides the
/// working set and the evictor's margin. Without it "100% local" would not fit for either.
pub const ALLOWANCE: u64 = 16 << 20;
/// The miss latencies a random-access worker reports (the mean is what throughput pays: the
/// tail weighs in).
pub(super) const MISS_METRICS: [&str; 3] = ["miss_us_p50", "miss_us_p99", "miss_us_mean"];

/// How big a run is.
pub(super) struct Sizes {
    pub(super) wss: u64,
    seconds: f64,
    python_strings: u64,
}

pub(super) fn sizes(opts: &BenchOpts) -> Sizes {
    if opts.quick {
        Sizes {
            wss: 96 << 20,
            seconds: 0.4,
            python_strings: 300_000,
        }
    } else {
        Sizes {
            wss: 512 << 20,
            seconds: 2.0,
            python_strings: 1_500_000,
        }
    }
}

/// One program at one local-memory ratio of its footprint.
#[derive(Debug, Clone, Copy)]
pub(super) struct Paged {
    name: &'static str,
    pub(super) ratio: f64,
    /// The program's footprint, which the ratio is of.
    pub(super) footprint: u64,
}

impl Workload for Paged {
    fn name(&self) -> &str {
        self.name
    }

    fn on(&self, system: &str) -> String {
        format!(
            "{} on {system} at {:.0}% local",
            self.name,
            self.ratio * 100.0
        )
    }

    fn params(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("local_ratio", self.ratio),
            ("working_set_mib", self.footprint as f64 / (1 << 20) as f64),
        ]
    }

    /// What one miss costs is reported against the ratio alone.
    fn params_for(&self, metric: &str) -> Vec<(&'static str, f64)> {
        if MISS_METRICS.contains(&metric) {
            vec![("local_ratio", self.ratio)]
        } else {
            self.params()
        }
    }
}

impl Paged {
    fn is_python(&self) -> bool {
        self.name == PYTHON_WORKLOAD
    }

    /// The program's throughput metric and its unit.
    fn metric(&self) -> (&'static str, &'static str) {
        match self.name {
            "seq-scan" => ("gb_per_s", "GB/s"),
            PYTHON_WORKLOAD => ("seconds", "s"),
            _ => ("ops_per_s", "ops/s"),
        }
    }
}

/// What running the programs needs: this executable (the worker), python3 and the dict
/// script, and the run's sizes.
pub(super) struct Programs {
    exe: PathBuf,
    python: Option<&'static str>,
    script: PathBuf,
    /// The Python program's footprint, which its ratios are of.
    python_bytes: Option<u64>,
    wss: u64,
    seconds: f64,
    python_strings: u64,
}

impl Programs {
    /// Finds python3 (noting its absence), writes the dict script beside the results and
    /// measures the Python program's footprint natively.
    pub(super) fn new(ctx: &mut Ctx, s: &Sizes) -> Result<Programs> {
        let python = Path::new("/usr/bin/python3")
            .exists()
            .then_some("/usr/bin/python3");
        if python.is_none() {
            ctx.note("python-dict skipped: /usr/bin/python3 not found");
        }
        let script = ctx.opts.out.join("pager_dict.py");
        std::fs::write(&script, DICT_SCRIPT)?;
        let python_bytes = match python {
            Some(py) => {
                let mut cmd = Command::new(py);
                cmd.arg(&script).arg(s.python_strings.to_string());
                Some((run_python(cmd)?.1 * (1 << 20) as f64) as u64)
            }
            None => None,
        };
        Ok(Programs {
            exe: std::env::current_exe()?,
            python,
            script,
            python_bytes,
            wss: s.wss,
            seconds: s.seconds,
            python_strings: s.python_strings,
        })
    }

    /// Every program at every ratio (ratio by ratio), python-dict only with python3.
    pub(super) fn workloads(&self) -> Vec<Paged> {
        let mut workloads = Vec::new();
        for ratio in RATIOS {
            for name in WORKLOADS {
                workloads.push(Paged {
                    name,
                    ratio,
                    footprint: self.wss,
                });
            }
            if let Some(footprint) = self.python_bytes {
                workloads.push(Paged {
                    name: PYTHON_WORKLOAD,
                    ratio,
                    footprint,
                });
            }
        }
        workloads
    }

    /// Runs program `w` with `cmd` (which runs its arguments under a system) and reads its
    /// figure, and for the random workloads what a miss cost.
    /// `watch` follows the bytes its system holds for it (`machine_mib`, `far_mib`).
    pub(super) fn measure(
        &self,
        mut cmd: Command,
        w: &Paged,
        watch: impl FnOnce(u32) -> Watch,
    ) -> Result<Sample> {
        let (metric, unit) = w.metric();
        let held_rows = |sample: Sample, held: Held| {
            let sample = sample.median("machine_mib", "MiB", held.machine_mib());
            // On a memory node: the far bytes, and what the pager does not page (its budget
            // plus that is what the node's run should hold here).
            match (held.far_mib(), held.unpaged_mib()) {
                (Some(far), Some(unpaged)) => {
                    sample
                        .median("far_mib", "MiB", far)
                        .median("unpaged_mib", "MiB", unpaged)
                }
                (Some(far), None) => sample.median("far_mib", "MiB", far),
                _ => sample,
            }
        };
        if w.is_python() {
            cmd.arg(self.python.expect("a python workload only with python"))
                .arg(&self.script)
                .arg(self.python_strings.to_string());
            let (out, held) = run_metered(cmd, watch)?;
            let seconds = python_report(out)?.0;
            return Ok(held_rows(Sample::new().median(metric, unit, seconds), held));
        }
        let job = Job::Pager(PagerJob {
            workload: w.name.to_owned(),
            wss: self.wss,
            seconds: self.seconds,
        });
        cmd.arg(&self.exe).args(job.args());
        let (out, held) = run_metered(cmd, watch)?;
        let v = worker_report(out)?;
        let value = v["value"].as_f64().context("worker report lacks value")?;
        let mut sample = held_rows(Sample::new().median(metric, unit, value), held);
        // What one miss costs the program (sampled accesses slower than a local one).
        for m in MISS_METRICS {
            if let Some(x) = v[m].as_f64() {
                sample = sample.median(m, "us", x);
            }
        }
        Ok(sample)
    }
}
