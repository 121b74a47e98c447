//! Miss rate of a SoftMap under Zipf(0.99) at a soft-memory ratio, round by round (a round
//! is N requests): `efficiency RATIO [N]`. Environment: `ROUNDS` (default 8), `LO` and `HI`
//! (the evacuator's free-segment watermarks), `SHIFT=R` (from round R on, the hot half of
//! the keys becomes the cold half: how fast the cache adapts).
use rand::SeedableRng;
use rand_distr::Distribution;
use std::sync::atomic::Ordering::Relaxed;
use tidepool_soft::{ArenaConfig, SoftArena, SoftMap, SoftRuntime, SEGMENT};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ratio: f64 = args.get(1).map_or(0.5, |a| a.parse().unwrap());
    let n: u64 = args.get(2).map_or(100_000, |a| a.parse().unwrap());
    let state = n as usize * 4112;
    let arena = SoftArena::new(
        ArenaConfig::default()
            .budget(((state as f64 * ratio) as usize).max(4 * SEGMENT))
            .max_bytes(8 << 30),
    )
    .unwrap();
    let runtime = SoftRuntime::new(arena.clone());
    runtime
        .start_evacuator(env("LO", 0.02), env("HI", 0.05))
        .unwrap();
    let map: SoftMap<u64, [u8; 4096]> = SoftMap::with_reconstructor(&arena, |k| [*k as u8; 4096]);
    let zipf = rand_distr::Zipf::new(n, 0.99).unwrap();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
    let shift = env("SHIFT", u64::MAX);
    let mut offset = 0;
    for round in 0..env("ROUNDS", 8u64) {
        if round == shift {
            offset = n / 2;
        }
        let before = map.stats();
        for _ in 0..n {
            let rank = (zipf.sample(&mut rng) as u64 - 1 + offset) % n;
            // Spread ranks over all n keys: a bijection for any n (2^61 - 1 is prime).
            map.get_or_reconstruct((rank as u128 * ((1u128 << 61) - 1) % n as u128) as u64);
        }
        let after = map.stats();
        let c = arena.counters();
        println!(
            "round {round}: miss rate {:.4}; evicted {} direct {} usage {} MiB of {}",
            (after.misses - before.misses) as f64 / n as f64,
            c.segments_evicted.load(Relaxed),
            c.direct_evictions.load(Relaxed),
            arena.usage() >> 20,
            arena.budget() >> 20
        );
    }
    let live = (0..n).filter(|k| map.get(k).is_some()).count();
    println!(
        "objects in soft memory: {live} of {n} ({:.3}); the budget would hold {:.0}",
        live as f64 / n as f64,
        arena.budget() as f64 / 4112.0
    );
}
