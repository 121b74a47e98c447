//! Every memory call real programs make, on paged memory: a C program (`tests/c/memcalls.c`)
//! maps four times the local budget, makes each call (mremap grow, shrink, fixed and
//! DONTUNMAP; madvise DONTNEED, FREE, REMOVE, HUGEPAGE; mprotect read-only and guard pages;
//! pkey_mprotect, with keys the pager's threads were never given;
//! reserve-then-commit; partial munmap; MAP_FIXED anonymous and file mappings over paged ranges;
//! brk/sbrk; jemalloc's, tcmalloc's and mimalloc's own arenas; mlock; madvise POPULATE_READ and
//! POPULATE_WRITE, back to back for longer than a short watchdog deadline) and checks every word
//! and every fault it should see. Each case runs natively first and must print the same under
//! the pager, with the local store and with a memory node. numpy's aligned buffers and Arrow's
//! allocator are checked the same way through python3 with pyarrow. Memory mapped with
//! `syscall(SYS_mmap, ...)` and the other calls made through `syscall()`
//! (`tests/c/rawcalls.c`) is paged too: same answer, resident memory near the budget.

mod common;

use common::{c_program, preload, NodeProc};
use std::path::PathBuf;
use std::process::Command;

fn memcalls() -> PathBuf {
    c_program("memcalls", &["-ldl", "-pthread"])
}

const CASES: [&str; 19] = [
    "mremap-grow",
    "mremap-shrink",
    "mremap-fixed",
    "mremap-dontunmap",
    "madvise-dontneed",
    "madvise-free",
    "madvise-remove",
    "hugepages",
    "mprotect-readonly",
    "mprotect-guard",
    "reserve-commit",
    "munmap-partial",
    "map-fixed",
    "brk",
    "allocators",
    "mlock",
    "madvise-populate",
    "mprotect-storm",
    "pkey-protect",
];

/// The watchdog's deadline for the populate case: far shorter than its run of back-to-back
/// populates (a thread that waits in page faults all along, served, completing none it is
/// counted for), which must not be mistaken for one fault never served.
const POPULATE_DEADLINE: &str = "1";

/// jemalloc cannot be dlopen'ed (its thread-locals are initial-exec): the allocators case
/// finds it preloaded, natively and under the pager alike.
fn jemalloc() -> Option<PathBuf> {
    tidepool_peers::shared_library("libjemalloc.so.2")
}

fn run_all(backend: &str) {
    for case in CASES {
        let mut native = Command::new(memcalls());
        native.args([case, "64"]);
        if let Some(j) = jemalloc().filter(|_| case == "allocators") {
            native.env("LD_PRELOAD", j);
        }
        let native = native.output().unwrap();
        let want = String::from_utf8_lossy(&native.stdout).into_owned();
        assert!(native.status.success(), "{case} fails natively: {want}");
        let mut paged = Command::new(env!("CARGO_BIN_EXE_tidepool"));
        paged
            .args(["run", "--local", "16M", "--backend", backend, "--"])
            .arg(memcalls())
            .args([case, "64"])
            .env("TIDEPOOL_PRELOAD", preload());
        if let Some(j) = jemalloc().filter(|_| case == "allocators") {
            paged.env("LD_PRELOAD", j);
        }
        if case == "madvise-populate" {
            paged.env("TIDEPOOL_RUN_FAULT_DEADLINE", POPULATE_DEADLINE);
        }
        if case == "mprotect-storm" || case == "pkey-protect" {
            // Every eviction through the copying path, which reads the pages it evicts (a
            // probation tier moves them instead).
            paged.env("TIDEPOOL_RUN_PROBATION", "0");
        }
        let paged = paged.output().unwrap();
        let (got, stderr) = (
            String::from_utf8_lossy(&paged.stdout),
            String::from_utf8_lossy(&paged.stderr),
        );
        assert!(
            paged.status.success(),
            "{case} on {backend}: {}\n{got}\n{stderr}",
            paged.status
        );
        assert_eq!(got, want, "{case} on {backend}:\n{stderr}");
    }
}

#[test]
fn every_memory_call_under_the_local_store() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    run_all("local:");
}

#[test]
fn every_memory_call_under_a_memory_node() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let node = NodeProc::start(&["--capacity", "1G"]);
    run_all(&format!("node://calls@{}", node.addr));
}

/// numpy's aligned buffers and Arrow's own allocator (pyarrow's memory pool, jemalloc or
/// mimalloc linked into libarrow, mapping its arenas itself) on paged memory: sorts, takes and
/// a group-by over 590 MiB of arrays (three times the budget) give the same answer as natively.
const ARROW_SCRIPT: &str = r#"
import hashlib
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

n = 12_000_000
x = pa.array((np.arange(n, dtype=np.int64) * 2654435761) % 1000003)
y = pc.multiply(x, 3)
order = pc.sort_indices(y)
t = pa.table({"k": pc.remainder(x, 1000), "v": y})
g = t.group_by("k").aggregate([("v", "sum"), ("v", "count")]).sort_by("k")
h = hashlib.sha256(pc.take(y, order).buffers()[1]).hexdigest()
print(pc.sum(y).as_py(), g.num_rows, g.column("v_sum")[7].as_py(), h)
"#;

#[test]
fn numpy_and_arrow_buffers_match_native() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let (python, _) = tidepool_bench::apps::python().expect("python3");
    let native = Command::new(&python)
        .args(["-c", ARROW_SCRIPT])
        .output()
        .unwrap();
    assert!(
        native.status.success(),
        "pyarrow and numpy are needed (scripts/setup installs them): {}",
        String::from_utf8_lossy(&native.stderr)
    );
    let paged = Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .args(["run", "--local", "192M", "--stats", "--"])
        .arg(&python)
        .args(["-c", ARROW_SCRIPT])
        .env("TIDEPOOL_PRELOAD", preload())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&paged.stderr);
    assert!(paged.status.success(), "{}: {stderr}", paged.status);
    assert_eq!(
        String::from_utf8_lossy(&paged.stdout),
        String::from_utf8_lossy(&native.stdout),
        "{stderr}"
    );
}

/// `syscall(SYS_mmap, ...)`, `SYS_mremap`, `SYS_madvise`, `SYS_munmap` and `SYS_brk` made by
/// hand over 64 MiB: the native answer, and under a 16 MiB budget (a memory node holding the
/// rest) a peak resident set well under the data's size. Before `syscall()` was interposed the
/// calls went to the kernel unpaged: the same run peaked at 69 MiB.
#[test]
fn memory_mapped_with_raw_syscalls_is_paged_within_the_budget() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let node = NodeProc::start(&["--capacity", "1G"]);
    let launcher = tidepool_bench::apps::Launcher::new(
        PathBuf::from(env!("CARGO_BIN_EXE_tidepool")),
        preload(),
        Some(format!("node://raw@{}", node.addr)),
    );
    let argv = [c_program("rawcalls", &[]).into_os_string(), "64".into()];
    let run = |system, local| {
        let cmd = launcher.command(system, local, &argv).unwrap();
        let ended = launcher.run_to_end(system, cmd).unwrap();
        assert!(
            ended.status.success(),
            "{}: {}\n{}",
            system.name(),
            ended.stdout,
            ended.stderr
        );
        ended
    };
    use tidepool_bench::apps::System;
    let native = run(System::Native, 0);
    let paged = run(System::TidepoolNode, 16 << 20);
    assert_eq!(paged.stdout, native.stdout);
    let (n, p) = (native.peak_rss >> 20, paged.peak_rss >> 20);
    assert!(n >= 64, "natively the program peaked at only {n} MiB");
    // 16 MiB of budget; the rest is the program's binaries, the pager's threads and tables
    // (17 MiB for the same program over 1 MiB, debug build) and its write-back buffer (4 MiB):
    // 30-32 MiB measured alone, 37-40 beside a CPU hog. Unpaged, it would be over 64.
    assert!(
        p <= 48,
        "paged, the program peaked at {p} MiB (natively {n} MiB)"
    );
}
