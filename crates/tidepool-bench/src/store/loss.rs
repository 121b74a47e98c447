//! `node-loss`: readers run batches of 32 over the whole store; one node is SIGKILLed.
//! `recovery_ms`: from the kill to the first correct read begun after it, in the slowest reader.
//! `reprotect_mib_per_s`: bytes stored again (on the spare node and the others) over the time
//! from the kill until every value has all its pieces again, re-protection riding on the load.

use super::data::{check, keys, noise, THREADS, VALUE_BYTES};
use super::kv::preload;
use super::systems::{start_nodes, StoreKind};
use crate::harness::wanted;
use crate::harness::{Ctx, Matrix, Sample, System, Turns, Workload};
use anyhow::{anyhow, Context, Result};
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};
use tidepool_store::FarStore;

/// A store `node-loss` runs on: one node more than its system's layout in the key-value
/// workloads, so that what the lost node held can be protected again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Layout {
    kind: StoreKind,
    nodes: usize,
    /// The store URL's query: how values are spread over the nodes.
    query: &'static str,
}

impl System for Layout {
    fn name(&self) -> &'static str {
        self.kind.name()
    }
}

/// The layouts, each a system of its own.
pub(super) const LAYOUTS: [Layout; 2] = [
    Layout {
        kind: StoreKind::NodeX3R2,
        nodes: 4,
        query: "replicas=2",
    },
    Layout {
        kind: StoreKind::NodeX6Ec,
        nodes: 7,
        query: "ec=4+2",
    },
];

/// `node-loss` on one layout (its node count is a parameter, so each layout is a workload too).
#[derive(Debug)]
struct NodeLoss(Layout);

impl Workload for NodeLoss {
    fn name(&self) -> &str {
        "node-loss"
    }

    fn params(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("nodes", self.0.nodes as f64),
            ("threads", THREADS as f64),
            ("batch", 32.0),
            ("value_bytes", VALUE_BYTES as f64),
        ]
    }
}

/// Every layout, all its rounds one after another (each run starts and kills its own nodes).
pub(super) fn run(ctx: &mut Ctx) -> Result<()> {
    let n = keys(&ctx.opts);
    let noise = noise();
    let workloads = LAYOUTS.map(NodeLoss);
    let samples = Matrix::new(&LAYOUTS, &workloads, ctx.opts.rounds())
        .turns(Turns::Consecutive)
        .only(|w, s| w.0 == *s && wanted(s.name()))
        .run(ctx, |ctx, _, _, layout| {
            let (ms, mib_s) = one_loss(ctx, layout, n, &noise)?;
            Ok(Sample::new().median("recovery_ms", "ms", ms).median(
                "reprotect_mib_per_s",
                "MiB/s",
                mib_s,
            ))
        })?;
    samples.report(ctx);
    Ok(())
}

/// A counter the store reports among its extra statistics.
fn extra_stat(store: &dyn FarStore, name: &str) -> Result<u64> {
    let st = store.stats()?;
    st.extra
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
        .ok_or_else(|| anyhow!("the store reports no {name}"))
}

/// One run: a store over `layout`, loaded, read by `THREADS` readers while one node is killed.
/// Returns (recovery ms, re-protection MiB/s).
fn one_loss(ctx: &Ctx, layout: &Layout, n: u64, noise: &[u8]) -> Result<(f64, f64)> {
    let (pids, url, servers) = start_nodes(layout.nodes, layout.query)?;
    for &p in &pids {
        ctx.opts.placement.pin_server(p)?;
    }
    let store = tidepool_store::open(&url)?;
    preload(store.as_ref(), n, noise)?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let killed: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let (recovered, reprotect) = std::thread::scope(|s| -> Result<(f64, f64)> {
        let readers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (store, stop, killed) = (&store, &stop, &killed);
                s.spawn(move || -> Result<Option<Duration>> {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64 + 99);
                    let mut keys = vec![0u64; 32];
                    let mut first_after = None;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        keys.iter_mut().for_each(|k| *k = rng.gen_range(0..n));
                        let begun = Instant::now();
                        let got = store.read_many(&keys)?;
                        for (k, g) in keys.iter().zip(&got) {
                            check(*k, Some(0), g.as_ref(), "node-loss")?;
                        }
                        match killed.get() {
                            Some(&k) if begun >= k && first_after.is_none() => {
                                first_after = Some(begun.elapsed() + (begun - k))
                            }
                            _ => {}
                        }
                    }
                    Ok(first_after)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let before = extra_stat(store.as_ref(), "bytes_reprotected")?;
        // SIGKILL the first node: the nodes are a Vec<NodeProcess> whose drop kills.
        let victim = pids[0];
        let victim = rustix::process::Pid::from_raw(victim as i32)
            .ok_or_else(|| anyhow!("node pid {victim}"))?;
        rustix::process::kill_process(victim, rustix::process::Signal::KILL)
            .context("killing a node")?;
        let at = Instant::now();
        killed.set(at).expect("killed once");
        let deadline = at + Duration::from_secs(60);
        let result = loop {
            let left = extra_stat(store.as_ref(), "bytes_not_protected");
            match left {
                Ok(0) => break Ok(at.elapsed()),
                Ok(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Ok(b) => break Err(anyhow!("{b} bytes still unprotected after 60 s")),
                Err(e) => break Err(e),
            }
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut worst = Duration::ZERO;
        for r in readers {
            let first = r
                .join()
                .map_err(|_| anyhow!("reader panicked"))??
                .ok_or_else(|| anyhow!("a reader made no read after the kill"))?;
            worst = worst.max(first);
        }
        let took = result?;
        let bytes = extra_stat(store.as_ref(), "bytes_reprotected")? - before;
        Ok((
            worst.as_secs_f64() * 1e3,
            bytes as f64 / (1 << 20) as f64 / took.as_secs_f64(),
        ))
    })?;
    drop(servers);
    Ok((recovered, reprotect))
}
