//! Running a measured program to its end and reading what it reports: `tidepool bench-worker`
//! processes (one JSON line) and the CPython program the paging suites share.

use anyhow::{bail, Context, Result};
use std::process::{Command, Output, Stdio};

/// Runs a worker; its throughput (GB/s for the scan, ops/s otherwise).
pub fn run_worker(cmd: Command) -> Result<f64> {
    let v = run_worker_report(cmd)?;
    v["value"].as_f64().context("worker report lacks value")
}

/// Runs a worker; its whole report (`value`, and for the random workloads `miss_us_p50`,
/// `miss_us_p99` and `miss_us_mean`).
pub fn run_worker_report(mut cmd: Command) -> Result<serde_json::Value> {
    worker_report(cmd.stdin(Stdio::null()).output()?)
}

/// What a worker that ended with `out` reported.
pub fn worker_report(out: Output) -> Result<serde_json::Value> {
    if !out.status.success() {
        bail!(
            "worker failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("worker said: {}", String::from_utf8_lossy(&out.stdout)))
}

pub const DICT_SCRIPT: &str = r#"
import resource, sys, time
n = int(sys.argv[1])
t = time.perf_counter()
d = {}
for i in range(n):
    d["key-%d" % i] = "value-%d-%s" % (i, "x" * (i % 17))
total = sum(len(k) + len(v) for k, v in d.items())
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, total)
"#;

/// Runs the Python program; (seconds, peak RSS MiB).
pub fn run_python(mut cmd: Command) -> Result<(f64, f64)> {
    python_report(cmd.stdin(Stdio::null()).output()?)
}

/// What the Python program that ended with `out` reported: (seconds, peak RSS MiB).
pub fn python_report(out: Output) -> Result<(f64, f64)> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "python failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let f: Vec<f64> = stdout
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    match f.as_slice() {
        [secs, kib, _] => Ok((*secs, kib / 1024.0)),
        _ => bail!("python printed '{}'", stdout.trim()),
    }
}
