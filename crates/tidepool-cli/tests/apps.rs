//! Real programs no one here wrote, under `tidepool run --local 256M` with four times that in
//! far memory, with the local store and with a memory node: a pandas groupby (its result must
//! hash as natively), redis-server completing BGSAVE of 1 GiB (every key back from the server
//! and from the RDB file), and a C program that forks without exec whose parent and child both
//! check all of their data.

mod common;

use common::{c_program, preload, NodeProc};
use std::path::PathBuf;
use std::process::Command;
use tidepool_bench::apps::{self, Launcher, Outcome, System};

fn launcher(node: Option<&NodeProc>) -> Launcher {
    Launcher::new(
        PathBuf::from(env!("CARGO_BIN_EXE_tidepool")),
        preload(),
        node.map(|n| format!("node://apps@{}", n.addr)),
    )
}

const LOCAL: u64 = 256 << 20;

fn work_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A free loopback port (another test may take it meanwhile; unlikely enough here).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn pandas_under(system: System, node: Option<&NodeProc>) {
    let (python, has_pandas) = apps::python().unwrap();
    assert!(
        has_pandas,
        "{} has no pandas: scripts/setup installs it",
        python.display()
    );
    let dir = work_dir("apps-pandas");
    let l = launcher(node);
    let rows = 40_000_000;
    let native = apps::pandas(&l, System::Native, 0, &python, rows, &dir).unwrap();
    let peak = native.peak_rss;
    assert!(peak > 4 * LOCAL, "the frame is only {} MiB", peak >> 20);
    let paged = apps::pandas(&l, system, LOCAL, &python, rows, &dir).unwrap();
    match (native.outcome, paged.outcome) {
        (Outcome::Done { answer: want, .. }, Outcome::Done { answer, .. }) => {
            assert_eq!(answer, want, "{}", system.name())
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn pandas_groupby_under_the_default_store() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    pandas_under(System::TidepoolDefault, None);
}

/// The default store saves memory: CPython building a dict of strings (compressible, as a
/// program's heap of text is) under `tidepool run --local 64M` peaks at under half its native
/// RSS, every byte of it counted, with the native answer.
#[test]
fn a_compressible_program_under_the_default_store_holds_less_than_half_its_native_memory() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let (python, _) = apps::python().unwrap();
    let script = work_dir("apps-dict").join("strings.py");
    std::fs::write(
        &script,
        "d = {i: ('value-%d-' % i) * 20 for i in range(1_000_000)}\n\
         print(sum(len(v) for v in d.values()))\n",
    )
    .unwrap();
    let l = launcher(None);
    let argv = [python.into_os_string(), script.into_os_string()];
    let run = |system, local| {
        let ended = l
            .run_to_end(system, l.command(system, local, &argv).unwrap())
            .unwrap();
        assert!(
            ended.status.success(),
            "{}: {}",
            system.name(),
            ended.stderr
        );
        ended
    };
    let native = run(System::Native, 0);
    let paged = run(System::TidepoolDefault, 64 << 20);
    assert_eq!(paged.stdout, native.stdout);
    let (n, p) = (native.peak_rss >> 20, paged.peak_rss >> 20);
    assert!(n > 300, "the dict is only {n} MiB natively");
    assert!(
        paged.peak_rss < native.peak_rss / 2,
        "under the default store the program peaked at {p} MiB, natively {n} MiB"
    );
    // The sampled bytes agree: the program's processes hold about that, no more.
    assert!(
        paged.held.machine <= paged.peak_rss + (8 << 20),
        "{:?}",
        paged.held
    );
    assert!(paged.held.machine > 64 << 20, "{:?}", paged.held);
}

fn bgsave_under(system: System, node: Option<&NodeProc>) {
    let dir = work_dir(&format!("apps-redis-{}", system.name()));
    let l = launcher(node);
    let port = free_port();
    let keys = 262_144; // 1 GiB of 4 KiB values
    let server = apps::RedisRun::start(&l, system, LOCAL, port, &dir).unwrap();
    server.fill(keys).unwrap();
    server.bgsave_under_load(&l, keys).unwrap();
    server.verify(keys).unwrap();
    let rdb = server.rdb();
    server.shutdown().unwrap();
    apps::verify_rdb(&rdb, keys, free_port()).unwrap();
    let _ = std::fs::remove_file(rdb);
}

#[test]
fn redis_bgsave_of_four_times_the_local_size_under_the_default_store() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    bgsave_under(System::TidepoolDefault, None);
}

#[test]
fn redis_bgsave_of_four_times_the_local_size_under_a_memory_node() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let node = NodeProc::start(&["--capacity", "4G"]);
    bgsave_under(System::TidepoolNode, Some(&node));
}

/// `tests/c/forks.c basic` with 1 GiB: the child checks every word of its parent's memory,
/// three quarters of it far, then both write their own copies and check them.
fn fork_under(backend: &str) {
    let out = c_program("forks", &["-pthread"]);
    let run = Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .args(["run", "--local", "256M", "--backend", backend, "--"])
        .arg(out)
        .args(["basic", "1024"])
        .env("TIDEPOOL_PRELOAD", preload())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    assert!(run.status.success(), "{}: {stdout}\n{stderr}", run.status);
    assert_eq!(stdout, "ok basic\n", "{stderr}");
}

#[test]
fn fork_of_four_times_the_local_size_under_the_default_store() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    fork_under("local:");
}

#[test]
fn fork_of_four_times_the_local_size_under_a_memory_node() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let node = NodeProc::start(&["--capacity", "4G"]);
    fork_under(&format!("node://fork@{}", node.addr));
}
