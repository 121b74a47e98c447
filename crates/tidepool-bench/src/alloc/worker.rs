//! The worker side of the alloc suite: the `alloc` job of `tidepool bench-worker`, run inside the
//! process whose malloc is being measured. Workloads follow Memento's study of serverless
//! functions.

use crate::job::AllocJob;
use anyhow::{bail, Context, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::time::Instant;

/// Runs the workload and prints one JSON line: seconds, peak RSS, the allocator that served
/// it and a checksum.
pub fn worker(job: &AllocJob) -> Result<()> {
    let (workload, scale) = (&job.workload, job.scale);
    let start = Instant::now();
    let checksum = match workload.as_str() {
        "serverless-burst" => serverless_burst(12 * scale, 100_000, 1),
        "serverless-exit" => serverless_exit(600_000 * scale),
        "serverless-threads" => serverless_threads(8 * scale, 100_000),
        "serverless-json" => serverless_json(30 * scale),
        "producer-consumer" => producer_consumer(400_000 * scale),
        "large-objects" => large_objects(1500 * scale),
        other => bail!("unknown alloc workload '{other}'"),
    };
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "workload": workload,
            "seconds": seconds,
            "peak_rss_kib": peak_rss_kib()?,
            "allocator": preloaded_allocator()?,
            "checksum": checksum,
        })
    );
    Ok(())
}

/// VmHWM of this process.
pub(super) fn peak_rss_kib() -> Result<u64> {
    status_kib("VmHWM:")
}

/// VmRSS of this process.
pub(super) fn current_rss_kib() -> Result<u64> {
    status_kib("VmRSS:")
}

/// A kB field of /proc/self/status.
fn status_kib(field: &str) -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .with_context(|| format!("no {field} in /proc/self/status"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .with_context(|| format!("malformed {field}"))?
        .parse()?)
}

/// The malloc library mapped into this process, if any besides libc.
pub(super) fn preloaded_allocator() -> Result<String> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    Ok(super::allocators::allocator_in_maps(&maps).to_string())
}

/// Memento's size mix: mostly under 512 bytes, a tail up to 32 KiB.
pub(super) fn object_size(rng: &mut SmallRng) -> usize {
    match rng.gen_range(0..100) {
        0..=49 => rng.gen_range(8..=64),
        50..=79 => rng.gen_range(65..=256),
        80..=94 => rng.gen_range(257..=512),
        95..=98 => rng.gen_range(513..=4096),
        _ => rng.gen_range(4097..=32768),
    }
}

/// One object: allocated and written at once, as programs do.
fn make_object(rng: &mut SmallRng, tag: u8) -> Vec<u8> {
    let n = object_size(rng);
    let mut v = Vec::with_capacity(n);
    v.resize(n, tag);
    v
}

/// One function invocation: `allocs` objects; 71% die within the next 16 allocations, the rest
/// live until the invocation ends (returned, so the caller decides when they die).
fn invocation(rng: &mut SmallRng, allocs: usize) -> (u64, Vec<Vec<u8>>) {
    const RING: usize = 32;
    let mut ring: Vec<Option<Vec<u8>>> = (0..RING).map(|_| None).collect();
    let mut survivors = Vec::with_capacity(allocs * 3 / 10);
    let mut sum = 0u64;
    for i in 0..allocs {
        // Whatever was scheduled to die now, dies.
        if let Some(dead) = ring[i % RING].take() {
            sum = sum.wrapping_add(dead[dead.len() / 2] as u64);
        }
        let obj = make_object(rng, i as u8);
        if rng.gen_range(0..100) < 71 {
            let d = rng.gen_range(1..=16);
            if let Some(early) = ring[(i + d) % RING].replace(obj) {
                sum = sum.wrapping_add(early[0] as u64);
            }
        } else {
            survivors.push(obj);
        }
    }
    (sum, survivors)
}

/// Many invocations in one warm process; each frees its survivors together at its end.
fn serverless_burst(invocations: usize, allocs: usize, seed: u64) -> u64 {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut sum = 0u64;
    for _ in 0..invocations {
        let (s, survivors) = invocation(&mut rng, allocs);
        sum = sum.wrapping_add(s).wrapping_add(survivors.len() as u64);
        drop(survivors);
    }
    sum
}

/// One invocation whose survivors are never freed: they die with the process.
fn serverless_exit(allocs: usize) -> u64 {
    let mut rng = SmallRng::seed_from_u64(7);
    let (s, survivors) = invocation(&mut rng, allocs);
    let n = survivors.len() as u64;
    std::mem::forget(survivors);
    s.wrapping_add(n)
}

/// Two concurrent invocation streams, as a container serving two requests at once.
fn serverless_threads(invocations: usize, allocs: usize) -> u64 {
    let handles: Vec<_> = (0..2u64)
        .map(|t| std::thread::spawn(move || serverless_burst(invocations / 2, allocs, 100 + t)))
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("worker thread panicked"))
        .fold(0, u64::wrapping_add)
}

/// Parse a request, transform it, render a response: what most functions do.
fn serverless_json(invocations: usize) -> u64 {
    let mut rng = SmallRng::seed_from_u64(3);
    let records: Vec<serde_json::Value> = (0..2000)
        .map(|i| {
            serde_json::json!({
                "id": i,
                "user": format!("user-{}", rng.gen_range(0..500)),
                "tags": (0..rng.gen_range(1..6)).map(|t| format!("tag{t}")).collect::<Vec<_>>(),
                "score": rng.gen_range(0.0..100.0),
                "address": {"city": format!("city-{}", i % 37), "zip": format!("{:05}", i * 7 % 99999)},
            })
        })
        .collect();
    let request = serde_json::to_string(&records).expect("serialisable");
    let mut sum = 0u64;
    for _ in 0..invocations {
        let parsed: serde_json::Value = serde_json::from_str(&request).expect("valid JSON");
        let items = parsed.as_array().expect("an array");
        let mut by_city: BTreeMap<String, Vec<&serde_json::Value>> = BTreeMap::new();
        for it in items {
            if it["score"].as_f64().unwrap_or(0.0) > 20.0 {
                by_city
                    .entry(it["address"]["city"].as_str().unwrap_or("").to_string())
                    .or_default()
                    .push(it);
            }
        }
        let response: Vec<serde_json::Value> = by_city
            .iter()
            .map(|(city, its)| {
                serde_json::json!({
                    "city": city,
                    "count": its.len(),
                    "users": its.iter().map(|i| i["user"].clone()).collect::<Vec<_>>(),
                    "label": format!("{} ({} users)", city.to_uppercase(), its.len()),
                })
            })
            .collect();
        sum = sum.wrapping_add(
            serde_json::to_string(&response)
                .expect("serialisable")
                .len() as u64,
        );
    }
    sum
}

/// Two producers allocate messages; two consumers free them: every free is cross-thread.
fn producer_consumer(messages: usize) -> u64 {
    let mut handles = vec![];
    let mut consumers = vec![];
    for p in 0..2u64 {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(256);
        handles.push(std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(p);
            for i in 0..messages / 2 {
                let n = rng.gen_range(32..=1024);
                let mut v = Vec::with_capacity(n);
                v.resize(n, i as u8);
                tx.send(v).expect("consumer alive");
            }
            0u64
        }));
        consumers.push(std::thread::spawn(move || {
            rx.iter()
                .map(|m| m[m.len() - 1] as u64)
                .fold(0u64, u64::wrapping_add)
        }));
    }
    handles
        .into_iter()
        .chain(consumers)
        .map(|h| h.join().expect("thread panicked"))
        .fold(0, u64::wrapping_add)
}

/// Zeroed buffers from 64 KiB to 8 MiB, every page written, a few alive at a time.
fn large_objects(iterations: usize) -> u64 {
    let mut rng = SmallRng::seed_from_u64(11);
    let mut live: Vec<Vec<u8>> = Vec::new();
    let mut sum = 0u64;
    for i in 0..iterations {
        let n = 1usize << rng.gen_range(16..=22);
        let n = n + rng.gen_range(0..n);
        // A zeroed buffer (calloc), then one write per page: allocators that trust fresh zero
        // pages skip the clearing; reused memory must be cleared.
        let mut v = vec![0u8; n];
        for page in (0..n).step_by(4096) {
            v[page] = i as u8;
        }
        live.push(v);
        if live.len() > 8 {
            let dead = live.remove(rng.gen_range(0..live.len()));
            sum = sum.wrapping_add(dead[0] as u64);
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invocation_follows_the_memento_shape() {
        let mut rng = SmallRng::seed_from_u64(1);
        let (_, survivors) = invocation(&mut rng, 100_000);
        let share = survivors.len() as f64 / 100_000.0;
        assert!((0.26..0.32).contains(&share), "survivor share {share}");
        let small = survivors.iter().filter(|v| v.len() <= 512).count() as f64;
        assert!(
            small / survivors.len() as f64 > 0.9,
            "most objects must be under 512 B"
        );
    }

    #[test]
    fn workloads_run_and_report() {
        assert_ne!(serverless_burst(2, 1000, 1), 0);
        assert_ne!(serverless_exit(1000), 0);
        assert_ne!(serverless_json(1), 0);
        assert_ne!(large_objects(10), 0);
        producer_consumer(1000);
        assert!(peak_rss_kib().unwrap() > 0);
    }
}
