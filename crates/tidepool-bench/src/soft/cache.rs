//! Part (d): 1 KiB values in Redis (the slow source) read Zipf(0.99) through a cache holding a
//! quarter of them: an LRU map in the process, memcached on loopback, a SoftMap of the same
//! budget, and a SoftMap whose budget is `auto` (it may grow into idle memory); Redis alone
//! for reference.

use super::shared::{arena, Requests};
use crate::harness::{Ctx, Matrix, Sample, System, Workload};
use anyhow::{Context, Result};
use std::sync::Arc;
use std::time::Instant;
use tidepool_store::FarStore;

/// The cache in front of the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cache {
    /// No cache: every read goes to Redis.
    RedisOnly,
    LruMap,
    Memcached,
    /// A SoftMap of the same budget.
    Soft,
    /// A SoftMap whose budget may grow into idle memory.
    SoftAuto,
}

impl System for Cache {
    fn name(&self) -> &'static str {
        match self {
            Cache::RedisOnly => "redis-only",
            Cache::LruMap => "lru-map",
            Cache::Memcached => "memcached",
            Cache::Soft => "tidepool-soft",
            Cache::SoftAuto => "tidepool-soft-auto",
        }
    }
}

/// Zipf(0.99) reads of `n` values through the cache.
#[derive(Debug, Clone, Copy)]
struct Reads {
    /// Keys at the source.
    n: u64,
    value_len: usize,
    /// The cache's budget.
    cache_bytes: usize,
    /// Seconds measured.
    secs: f64,
}

impl Workload for Reads {
    fn name(&self) -> &str {
        "cache"
    }

    fn params(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("cache_fraction", 0.25),
            ("value_bytes", self.value_len as f64),
        ]
    }
}

/// One cache's read: the value, and whether the cache had it.
type CacheGet = dyn FnMut(u64) -> Result<(Vec<u8>, bool)>;

/// Part (d): a cache of 1 KiB values in front of Redis, Zipf(0.99) reads.
pub(super) fn run(ctx: &mut Ctx) -> Result<()> {
    let quick = ctx.opts.quick;
    let n: u64 = if quick { 50_000 } else { 200_000 };
    let value_len = 1024;
    let cache_bytes = (n as usize * value_len) / 4; // a quarter of the data
    let secs = if quick { 1.0 } else { 4.0 };
    ctx.step("cache: starting Redis (the source) and memcached");
    let redis = match tidepool_peers::RedisServer::start() {
        Ok(r) => r,
        Err(e) => {
            ctx.note(format!("part (d) not run: Redis did not start: {e}"));
            return Ok(());
        }
    };
    ctx.opts.placement.pin_server(redis.pid())?;
    let source: Arc<dyn FarStore> =
        tidepool_store::open(&redis.url()).context("connecting to Redis")?;
    let value = |k: u64| -> Vec<u8> { (0..value_len).map(|i| (k as usize + i) as u8).collect() };
    for chunk in (0..n).collect::<Vec<_>>().chunks(512) {
        let vals: Vec<Vec<u8>> = chunk.iter().map(|&k| value(k)).collect();
        let items: Vec<(u64, &[u8])> = chunk.iter().zip(&vals).map(|(&k, v)| (k, &v[..])).collect();
        source.write_many(&items)?;
    }
    let fetch = {
        let source = source.clone();
        move |k: u64| -> Result<Vec<u8>> {
            source.read_many(&[k])?[0]
                .as_ref()
                .map(|b| b.to_vec())
                .context("a key missing at the source")
        }
    };
    let memcached = match tidepool_peers::Memcached::start((cache_bytes >> 20).max(8) as u32) {
        Ok(m) => {
            ctx.opts.placement.pin_server(m.pid())?;
            Some(m)
        }
        Err(e) => {
            ctx.note(format!(
                "memcached did not start, so it is left out of part (d): {e}"
            ));
            None
        }
    };
    ctx.advance();
    let mut systems = vec![Cache::RedisOnly, Cache::LruMap];
    if memcached.is_some() {
        systems.push(Cache::Memcached);
    }
    systems.extend([Cache::Soft, Cache::SoftAuto]);
    let workloads = [Reads {
        n,
        value_len,
        cache_bytes,
        secs,
    }];
    let samples = Matrix::new(&systems, &workloads, 1).run(ctx, |_, _, w, &system| {
        let get = open(system, w, fetch.clone(), memcached.as_ref())?;
        serve(system, w, get)
    })?;
    samples.report(ctx);
    Ok(())
}

/// Opens `system`'s cache of `w.cache_bytes` in front of `fetch`.
fn open<F>(
    system: Cache,
    w: &Reads,
    fetch: F,
    memcached: Option<&tidepool_peers::Memcached>,
) -> Result<Box<CacheGet>>
where
    F: Fn(u64) -> Result<Vec<u8>> + Clone + Send + Sync + 'static,
{
    let (cache_bytes, value_len) = (w.cache_bytes, w.value_len);
    Ok(match system {
        Cache::RedisOnly => Box::new(move |k| Ok((fetch(k)?, false))),
        Cache::LruMap => {
            let cap = std::num::NonZeroUsize::new(cache_bytes / (value_len + 64)).expect("room");
            let mut lru = lru::LruCache::<u64, Vec<u8>>::new(cap);
            Box::new(move |k| {
                if let Some(v) = lru.get(&k) {
                    return Ok((v.clone(), true));
                }
                let v = fetch(k)?;
                lru.put(k, v.clone());
                Ok((v, false))
            })
        }
        Cache::Memcached => {
            let mc = tidepool_store::open(&memcached.expect("listed only if started").url())?;
            Box::new(move |k| {
                if let Some(v) = mc.read_many(&[k])?.pop().flatten() {
                    return Ok((v.to_vec(), true));
                }
                let v = fetch(k)?;
                mc.write_many(&[(k, &v)])?;
                Ok((v, false))
            })
        }
        Cache::Soft | Cache::SoftAuto => {
            let arena = arena(cache_bytes)?;
            arena.start_evacuator(0.02, 0.05)?;
            if system == Cache::SoftAuto {
                arena.start_auto_budget(tidepool_soft::AutoBudget::default())?;
            }
            let map: tidepool_soft::SoftMap<u64, Vec<u8>, anyhow::Error> =
                tidepool_soft::SoftMap::fallible(&arena, move |k| fetch(*k));
            Box::new(move |k| {
                // The runtime (evacuator, budget) runs as long as the cache is used.
                let _runtime = &arena;
                if let Some(v) = map.get(&k) {
                    return Ok((v, true));
                }
                let v = map.try_get_or_reconstruct(k)?.context("no reconstructor")?;
                Ok((v, false))
            })
        }
    })
}

/// Warms `get` up over as many requests as there are keys, then reads for `w.secs`:
/// throughput and hit rate.
fn serve(system: Cache, w: &Reads, mut get: Box<CacheGet>) -> Result<Sample> {
    let (n, secs, value_len) = (w.n, w.secs, w.value_len);
    let mut req = Requests::new(n, 9);
    for _ in 0..n {
        get(req.next())?;
    }
    let (mut ops, mut hits) = (0u64, 0u64);
    let t = Instant::now();
    while t.elapsed().as_secs_f64() < secs {
        for _ in 0..256 {
            let k = req.next();
            let (v, hit) = get(k)?;
            anyhow::ensure!(
                v.len() == value_len && v[0] == k as u8,
                "{}: wrong value for {k}",
                system.name()
            );
            hits += hit as u64;
        }
        ops += 256;
    }
    Ok(Sample::new()
        .median("ops_per_s", "ops/s", ops as f64 / t.elapsed().as_secs_f64())
        .median("hit_rate", "fraction", hits as f64 / ops as f64))
}
