//! One arbiter over both kinds of local memory, for real: CPython under `tidepool run` (its
//! far memory on a memory node) and a soft-memory application share a memory cgroup with no
//! swap, under `tidepool coord`, while an antagonist takes memory for a while and leaves.
//! A page fault served from far memory costs tens of microseconds; the soft application
//! rebuilds an object in one. Budgets must move to the Python program, and nobody may be
//! OOM-killed. (Root and the cgroup v1 memory controller needed.)

mod common;

use common::{preload, python3, NodeProc};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tidepool_bench::coord::Cgroup;
use tidepool_bench::job::{AntagonistJob, AppJob, Job};
use tidepool_sys::probe::Need;

/// Kills a child when dropped.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// 56k objects of 4 KiB (about 230 MiB), read and written with a skew toward the first ones
/// (half the accesses fall in the first eighth, four fifths in the first half).
const SCRIPT: &str = r#"
import random, sys, time
n, secs = int(sys.argv[1]), float(sys.argv[2])
t = time.time()
data = [bytearray(4096) for _ in range(n)]
print("filled in %.1f s" % (time.time() - t), flush=True)
r = random.Random(1)
t0, ops = time.time(), 0
while time.time() - t0 < secs:
    i = int(r.random() ** 3 * n)
    data[i][ops % 4096] = ops & 255
    ops += 1
print("ops", ops, flush=True)
"#;

fn state(addr: &str) -> Option<tidepool_coord::Snapshot> {
    let body = ureq::get(&format!("http://{addr}/api/state"))
        .timeout(Duration::from_secs(2))
        .call()
        .ok()?
        .into_string()
        .ok()?;
    serde_json::from_str(&body).ok()
}

#[test]
fn budgets_move_to_the_program_whose_misses_cost_more_and_nobody_is_oom_killed() {
    tidepool_sys::skip_unless!(Need::Root, Need::CgroupV1Memory);
    let tidepool = PathBuf::from(env!("CARGO_BIN_EXE_tidepool"));
    // Built (or found up to date) before anything starts: building it after the soft
    // application started would hold python back for as long as cargo takes, and the budgets
    // would be measured without it.
    let preload = preload();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("coord-mixed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("skewed.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let socket = dir.join("coord.sock");
    // Far memory on another "machine": outside the cgroup.
    let node = NodeProc::start(&["--capacity", "1G"]);
    let cg = Cgroup::create("test-mixed", 400 << 20).expect("a memory cgroup");
    let mut coord = Kill(
        cg.command_of(
            &tidepool,
            &[
                "coord",
                "--socket",
                socket.to_str().unwrap(),
                "--reserve",
                "64M",
                "--floor",
                "8M",
                "--http",
                "127.0.0.1:0",
            ],
        )
        .stdout(Stdio::piped())
        .env("RUST_LOG", "tidepool_coord=info")
        .spawn()
        .expect("tidepool coord"),
    );
    let mut first = String::new();
    let mut out = BufReader::new(coord.0.stdout.take().unwrap());
    out.read_line(&mut first).unwrap();
    let http = common::dashboard_addr(&first);
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let seconds = 40;
    // The soft application: 128 MiB of objects that cost 1 us each to rebuild.
    let mut soft = Kill(
        cg.command_of(
            &tidepool,
            &Job::CoordApp(AppJob {
                name: "cheap".into(),
                objects: 32768,
                skew: 0.9,
                rebuild_us: 1.0,
                work_us: 5.0,
                seconds: seconds as f64,
                budget: 96 << 20,
                seed: 1,
            })
            .args(),
        )
        .env("TIDEPOOL_COORD", &socket)
        .env("TIDEPOOL_APP", "cheap")
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .expect("the soft application"),
    );
    let mut python = Kill(
        cg.command_of(
            &tidepool,
            &[
                "run",
                "--local",
                "96M",
                "--backend",
                &format!("node://mixed@{}", node.addr),
                "--coord",
                socket.to_str().unwrap(),
                "--name",
                "python",
                "--",
                python3(),
                script.to_str().unwrap(),
                "56000",
                &(seconds - 4).to_string(),
            ],
        )
        .env("TIDEPOOL_PRELOAD", &preload)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python under tidepool run"),
    );
    // The antagonist: 128 MiB at 15 s, held for 8 s.
    let mut antagonist = Kill(
        cg.command_of(
            &tidepool,
            &Job::Antagonist(AntagonistJob {
                bytes: 128 << 20,
                mib_per_s: 256.0,
                delay_s: 15.0,
                hold_s: 8.0,
            })
            .args(),
        )
        .stdout(Stdio::null())
        .spawn()
        .expect("the antagonist"),
    );
    // Budgets as the coordinator sets them, every half second.
    let t0 = Instant::now();
    let mut seen: Vec<(f64, u64, u64, String)> = Vec::new();
    let mut kinds = (false, false);
    while t0.elapsed() < Duration::from_secs(seconds as u64 - 2) {
        std::thread::sleep(Duration::from_millis(500));
        let Some(s) = state(&http) else { continue };
        let find = |name: &str| s.apps.iter().find(|a| a.name == name);
        if let (Some(p), Some(c)) = (find("python"), find("cheap")) {
            kinds = (p.kind == "paged", c.kind == "soft");
            seen.push((t0.elapsed().as_secs_f64(), p.budget, c.budget, line(p, c)));
        }
    }
    let py = python.0.wait().unwrap();
    let mut py_out = String::new();
    std::io::Read::read_to_string(python.0.stdout.as_mut().unwrap(), &mut py_out).unwrap();
    let soft_status = soft.0.wait().unwrap();
    let antagonist_status = antagonist.0.wait().unwrap();
    let kills = cg.oom_kills();
    eprintln!("python said: {py_out}");
    let trail: Vec<String> = seen
        .iter()
        .map(|s| format!("{:.1}s {}", s.0, s.3))
        .collect();
    let trail = trail.join("\n");
    eprintln!("{trail}");
    assert_eq!(kills, 0, "OOM kills in the cgroup\n{trail}");
    assert!(py.success(), "python: {py}\n{py_out}\n{trail}");
    assert!(py_out.contains("ops "), "python did not finish: {py_out}");
    assert!(soft_status.success(), "soft application: {soft_status}");
    assert!(
        antagonist_status.success(),
        "antagonist: {antagonist_status}"
    );
    assert_eq!(kinds, (true, true), "kinds as the coordinator shows them");
    assert!(seen.len() >= 20, "the coordinator was polled\n{trail}");
    // The last quarter: where the budgets settled, after the antagonist left.
    let tail = &seen[seen.len() * 3 / 4..];
    let share = tail
        .iter()
        .map(|s| s.1 as f64 / (s.1 + s.2).max(1) as f64)
        .sum::<f64>()
        / tail.len() as f64;
    assert!(
        share > 0.6,
        "python's share of the two budgets at the end: {share:.2}; budgets should move to \
         the program whose misses cost more\n{trail}"
    );
}

/// One line of what the coordinator showed: budgets, held, misses and miss time.
fn line(p: &tidepool_coord::AppSnapshot, c: &tidepool_coord::AppSnapshot) -> String {
    format!(
        "python budget {} MiB held {} MiB miss {:.0} us utility {:.4} | cheap budget {} MiB \
         held {} MiB miss {:.1} us utility {:.4}",
        p.budget >> 20,
        p.held >> 20,
        p.miss_us,
        p.utility_per_mib,
        c.budget >> 20,
        c.held >> 20,
        c.miss_us,
        c.utility_per_mib
    )
}
