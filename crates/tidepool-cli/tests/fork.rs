//! fork without exec under `tidepool run`, with the local store and a memory node: a C program
//! (`tests/c/forks.c`) fills memory four times the local budget, forks, and has parent, child
//! and grandchild each check every word they should see and change their own copies. Each case
//! runs natively first, and must print the same under the pager. Every run has a deadline: a
//! hang fails the case and says where each thread was.

mod common;

use common::{c_program, output_within, preload, NodeProc};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Far more than any case takes, paged, on a loaded 2-vCPU machine.
const DEADLINE: Duration = Duration::from_secs(240);

/// `tests/c/forks.c`, compiled once.
fn forks() -> PathBuf {
    c_program("forks", &["-pthread"])
}

/// Local memory for 64 MiB of data: a quarter.
const LOCAL: &str = "16M";
const MIB: &str = "64";

/// Runs `case` natively and paged over `backend`; returns the paged run's standard error.
fn run_case(case: &str, backend: &str) -> String {
    run_sized(case, backend, LOCAL, MIB)
}

/// [`run_case`] over `mib` MiB of data with `local` of local memory.
fn run_sized(case: &str, backend: &str, local: &str, mib: &str) -> String {
    let native = output_within(Command::new(forks()).args([case, mib]), DEADLINE);
    let native_out = String::from_utf8_lossy(&native.stdout).into_owned();
    assert!(
        native.status.success(),
        "{case} fails natively: {native_out}"
    );
    let paged = output_within(
        Command::new(env!("CARGO_BIN_EXE_tidepool"))
            .args(["run", "--local", local, "--backend", backend, "--"])
            .arg(forks())
            .args([case, mib])
            .env("TIDEPOOL_PRELOAD", preload()),
        DEADLINE,
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&paged.stdout),
        String::from_utf8_lossy(&paged.stderr),
    );
    assert!(
        paged.status.success(),
        "{case} on {backend}: {}\n{stdout}\n{stderr}",
        paged.status
    );
    // Lines may come in either order (the orphan prints after its parent has exited).
    let mut got: Vec<&str> = stdout.lines().collect();
    let mut want: Vec<&str> = native_out.lines().collect();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want, "{case} on {backend}:\n{stderr}");
    stderr.into_owned()
}

const CASES: [&str; 9] = [
    "basic",
    "scan",
    "threads",
    "grandchild",
    "orphan",
    "exec",
    "shared",
    "advice",
    "storm",
];

#[test]
fn every_fork_case_under_the_local_store() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    for case in CASES {
        run_case(case, "local:");
    }
}

/// A child that reads all of its parent's memory (as Redis's BGSAVE does) pages with a budget
/// of its own, a quarter of the parent's, and leaves the pages it shares with its parent to the
/// parent: it holds less than the parent's budget of its own. (Before, it paged with the
/// parent's whole budget, and held 39 MiB of its own here: its pages, and the store's copies
/// of the shared pages it evicted.)
#[test]
fn a_forked_child_reading_everything_holds_its_own_budget_not_its_parents() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let stderr = run_sized("scan", "local:", "32M", "128");
    let kib: u64 = stderr
        .lines()
        .find_map(|l| l.strip_prefix("child private KiB "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no private memory reported: {stderr}"));
    // 8 MiB of budget; the pages that were on their way to the store at the fork (up to the
    // 4 MiB write-back buffer, written to the child's copy of the store); pages the parent let
    // go of meanwhile, the child's alone now; the pager's tables and buffers the child wrote.
    // 15-20 MiB measured.
    assert!(
        kib < 32 << 10,
        "the child holds {kib} KiB of its own: {stderr}"
    );
}

#[test]
fn every_fork_case_under_a_memory_node() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let node = NodeProc::start(&["--capacity", "1G"]);
    let backend = format!("node://forks@{}", node.addr);
    for case in CASES {
        run_case(case, &backend);
    }
    // Every process has exited: the node holds nothing for them any more (the children's own
    // sessions and the parents' ended with their last connections).
    let stats = Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .args(["stats", &backend])
        .output()
        .unwrap();
    let stats = String::from_utf8_lossy(&stats.stdout);
    let objects = stats
        .lines()
        .find(|l| l.starts_with("tenant.objects"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no object count in {stats}"));
    assert_eq!(objects, "0", "{stats}");
}
