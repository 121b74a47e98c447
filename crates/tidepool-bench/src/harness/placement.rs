//! Where a suite's servers and clients run, and how long and how often it measures.

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::Duration;

/// Where servers and clients run. On small VMs a wake-up across vCPUs costs tens of
/// microseconds, so placement moves results more than code does; every system of a suite gets
/// the same placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Latency workloads as `Shared` (a round trip then measures the software, not the
    /// hypervisor's price for waking another vCPU), throughput workloads as `Split` (the server
    /// has a core of its own, as a memory node would).
    Auto,
    /// Servers on the last CPU, clients on the others (one CPU each on a 2-vCPU machine).
    Split,
    /// Everything on CPU 0: results measure total CPU per operation, with no cross-CPU wake-up.
    Shared,
    /// Wherever the scheduler puts things.
    Free,
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Placement::Auto),
            "split" => Ok(Placement::Split),
            "shared" => Ok(Placement::Shared),
            "free" => Ok(Placement::Free),
            _ => Err(format!(
                "placement must be auto, split, shared or free, not '{s}'"
            )),
        }
    }
}

impl Placement {
    /// CPUs of the machine (not of this thread's affinity, which placement itself narrows).
    fn cpus() -> usize {
        tidepool_sys::online_cpus()
    }

    /// The placement for one kind of workload.
    pub fn for_workload(self, latency: bool) -> Placement {
        match self {
            Placement::Auto if latency => Placement::Shared,
            Placement::Auto => Placement::Split,
            p => p,
        }
    }

    /// CPUs for client threads and client processes, if pinned.
    pub fn client_cpus(self) -> Option<Vec<usize>> {
        match self {
            Placement::Split | Placement::Auto if Self::cpus() > 1 => {
                Some((0..Self::cpus() - 1).collect())
            }
            Placement::Split | Placement::Auto | Placement::Shared => Some(vec![0]),
            Placement::Free => None,
        }
    }

    /// CPUs for server processes, if pinned.
    pub fn server_cpus(self) -> Option<Vec<usize>> {
        match self {
            Placement::Split | Placement::Auto => Some(vec![Self::cpus() - 1]),
            Placement::Shared => Some(vec![0]),
            Placement::Free => None,
        }
    }

    /// Pins a server process (all its threads) where servers go.
    pub fn pin_server(self, pid: u32) -> Result<()> {
        if let Some(cpus) = self.server_cpus() {
            tidepool_sys::pin_process(pid, &cpus)
                .with_context(|| format!("cannot pin server process {pid}"))?;
        }
        Ok(())
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Placement::Auto => "auto (latency: shared, throughput: split)",
            Placement::Split => "split",
            Placement::Shared => "shared",
            Placement::Free => "free",
        }
    }
}

/// `cmd` run on any CPU of the machine (through `taskset`), not only where the bench's own
/// threads and the programs it starts are pinned. Programs under a pager or swap run where a
/// user's would: the pager places its own threads (it follows the program's CPU, which needs
/// more than one), and the kernel's reclaim for zram runs on any CPU anyway. Programs paged to
/// a memory node stay off the node's CPU, as they would be on another machine.
pub fn on_any_cpu(cmd: &std::process::Command) -> std::process::Command {
    let mut c = std::process::Command::new("taskset");
    c.arg("--cpu-list")
        .arg(format!("0-{}", Placement::cpus().saturating_sub(1)))
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    if let Some(d) = cmd.get_current_dir() {
        c.current_dir(d);
    }
    c
}

/// How a suite should run.
#[derive(Debug, Clone)]
pub struct BenchOpts {
    /// Finish within about a minute, keeping every system and workload with less data.
    pub quick: bool,
    pub out: PathBuf,
    pub placement: Placement,
    /// The `alloc` suite's mimalloc-bench checkout, built with its own scripts: binaries in
    /// `out/bench/`, inputs in `bench/` (None: its programs are skipped).
    pub mimalloc_bench: Option<PathBuf>,
}

impl BenchOpts {
    /// Seconds per measurement.
    pub fn measure_for(&self) -> Duration {
        if self.quick {
            Duration::from_millis(300)
        } else {
            Duration::from_secs(1)
        }
    }

    /// Rounds over all systems; results are the median (throughput) or pooled (latency).
    /// Several short alternating rounds beat one long one on a shared VM: drift hits every
    /// system, and the median drops the round that a neighbour disturbed.
    pub fn rounds(&self) -> usize {
        if self.quick {
            3
        } else {
            5
        }
    }
}
