//! `pressure`: each server alone in a memory cgroup standing for a machine (swap on zram, as
//! a host with swap has), filled with most of the machine's memory worth of values, under a
//! get-heavy load, while an antagonist takes more than half of the machine for a while and
//! then leaves. memcached's `-m` is what tidepool-cache held once filled: the fixed size a
//! user would have picked for the same data. Reported: `oom_kills` in the cgroup,
//! `swapped_mib` (the most of the server's memory in swap at once), `hit_ratio` over the
//! phase after the antagonist left, and `ops_per_s` while it held its memory.

use super::load::{self, Spec};
use super::Server;
use crate::coord::Cgroup;
use crate::harness::{BenchOpts, Ctx};
use crate::job::{AntagonistJob, Job};
use crate::report::Row;
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

struct Scale {
    limit: u64,
    reserve: u64,
    keys: u64,
    phase: Duration,
}

fn scale(opts: &BenchOpts) -> Scale {
    if opts.quick {
        Scale {
            limit: 1 << 30,
            reserve: 128 << 20,
            keys: 600_000,
            phase: Duration::from_secs(6),
        }
    } else {
        Scale {
            limit: 2 << 30,
            reserve: 192 << 20,
            keys: 1_200_000,
            phase: Duration::from_secs(12),
        }
    }
}

fn rounds(opts: &BenchOpts) -> usize {
    if opts.quick {
        1
    } else {
        2
    }
}

/// The systems of the pressure workload: the cache alone, the cache with its far tier on a
/// memory node (outside the cgroup: another machine's memory), and memcached.
const SYSTEMS: [&str; 3] = ["tidepool-cache", "tidepool-cache-far", "memcached"];

pub(super) fn steps(opts: &BenchOpts) -> u64 {
    (SYSTEMS.len() * rounds(opts)) as u64
}

/// Kib of swap a process uses now (0 if it is gone).
fn swapped_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmSwap:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// The antagonist, started in the cgroup: takes `bytes` as fast as it can, holds them for
/// `hold`, exits.
fn antagonist(cg: &Cgroup, bytes: u64, hold: Duration) -> Result<Child> {
    let job = Job::Antagonist(AntagonistJob {
        bytes,
        mib_per_s: 0.0,
        delay_s: 0.0,
        hold_s: hold.as_secs_f64(),
    });
    let mut c = cg.command(&job.args())?;
    c.stdout(Stdio::null()).stderr(Stdio::null());
    c.spawn().context("cannot start the antagonist")
}

pub(super) fn run(ctx: &mut Ctx) -> Result<()> {
    let sc = scale(&ctx.opts);
    // Swap, as a host has: memcached's memory may go there when the antagonist comes.
    let _zram = match crate::zram::Zram::start(sc.limit) {
        Ok(z) => Some(z),
        Err(e) => {
            ctx.note(format!(
                "pressure: no swap on zram ({e:#}); servers are OOM-killed rather than swapped"
            ));
            None
        }
    };
    let mut held_mib = None;
    let mut results: BTreeMap<(&'static str, &'static str), Vec<f64>> = BTreeMap::new();
    for round in 0..rounds(&ctx.opts) {
        for system in SYSTEMS {
            ctx.step(format!("pressure, round {}: {system}", round + 1));
            let cg = Cgroup::create_with_swap(&format!("cache-{system}"), sc.limit)?;
            let outcome = one(ctx, &cg, &sc, system, &mut held_mib);
            let kills = cg.oom_kills() as f64;
            match outcome {
                Ok(r) => {
                    results
                        .entry((system, "oom_kills"))
                        .or_default()
                        .push(kills);
                    for (k, v) in r {
                        results.entry((system, k)).or_default().push(v);
                    }
                }
                Err(e) => ctx.note(format!("pressure on {system}, round {}: {e:#}", round + 1)),
            }
            ctx.advance();
        }
    }
    let params: BTreeMap<String, f64> = [
        ("limit_mib", (sc.limit >> 20) as f64),
        ("keys", sc.keys as f64),
        ("antagonist_mib", ((sc.limit * 6 / 10) >> 20) as f64),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    // In SYSTEMS' order (the table's columns follow the order of first rows).
    let mut results: Vec<_> = results.into_iter().collect();
    results.sort_by_key(|((system, _), _)| SYSTEMS.iter().position(|s| s == system));
    for ((system, metric), mut v) in results {
        let unit = match metric {
            "swapped_mib" => "MiB",
            "ops_per_s" => "ops/s",
            "oom_kills" => "kills",
            _ => "ratio",
        };
        // The worst round for kills and swap, the median for the rest.
        let value = match metric {
            "oom_kills" | "swapped_mib" => v.iter().copied().fold(0.0, f64::max),
            _ => crate::harness::median(&mut v),
        };
        ctx.report.results.push(Row {
            system: system.into(),
            workload: "pressure".into(),
            metric: metric.into(),
            value,
            unit: unit.into(),
            params: params.clone(),
        });
    }
    if let Some(h) = held_mib {
        ctx.report.notes.push(format!(
            "pressure: a {} MiB cgroup, {} keys of {} B, memcached -m {h} (what tidepool cache held \
             once filled); the antagonist takes 60% of the cgroup for {:?}",
            sc.limit >> 20,
            sc.keys,
            load::VALUE_BYTES,
            sc.phase
        ));
    }
    Ok(())
}

/// One server through fill, load, antagonist, load. `held_mib` carries tidepool-cache's
/// budget once filled to memcached's `-m` (tidepool-cache runs first).
fn one(
    ctx: &mut Ctx,
    cg: &Cgroup,
    sc: &Scale,
    system: &'static str,
    held_mib: &mut Option<u64>,
) -> Result<Vec<(&'static str, f64)>> {
    // The far tier's memory node, outside the cgroup.
    let node = match system {
        "tidepool-cache-far" => Some(crate::node::NodeProcess::start(&format!(
            "{}M",
            (2 * sc.keys * load::VALUE_BYTES as u64) >> 20
        ))?),
        _ => None,
    };
    let server = if let Some(node) = &node {
        let mut args = Server::tidepool_args(sc.reserve >> 20);
        args.extend(["--far".into(), format!("node://cache@{}", node.addr)]);
        let mut s = Server::tidepool(cg.command(&args)?)?;
        s.name = "tidepool-cache-far";
        s.wait_ready(Duration::from_secs(10))?;
        s
    } else if system == "tidepool-cache" {
        let s = Server::tidepool(cg.command(&Server::tidepool_args(sc.reserve >> 20))?)?;
        s.wait_ready(Duration::from_secs(10))?;
        s
    } else {
        let mib = held_mib.unwrap_or((sc.limit - sc.reserve) >> 20);
        let s = Server::memcached(mib)?;
        cg.adopt(s.pid())?;
        s.wait_ready(Duration::from_secs(10))?;
        s
    };
    ctx.opts
        .placement
        .for_workload(false)
        .pin_server(server.pid())?;
    load::fill(server.addr, 0..sc.keys)?;
    if system == "tidepool-cache" {
        *held_mib = Some(server.stat("limit_maxbytes")? >> 20);
    }
    if node.is_some() {
        // The far copies are written behind the sets: let them land first.
        let t = std::time::Instant::now();
        while server.stat("far_writes")? < sc.keys && t.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // Watch the server's swap throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let pid = server.pid();
    let watcher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while !stop.load(Relaxed) {
                most = most.max(swapped_kib(pid));
                std::thread::sleep(Duration::from_millis(50));
            }
            most
        })
    };
    let spec = |duration| Spec {
        addr: server.addr,
        conns: 16,
        keys: sc.keys,
        get_share: 0.9,
        duration,
        seed: 11,
    };
    let outcome = (|| -> Result<Vec<(&'static str, f64)>> {
        load::run(&spec(sc.phase))?;
        let mut hog = antagonist(cg, sc.limit * 6 / 10, sc.phase)?;
        let during = load::run(&spec(sc.phase));
        let _ = hog.wait();
        // Recovery, then the phase the hit ratio is read over.
        let _ = load::run(&spec(sc.phase / 2));
        let after = load::run(&spec(sc.phase));
        Ok(vec![
            ("ops_per_s", during.as_ref().map_or(0.0, |o| o.ops_per_s())),
            ("hit_ratio", after.as_ref().map_or(0.0, |o| o.hit_ratio())),
        ])
    })();
    stop.store(true, Relaxed);
    let swapped = watcher.join().unwrap_or(0) as f64 / 1024.0;
    let mut r = outcome?;
    r.push(("swapped_mib", swapped));
    Ok(r)
}
