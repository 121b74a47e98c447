//! A program whose cache is a SoftMap with an `auto` budget, and a memory antagonist that
//! allocates as fast as it can, both in one memory cgroup: nobody is OOM-killed, the soft
//! budget gives way, and the hit rate recovers once the antagonist leaves.
//!
//! The test runs its own binary twice more, as the program and as the antagonist, each
//! joining a fresh cgroup (v1 memory controller, root needed) limited to 1 GiB with no swap.

use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tidepool_soft::{ArenaConfig, AutoBudget, SoftArena, SoftMap, SoftRuntime};
use tidepool_sys::probe::Need;

const LIMIT: usize = 1 << 30;
const KEYS: u64 = 150_000; // 4 KiB values: 600 MiB of soft state
const ANTAGONIST: usize = 700 << 20;
const RUN: Duration = Duration::from_secs(10);
const ANTAGONIST_AT: Duration = Duration::from_millis(3000);
const ANTAGONIST_HOLDS: Duration = Duration::from_millis(2000);

fn value(k: u64) -> Vec<u8> {
    let mut v = vec![0u8; 4096];
    for (i, c) in v.chunks_mut(8).enumerate() {
        c.copy_from_slice(&(k * 4096 + i as u64).to_le_bytes());
    }
    v
}

fn join(cgroup: &str) {
    std::fs::write(
        format!("{cgroup}/cgroup.procs"),
        std::process::id().to_string(),
    )
    .expect("join the test's memory cgroup");
}

fn program(cgroup: &str) {
    join(cgroup);
    let arena = SoftArena::new(ArenaConfig::default().budget(64 << 20).max_bytes(4 << 30)).unwrap();
    let runtime = SoftRuntime::new(arena.clone());
    runtime.start_evacuator(0.1, 0.2).unwrap();
    runtime
        .start_auto_budget(AutoBudget::default().reserve(96 << 20))
        .unwrap();
    let map: SoftMap<u64, Vec<u8>> = SoftMap::with_reconstructor(&arena, |k| value(*k));
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    let start = Instant::now();
    let mut window = Instant::now();
    let (mut hits, mut gets) = (0u64, 0u64);
    let mut last = map.stats();
    while start.elapsed() < RUN {
        let k = rng.gen_range(0..KEYS);
        assert_eq!(map.get_or_reconstruct(k).unwrap(), value(k), "key {k}");
        gets += 1;
        if window.elapsed() >= Duration::from_millis(200) {
            let s = map.stats();
            hits += s.hits - last.hits;
            let rate = (s.hits - last.hits) as f64 / gets as f64;
            println!(
                "{{\"t\": {:.2}, \"hit_rate\": {rate:.4}, \"budget_mib\": {}, \"usage_mib\": {}}}",
                start.elapsed().as_secs_f64(),
                arena.budget() >> 20,
                arena.usage() >> 20
            );
            (last, gets, window) = (s, 0, Instant::now());
        }
    }
    let _ = hits;
}

fn antagonist(cgroup: &str) {
    join(cgroup);
    std::thread::sleep(ANTAGONIST_AT);
    let t = Instant::now();
    // Zeroed pages from mmap: no memory until the loop touches each one.
    let mut mem = vec![0u8; ANTAGONIST];
    for p in mem.chunks_mut(4096) {
        p[0] = 1;
    }
    eprintln!(
        "antagonist: {} MiB in {:.0} ms",
        ANTAGONIST >> 20,
        t.elapsed().as_secs_f64() * 1e3
    );
    std::thread::sleep(ANTAGONIST_HOLDS);
    std::hint::black_box(&mem);
}

/// A v1 memory cgroup under the test's own, removed on drop.
struct Cgroup(PathBuf);

impl Cgroup {
    fn create() -> Cgroup {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let path = own
            .lines()
            .find_map(|l| {
                l.split(':')
                    .nth(2)
                    .filter(|_| l.split(':').nth(1) == Some("memory"))
            })
            .expect("this test needs the cgroup v1 memory controller");
        let dir = PathBuf::from("/sys/fs/cgroup/memory")
            .join(path.trim_start_matches('/'))
            .join(format!("tidepool-soft-antagonist-{}", std::process::id()));
        std::fs::create_dir(&dir).expect("create a memory cgroup (this test needs root)");
        let set = |f: &str, v: String| {
            std::fs::write(dir.join(f), v).unwrap_or_else(|e| panic!("{f}: {e}"));
        };
        set("memory.limit_in_bytes", LIMIT.to_string());
        // No swap: the soft budget must give way by itself.
        if dir.join("memory.memsw.limit_in_bytes").exists() {
            set("memory.memsw.limit_in_bytes", LIMIT.to_string());
        }
        Cgroup(dir)
    }

    fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(self.0.join("memory.oom_control"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn soft_map_survives_a_fast_antagonist() {
    if let (Ok(role), Ok(cg)) = (
        std::env::var("TIDEPOOL_SOFT_ROLE"),
        std::env::var("TIDEPOOL_SOFT_CG"),
    ) {
        match role.as_str() {
            "program" => program(&cg),
            _ => antagonist(&cg),
        }
        return;
    }
    tidepool_sys::skip_unless!(Need::Root, Need::CgroupV1Memory);
    let cg = Cgroup::create();
    let spawn = |role: &str| {
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "soft_map_survives_a_fast_antagonist",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TIDEPOOL_SOFT_ROLE", role)
            .env("TIDEPOOL_SOFT_CG", &cg.0)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut prog = spawn("program");
    let mut anta = spawn("antagonist");
    let lines: Vec<serde_like::Point> = BufReader::new(prog.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_like::parse(&l))
        .collect();
    let ps = prog.wait().unwrap();
    let as_ = anta.wait().unwrap();
    for p in &lines {
        eprintln!(
            "t={:.1}s hit rate {:.3} budget {} MiB usage {} MiB",
            p.t, p.hit_rate, p.budget_mib, p.usage_mib
        );
    }
    assert!(ps.success(), "the program died: {ps:?}");
    assert!(as_.success(), "the antagonist died: {as_:?}");
    assert_eq!(cg.oom_kills(), 0, "the cgroup OOM-killed something");
    let at = ANTAGONIST_AT.as_secs_f64();
    let before = lines
        .iter()
        .filter(|p| p.t > at - 1.0 && p.t <= at)
        .map(|p| p.hit_rate)
        .fold(0.0, f64::max);
    let squeezed = lines
        .iter()
        .filter(|p| p.t > at)
        .map(|p| p.budget_mib)
        .min()
        .unwrap_or(u64::MAX);
    let after = lines
        .iter()
        .filter(|p| p.t > RUN.as_secs_f64() - 1.0)
        .map(|p| p.hit_rate)
        .fold(0.0, f64::max);
    eprintln!("hit rate before {before:.3}, after {after:.3}; budget squeezed to {squeezed} MiB");
    assert!(before > 0.5, "the cache never warmed up: {before}");
    assert!(squeezed < 400, "the budget never gave way: {squeezed} MiB");
    assert!(
        after >= 0.8 * before,
        "the hit rate did not recover: {after} after {before}"
    );
}

/// The program's report lines, parsed by hand (four numbers).
mod serde_like {
    pub struct Point {
        pub t: f64,
        pub hit_rate: f64,
        pub budget_mib: u64,
        pub usage_mib: u64,
    }

    pub fn parse(line: &str) -> Option<Point> {
        let num = |key: &str| -> Option<f64> {
            let at = line.find(&format!("\"{key}\": "))? + key.len() + 4;
            let rest = &line[at..];
            let end = rest.find([',', '}'])?;
            rest[..end].trim().parse().ok()
        };
        Some(Point {
            t: num("t")?,
            hit_rate: num("hit_rate")?,
            budget_mib: num("budget_mib")? as u64,
            usage_mib: num("usage_mib")? as u64,
        })
    }
}
