//! A DataFrame-style query over far vectors on a memory node started in this process:
//! offloaded, then computed here with every line fetched, then here with everything local.
//!
//! `cargo run --release -p tidepool-far --example query [ROWS]`

use std::time::Instant;
use tidepool_far::{Cmp, Far, FarVec, Offload, Query, Section, SectionConfig, Structure};
use tidepool_node::{NodeConfig, Server};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rows: usize = std::env::args().nth(1).map_or(Ok(8 << 20), |a| a.parse())?;
    let node = Server::start(NodeConfig::new("127.0.0.1:0", rows as u64 * 64))?;
    let far = Far::new(tidepool_store::open(&format!(
        "node://example@{}",
        node.local_addr()
    ))?);
    // A tenth of the table's 16 bytes a row, split by column size.
    let local = rows * 16 / 10;
    let sec = |line: usize, bytes: usize| {
        Section::new(SectionConfig::new(
            Structure::Full,
            line,
            bytes.max(4 * line),
        ))
    };
    let (rs, qs, ps) = (
        sec(4096, local / 4)?,
        sec(4096, local / 4)?,
        sec(8192, local / 2)?,
    );
    let (region, qty, price): (FarVec<u32>, FarVec<u32>, FarVec<f64>) = (
        FarVec::new(&far, &rs, rows)?,
        FarVec::new(&far, &qs, rows)?,
        FarVec::new(&far, &ps, rows)?,
    );
    region.fill_with(|i| (i as u32).wrapping_mul(2_654_435_761) % 64)?;
    qty.fill_with(|i| (i as u32).wrapping_mul(40_503) % 100)?;
    price.fill_with(|i| (i % 100_000) as f64 / 100.0)?;
    for how in [Offload::Always, Offload::Never] {
        for _ in 0..3 {
            let t0 = Instant::now();
            let mut q = Query::new();
            let (r, n, p) = (q.column(&region)?, q.column(&qty)?, q.column(&price)?);
            q.filter(n, Cmp::Gt, 20).group_by(r, 64);
            let (sum, _, _, count) = (q.sum(p), q.min(p), q.max(p), q.count());
            let a = q.run(how)?;
            let secs = t0.elapsed().as_secs_f64();
            println!(
                "{how:?} ({:?}): {:.1}M rows/s (group 0: sum {:.2}, {} rows)",
                a.ran,
                rows as f64 / secs / 1e6,
                a.get(0, &sum),
                a.get(0, &count)
            );
        }
    }
    node.shutdown();
    Ok(())
}
