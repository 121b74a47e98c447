//! Parts (b) and (c) run in a v1 memory cgroup standing for a machine: its sizes, the cgroup,
//! and a sampler of its headroom.

use crate::harness::BenchOpts;
use anyhow::{bail, Context, Result};
use std::process::Command;
use std::time::{Duration, Instant};

/// Sizes of the cgroup parts.
pub(super) struct PressureScale {
    /// The cgroup's memory limit (the "machine").
    pub(super) limit: u64,
    pub(super) reserve: u64,
    pub(super) objects: u64,
    /// Seconds between the events of a run.
    pub(super) phase_s: f64,
}

pub(super) fn pressure_scale(opts: &BenchOpts) -> PressureScale {
    if opts.quick {
        PressureScale {
            limit: 1 << 30,
            reserve: 128 << 20,
            objects: 160_000,
            phase_s: 8.0,
        }
    } else {
        PressureScale {
            limit: 3 << 30,
            reserve: 256 << 20,
            objects: 512_000,
            phase_s: 15.0,
        }
    }
}

/// A v1 memory cgroup with no swap, standing for a machine whose memory is `limit`; removed
/// when dropped.
#[derive(Debug)]
pub struct Cgroup {
    dir: std::path::PathBuf,
}

impl Cgroup {
    pub fn create(name: &str, limit: u64) -> Result<Cgroup> {
        let root = std::path::Path::new("/sys/fs/cgroup/memory");
        if !root.join("memory.limit_in_bytes").exists() {
            bail!(
                "needs the cgroup v1 memory controller at {}; {}",
                root.display(),
                tidepool_sys::probe::DOCTOR_HINT
            );
        }
        let dir = root.join(format!("tidepool-bench-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).with_context(|| {
            format!(
                "cannot create {} (root needed); {}",
                dir.display(),
                tidepool_sys::probe::DOCTOR_HINT
            )
        })?;
        let cg = Cgroup { dir };
        cg.set("memory.limit_in_bytes", limit)?;
        // No swap: soft memory must give way by itself, or something is OOM-killed.
        if cg.dir.join("memory.memsw.limit_in_bytes").exists() {
            cg.set("memory.memsw.limit_in_bytes", limit)?;
        }
        Ok(cg)
    }

    /// A cgroup of `limit` whose members may swap (where the machine has swap), as on a host
    /// with swap: what a fixed-size server does when the host runs short.
    pub fn create_with_swap(name: &str, limit: u64) -> Result<Cgroup> {
        let cg = Cgroup::create(name, limit)?;
        if cg.dir.join("memory.memsw.limit_in_bytes").exists() {
            // Raise the memory+swap limit to twice the memory limit.
            cg.set("memory.memsw.limit_in_bytes", 2 * limit)?;
        }
        cg.set("memory.swappiness", 60)?;
        Ok(cg)
    }

    /// Moves process `pid` into the cgroup (memory it already holds stays charged where it
    /// was: adopt a process before it fills).
    pub fn adopt(&self, pid: u32) -> Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("cannot move process {pid} into {}", self.dir.display()))
    }

    pub fn set(&self, file: &str, v: u64) -> Result<()> {
        std::fs::write(self.dir.join(file), v.to_string())
            .with_context(|| format!("cannot set {file}"))
    }

    pub fn read(&self, file: &str) -> u64 {
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Limit less usage: what the "machine" has left.
    pub fn headroom(&self) -> u64 {
        self.read("memory.limit_in_bytes")
            .saturating_sub(self.read("memory.usage_in_bytes"))
    }

    pub fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("memory.oom_control"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// `tidepool ARGS` started inside the cgroup (it joins before anything runs).
    pub fn command(&self, args: &[String]) -> Result<Command> {
        Ok(self.command_of(&std::env::current_exe()?, args))
    }

    /// `PROGRAM ARGS` started inside the cgroup.
    pub fn command_of(
        &self,
        program: &std::path::Path,
        args: &[impl AsRef<std::ffi::OsStr>],
    ) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(r#"echo $$ > "$1" && shift && exec "$@""#)
            .arg("sh")
            .arg(self.dir.join("cgroup.procs"))
            .arg(program)
            .args(args);
        c
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// What the sampler saw: (seconds, headroom) every 10 ms, and the longest stretch under the
/// reserve.
#[derive(Debug, Default)]
pub(super) struct Watch {
    pub(super) points: Vec<(f64, u64)>,
    pub(super) longest_below: f64,
}

/// A thread watching a cgroup's headroom until finished.
pub(super) struct Sampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Watch>,
}

impl Sampler {
    pub(super) fn start(cg: &Cgroup, reserve: u64, t0: Instant) -> Sampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (st, dir) = (stop.clone(), cg.dir.clone());
        let thread = std::thread::spawn(move || {
            let cg = Cgroup { dir };
            let w = watch(&cg, reserve, &st, t0);
            std::mem::forget(cg); // the caller's guard removes it
            w
        });
        Sampler { stop, thread }
    }

    pub(super) fn finish(self) -> Result<Watch> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("sampler panicked"))
    }
}

pub(super) fn watch(
    cg: &Cgroup,
    reserve: u64,
    stop: &std::sync::atomic::AtomicBool,
    t0: Instant,
) -> Watch {
    let mut w = Watch::default();
    let mut below_since: Option<f64> = None;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let t = t0.elapsed().as_secs_f64();
        let h = cg.headroom();
        w.points.push((t, h));
        match (h < reserve, below_since) {
            (true, None) => below_since = Some(t),
            (false, Some(s)) => {
                w.longest_below = w.longest_below.max(t - s);
                below_since = None;
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Some(s) = below_since {
        w.longest_below = w.longest_below.max(t0.elapsed().as_secs_f64() - s);
    }
    w
}
