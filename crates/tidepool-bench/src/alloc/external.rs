//! Running a program nobody here wrote under one allocator: its wall time, its peak RSS as the
//! kernel counted it (`wait4`, since such programs do not report their own), its output, and
//! whether the preloaded allocator really was the one mapped into it.
//!
//! The program is started by a worker (an `alloc-exec` job of `tidepool bench-worker`) with `fork`,
//! not by the suite: the kernel carries a process's peak RSS across `execve`, so a program
//! started from the suite's address space (std's posix_spawn shares it until the exec) reported
//! the suite's few MiB as its own floor, above what cfrac or glibc-simple ever use. A fresh
//! worker's forked copy holds a few hundred KiB.
//!
//! The preload is checked in `/proc/PID/maps` while the program starts: the dynamic loader maps
//! `LD_PRELOAD` libraries before the program's own dependencies, so once libc is mapped a
//! preload is either there or was never loaded. The maps are read every fraction of a
//! millisecond until then, which takes a few milliseconds; a program that exits sooner leaves
//! the check undone (reported as such, never as a pass).

use super::allocators::{allocator_in_maps, check_mapped};
use crate::job::Job;
use crate::job::Launch;
use anyhow::{bail, Context, Result};
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What a run of a program gave.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Finished {
    /// From starting it to its exit.
    pub(super) seconds: f64,
    pub(super) peak_rss_kib: u64,
    pub(super) stdout: String,
    pub(super) stderr: String,
    /// The preload was seen mapped (or, for glibc, no allocator was); false when the program
    /// exited before its libraries were all mapped, so nobody could tell.
    pub(super) preload_checked: bool,
}

/// The worker's one line of output.
#[derive(Debug, Serialize, Deserialize)]
enum Outcome {
    Finished(Finished),
    Failed(String),
}

/// Runs `launch` through a worker process (see the module's comment) and returns what it gave.
/// Fails if the program exits unsuccessfully, is killed, or runs with another allocator than
/// the one asked for.
pub(super) fn run(launch: &Launch) -> Result<Finished> {
    let out = Job::AllocExec(launch.clone())
        .command(&std::env::current_exe()?)
        .env_remove("LD_PRELOAD")
        .output()
        .context("cannot start the worker")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or("");
    match serde_json::from_str::<Outcome>(line) {
        Ok(Outcome::Finished(f)) => Ok(f),
        Ok(Outcome::Failed(e)) => bail!("{e}"),
        Err(_) => bail!(
            "the worker failed ({}): {}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr))
        ),
    }
}

/// Runs the program `launch` describes and prints the [`Outcome`] as one JSON line.
pub fn worker(launch: &Launch) -> Result<()> {
    let outcome = match measure(launch) {
        Ok(f) => Outcome::Finished(f),
        Err(e) => Outcome::Failed(format!("{e:#}")),
    };
    println!("{}", serde_json::to_string(&outcome)?);
    Ok(())
}

/// Starts the program with `fork`, watches it load, waits for it (killing it after the
/// timeout) and collects its figures and output.
fn measure(launch: &Launch) -> Result<Finished> {
    if let Some(cpus) = &launch.cpus {
        tidepool_sys::set_affinity(0, cpus).context("cannot pin the program")?;
    }
    let stdin = match &launch.stdin {
        Some(path) => std::fs::File::open(path),
        None => std::fs::File::open("/dev/null"),
    }
    .with_context(|| format!("cannot open the input {:?}", launch.stdin))?;
    let exec = ExecArgs::of(launch)?;
    let (out_r, out_w) = std::io::pipe()?;
    let (err_r, err_w) = std::io::pipe()?;
    let start = Instant::now();
    let id = tidepool_sys::fork_exec(
        &exec.program,
        &exec.argv,
        &exec.envp,
        &exec.cwd,
        [stdin.as_fd(), out_w.as_fd(), err_w.as_fd()],
    )
    .with_context(|| format!("cannot start {}", launch.program.display()))?;
    drop((out_w, err_w, stdin));
    let pid = Pid::from_raw(id as i32).context("odd pid")?;
    let (stdout, stderr) = (drain(out_r), drain(err_r));
    let timeout = Duration::from_secs(launch.timeout_s);
    let (done, watchdog) = watchdog(pid, timeout);
    let loaded = watch_loading(pid, launch.preload.as_deref());
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
    if killed {
        bail!("still running after {} s; killed", timeout.as_secs());
    }
    // A process the program started may still hold its output; that is not waited for long.
    let collect = |rx: mpsc::Receiver<String>| rx.recv_timeout(Duration::from_secs(5));
    let stderr = collect(stderr).unwrap_or_default();
    if !status.success() {
        bail!("{status}: {}", tail(&stderr));
    }
    let stdout = collect(stdout).context("its output stayed open 5 s after it exited")?;
    let preload_checked = loaded?;
    Ok(Finished {
        seconds,
        peak_rss_kib,
        stdout,
        stderr,
        preload_checked,
    })
}

/// What `execve` is given: the program, its arguments, its environment (with the preload, if
/// any, as the only `LD_PRELOAD`), and the directory to run in.
struct ExecArgs {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: CString,
}

impl ExecArgs {
    /// The exec arguments of `launch`; refused if any holds a NUL byte.
    fn of(launch: &Launch) -> Result<ExecArgs> {
        let c = |bytes: &[u8]| CString::new(bytes).context("a NUL byte in an argument");
        let program = c(launch.program.as_os_str().as_bytes())?;
        let mut argv = vec![program.clone()];
        for a in &launch.args {
            argv.push(c(a.as_bytes())?);
        }
        let mut envp = Vec::new();
        for (k, v) in std::env::vars_os().filter(|(k, _)| k != "LD_PRELOAD") {
            envp.push(c(&[k.as_bytes(), b"=", v.as_bytes()].concat())?);
        }
        if let Some(lib) = &launch.preload {
            envp.push(c(&[b"LD_PRELOAD=", lib.as_os_str().as_bytes()].concat())?);
        }
        let cwd = c(launch.cwd.as_os_str().as_bytes())?;
        Ok(ExecArgs {
            program,
            argv,
            envp,
            cwd,
        })
    }
}

/// Reads a pipe to its end on a thread of its own; the text comes on the channel.
fn drain(mut stream: std::io::PipeReader) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stream.read_to_end(&mut text);
        let _ = tx.send(String::from_utf8_lossy(&text).into_owned());
    });
    rx
}

/// Kills the program if it outlives the timeout: dropping the sender says it is done; the
/// thread says whether it killed. It kills only before the program is reaped (the caller
/// leaves it a zombie until the watchdog is done), so the pid is still the program's.
fn watchdog(pid: Pid, timeout: Duration) -> (mpsc::Sender<()>, std::thread::JoinHandle<bool>) {
    let (done, watch) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let late = watch.recv_timeout(timeout) == Err(mpsc::RecvTimeoutError::Timeout);
        if late {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
        late
    });
    (done, watchdog)
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

    fn sh(script: &str, timeout_s: u64) -> Launch {
        Launch {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            cwd: "/tmp".into(),
            stdin: None,
            preload: None,
            cpus: None,
            timeout_s,
        }
    }

    #[test]
    fn a_program_run_gives_time_rss_output_and_its_failures() {
        let f = measure(&sh("echo out; pwd; echo err >&2; sleep 0.05", 30)).unwrap();
        assert_eq!(f.stdout, "out\n/tmp\n");
        assert_eq!(f.stderr, "err\n");
        assert!(f.seconds >= 0.05 && f.peak_rss_kib > 0, "{f:?}");
        assert!(f.preload_checked, "sh maps libc within 50 ms");

        let e = measure(&sh("echo boom >&2; exit 7", 30)).unwrap_err();
        assert!(format!("{e:#}").contains("boom"), "{e:#}");

        let e = measure(&sh("exec sleep 30", 1)).unwrap_err();
        assert!(format!("{e:#}").contains("killed"), "{e:#}");
    }

    #[test]
    fn a_preload_that_is_not_mapped_is_caught() {
        let mut launch = sh("sleep 0.05", 30);
        // Not a library the loader can map: it warns and runs without it.
        launch.preload = Some("/nonexistent/libjemalloc.so.2".into());
        let e = measure(&launch).unwrap_err();
        assert!(format!("{e:#}").contains("not live"), "{e:#}");
    }
}
