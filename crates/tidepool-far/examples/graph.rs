//! Mira's running example (its Figure 4), for a first look at overheads: edges read in
//! order, each updating its two nodes at random. Native vectors against far vectors whose
//! sections hold everything (100% local), and a quarter of the nodes (25% local).
//!
//! `cargo run --release -p tidepool-far --example graph [EDGES] [NODES]`
//!
//! Environment: `GRAPH_LINE` (node line bytes, default 64), `GRAPH_ONLY` (one configuration:
//! `100`, `25` or `25b`), `GRAPH_NOLOCAL` (at 100%, go element by element instead of through
//! the plain slice).

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
    // Touched before timing, as the far section is loaded before timing: first touch of
    // memory is slow here.
    n.fill(0);
    std::hint::black_box(&mut n);
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
    let store = Far::new(Arc::new(tidepool_store::LocalStore::new()));
    let es = Section::new(SectionConfig::new(Structure::Direct, 4096, 64 * 4096))?;
    let node_bytes = ((nodes * 8) as f64 * node_share) as usize;
    let line: usize = std::env::var("GRAPH_LINE")
        .ok()
        .and_then(|l| l.parse().ok())
        .unwrap_or(64);
    let ns = Section::new(SectionConfig::new(
        if node_share >= 1.0 {
            Structure::Direct
        } else {
            Structure::SetAssociative(8)
        },
        line,
        if node_share >= 1.0 {
            node_bytes.div_ceil(line) * line
        } else {
            (node_bytes / (8 * line) * 8 * line).max(8 * line)
        },
    ))?;
    let ev = FarVec::from_slice(&store, &es, e)?;
    ev.set_prefetch(16);
    let nv: FarVec<u64> = FarVec::new(&store, &ns, nodes)?;
    if node_share >= 1.0 {
        nv.load_all()?;
    }
    let t = Instant::now();
    if let Some(mut local) = nv
        .local_mut()
        .filter(|_| std::env::var_os("GRAPH_NOLOCAL").is_none())
    {
        // Every node is local, in order: the vector is a plain slice (Mira's native loads).
        let mut i = 0u64;
        for line in ev.line_iter() {
            for x in line?.iter() {
                local[x.from as usize] += i;
                local[x.to as usize] += 1;
                i += 1;
            }
        }
    } else {
        // Split phase, as Mira compiles it: before each block of edges, one request for all
        // the node lines the block will touch.
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
            nv.update(x.from as usize, |n| *n += i as u64)?;
            nv.update(x.to as usize, |n| *n += 1)?;
        }
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
    let only = std::env::var("GRAPH_ONLY").ok();
    for (share, batched) in [(1.0, false), (0.25, false), (0.25, true)] {
        if only
            .as_deref()
            .is_some_and(|o| o != format!("{}{}", share * 100.0, if batched { "b" } else { "" }))
        {
            continue;
        }
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
