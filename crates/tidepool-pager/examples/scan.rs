//! Quick look at sequential-scan and random read-modify-write throughput over a region at a
//! given local ratio: `cargo run --release -p tidepool-pager --example scan -- MIB RATIO`.
use std::time::Instant;
use tidepool_pager::{Config, Pager, Region};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args.get(1).map_or(512, |s| s.parse().unwrap());
    let ratio: f64 = args.get(2).map_or(0.5, |s| s.parse().unwrap());
    let len = mib << 20;
    let store = tidepool_store::open("local:").unwrap();
    let pager = Pager::start(Config::new((len as f64 * ratio) as usize), store).unwrap();
    let mut region = Region::new(&pager, len).unwrap();
    let words = region.len() / 8;
    // SAFETY: the region is page aligned and `len` bytes long.
    let mem = unsafe { std::slice::from_raw_parts_mut(region.as_mut_ptr() as *mut u64, words) };
    let t = Instant::now();
    let mut x = 88172645463325252u64;
    for w in mem.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *w = x;
    }
    eprintln!(
        "fill {:.2} GB/s",
        len as f64 / t.elapsed().as_secs_f64() / 1e9
    );
    for _ in 0..3 {
        let t = Instant::now();
        let mut sum = 0u64;
        for w in mem.iter() {
            sum = sum.wrapping_add(*w);
        }
        eprintln!(
            "scan {:.2} GB/s ({sum:x})",
            len as f64 / t.elapsed().as_secs_f64() / 1e9
        );
    }
    let t = Instant::now();
    let n = 200_000;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = (x % words as u64) as usize;
        mem[i] = mem[i].wrapping_add(1);
    }
    eprintln!(
        "random rmw {:.3} Mops/s",
        n as f64 / t.elapsed().as_secs_f64() / 1e6
    );
    eprintln!("{}", pager.stats());
}
