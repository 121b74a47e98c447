//! The `alloc-stress` job of `tidepool bench-worker`: the long verifying stress run of an
//! allocator.

use super::worker::{current_rss_kib, object_size, peak_rss_kib, preloaded_allocator};
use anyhow::{bail, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::time::Instant;

/// A block whose every byte is derived from its address and a stamp, so corruption, overlap
/// and use of a wrong size are all visible when it is checked.
struct Stamped {
    bytes: Vec<u8>,
    stamp: u8,
}

impl Stamped {
    fn new(n: usize, stamp: u8) -> Stamped {
        let mut bytes = Vec::with_capacity(n);
        let base = bytes.as_ptr() as usize;
        bytes.extend((0..n).map(|i| ((base + i) as u8) ^ stamp));
        Stamped { bytes, stamp }
    }

    fn intact(&self) -> bool {
        let base = self.bytes.as_ptr() as usize;
        self.bytes
            .iter()
            .enumerate()
            .all(|(i, &b)| b == ((base + i) as u8) ^ self.stamp)
    }
}

/// Several threads allocate (every size range, large included), verify, free, and pass blocks
/// to each other to free, for `seconds`; RSS is sampled every second. Fails on the first
/// corrupted block; reports RSS in the first and last tenth of the run.
pub fn stress(seconds: u64) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let corrupt = Arc::new(AtomicU64::new(0));
    let ops = Arc::new(AtomicU64::new(0));
    let threads = 4;
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..threads)
        .map(|_| std::sync::mpsc::sync_channel::<Stamped>(512))
        .unzip();
    let mut handles = vec![];
    for (t, rx) in receivers.into_iter().enumerate() {
        let next = senders[(t + 1) % threads].clone();
        let (stop, corrupt, ops) = (stop.clone(), corrupt.clone(), ops.clone());
        handles.push(std::thread::spawn(move || {
            churn(t, &rx, &next, &stop, &corrupt, &ops)
        }));
    }
    drop(senders);
    let start = Instant::now();
    let mut samples = vec![];
    while start.elapsed().as_secs() < seconds {
        std::thread::sleep(std::time::Duration::from_secs(1));
        samples.push(current_rss_kib()?);
        if corrupt.load(Ordering::Relaxed) > 0 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    let tenth = (samples.len() / 10).max(1);
    let early = samples[..tenth].iter().copied().max().unwrap_or(0);
    let late = samples[samples.len() - tenth..]
        .iter()
        .copied()
        .max()
        .unwrap_or(0);
    let report = serde_json::json!({
        "workload": "stress",
        "seconds": start.elapsed().as_secs_f64(),
        "allocations": total,
        "corrupt_blocks": corrupt.load(Ordering::Relaxed),
        "rss_kib_first_tenth": early,
        "rss_kib_last_tenth": late,
        "peak_rss_kib": peak_rss_kib()?,
        "allocator": preloaded_allocator()?,
    });
    println!("{report}");
    if corrupt.load(Ordering::Relaxed) > 0 {
        bail!("{} corrupted blocks", corrupt.load(Ordering::Relaxed));
    }
    // Unbounded growth would show as the last tenth far above the first.
    if late > early * 3 / 2 + 16 * 1024 {
        bail!("RSS grew from {early} KiB to {late} KiB over the run");
    }
    Ok(())
}

/// One stress thread (number `t`) until `stop`: allocates, verifies and frees, passes some
/// blocks on to `next` and frees what comes from `rx`; counts corrupted blocks in `corrupt`.
/// Returns its allocations.
fn churn(
    t: usize,
    rx: &Receiver<Stamped>,
    next: &SyncSender<Stamped>,
    stop: &AtomicBool,
    corrupt: &AtomicU64,
    ops: &AtomicU64,
) -> u64 {
    let mut rng = SmallRng::seed_from_u64(t as u64 + 1);
    let mut mine: Vec<Stamped> = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..1000 {
            let size = match rng.gen_range(0..1000) {
                0..=4 => rng.gen_range(40_000..2_000_000),
                _ => object_size(&mut rng),
            };
            mine.push(Stamped::new(size, rng.gen()));
            // Keep the live set bounded but churning: random frees, some passed on.
            while mine.len() > 2000 {
                let b = mine.swap_remove(rng.gen_range(0..mine.len()));
                if !b.intact() {
                    corrupt.fetch_add(1, Ordering::Relaxed);
                }
                if rng.gen_range(0..4) == 0 {
                    let _ = next.try_send(b);
                }
            }
            while let Ok(b) = rx.try_recv() {
                if !b.intact() {
                    corrupt.fetch_add(1, Ordering::Relaxed);
                }
            }
            n += 1;
        }
        // Now and then a thread comes and goes, as thread pools resize.
        if rng.gen_range(0..50) == 0 && !passing_thread_keeps_blocks() {
            corrupt.fetch_add(1, Ordering::Relaxed);
        }
        ops.store(ops.load(Ordering::Relaxed) + 1000, Ordering::Relaxed);
    }
    n
}

/// Hands 200 fresh blocks to a thread that checks and frees them before it exits: whether
/// all of them were intact.
fn passing_thread_keeps_blocks() -> bool {
    let v: Vec<Stamped> = (0..200).map(|i| Stamped::new(64 + i, 7)).collect();
    let back = std::thread::spawn(move || v.into_iter().filter(|b| b.intact()).count())
        .join()
        .unwrap_or(0);
    back == 200
}
