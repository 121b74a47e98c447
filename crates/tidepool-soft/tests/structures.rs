//! The soft data structures: values that vanish come back from the reconstructor (vectors,
//! maps) or are skipped (queues), and are never wrong.

use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Arc;
use tidepool_soft::{ArenaConfig, SoftArena, SoftMap, SoftQueue, SoftRuntime, SoftVec, SEGMENT};

fn arena(budget: usize) -> Arc<SoftArena> {
    SoftArena::new(ArenaConfig::default().budget(budget).max_bytes(1 << 30)).expect("arena")
}

fn payload(k: u64) -> String {
    format!("value-{k}-{}", "x".repeat((k % 200) as usize))
}

#[test]
fn map_gets_inserts_removes_and_reconstructs() {
    let arena = arena(64 * SEGMENT);
    let built = Arc::new(AtomicU64::new(0));
    let b = built.clone();
    let map: SoftMap<u64, String> = SoftMap::with_reconstructor(&arena, move |k| {
        b.fetch_add(1, Relaxed);
        payload(*k)
    });
    assert_eq!(map.get(&1), None);
    assert_eq!(map.get_or_reconstruct(1), Some(payload(1)));
    assert_eq!(built.load(Relaxed), 1);
    assert_eq!(map.get(&1), Some(payload(1)));
    map.insert(2, &"two".to_string()).unwrap();
    assert_eq!(map.get_or_reconstruct(2), Some("two".to_string()));
    assert_eq!(built.load(Relaxed), 1, "a hit must not reconstruct");
    assert!(map.remove(&2));
    assert!(!map.remove(&2));
    assert_eq!(map.get(&2), None);
    for k in 0..50_000 {
        map.insert(k, &payload(k)).unwrap();
    }
    while arena.punch_oldest() > 0 {}
    for k in 0..50_000 {
        assert_eq!(map.get_or_reconstruct(k), Some(payload(k)), "key {k}");
    }
    assert!(built.load(Relaxed) > 1);
    let plain: SoftMap<u64, u64> = SoftMap::new(&arena);
    plain.insert(5, &6).unwrap();
    assert_eq!(plain.get_or_reconstruct(5), Some(6));
    assert_eq!(plain.get_or_reconstruct(7), None);
}

#[test]
fn map_under_a_small_budget_with_threads() {
    let arena = arena(6 * SEGMENT);
    let runtime = SoftRuntime::new(arena.clone());
    runtime.start_evacuator(0.3, 0.5).unwrap();
    let map: Arc<SoftMap<u64, String>> =
        Arc::new(SoftMap::with_reconstructor(&arena, |k| payload(*k)));
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let map = map.clone();
            std::thread::spawn(move || {
                for round in 0..3u64 {
                    for k in 0..40_000u64 {
                        let key = (k * 7 + t + round) % 60_000;
                        assert_eq!(map.get_or_reconstruct(key), Some(payload(key)));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = map.stats();
    assert!(s.hits > 0 && s.reconstructions > 0, "{s:?}");
    assert!(arena.usage() <= arena.budget() + SEGMENT);
}

#[test]
fn vec_rebuilds_by_index() {
    let arena = arena(4 * SEGMENT);
    let v: SoftVec<[u8; 100]> = SoftVec::new(&arena, 200_000, |i| [(i % 251) as u8; 100]);
    for round in 0..2 {
        for i in 0..v.len() {
            assert_eq!(v.get(i), [(i % 251) as u8; 100], "round {round} index {i}");
        }
    }
    v.set(3, &[7; 100]).unwrap();
    assert_eq!(v.get_cached(3), Some([7; 100]));
    let s = v.stats();
    assert!(s.reconstructions >= 200_000, "{s:?}");
}

#[test]
fn queue_pops_in_order_and_skips_what_vanished() {
    let arena = arena(64 * SEGMENT);
    let q: SoftQueue<(u64, String)> = SoftQueue::new(&arena);
    for k in 0..100_000u64 {
        q.push(&(k, payload(k))).unwrap();
    }
    assert!(arena.punch_oldest() > 0);
    let mut last = None;
    let mut popped = 0;
    while let Some((k, v)) = q.pop() {
        assert_eq!(v, payload(k));
        assert!(
            last.is_none_or(|l| k > l),
            "out of order: {k} after {last:?}"
        );
        last = Some(k);
        popped += 1;
    }
    assert!(popped > 0 && popped < 100_000, "{popped}");
    assert_eq!(last, Some(99_999));
    assert!(q.is_empty());
}

#[test]
fn debug_mode_catches_a_reconstructor_that_disagrees() {
    let arena = arena(16 * SEGMENT);
    let mut map: SoftMap<u64, String> = SoftMap::with_reconstructor(&arena, |k| payload(*k));
    map.set_debug(true);
    map.insert(1, &payload(1)).unwrap();
    map.insert(2, &"stale".to_string()).unwrap(); // written here, not at the source
    assert_eq!(map.get_or_reconstruct(1), Some(payload(1)));
    assert_eq!(map.stats().mismatches, 0);
    assert_eq!(map.get_or_reconstruct(2), Some("stale".to_string()));
    assert_eq!(map.stats().mismatches, 1);
}

/// Collects what the crate logs.
#[derive(Clone, Default)]
struct Log(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_profile_says_what_rebuilding_costs() {
    let arena = arena(2 * SEGMENT);
    let v: SoftVec<[u8; 4000]> = SoftVec::new(&arena, 5_000, |i| {
        std::thread::sleep(std::time::Duration::from_micros(50));
        [(i % 251) as u8; 4000]
    });
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        for i in 0..v.len() {
            v.get(i);
        }
    });
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("rebuilding costs"), "no warning in: {text}");
    let s = v.stats();
    assert_eq!(s.misses, 5_000);
    assert!(s.reconstruct_us >= 50.0, "{s:?}");
    assert!(s.rebuild_us_per_read() >= 50.0, "{s:?}");
}

#[test]
fn the_index_of_a_map_over_endless_keys_stays_bounded() {
    // Values far beyond the budget: the index keeps about what soft memory holds, not every
    // key ever inserted.
    let arena = arena(4 * SEGMENT);
    let runtime = SoftRuntime::new(arena.clone());
    runtime.start_evacuator(0.1, 0.2).unwrap();
    let map: SoftMap<u64, Vec<u8>> = SoftMap::with_reconstructor(&arena, |k| vec![*k as u8; 1000]);
    for k in 0..300_000u64 {
        map.insert(k, &vec![k as u8; 1000]).unwrap();
    }
    // 8 MiB holds at most ~8k values of 1 KiB; pruning runs a shard every 4096 new keys.
    assert!(map.len() < 150_000, "index of {} keys", map.len());
    map.prune();
    // What soft memory holds (a budget's worth), and the keys dropped since hotness last aged
    // (their slots remember them; hotness halves every two budgets' worth of allocation).
    assert!(
        map.len() <= 26_000,
        "index of {} keys after a full prune",
        map.len()
    );
    // Pruned keys come back through the reconstructor.
    assert_eq!(map.get_or_reconstruct(5), Some(vec![5u8; 1000]));
}

#[test]
fn a_budget_cut_to_nothing_takes_even_the_segments_being_filled() {
    // A few small values all sit in the segments threads allocate from; a cut to zero must
    // take those too, and they come back through the reconstructor.
    let arena = arena(64 * SEGMENT);
    let map: SoftMap<u64, String> = SoftMap::with_reconstructor(&arena, |k| payload(*k));
    for k in 0..10 {
        map.insert(k, &payload(k)).unwrap();
    }
    assert_eq!(map.get(&3), Some(payload(3)));
    arena.set_budget(0);
    assert_eq!(arena.usage(), 0);
    assert_eq!(map.get(&3), None, "a value survived a cut to nothing");
    arena.set_budget(64 * SEGMENT);
    assert_eq!(map.get_or_reconstruct(3), Some(payload(3)));
    assert_eq!(map.stats().reconstructions, 1);
}

#[test]
fn map_lists_the_keys_whose_values_are_present() {
    let arena = arena(64 * SEGMENT);
    let map: SoftMap<u64, Vec<u8>> = SoftMap::new(&arena);
    assert!(map.keys().is_empty());
    assert_eq!(map.present_len(), 0);
    // Values of half a segment: each closed segment holds one or two of them.
    for k in 0..40u64 {
        map.insert(k, &vec![k as u8; SEGMENT / 2]).unwrap();
    }
    let mut keys = map.keys();
    keys.sort();
    assert_eq!(keys, (0..40).collect::<Vec<_>>());
    assert_eq!(map.present_len(), 40);
    assert!(map.contains_key(&7) && !map.contains_key(&40));
    assert!(map.remove(&7));
    assert!(!map.contains_key(&7));
    assert_eq!(map.present_len(), 39);
    let before = map.stats();
    while arena.punch_oldest() > 0 {}
    // The index keeps every key; only those whose values survived are listed.
    assert_eq!(map.len(), 39);
    let keys = map.keys();
    assert!(keys.len() < 39, "nothing was dropped");
    assert_eq!(keys.len(), map.present_len());
    for k in 0..40u64 {
        assert_eq!(map.contains_key(&k), keys.contains(&k), "key {k}");
        if keys.contains(&k) {
            assert_eq!(map.get(&k), Some(vec![k as u8; SEGMENT / 2]));
        } else {
            assert_eq!(map.get(&k), None);
        }
    }
    // Listing and checking presence count no reads.
    let after = map.stats();
    assert_eq!(after.hits + after.misses, before.hits + before.misses + 40);
}

#[test]
fn at_a_budget_of_one_segment_every_thread_can_still_store() {
    // A host short of memory cuts the `auto` budget to its floor, one segment, which one
    // thread's allocation head holds; a second thread's insert must take it over (the first
    // thread's values are lost, as any eviction loses them), not fail for want of budget.
    let arena = arena(SEGMENT);
    let map: Arc<SoftMap<u64, String>> = Arc::new(SoftMap::new(&arena));
    map.insert(0, &payload(0)).unwrap();
    for t in 1..=4u64 {
        let m = map.clone();
        std::thread::spawn(move || {
            for k in 0..100 {
                let key = t * 1000 + k;
                m.insert(key, &payload(key))
                    .expect("an insert at the floor budget");
            }
        })
        .join()
        .unwrap();
    }
    assert!(arena.usage() <= SEGMENT, "the budget was overrun");
}
