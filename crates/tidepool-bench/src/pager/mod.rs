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
//! 16 MiB allowance for the rest of the process):
//! `tidepool-local`, `tidepool-node` and `tidepool-node-x6-ec4+2` (the program under
//! `tidepool run`, far store in process, on a `tidepool node` process, or erasure-coded 4+2
//! over six node processes), `linux-zram` (the program in a cgroup v1 memory group
//! limited to the same local size, swapping to zram), and `native` (everything local, once).

mod verdict;
mod worker;

use crate::harness::{
    matrix_steps, BenchOpts, Ctx, Matrix, Sample, Suite, System, Turns, Workload,
};
use crate::node::{NodeProcess, NODE_BUSY_POLL_US};
use crate::worker::{run_python, run_worker_report, DICT_SCRIPT};
use crate::zram::Zram;
use anyhow::{Context, Result};
use std::path::Path;
use std::process::Command;
use std::time::Instant;
pub use worker::worker;

const WORKLOADS: [&str; 4] = ["seq-scan", "uniform-rmw", "uniform-rmw-4t", "zipf-0.99"];
const PYTHON_WORKLOAD: &str = "python-dict";
const RATIOS: [f64; 4] = [0.25, 0.5, 0.75, 1.0];
/// Local memory every system gets on top of its share of the working set: for zram's cgroup
/// the process itself (binary, stacks, libraries), for tidepool's budget the heap besides the
/// working set and the evictor's margin. Without it "100% local" would not fit for either.
pub const ALLOWANCE: u64 = 16 << 20;
/// The miss latencies a random-access worker reports (the mean is what throughput pays: the
/// tail weighs in).
const MISS_METRICS: [&str; 3] = ["miss_us_p50", "miss_us_p99", "miss_us_mean"];

#[derive(Debug)]
pub struct PagerSuite;

struct Sizes {
    wss: u64,
    seconds: f64,
    python_strings: u64,
}

fn sizes(opts: &BenchOpts) -> Sizes {
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

fn rounds(opts: &BenchOpts) -> usize {
    if opts.quick {
        1
    } else {
        3
    }
}

/// Where the program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pager {
    /// Under `tidepool run`, far store in process.
    TidepoolLocal,
    /// Under `tidepool run`, on a `tidepool node` process.
    TidepoolNode,
    /// Under `tidepool run`, erasure-coded 4+2 over six node processes.
    TidepoolNodeEc,
    /// In a memory cgroup limited to the same local size, swapping to zram.
    LinuxZram,
    /// Everything local (at 100% only).
    Native,
}

impl System for Pager {
    fn name(&self) -> &'static str {
        match self {
            Pager::TidepoolLocal => "tidepool-local",
            Pager::TidepoolNode => "tidepool-node",
            Pager::TidepoolNodeEc => "tidepool-node-x6-ec4+2",
            Pager::LinuxZram => "linux-zram",
            Pager::Native => "native",
        }
    }
}

/// One program at one local-memory ratio of its footprint.
#[derive(Debug, Clone, Copy)]
struct Paged {
    name: &'static str,
    ratio: f64,
    /// The program's footprint, which the ratio is of.
    footprint: u64,
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
        let exe = std::env::current_exe()?;
        let preload = crate::libs::next_to_exe("tidepool-preload", "libtidepool_preload.so")?;
        // The node has a CPU of its own (as on another machine), so it polls for requests
        // rather than sleeping between them (`--busy-poll-us`): a cross-CPU wake-up costs this
        // VM tens of microseconds, more than serving the page.
        let node = NodeProcess::start_with(
            &format!("{}", s.wss * 3),
            &["--busy-poll-us", &NODE_BUSY_POLL_US.to_string()],
        )?;
        ctx.opts.placement.pin_server(node.pid())?;
        ctx.note(format!(
            "tidepool-node: the node polls {NODE_BUSY_POLL_US} us for requests before it sleeps; \
             its clients poll {} us for answers",
            tidepool_store::NODE_DEFAULT_POLL.as_micros()
        ));
        // The erasure-coded store: six nodes started the same way, each page in four data
        // pieces and two parity pieces, one per node.
        let ec_nodes = (0..6)
            .map(|_| {
                NodeProcess::start_with(
                    &format!("{}", s.wss),
                    &["--busy-poll-us", &NODE_BUSY_POLL_US.to_string()],
                )
            })
            .collect::<Result<Vec<_>>>()?;
        for n in &ec_nodes {
            ctx.opts.placement.pin_server(n.pid())?;
        }
        let ec_url = format!(
            "node://bench@{}?ec=4+2",
            ec_nodes
                .iter()
                .map(|n| n.addr.as_str())
                .collect::<Vec<_>>()
                .join(",")
        );
        // The wire's floor in this run: one 4 KiB get at a time from the same node.
        ctx.step("the node's unpipelined 4 KiB get");
        let get = node_get_latency(&format!("node://bench-get@{}", node.addr))?;
        for (metric, v) in [("p50_us", get.0), ("p99_us", get.1)] {
            ctx.report
                .push("tidepool-node", "get-4k-unpipelined", metric, v, "us", &[]);
        }
        let zram = match Zram::start(s.wss * 2) {
            Ok(z) => Some(z),
            Err(e) => {
                ctx.note(format!("linux-zram skipped: {e:#}"));
                None
            }
        };
        let python = Path::new("/usr/bin/python3")
            .exists()
            .then_some("/usr/bin/python3");
        if python.is_none() {
            ctx.note("python-dict skipped: /usr/bin/python3 not found");
        }
        let script = ctx.opts.out.join("pager_dict.py");
        std::fs::write(&script, DICT_SCRIPT)?;
        // The Python program's footprint, which its ratios are of.
        let python_bytes = match python {
            Some(py) => {
                let mut cmd = Command::new(py);
                cmd.arg(&script).arg(s.python_strings.to_string());
                Some((run_python(cmd)?.1 * (1 << 20) as f64) as u64)
            }
            None => None,
        };
        let mut systems = vec![
            Pager::TidepoolLocal,
            Pager::TidepoolNode,
            Pager::TidepoolNodeEc,
        ];
        if zram.is_some() {
            systems.push(Pager::LinuxZram);
        }
        systems.push(Pager::Native);
        let mut workloads = Vec::new();
        for ratio in RATIOS {
            for name in WORKLOADS {
                workloads.push(Paged {
                    name,
                    ratio,
                    footprint: s.wss,
                });
            }
            if let Some(footprint) = python_bytes {
                workloads.push(Paged {
                    name: PYTHON_WORKLOAD,
                    ratio,
                    footprint,
                });
            }
        }
        let samples = Matrix::new(&systems, &workloads, rounds(&ctx.opts))
            .turns(Turns::Rotate)
            .only(|w, &sys| sys != Pager::Native || w.ratio == 1.0)
            .note_failures()
            .run(ctx, |_, _, w, &sys| {
                let local = (w.footprint as f64 * w.ratio) as u64 + ALLOWANCE;
                let mut cmd = match sys {
                    Pager::Native => Command::new("env"),
                    Pager::LinuxZram => zram
                        .as_ref()
                        .expect("listed only if started")
                        .command(local)?,
                    Pager::TidepoolLocal | Pager::TidepoolNode | Pager::TidepoolNodeEc => {
                        let backend = match sys {
                            Pager::TidepoolNode => format!("node://bench@{}", node.addr),
                            Pager::TidepoolNodeEc => ec_url.clone(),
                            _ => "local:".into(),
                        };
                        let mut c = Command::new(&exe);
                        c.args(["run", "--local", &local.to_string()])
                            .args(["--backend", &backend, "--"])
                            .env("TIDEPOOL_PRELOAD", &preload);
                        c
                    }
                };
                let (metric, unit) = w.metric();
                if w.is_python() {
                    cmd.arg(python.expect("a python workload only with python"))
                        .arg(&script)
                        .arg(s.python_strings.to_string());
                    return Ok(Sample::new().median(metric, unit, run_python(cmd)?.0));
                }
                cmd.arg(&exe).args([
                    "bench-worker",
                    "pager",
                    w.name,
                    &s.wss.to_string(),
                    &s.seconds.to_string(),
                ]);
                let v = run_worker_report(cmd)?;
                let value = v["value"].as_f64().context("worker report lacks value")?;
                let mut sample = Sample::new().median(metric, unit, value);
                // What one miss costs the program (sampled accesses slower than a local one).
                for m in MISS_METRICS {
                    if let Some(x) = v[m].as_f64() {
                        sample = sample.median(m, "us", x);
                    }
                }
                Ok(sample)
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
