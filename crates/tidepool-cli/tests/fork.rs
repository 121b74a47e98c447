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

fn run_case(case: &str, backend: &str) {
    let native = output_within(Command::new(forks()).args([case, MIB]), DEADLINE);
    let native_out = String::from_utf8_lossy(&native.stdout).into_owned();
    assert!(
        native.status.success(),
        "{case} fails natively: {native_out}"
    );
    let paged = output_within(
        Command::new(env!("CARGO_BIN_EXE_tidepool"))
            .args(["run", "--local", LOCAL, "--backend", backend, "--"])
            .arg(forks())
            .args([case, MIB])
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
}

const CASES: [&str; 8] = [
    "basic",
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
