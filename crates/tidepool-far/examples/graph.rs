//! Mira's running example (its Figure 4), for a first look at overheads: edges read in
//! order, each updating its two nodes at random. Native vectors against far vectors whose
//! sections hold everything (100% local), and a quarter of the nodes (25% local).
//!
//! `cargo run --release -p tidepool-far --example graph [EDGES] [NODES]`

use std::sync::Arc;
use std::time::Instant;
use tidepool_far::{Far, FarError, FarVec, Section, SectionConfig, Structure};

#[derive(
    Clone,
    Copy,
    Default,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
)]
#[repr(C)]
struct Edge {
    from: u32,
    to: u32,
}

fn edges(n: usize, nodes: usize) -> Vec<Edge> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Edge {
                from: (x % nodes as u64) as u32,
                to: ((x >> 32) % nodes as u64) as u32,
            }
        })
        .collect()
}

fn native(e: &[Edge], nodes: usize) -> (f64, u64) {
    let mut n = vec![0u64; nodes];
    let t = Instant::now();
    for (i, x) in e.iter().enumerate() {
        n[x.from as usize] += i as u64;
        n[x.to as usize] += 1;
    }
    (t.elapsed().as_secs_f64(), n.iter().sum())
}

fn far(
    e: &[Edge],
    nodes: usize,
    node_share: f64,
    batched: bool,
) -> Result<(f64, u64, String), FarError> {
    let store = Far::new(Arc::new(tidepool_store::LocalStore::new(false)));
    let es = Section::new(SectionConfig::new(Structure::Direct, 4096, 64 * 4096))?;
    let node_bytes = ((nodes * 8) as f64 * node_share) as usize;
    let ns = Section::new(SectionConfig::new(
        Structure::SetAssociative(8),
        64,
        (node_bytes / 512 * 512).max(512),
    ))?;
    let ev = FarVec::from_slice(&store, &es, e)?;
    ev.set_prefetch(16);
    let nv: FarVec<u64> = FarVec::new(&store, &ns, nodes)?;
    let t = Instant::now();
    // Split phase, as Mira compiles it: before each block of edges, one request for all the
    // node lines the block will touch.
    const BLOCK: usize = 256;
    let mut ahead = ev.iter();
    let mut wanted = Vec::with_capacity(2 * BLOCK);
    for (i, x) in ev.iter().enumerate() {
        if batched && i % BLOCK == 0 {
            wanted.clear();
            for y in ahead.by_ref().take(BLOCK) {
                let y = y?;
                wanted.extend([y.from as usize, y.to as usize]);
            }
            nv.request(&wanted)?;
        }
        let x = x?;
        let mut a = nv.line_mut(x.from as usize)?;
        let f = a.first;
        a[x.from as usize - f] += i as u64;
        drop(a);
        let mut b = nv.line_mut(x.to as usize)?;
        let f = b.first;
        b[x.to as usize - f] += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    let sum = nv.iter().map(|x| x.unwrap()).sum();
    Ok((
        secs,
        sum,
        format!("edges {:?}\n  nodes {:?}", es.stats(), ns.stats()),
    ))
}

fn main() -> Result<(), FarError> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n_edges = args.first().copied().unwrap_or(20_000_000);
    let nodes = args.get(1).copied().unwrap_or(4_000_000);
    let e = edges(n_edges, nodes);
    let (tn, sn) = native(&e, nodes);
    println!("native: {:.1} ns/edge", tn * 1e9 / n_edges as f64);
    for (share, batched) in [(1.0, false), (0.25, false), (0.25, true)] {
        let (tf, sf, stats) = far(&e, nodes, share, batched)?;
        assert_eq!(sf, sn, "far and native disagree");
        println!(
            "far, nodes {:.0}% local{}: {:.1} ns/edge ({:.2}x native)\n  {stats}",
            share * 100.0,
            if batched {
                ", node misses requested a block ahead"
            } else {
                ""
            },
            tf * 1e9 / n_edges as f64,
            tf / tn
        );
    }
    Ok(())
}
