//! Cooperative reclamation with a pool of compaction threads: `cooperative THREADS LIVE`.
use rand::{Rng, SeedableRng};
use std::time::Instant;
use tidepool_soft::{ArenaConfig, SoftArena, SoftPool, SoftRuntime, SEGMENT};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).map_or(1, |a| a.parse().unwrap());
    let live: f64 = args.get(2).map_or(0.5, |a| a.parse().unwrap());
    let segments = 256;
    let arena = SoftArena::new(
        ArenaConfig::default()
            .budget((2 * segments + 8) * SEGMENT)
            .max_bytes(8 << 30),
    )
    .unwrap();
    // Watermarks no allocation reaches: the pool only serves the evacuate call below.
    let runtime = SoftRuntime::new(arena.clone());
    runtime.start_evacuators(0.0, 0.0, threads).unwrap();
    let pool = SoftPool::new(&arena, |_: ()| [0u8; 48]);
    let mut boxes: Vec<_> = (0..segments * SEGMENT / 64)
        .map(|i| pool.new_box_with([i as u8; 48]).unwrap())
        .collect();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
    boxes.retain(|_| rng.gen_bool(live));
    let t = Instant::now();
    let r = arena.evacuate(usize::MAX, 1.0);
    let secs = t.elapsed().as_secs_f64();
    let net = r.segments_freed as f64 * SEGMENT as f64 - r.bytes_moved as f64;
    println!(
        "{threads} threads, {:.0}% live: {:.0} MiB/s net ({r:?})",
        live * 100.0,
        net / secs / (1 << 20) as f64
    );
}
