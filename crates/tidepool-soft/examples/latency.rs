use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::hint::black_box;
use std::time::Instant;
use tidepool_soft::{ArenaConfig, SoftArena, SoftPool};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(1 << 21, |a| a.parse().unwrap());
    let arena = SoftArena::new(ArenaConfig::default().budget(1 << 30).max_bytes(4 << 30)).unwrap();
    // A random cycle: object i holds the index of the next one.
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(1));
    let mut next = vec![0u64; n];
    for k in 0..n {
        next[order[k]] = order[(k + 1) % n] as u64;
    }
    let val = |i: usize| {
        let mut v = [0u64; 4];
        v[0] = next[i];
        v[1] = i as u64;
        v
    };
    let pool = SoftPool::new(&arena, move |_: usize| [0u64; 4]);
    let boxes: Vec<Box<[u64; 4]>> = (0..n).map(|i| Box::new(val(i))).collect();
    let soft: Vec<_> = (0..n).map(|i| pool.new_box_with(val(i)).unwrap()).collect();
    for round in 0..3 {
        let t = Instant::now();
        let mut s = 0u64;
        for &i in &order {
            let v: [u64; 4] = *black_box(&boxes[i]).as_ref();
            s += v[1];
        }
        let a = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        let mut s2 = 0u64;
        for &i in &order {
            s2 += soft[i].get().unwrap()[1];
        }
        let b = t.elapsed().as_nanos() as f64 / n as f64;
        // dependent chain
        let t = Instant::now();
        let mut i = 0usize;
        for _ in 0..n {
            i = black_box(&boxes[i])[0] as usize;
        }
        let c = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        let mut j = 0usize;
        for _ in 0..n {
            j = soft[j].get().unwrap()[0] as usize;
        }
        let d = t.elapsed().as_nanos() as f64 / n as f64;
        println!("round {round}: 32 B independent: box {a:.1} ns, soft {b:.1} ns ({:.2}x); chained: box {c:.1} ns, soft {d:.1} ns ({:.2}x) {s} {s2} {i} {j}", b / a, d / c);
    }
    const BIG: usize = 4 << 20;
    let k = 32;
    let bigpool = SoftPool::new(&arena, |_: ()| [0u8; BIG]);
    let bigs: Vec<Box<[u8; BIG]>> = (0..k)
        .map(|i| vec![i as u8; BIG].into_boxed_slice().try_into().unwrap())
        .collect();
    let sbigs: Vec<_> = (0..k)
        .map(|i| {
            let b = bigpool.new_box();
            b.write_from(&bigs[i]).unwrap();
            b
        })
        .collect();
    let mut out: Box<[u8; BIG]> = vec![0u8; BIG].into_boxed_slice().try_into().unwrap();
    for round in 0..3 {
        let t = Instant::now();
        for b in &bigs {
            out.copy_from_slice(&b[..]);
            black_box(&out);
        }
        let a = t.elapsed().as_nanos() as f64 / k as f64;
        let t = Instant::now();
        for b in &sbigs {
            assert!(b.get_into(&mut out));
            black_box(&out);
        }
        let c = t.elapsed().as_nanos() as f64 / k as f64;
        println!(
            "round {round}: 4 MiB: box {:.0} us, soft {:.0} us, ratio {:.2}",
            a / 1e3,
            c / 1e3,
            c / a
        );
    }
}
