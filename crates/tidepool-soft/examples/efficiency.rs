//! Miss rate of a SoftMap under Zipf(0.99) at a soft-memory ratio: `efficiency RATIO [N]`.
use rand::SeedableRng;
use rand_distr::Distribution;
use std::sync::atomic::Ordering::Relaxed;
use tidepool_soft::{ArenaConfig, SoftArena, SoftMap, SEGMENT};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ratio: f64 = args.get(1).map_or(0.5, |a| a.parse().unwrap());
    let n: u64 = args.get(2).map_or(100_000, |a| a.parse().unwrap());
    let state = n as usize * 4112;
    let arena = SoftArena::new(ArenaConfig {
        budget: ((state as f64 * ratio) as usize).max(4 * SEGMENT),
        max_bytes: 8 << 30,
    })
    .unwrap();
    let (lo, hi) = (
        std::env::var("LO").map_or(0.1, |v| v.parse().unwrap()),
        std::env::var("HI").map_or(0.2, |v| v.parse().unwrap()),
    );
    arena.start_evacuator(lo, hi).unwrap();
    let map: SoftMap<u64, [u8; 4096]> = SoftMap::with_reconstructor(&arena, |k| [*k as u8; 4096]);
    let zipf = rand_distr::Zipf::new(n, 0.99).unwrap();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
    let mut next = || (zipf.sample(&mut rng) as u64 - 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) % n;
    for round in 0..std::env::var("ROUNDS").map_or(8, |v| v.parse().unwrap()) {
        let before = map.stats();
        for _ in 0..n {
            map.get_or_reconstruct(next());
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
}
