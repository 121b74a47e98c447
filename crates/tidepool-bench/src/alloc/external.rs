//! Running a program nobody here wrote under one allocator: its wall time, its peak RSS as the
//! kernel counted it (`wait4`, since such programs do not report their own), its output, and
//! whether the preloaded allocator really was the one mapped into it.
//!
//! The preload is checked in `/proc/PID/maps` while the program starts: the dynamic loader maps
//! `LD_PRELOAD` libraries before the program's own dependencies, so once libc is mapped a
//! preload is either there or was never loaded. The maps are read every fraction of a
//! millisecond until then, which takes a few milliseconds; a program that exits sooner leaves
//! the check undone (reported as such, never as a pass).

use super::allocators::{allocator_in_maps, check_mapped};
use anyhow::{bail, Context, Result};
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What a run of a program gave.
#[derive(Debug)]
pub(super) struct Finished {
    /// From spawning it to its exit.
    pub(super) seconds: f64,
    pub(super) peak_rss_kib: u64,
    pub(super) stdout: String,
    pub(super) stderr: String,
    /// The preload was seen mapped (or, for glibc, no allocator was); false when the program
    /// exited before its libraries were all mapped, so nobody could tell.
    pub(super) preload_checked: bool,
}

/// Runs `cmd` (its environment, stdin and working directory already set) to its end, on
/// `cpus` if given, killing it after `timeout`. Fails if it exits unsuccessfully, is killed, or
/// runs with another allocator than `lib` (None: glibc's own malloc, nothing preloaded).
pub(super) fn run(
    mut cmd: Command,
    lib: Option<&Path>,
    cpus: Option<&[usize]>,
    timeout: Duration,
) -> Result<Finished> {
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
    let id = child.id();
    let pid = Pid::from_child(&child);
    if let Some(cpus) = cpus {
        // Best effort: the program may already have exited.
        let _ = tidepool_sys::pin_process(id, cpus);
    }
    let drain = |stream: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut s) = stream {
                let _ = s.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = drain(child.stdout.take().map(|s| Box::new(s) as _));
    let stderr = drain(child.stderr.take().map(|s| Box::new(s) as _));
    // Kills the program if it outlives `timeout`. It kills only before the program is reaped
    // (the wait below leaves it a zombie until the watchdog is done), so the pid is still ours.
    let (done, watch) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let late = watch.recv_timeout(timeout) == Err(mpsc::RecvTimeoutError::Timeout);
        if late {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
        late
    });
    let loaded = watch_loading(pid, lib);
    // Exited, not yet reaped.
    let exited = loop {
        match rustix::process::waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r,
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    drop(done);
    let killed = watchdog.join().unwrap_or(false);
    let (status, peak_rss_kib) = tidepool_sys::reap_child(id).context("cannot reap the program")?;
    exited.context("cannot wait for the program")?;
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    if killed {
        bail!("still running after {} s; killed", timeout.as_secs());
    }
    if !status.success() {
        bail!("{status}: {}", tail(&stderr));
    }
    let preload_checked = loaded?;
    Ok(Finished {
        seconds,
        peak_rss_kib,
        stdout,
        stderr,
        preload_checked,
    })
}

/// Watches `pid`'s maps until its libraries are loaded, then checks the allocator mapped in it.
/// `Ok(false)`: it exited (or took implausibly long) before that could be seen.
fn watch_loading(pid: Pid, lib: Option<&Path>) -> Result<bool> {
    let path = format!("/proc/{}/maps", pid.as_raw_pid());
    let give_up = Instant::now() + Duration::from_secs(5);
    while Instant::now() < give_up {
        let still_running = rustix::process::waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT | WaitIdOptions::NOHANG,
        )
        .map(|s| s.is_none())
        .unwrap_or(false);
        let Ok(maps) = std::fs::read_to_string(&path) else {
            return Ok(false);
        };
        if !still_running {
            return Ok(false);
        }
        if libc_mapped(&maps) {
            check_mapped(allocator_in_maps(&maps), lib).map_err(anyhow::Error::msg)?;
            return Ok(true);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(false)
}

/// Whether the C library is mapped: the loader has then mapped every preload.
fn libc_mapped(maps: &str) -> bool {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter_map(|p| p.rsplit('/').next())
        .any(|f| f.starts_with("libc.so") || f.starts_with("libc-"))
}

/// The last lines of a program's stderr, for a failure note.
fn tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().rev().take(3).collect();
    if lines.is_empty() {
        return "nothing on stderr".into();
    }
    lines.into_iter().rev().collect::<Vec<_>>().join(" / ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_run_gives_time_rss_output_and_its_failures() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2; sleep 0.05"]);
        let f = run(cmd, None, None, Duration::from_secs(30)).unwrap();
        assert_eq!((f.stdout.as_str(), f.stderr.as_str()), ("out\n", "err\n"));
        assert!(f.seconds >= 0.05 && f.peak_rss_kib > 0, "{f:?}");
        assert!(f.preload_checked, "sh maps libc within 50 ms");

        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo boom >&2; exit 7"]);
        let e = run(cmd, None, None, Duration::from_secs(30)).unwrap_err();
        assert!(format!("{e:#}").contains("boom"), "{e:#}");

        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let e = run(cmd, None, None, Duration::from_millis(200)).unwrap_err();
        assert!(format!("{e:#}").contains("killed"), "{e:#}");
    }

    #[test]
    fn a_preload_that_is_not_mapped_is_caught() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 0.05"]);
        let e = run(
            cmd,
            Some(Path::new("/nonexistent/libjemalloc.so.2")),
            None,
            Duration::from_secs(30),
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("not live"), "{e:#}");
    }
}
