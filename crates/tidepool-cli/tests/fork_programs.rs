//! Programs no one here wrote, forking under `tidepool run`, over the local store and a memory
//! node: CPython parents two to eight times the local budget whose children read, write and
//! fork again (`tests/py/fork_tree.py`), stress-ng's vm stressor verifying every one of its
//! methods in forked workers, and SIGTERM and SIGINT ending a program and all it forked as
//! they do natively. Then the watchdog: a fault nobody can serve stops the program with exit
//! 70 and says why. Every run has a deadline; a hang fails its test with where each thread was.

mod common;

use common::{descendants, output_within, preload, python3, text, NodeProc};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Far more than any run here takes paged, on a loaded 2-vCPU machine.
const DEADLINE: Duration = Duration::from_secs(300);

fn tidepool_run(local: &str, backend: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tidepool"));
    cmd.args([
        "run",
        "--local",
        local,
        "--backend",
        backend,
        "--no-coord",
        "--",
    ])
    .env("TIDEPOOL_PRELOAD", preload());
    cmd
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(name)
}

/// `fork_tree.py` at 2, 4 and 8 times an 8 MiB budget: the same lines and status as natively.
fn python_fork_trees(backend: &str) {
    for mib in ["16", "32", "64"] {
        let native = output_within(
            Command::new(python3()).arg(script("fork_tree.py")).arg(mib),
            DEADLINE,
        );
        let (want, err) = text(&native);
        assert!(native.status.success(), "natively: {want}\n{err}");
        let paged = output_within(
            tidepool_run("8M", backend)
                .arg(python3())
                .arg(script("fork_tree.py"))
                .arg(mib),
            DEADLINE,
        );
        let (got, err) = text(&paged);
        assert!(
            paged.status.success(),
            "{mib} MiB over {backend}: {}\n{got}\n{err}",
            paged.status
        );
        assert_eq!(got, want, "{mib} MiB over {backend}:\n{err}");
    }
}

#[test]
fn python_fork_trees_of_two_to_eight_times_local_under_the_local_store() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    python_fork_trees("local:");
}

#[test]
fn python_fork_trees_of_two_to_eight_times_local_under_a_memory_node() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let node = NodeProc::start(&["--capacity", "1G"]);
    python_fork_trees(&format!("node://forks@{}", node.addr));
}

/// stress-ng, which `scripts/setup` installs; `None` (with a note) where it is missing.
fn stress_ng() -> Option<&'static str> {
    let found = Command::new("stress-ng")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("skipped: stress-ng is not installed (scripts/setup installs it)");
    }
    found.then_some("stress-ng")
}

/// Every method of stress-ng's vm stressor (each of two forked workers four times the local
/// budget, checking what it wrote) gives stress-ng's verdict: success.
fn every_vm_method(backend: &str) {
    let Some(stress) = stress_ng() else {
        return;
    };
    let methods = Command::new(stress)
        .args(["--vm-method", "which"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&methods.stdout).into_owned()
        + &String::from_utf8_lossy(&methods.stderr);
    let methods: Vec<&str> = listed
        .rsplit_once("one of:")
        .map(|(_, m)| m.split_whitespace().filter(|&m| m != "all").collect())
        .unwrap_or_default();
    assert!(methods.len() > 10, "stress-ng lists its methods: {listed}");
    for method in methods {
        let args = [
            "--vm",
            "2",
            "--vm-bytes",
            "32M",
            "--vm-method",
            method,
            "--verify",
            "--vm-keep",
            "-t",
            "1",
        ];
        let out = output_within(tidepool_run("8M", backend).arg(stress).args(args), DEADLINE);
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success(),
            "stress-ng --vm-method {method} over {backend}: {}\n{stdout}\n{stderr}",
            out.status
        );
        assert!(
            !stderr.contains("fail") && !stdout.contains("fail"),
            "{method} over {backend}: {stdout}\n{stderr}"
        );
    }
}

#[test]
fn stress_ng_verifies_every_vm_method_under_the_local_store() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    every_vm_method("local:");
}

#[test]
fn stress_ng_verifies_every_vm_method_under_a_memory_node() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let node = NodeProc::start(&["--capacity", "1G"]);
    every_vm_method(&format!("node://stress@{}", node.addr));
}

/// Whether process `pid` has ended (gone, or a zombie nobody reaped yet).
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Starts `cmd` in a process group of its own, waits until it printed `ready` and has
/// `processes` processes, sends `signal` (to the group, as a terminal's Ctrl-C does, if
/// `to_group`; else to the program alone, as `kill` does), and returns how each process ended:
/// the program's exit status, and whether every process it had forked ended too.
fn signal_and_watch(
    mut cmd: Command,
    processes: usize,
    signal: nix::sys::signal::Signal,
    to_group: bool,
) -> (std::process::ExitStatus, bool) {
    let mut child = cmd
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("ready"), "{line:?}");
    let started = Instant::now();
    let forked = loop {
        let d = descendants(pid);
        if d.len() + 1 >= processes || started.elapsed() > Duration::from_secs(60) {
            break d;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        forked.len() + 1 >= processes,
        "only {} forked",
        forked.len()
    );
    std::thread::sleep(Duration::from_millis(500));
    let target = nix::unistd::Pid::from_raw(pid as i32);
    if to_group {
        nix::sys::signal::killpg(target, signal).unwrap();
    } else {
        nix::sys::signal::kill(target, signal).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let threads = common::where_threads_are(pid);
            common::kill_tree(pid);
            let _ = child.wait();
            panic!("{signal} did not end the program within a minute:\n{threads}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let all_ended = loop {
        if forked.iter().all(|&p| ended(p)) {
            break true;
        }
        if Instant::now() > deadline {
            for &p in &forked {
                common::kill_tree(p);
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, all_ended)
}

/// A CPython parent and two forked children all summing data three times the budget, forever.
const PYTHON_LOOPERS: &str = r#"
import os, sys
data = list(range(600_000))
for _ in range(2):
    if os.fork() == 0:
        while True:
            sum(data)
print("ready", flush=True)
while True:
    sum(data)
"#;

#[test]
fn sigterm_and_sigint_end_the_program_and_what_it_forked_as_natively() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    use nix::sys::signal::Signal::{SIGINT, SIGTERM};
    let python = |paged: bool| {
        let mut cmd = if paged {
            tidepool_run("8M", "local:")
        } else {
            Command::new("env")
        };
        cmd.args([python3(), "-c", PYTHON_LOOPERS]);
        cmd
    };
    // Ctrl-C at a terminal: every process of the group gets SIGINT, and each CPython stops
    // with KeyboardInterrupt.
    let native = signal_and_watch(python(false), 3, SIGINT, true);
    let paged = signal_and_watch(python(true), 3, SIGINT, true);
    assert!(native.1, "natively, SIGINT ends every process");
    assert_eq!(paged, native, "SIGINT to the group, paged and natively");

    // SIGTERM to the program (what `kill PID` of `tidepool run` does: it became the program):
    // stress-ng stops its workers, as it does natively.
    let Some(stress) = stress_ng() else {
        return;
    };
    let stress_ng = |paged: bool| {
        let mut cmd = if paged {
            tidepool_run("8M", "local:")
        } else {
            Command::new("env")
        };
        // `sh` prints "ready" and becomes stress-ng.
        cmd.args([
            "sh",
            "-c",
            "echo ready; exec \"$0\" --vm 2 --vm-bytes 32M --vm-method all --verify -t 120",
            stress,
        ]);
        cmd
    };
    let native = signal_and_watch(stress_ng(false), 3, SIGTERM, false);
    let paged = signal_and_watch(stress_ng(true), 3, SIGTERM, false);
    assert!(native.1, "natively, SIGTERM to stress-ng ends its workers");
    assert_eq!(paged, native, "SIGTERM to stress-ng, paged and natively");
}

/// A program that allocates and reads back four times the budget.
const TOUCH_MUCH: &str = r#"
data = [bytes([i % 256]) * 4000 for i in range(16_000)]
print(sum(len(d) for d in data))
"#;

/// A fault nobody can serve (the handlers stopped on purpose, as if stuck) ends the program
/// with exit 70 and the watchdog's account, at its deadline, over each kind of store.
#[test]
fn a_fault_nobody_serves_stops_the_program_with_the_watchdogs_message() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let node = NodeProc::start(&["--capacity", "256M"]);
    for backend in ["local:".to_string(), format!("node://dog@{}", node.addr)] {
        // Made (the preload library built, if cargo must) before the clock starts.
        let mut run = tidepool_run("16M", &backend);
        run.args([python3(), "-c", TOUCH_MUCH])
            .env("TIDEPOOL_RUN_STALL_AFTER", "500")
            .env("TIDEPOOL_RUN_FAULT_DEADLINE", "2");
        let started = Instant::now();
        let out = output_within(&mut run, DEADLINE);
        let took = started.elapsed();
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(70), "{backend}: {stdout}\n{stderr}");
        assert!(stdout.is_empty(), "it went on: {stdout}");
        for says in [
            "has waited",
            "for a page fault (deadline 2.0 s)",
            "stopped on purpose",
            "tp-fault",
            "pager threads:",
            "exit status 70",
        ] {
            assert!(stderr.contains(says), "{backend}: no {says:?} in\n{stderr}");
        }
        // Liveness with room to spare: the deadline is 2 s, and the run before the handlers
        // stop takes about one.
        assert!(
            took < Duration::from_secs(30),
            "{backend}: stopped only after {took:?}"
        );
    }
}

/// Fills four times the budget, says "ready", waits for a line, then reads everything back.
const FILL_THEN_READ: &str = r#"
import sys
data = [bytes([i % 256]) * 4000 for i in range(16_000)]
print("ready", flush=True)
sys.stdin.readline()
print(sum(d[0] + d[-1] for d in data))
"#;

/// A memory node that stops answering (SIGSTOP: connected, silent) while the program needs its
/// pages: the watchdog stops the program at its deadline, naming the silent store, before the
/// node's own timeout (10 s by default) would.
#[test]
fn a_silent_store_is_named_by_the_watchdog_at_its_deadline() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    use std::io::Write;
    let node = NodeProc::start(&["--capacity", "256M"]);
    let backend = format!("node://silent@{}", node.addr);
    let mut child = tidepool_run("16M", &backend)
        .args([python3(), "-c", FILL_THEN_READ])
        .env("TIDEPOOL_RUN_FAULT_DEADLINE", "3")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let node_pid = nix::unistd::Pid::from_raw(node.pid() as i32);
    nix::sys::signal::kill(node_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let started = Instant::now();
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > Duration::from_secs(60) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    nix::sys::signal::kill(node_pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let Some(status) = status else {
        common::kill_tree(child.id());
        panic!("the program hung on a silent node");
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(70), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the far store node://{} has not answered",
            node.addr
        )),
        "the watchdog names the silent store: {stderr}"
    );
    // Liveness with room to spare: the deadline is 3 s, the node's own timeout 10 s.
    assert!(took < Duration::from_secs(30), "stopped after {took:?}");
}
