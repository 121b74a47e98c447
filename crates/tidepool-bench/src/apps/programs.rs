//! The programs besides Redis: pandas, GNU sort and CPython, each checked against its native
//! answer.

use super::launch::{Ended, Launcher, SectionTotals, System};
use crate::data::splitmix64;
use crate::harness::BenchOpts;
use crate::meter::Held;
use anyhow::{anyhow, bail, Context, Result};
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use tidepool_sys::interrupts::Interrupts;

/// Sizes of one run of the suite.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub redis_keys: u64,
    pub redis_requests: u64,
    pub pandas_rows: u64,
    pub sort_lines: u64,
    pub dict_strings: u64,
    /// Entries of go-map's and node-map's maps; jvm-hashmap's is a third more.
    pub map_entries: u64,
}

impl Sizes {
    /// Entries of a runtime workload's map (the issue's programs: 3M for Go and Node.js, 4M
    /// for the JVM).
    pub fn runtime_entries(&self, workload: &str) -> u64 {
        match workload {
            "jvm-hashmap" => self.map_entries * 4 / 3,
            _ => self.map_entries,
        }
    }
}

impl Sizes {
    pub fn of(opts: &BenchOpts) -> Sizes {
        if opts.quick {
            Sizes {
                redis_keys: 32_768,
                redis_requests: 20_000,
                pandas_rows: 4_000_000,
                sort_lines: 600_000,
                dict_strings: 300_000,
                map_entries: 300_000,
            }
        } else {
            // 262144 values of 4 KiB: 1 GiB.
            Sizes {
                redis_keys: 262_144,
                redis_requests: 200_000,
                pandas_rows: 40_000_000,
                sort_lines: 6_000_000,
                dict_strings: 3_000_000,
                map_entries: 3_000_000,
            }
        }
    }
}

/// The real interpreter behind `python3` on PATH (a pyenv shim would add processes of its own
/// to every run), and whether it has pandas.
pub fn python() -> Result<(PathBuf, bool)> {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .context("python3 is not installed")?;
    let exe = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let pandas = Command::new(&exe)
        .args(["-c", "import pandas"])
        .status()
        .is_ok_and(|s| s.success());
    Ok((exe, pandas))
}

pub const PANDAS_SCRIPT: &str = r#"
import hashlib, sys, time
import numpy as np, pandas as pd
n = int(sys.argv[1])
t = time.perf_counter()
rng = np.random.default_rng(42)
df = pd.DataFrame({"k": rng.integers(0, 1000, n), "v": rng.random(n), "w": rng.integers(0, 100, n)})
g = df.groupby("k").agg({"v": ["sum", "mean"], "w": "sum"})
print(time.perf_counter() - t, hashlib.sha256(g.round(6).to_csv().encode()).hexdigest())
"#;

/// A program's run: its seconds and the answer it printed.
#[derive(Debug)]
pub enum Outcome {
    Done { seconds: f64, answer: String },
    OomKilled,
}

/// A program's run under a system: how it ended, its peak RSS, the bytes its system held and
/// the cross-CPU interrupts the machine took meanwhile.
#[derive(Debug)]
pub struct Ran {
    pub outcome: Outcome,
    pub peak_rss: u64,
    pub held: Held,
    pub interrupts: Option<Interrupts>,
    /// What its sections did, under `tidepool run`.
    pub sections: Option<SectionTotals>,
}

impl Ran {
    /// The run as `outcome`, its figures from `ended`.
    pub(super) fn of(outcome: Outcome, ended: Ended) -> Ran {
        Ran {
            outcome,
            peak_rss: ended.peak_rss,
            held: ended.held,
            interrupts: ended.interrupts,
            sections: ended.sections,
        }
    }
}

fn program_outcome(what: &str, ended: &Ended) -> Result<Outcome> {
    if ended.oom_killed() {
        return Ok(Outcome::OomKilled);
    }
    if !ended.status.success() {
        bail!("{what} failed ({}): {}", ended.status, ended.stderr.trim());
    }
    let mut words = ended.stdout.split_whitespace();
    let seconds = words
        .next()
        .and_then(|w| w.parse().ok())
        .ok_or_else(|| anyhow!("{what} printed '{}'", ended.stdout.trim()))?;
    Ok(Outcome::Done {
        seconds,
        answer: words.collect::<Vec<_>>().join(" "),
    })
}

/// The pandas groupby, timed inside the script (imports excluded).
pub fn pandas(
    l: &Launcher,
    system: System,
    local: u64,
    python: &Path,
    rows: u64,
    dir: &Path,
) -> Result<Ran> {
    let ended = run_script(
        l,
        system,
        local,
        python,
        dir,
        "apps_pandas.py",
        PANDAS_SCRIPT,
        rows,
    )?;
    Ok(Ran::of(program_outcome("pandas", &ended)?, ended))
}

/// Writes `text` to `dir/name` and runs it with `python` and one number argument, to its end.
#[allow(clippy::too_many_arguments)]
fn run_script(
    l: &Launcher,
    system: System,
    local: u64,
    python: &Path,
    dir: &Path,
    name: &str,
    text: &str,
    arg: u64,
) -> Result<Ended> {
    let script = dir.join(name);
    std::fs::write(&script, text)?;
    let argv = [python.into(), script.into(), arg.to_string().into()];
    l.run_to_end(system, l.command_anywhere(system, local, &argv)?)
}

/// The python-dict workload (the pager suite's script).
pub fn python_dict(
    l: &Launcher,
    system: System,
    local: u64,
    python: &Path,
    strings: u64,
    dir: &Path,
) -> Result<Ran> {
    let ended = run_script(
        l,
        system,
        local,
        python,
        dir,
        "apps_dict.py",
        crate::worker::DICT_SCRIPT,
        strings,
    )?;
    // The script prints seconds, its own peak RSS and the sum; the sum is the answer.
    let outcome = match program_outcome("python-dict", &ended)? {
        Outcome::Done { seconds, answer } => Outcome::Done {
            seconds,
            answer: answer.split_whitespace().last().unwrap_or("").to_string(),
        },
        o => o,
    };
    Ok(Ran::of(outcome, ended))
}

/// A deterministic text file of `lines` lines for sort (hex keys and varying tails).
pub fn sort_input(dir: &Path, lines: u64) -> Result<PathBuf> {
    let path = dir.join(format!("apps_sort_{lines}.txt"));
    if path.exists() {
        return Ok(path);
    }
    let tmp = dir.join(format!("apps_sort_{lines}.tmp"));
    let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..lines {
        x = splitmix64(x);
        let tail = 10 + (x >> 58) as usize;
        writeln!(w, "{x:016x} {}", "x".repeat(tail))?;
    }
    w.flush()?;
    drop(w);
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// GNU sort of `input` into a file; the answer is the output's sha256 (sha256sum).
pub fn sort(l: &Launcher, system: System, local: u64, input: &Path, dir: &Path) -> Result<Ran> {
    let output = dir.join(format!("apps_sort_{}.out", system.name()));
    let argv: Vec<OsString> = vec![
        "sort".into(),
        "-o".into(),
        output.clone().into(),
        input.into(),
    ];
    let mut cmd = l.command_anywhere(system, local, &argv)?;
    cmd.env("LC_ALL", "C").env("TMPDIR", dir);
    let ended = l.run_to_end(system, cmd)?;
    if ended.oom_killed() {
        return Ok(Ran::of(Outcome::OomKilled, ended));
    }
    if !ended.status.success() {
        bail!("sort failed ({}): {}", ended.status, ended.stderr.trim());
    }
    let sum = Command::new("sha256sum").arg(&output).output()?;
    let answer = String::from_utf8_lossy(&sum.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string();
    let _ = std::fs::remove_file(&output);
    let seconds = ended.seconds;
    Ok(Ran::of(Outcome::Done { seconds, answer }, ended))
}
