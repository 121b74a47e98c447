//! Where a benchmark's figures came from: the commit (and whether the tree had changes), the
//! kernel, the CPU, the memory and the peers' versions. Written into every suite's JSON as
//! `env` and printed under its plot.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::process::Command;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Env {
    /// `git rev-parse HEAD` where the benchmark ran, or "unknown" outside a checkout.
    pub commit: String,
    /// Tracked files differed from the commit.
    pub dirty: bool,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_bytes: u64,
    /// Peer programs and their version lines, for those installed.
    pub peers: BTreeMap<String, String>,
    pub quick: bool,
}

/// First line of a command's output (stdout, else stderr), if it ran.
fn first_line(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = if out.stdout.is_empty() {
        out.stderr
    } else {
        out.stdout
    };
    let line = String::from_utf8_lossy(&text)
        .lines()
        .next()?
        .trim()
        .to_string();
    (!line.is_empty()).then_some(line)
}

impl Env {
    pub fn capture(quick: bool) -> Env {
        let commit = first_line("git", &["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
        let dirty = commit != "unknown"
            && first_line("git", &["status", "--porcelain", "--untracked-files=no"]).is_some();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_string())
            .unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_bytes = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib << 10);
        let mut peers = BTreeMap::new();
        for (name, args) in [
            ("redis-server", &["--version"][..]),
            ("memcached", &["-V"][..]),
            ("python3", &["--version"][..]),
            ("sort", &["--version"][..]),
        ] {
            if let Some(v) = first_line(name, args) {
                peers.insert(name.to_string(), v);
            }
        }
        Env {
            commit,
            dirty,
            kernel,
            cpu_model,
            cpus: tidepool_sys::online_cpus(),
            memory_bytes,
            peers,
            quick,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_is_described() {
        let e = Env::capture(true);
        assert!(e.cpus >= 1 && e.memory_bytes > 0, "{e:?}");
        assert!(!e.kernel.is_empty(), "{e:?}");
        // In a git checkout of this repository the commit is known.
        let checkout = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.git");
        if checkout.exists() {
            assert_eq!(e.commit.len(), 40, "{e:?}");
        } else {
            assert_eq!(e.commit, "unknown", "{e:?}");
        }
        let v = serde_json::to_value(&e).unwrap();
        assert!(v["peers"].is_object() && v["quick"] == true, "{v}");
    }
}
