//! Statically linked programs under `tidepool run` (issue 56): a static C program mapping
//! memory through its C library's own system calls (`tests/c/rawcalls.c` built with
//! `-static`) and a Go program built with default flags (the apps suite's `go-map`: static, and Go's
//! runtime maps its heap with system calls of its own) run at a quarter of their native peak
//! with their native answers, and hold at most the budget beyond what a tiny program of the
//! same kind holds under the pager. The Go program built with cgo (linked dynamically) gives
//! its native answer paged. Exit statuses pass through the supervising `tidepool run`;
//! a fork without exec fails with a message rather than leave a child with unpaged zeros.

mod common;

use common::{c_program, preload, NodeProc};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use tidepool_bench::apps::{Ended, Launcher, System};

fn launcher(node: &NodeProc) -> Launcher {
    Launcher::new(
        PathBuf::from(env!("CARGO_BIN_EXE_tidepool")),
        preload(),
        Some(format!("node://static@{}", node.addr)),
    )
}

fn run(l: &Launcher, system: System, local: u64, argv: &[OsString]) -> Ended {
    let cmd = l.command(system, local, argv).unwrap();
    let ended = l.run_to_end(system, cmd).unwrap();
    assert!(
        ended.status.success(),
        "{} {argv:?}: {}\n{}\n{}",
        system.name(),
        ended.status,
        ended.stdout,
        ended.stderr
    );
    ended
}

/// Runs `argv` natively, then paged at a quarter of its native peak over a memory node; checks
/// the answer and that the paged peak is at most `small`'s paged peak (the pager's, the
/// binaries' and the runtime's own memory) plus the budget and a little.
fn quarter_of_the_peak(argv: &[OsString], small: &[OsString]) {
    let node = NodeProc::start(&["--capacity", "2G"]);
    let l = launcher(&node);
    let native = run(&l, System::Native, 0, argv);
    let local = (native.peak_rss / 4).max(4 << 20);
    let paged = run(&l, System::TidepoolNode, local, argv);
    assert_eq!(paged.stdout, native.stdout, "{}", paged.stderr);
    let base = run(&l, System::TidepoolNode, local, small).peak_rss;
    let mib = |b: u64| b >> 20;
    // Slack: the write-back buffer (4 MiB) and the page tables of what was paged.
    let most = base + local + (8 << 20);
    assert!(
        paged.peak_rss <= most,
        "paged at {} MiB the program peaked at {} MiB; a tiny one at {} MiB; native {} MiB",
        mib(local),
        mib(paged.peak_rss),
        mib(base),
        mib(native.peak_rss)
    );
    assert!(
        paged.peak_rss < native.peak_rss / 2,
        "{}",
        mib(paged.peak_rss)
    );
}

#[test]
fn a_static_c_program_runs_paged_at_a_quarter_of_its_peak() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let prog = c_program("rawcalls", &["-static"]).into_os_string();
    quarter_of_the_peak(&[prog.clone(), "128".into()], &[prog, "1".into()]);
}

/// The apps suite's go-map program, built with default flags into this test binary's scratch
/// directory.
fn gomap() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("static-programs");
    std::fs::create_dir_all(&dir).unwrap();
    let out = tidepool_bench::apps::runtimes::build_go_map(&dir).unwrap();
    assert!(
        tidepool_sys::exec_static::is_static(&out),
        "Go built a dynamically linked program"
    );
    out
}

#[test]
fn a_go_program_built_with_default_flags_runs_paged_at_a_quarter_of_its_peak() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let prog = gomap().into_os_string();
    quarter_of_the_peak(&[prog.clone(), "600000".into()], &[prog, "10".into()]);
}

/// The same program built with cgo is dynamically linked: the preload is loaded, and Go's
/// runtime maps its heap through the C library's `mmap` (`_cgo_mmap`), which it interposes.
/// Its answer is native's and its heap is paged. It holds more than the static build beside
/// its budget (measured: 36 MiB at 20 MiB local, against the static build's 16 and a tiny
/// run's 7), memory outside the pager's regions not yet accounted for, so the bound here is
/// three quarters of the native peak, not the budget.
#[test]
fn a_go_program_built_with_cgo_runs_paged() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("static-programs");
    std::fs::create_dir_all(&dir).unwrap();
    let prog = tidepool_bench::apps::runtimes::build_go_map_cgo(&dir).unwrap();
    assert!(
        !tidepool_sys::exec_static::is_static(&prog),
        "Go built a statically linked program with cgo"
    );
    let argv = [prog.into_os_string(), "600000".into()];
    let node = NodeProc::start(&["--capacity", "2G"]);
    let l = launcher(&node);
    let native = run(&l, System::Native, 0, &argv);
    let local = (native.peak_rss / 4).max(4 << 20);
    let paged = run(&l, System::TidepoolNode, local, &argv);
    assert_eq!(paged.stdout, native.stdout, "{}", paged.stderr);
    assert!(
        paged.peak_rss < native.peak_rss / 4 * 3,
        "paged at {} MiB the program peaked at {} MiB; native {} MiB",
        local >> 20,
        paged.peak_rss >> 20,
        native.peak_rss >> 20
    );
}

/// What `tests/c/static_life.c` sees under the pager: its exit status, its arguments and
/// environment, a thread, a fork refused with a message, and no socket of the supervisor's;
/// with `--stats`, the pager's figures.
#[test]
fn a_static_programs_status_arguments_and_forks() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let prog = c_program("static_life", &["-static", "-pthread"]);
    let paged = Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .args(["run", "--local", "8M", "--"])
        .arg(&prog)
        .args(["one", "two words"])
        .env("TIDEPOOL_PRELOAD", preload())
        .env("STATIC_LIFE", "here")
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&paged.stdout),
        String::from_utf8_lossy(&paged.stderr),
    );
    assert_eq!(paged.status.code(), Some(3), "{out}\n{err}");
    assert!(out.contains("argc 3 one|two words"), "{out}");
    assert!(out.contains("env here"), "{out}");
    assert!(out.contains("thread 42"), "{out}");
    assert!(out.contains("fork: Function not implemented"), "{out}");
    assert!(err.contains("forked without exec"), "{err}");
    assert!(
        !out.contains("TIDEPOOL_SUPERVISOR_FD"),
        "the supervisor's descriptor variable leaked into the program: {out}"
    );
    // The pager's control socket, and no other: the local store opens none, and the
    // supervisor's is closed before the program starts.
    assert!(out.contains("sockets 1\n"), "{out}");
    // --stats: the pager's figures at its exit, which the program makes with exit_group.
    let stats = Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .args(["run", "--local", "8M", "--stats", "--"])
        .arg(&prog)
        .env("TIDEPOOL_PRELOAD", preload())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&stats.stderr);
    assert_eq!(stats.status.code(), Some(3), "{err}");
    assert!(err.contains("far store local:"), "{err}");
    assert!(err.contains("missing ("), "{err}");
}
