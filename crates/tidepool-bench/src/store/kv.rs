//! The key-value workloads: one client at a time for latency, `THREADS` clients with batches in
//! flight for throughput, every system on the same keys and values.

use super::data::{batches, check, keys, noise, value, THREADS, VALUE_BYTES};
use super::systems::StoreSystem;
use crate::harness::{BenchOpts, Ctx, Matrix, Pass, Sample, System, Workload};
use anyhow::{anyhow, Context, Result};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidepool_store::{FarStore, Key};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Get,
    Put,
}

/// One key-value workload: reads or writes of `batch` keys per call from `threads` clients.
#[derive(Debug, Clone, Copy)]
pub(super) struct Kv {
    name: &'static str,
    kind: Kind,
    threads: usize,
    batch: usize,
}

impl Workload for Kv {
    fn name(&self) -> &str {
        self.name
    }

    fn on(&self, system: &str) -> String {
        format!("{} batch {} on {system}", self.name, self.batch)
    }

    fn params(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("threads", self.threads as f64),
            ("batch", self.batch as f64),
            ("value_bytes", VALUE_BYTES as f64),
        ]
    }

    fn latency(&self) -> bool {
        self.name.ends_with("unpipelined")
    }
}

/// The workloads, unpipelined first, then the batched ones at each batch size.
pub(super) fn workloads(opts: &BenchOpts) -> Vec<Kv> {
    let kv = |name, kind, threads, batch| Kv {
        name,
        kind,
        threads,
        batch,
    };
    let mut w = vec![
        kv("get-unpipelined", Kind::Get, 1, 1),
        kv("put-unpipelined", Kind::Put, 1, 1),
    ];
    for b in batches(opts) {
        w.push(kv("get-batched", Kind::Get, THREADS, b));
        w.push(kv("put-batched", Kind::Put, THREADS, b));
    }
    w
}

/// Loads every system, then measures each on every workload: throughput (the median of the
/// rounds), the servers' CPU per operation (batched) and latency (unpipelined: all systems in
/// turns of [`TURN`] requests within each round, pooled over the rounds).
pub(super) fn run(ctx: &mut Ctx, systems: &[StoreSystem]) -> Result<()> {
    let n = keys(&ctx.opts);
    let noise = noise();
    for s in systems {
        ctx.step(format!("loading {n} values into {}", s.name()));
        preload(s.store.as_ref(), n, &noise).with_context(|| format!("loading {}", s.name()))?;
        // What the store keeps far for each byte of the values (redundancy and allocation
        // overhead), where the backend can tell.
        if let Some(far) = s.store.stats().ok().and_then(|st| st.far_bytes) {
            ctx.report.push(
                s.name(),
                "load",
                "far_bytes_per_live_byte",
                far as f64 / (n as f64 * VALUE_BYTES as f64),
                "ratio",
                &[("value_bytes", VALUE_BYTES as f64)],
            );
        }
    }
    let workloads = workloads(&ctx.opts);
    // The latency workloads measure every system at once (see `interleaved`): the first
    // system's turn in a pass does it, the others' turns add nothing.
    let mut timed: Option<(Pass, &'static str)> = None;
    let samples = Matrix::new(systems, &workloads, ctx.opts.rounds())
        .warm_up()
        .run(ctx, |ctx, pass, w, s| {
            let d = match pass {
                Pass::WarmUp => ctx.opts.measure_for() / 2,
                Pass::Round(_) => ctx.opts.measure_for(),
            };
            if w.latency() {
                if timed == Some((pass, w.name)) {
                    return Ok(Sample::new());
                }
                timed = Some((pass, w.name));
                let placement = ctx.opts.placement.for_workload(true);
                for p in systems.iter().flat_map(|s| s.server_pids()) {
                    placement.pin_server(p)?;
                }
                return interleaved(systems, w, n, d * systems.len() as u32, &noise);
            }
            let cpu0 = s.cpu_seconds();
            let (ops, secs) = drive(&s.store, w, n, d, &noise, s.name())?;
            let rate = ops as f64 / secs;
            if let Pass::Round(r) = pass {
                if std::env::var_os("TIDEPOOL_BENCH_TRACE").is_some() {
                    eprintln!(
                        "trace: round {} {} batch {} {}: {rate:.0} ops/s",
                        r + 1,
                        w.name,
                        w.batch,
                        s.name()
                    );
                }
            }
            let sample = Sample::new().median("ops_per_s", "ops/s", rate);
            // What the server itself spends per operation, whoever limited the throughput.
            Ok(match (cpu0, s.cpu_seconds()) {
                (Some(a), Some(b)) => {
                    sample.per_op("server_cpu_us_per_op", "us", (b - a) * 1e6, ops)
                }
                _ => sample,
            })
        })?;
    samples.report(ctx);
    Ok(())
}

/// Writes version 0 of keys `0..n`, 64 a call.
pub(super) fn preload(store: &dyn FarStore, n: u64, noise: &[u8]) -> Result<()> {
    let values: Vec<Vec<u8>> = (0..n).map(|k| value(k, 0, noise)).collect();
    for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
        let items: Vec<(Key, &[u8])> = chunk
            .iter()
            .map(|&k| (k, values[k as usize].as_slice()))
            .collect();
        store.write_many(&items)?;
    }
    Ok(())
}

/// Requests a system gets in a row before the next system's turn in [`interleaved`].
const TURN: usize = 32;

/// One client times every system for `d` in all, each getting [`TURN`] requests in its turn:
/// one unpipelined request's latency on this VM drifts by a quarter from one second to the
/// next, more than the systems differ, so systems measured one after another would be ranked
/// by the second they drew. Returns each system's latency and rate, filed under its name.
fn interleaved(
    systems: &[StoreSystem],
    w: &Kv,
    n: u64,
    d: Duration,
    noise: &[u8],
) -> Result<Sample> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut hists: Vec<Histogram<u64>> = systems.iter().map(|_| new_hist()).collect();
    let mut busy = vec![Duration::ZERO; systems.len()];
    let mut done = vec![0u64; systems.len()];
    let mut bufs = vec![value(0, 0, noise)];
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        for (i, s) in systems.iter().enumerate() {
            let turn = Instant::now();
            for _ in 0..TURN {
                let k = [rng.gen_range(0..n)];
                let ns = call(s.store.as_ref(), w.kind, &k, &mut bufs, s.name())?;
                hists[i].record(ns).ok();
            }
            busy[i] += turn.elapsed();
            done[i] += TURN as u64;
        }
    }
    let mut sample = Sample::new();
    for (i, (s, h)) in systems.iter().zip(hists).enumerate() {
        let rate = done[i] as f64 / busy[i].as_secs_f64();
        sample = sample
            .median("ops_per_s", "ops/s", rate)
            .of(s.name())
            .latency(h)
            .of(s.name());
    }
    Ok(sample)
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(100, 10_000_000_000, 3).expect("valid bounds")
}

/// One timed call of `kind` on `keys` (puts write `bufs`, one per key, each tagged with its
/// key first); gets are checked. Returns the call's nanoseconds.
fn call(
    store: &dyn FarStore,
    kind: Kind,
    keys: &[Key],
    bufs: &mut [Vec<u8>],
    who: &str,
) -> Result<u64> {
    match kind {
        Kind::Get => {
            let t0 = Instant::now();
            let got = store.read_many(keys)?;
            let ns = t0.elapsed().as_nanos() as u64;
            for (k, g) in keys.iter().zip(&got) {
                check(*k, None, g.as_ref(), who)?;
            }
            Ok(ns)
        }
        Kind::Put => {
            for (b, k) in bufs.iter_mut().zip(keys) {
                b[..8].copy_from_slice(&k.to_le_bytes());
            }
            let items: Vec<(Key, &[u8])> = keys
                .iter()
                .copied()
                .zip(bufs.iter().map(Vec::as_slice))
                .collect();
            let t0 = Instant::now();
            store.write_many(&items)?;
            Ok(t0.elapsed().as_nanos() as u64)
        }
    }
}

/// Runs `w.threads` clients for `d`, each with `w.batch` requests per call. Returns keys done
/// and seconds taken.
fn drive(
    store: &Arc<dyn FarStore>,
    w: &Kv,
    n: u64,
    d: Duration,
    noise: &[u8],
    who: &str,
) -> Result<(u64, f64)> {
    let (kind, threads, batch) = (w.kind, w.threads, w.batch);
    let start = Instant::now();
    let results: Vec<Result<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let store = Arc::clone(store);
                s.spawn(move || -> Result<u64> {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64 + 7);
                    let mut done = 0u64;
                    let mut keys = vec![0u64; batch];
                    // Values for puts are built before timing starts.
                    let mut bufs: Vec<Vec<u8>> = if kind == Kind::Put {
                        (0..batch).map(|_| value(0, 0, noise)).collect()
                    } else {
                        vec![]
                    };
                    let deadline = start + d;
                    while Instant::now() < deadline {
                        for k in keys.iter_mut() {
                            *k = rng.gen_range(0..n);
                        }
                        call(store.as_ref(), kind, &keys, &mut bufs, who)?;
                        done += batch as u64;
                    }
                    Ok(done)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("client thread panicked")))
            })
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let mut ops = 0;
    for r in results {
        ops += r?;
    }
    Ok((ops, secs))
}
