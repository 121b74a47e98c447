//! The bytes a system holds for a program while it runs, sampled every [`EVERY`]: what the
//! paging suites report beside every time (`machine_mib`, `far_mib`).
//!
//! - On this machine ([`Gauge`]): for a program under `tidepool run`, or native, the
//!   proportional set size (Pss) of its process and every descendant: its RSS, stores in its
//!   process included, with pages a fork shares counted once. For a program swapping to zram,
//!   its memory cgroup's usage plus what the zram device holds beyond where it stood when the
//!   program started (`mem_used_total` in mm_stat: compressed pages and their allocator).
//! - On a memory node: the bytes the node has allocated to the program's tenant, beyond where
//!   they stood at the start. In production they are another machine's.
//! - Unpaged, for a program's processes, every [`UNPAGED_EVERY`]th sample and at each new peak
//!   (at most every other sample): the Pss of their
//!   mappings not registered with a userfaultfd (no `um` in smaps' VmFlags): code, libraries,
//!   stacks, and the pager's own memory (its tables and buffers, an in-process store). What a
//!   pager's budget does not cover.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// How often the bytes are sampled.
pub const EVERY: Duration = Duration::from_millis(50);

/// Every how many samples the unpaged bytes are counted (smaps is longer to read than
/// smaps_rollup, and they change slowly).
pub const UNPAGED_EVERY: u32 = 10;

/// How a system's bytes on this machine are counted.
#[derive(Debug, Clone)]
pub enum Gauge {
    /// The program's processes' Pss.
    Processes,
    /// A memory cgroup's usage plus a zram device's memory.
    Zram { cgroup: PathBuf, device: PathBuf },
}

fn read_u64(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `mem_used_total`, the third field of a zram device's mm_stat.
fn zram_used(device: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(device.join("mm_stat"))
        .ok()?
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

/// `pid` and its descendants.
fn process_tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let p = all[i];
        i += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            if let Ok(children) = std::fs::read_to_string(t.path().join("children")) {
                all.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                );
            }
        }
    }
    all
}

/// A process's Pss (or, where smaps_rollup is missing, its RSS), bytes.
fn pss_of(pid: u32) -> Option<u64> {
    let field = |file: &str, name: &str| -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
        let kib: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some(kib << 10)
    };
    field("smaps_rollup", "Pss:").or_else(|| field("status", "VmRSS:"))
}

/// The Pss of a process's mappings that no userfaultfd tracks, bytes.
fn unpaged_of(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let (mut sum, mut pss) = (0, 0);
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("Pss:") {
            pss = v.split_whitespace().next()?.parse::<u64>().ok()? << 10;
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            // VmFlags ends each mapping's block.
            if !flags.split_whitespace().any(|f| f == "um") {
                sum += pss;
            }
            pss = 0;
        }
    }
    Some(sum)
}

impl Gauge {
    /// The unpaged bytes now (see the module's notes), for a program's processes.
    fn unpaged(&self, pid: u32) -> Option<u64> {
        match self {
            Gauge::Processes => Some(process_tree(pid).into_iter().filter_map(unpaged_of).sum()),
            Gauge::Zram { .. } => None,
        }
    }

    /// The bytes now, for the program `pid` (`base`: the zram device's bytes at its start).
    fn sample(&self, pid: u32, base: u64) -> u64 {
        match self {
            Gauge::Processes => process_tree(pid).into_iter().filter_map(pss_of).sum(),
            Gauge::Zram { cgroup, device } => {
                read_u64(&cgroup.join("memory.usage_in_bytes")).unwrap_or(0)
                    + zram_used(device).unwrap_or(0).saturating_sub(base)
            }
        }
    }

    fn base(&self) -> u64 {
        match self {
            Gauge::Processes => 0,
            Gauge::Zram { device, .. } => zram_used(device).unwrap_or(0),
        }
    }
}

/// The bytes a memory node holds for one tenant.
#[derive(Debug, Clone)]
pub struct FarGauge {
    /// The node's URL with the program's tenant.
    pub url: String,
}

impl FarGauge {
    fn open(&self) -> Option<Arc<dyn tidepool_store::FarStore>> {
        tidepool_store::open(&self.url).ok()
    }
}

fn far_bytes(store: &Option<Arc<dyn tidepool_store::FarStore>>) -> Option<u64> {
    store.as_ref()?.stats().ok()?.far_bytes
}

#[derive(Debug, Default)]
struct Peaks {
    machine: AtomicU64,
    far: AtomicU64,
    unpaged: AtomicU64,
    stop: AtomicBool,
}

/// Peak bytes, held on this machine and on a memory node.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Held {
    pub machine: u64,
    pub far: Option<u64>,
    /// The peak of the bytes outside the pager's regions (programs' processes only).
    pub unpaged: Option<u64>,
}

impl Held {
    pub fn machine_mib(&self) -> f64 {
        self.machine as f64 / (1u64 << 20) as f64
    }

    pub fn far_mib(&self) -> Option<f64> {
        self.far.map(|f| f as f64 / (1u64 << 20) as f64)
    }

    pub fn unpaged_mib(&self) -> Option<f64> {
        self.unpaged.map(|u| u as f64 / (1u64 << 20) as f64)
    }
}

/// A sampler following one program until [`Watch::finish`].
#[derive(Debug)]
pub struct Watch {
    peaks: Arc<Peaks>,
    far: bool,
    unpaged: bool,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    /// Starts sampling program `pid` (and its descendants).
    pub fn start(pid: u32, gauge: &Gauge, far: Option<&FarGauge>) -> Watch {
        let peaks = Arc::new(Peaks::default());
        let (gauge, far_gauge) = (gauge.clone(), far.cloned());
        let base = gauge.base();
        let unpaged = matches!(gauge, Gauge::Processes);
        let p = peaks.clone();
        let thread = std::thread::spawn(move || {
            let store = far_gauge.as_ref().and_then(FarGauge::open);
            let far_base = far_bytes(&store).unwrap_or(0);
            let (mut n, mut last) = (0u32, 0u32);
            loop {
                let bytes = gauge.sample(pid, base);
                let peak = p.machine.fetch_max(bytes, Relaxed) < bytes;
                if n.wrapping_sub(last) >= UNPAGED_EVERY || (peak && n.wrapping_sub(last) >= 2) {
                    last = n;
                    if let Some(u) = gauge.unpaged(pid) {
                        p.unpaged.fetch_max(u, Relaxed);
                    }
                }
                n = n.wrapping_add(1);
                if let Some(f) = far_bytes(&store) {
                    p.far.fetch_max(f.saturating_sub(far_base), Relaxed);
                }
                if p.stop.load(Relaxed) {
                    break;
                }
                std::thread::sleep(EVERY);
            }
        });
        Watch {
            peaks,
            far: far.is_some(),
            unpaged,
            thread: Some(thread),
        }
    }

    /// The peaks since the start or the last call, and starts over (one phase of a program
    /// that runs several).
    pub fn take(&self) -> Held {
        Held {
            machine: self.peaks.machine.swap(0, Relaxed),
            far: self.far.then(|| self.peaks.far.swap(0, Relaxed)),
            unpaged: self.unpaged.then(|| self.peaks.unpaged.swap(0, Relaxed)),
        }
    }

    /// Stops sampling (after one last sample); the peaks.
    pub fn finish(mut self) -> Held {
        self.peaks.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.take()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.peaks.stop.store(true, Relaxed);
    }
}

/// Runs `cmd` to its end, collecting its output, with `watch` following it.
pub fn run_metered(
    mut cmd: std::process::Command,
    watch: impl FnOnce(u32) -> Watch,
) -> std::io::Result<(std::process::Output, Held)> {
    use std::process::Stdio;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let watch = watch(child.id());
    let out = child.wait_with_output();
    let held = watch.finish();
    Ok((out?, held))
}

/// The verdict note on a pager whose pages live off this machine: `held` MiB on it should be
/// its `budget` plus its `unpaged` memory, within 10%. `budget_is` says what the budget
/// counts, if more than the program's `--local` (empty otherwise).
pub fn budget_note(
    workload: &str,
    ratio: f64,
    system: &str,
    held: f64,
    budget: f64,
    budget_is: &str,
    unpaged: f64,
) -> String {
    let x = held / (budget + unpaged);
    format!(
        "{workload} at {:.0}% local: {system} holds {held:.0} MiB on this machine, {x:.2}x its \
         budget ({budget:.0} MiB{budget_is}) plus its unpaged memory ({unpaged:.0} MiB): {}",
        ratio * 100.0,
        if x <= 1.1 {
            "within 10%"
        } else {
            "over by more than 10%"
        }
    )
}
