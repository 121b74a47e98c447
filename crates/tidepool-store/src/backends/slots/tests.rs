//! The slab and the map: slots keep their bytes, holes are compacted away, values survive
//! compactions racing with readers and writers.

use super::*;
use proptest::prelude::*;

#[test]
fn a_freed_slot_is_reused_before_new_memory() {
    let slab = Slab::default();
    let a = slab.store(&[1; 1000]);
    let b = slab.store(&[2; 1000]);
    let held = slab.held.load(Relaxed);
    // SAFETY: stored above, freed once, not read again.
    unsafe { slab.free(a) };
    assert_eq!(slab.store(&[3; 999]), a);
    assert_eq!(slab.held.load(Relaxed), held);
    // SAFETY: a live slot of this slab holding 1000 bytes.
    assert_eq!(unsafe { slab.bytes(b, 1000) }, &[2; 1000][..]);
}

#[test]
fn classes_round_up_to_the_grain() {
    assert_eq!(class_size(class_of(1)), 32);
    assert_eq!(class_size(class_of(32)), 32);
    assert_eq!(class_size(class_of(33)), 64);
    assert_eq!(class_size(class_of(MAX)), MAX);
    assert_eq!(chunk_tail(class_of(MAX)), 0);
    assert_eq!(chunk_tail(class_of(3296)), 3104);
}

/// A value that names its key and version, so a read shows whether it got the right one.
fn value(key: u64, version: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|j| (key as usize * 7 + j) as u8).collect();
    v[..8].copy_from_slice(&version.to_le_bytes());
    v
}

fn read(map: &SlotMap, key: u64) -> Option<Vec<u8>> {
    map.get(key, |_, body| match body {
        Body::Bytes(b) => b.to_vec(),
        Body::Word(_) => unreachable!("no words stored here"),
    })
}

const META: Meta = Meta { tag: 0, len: 0 };

#[test]
fn compaction_gives_back_the_holes_and_keeps_every_value() {
    let map = SlotMap::default();
    let per = slots_per_chunk(class_of(1000)) as usize;
    for k in 0..4000u64 {
        map.insert(k, META, Body::Bytes(&value(k, 0, 1000)));
    }
    // Three keys in four go, spread over every chunk.
    for k in (0..4000u64).filter(|k| k % 4 != 0) {
        map.remove(k, |_, _| ());
    }
    let before = map.slab.held.load(Relaxed);
    assert!(map.slab.holes() > before / 2, "holes {}", map.slab.holes());
    assert!(map.compact() > 0);
    let after = map.slab.held.load(Relaxed);
    let needed = 1000usize.div_ceil(per) + 1;
    assert!(
        after <= (needed * CHUNK) as u64,
        "{after} bytes of chunks hold 1000 slots ({needed} chunks would do)"
    );
    for k in 0..4000u64 {
        let expect = (k % 4 == 0).then(|| value(k, 0, 1000));
        assert_eq!(read(&map, k), expect, "key {k}");
    }
    assert_eq!(map.compactions().1, map.moved.load(Relaxed));
    // A second pass finds nothing to drain.
    assert_eq!(map.compact(), 0);
}

#[test]
fn compaction_races_with_readers_and_writers() {
    let map = std::sync::Arc::new(SlotMap::default());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let compactor = {
        let (map, stop) = (map.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut drained = 0;
            while !stop.load(Acquire) {
                drained += map.compact();
            }
            drained
        })
    };
    let workers: Vec<_> = (0..2u64)
        .map(|t| {
            let map = map.clone();
            std::thread::spawn(move || {
                // Each worker owns its keys: t, t + 2, ...; a model of their versions.
                let mut versions = FxHashMap::default();
                let mut rng = 0x2545_F491_4F6C_DD1Du64 ^ t;
                for step in 0..60_000u64 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let key = (rng % 3000) * 2 + t;
                    let len = 300 + (key as usize % 5) * 200;
                    match rng % 4 {
                        0 => {
                            map.remove(key, |_, _| ());
                            versions.remove(&key);
                        }
                        1 | 2 => {
                            map.insert(key, META, Body::Bytes(&value(key, step, len)));
                            versions.insert(key, step);
                        }
                        _ => {
                            let expect = versions.get(&key).map(|&v| value(key, v, len));
                            assert_eq!(read(&map, key), expect, "key {key} at step {step}");
                        }
                    }
                }
                versions
            })
        })
        .collect();
    let models: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, Release);
    assert!(compactor.join().unwrap() > 0, "no chunk was ever drained");
    for versions in models {
        for (key, v) in versions {
            let len = 300 + (key as usize % 5) * 200;
            assert_eq!(read(&map, key), Some(value(key, v, len)));
        }
    }
}

proptest! {
    #[test]
    fn compaction_keeps_values_under_any_mix(
        ops in proptest::collection::vec((0u64..300, 1usize..=MAX, 0u8..4), 1..400),
    ) {
        let map = SlotMap::default();
        let mut model: FxHashMap<u64, Vec<u8>> = FxHashMap::default();
        for (i, &(key, len, op)) in ops.iter().enumerate() {
            match op {
                0 => {
                    map.remove(key, |_, _| ());
                    model.remove(&key);
                }
                1 => {
                    map.compact();
                }
                _ => {
                    let v = value(key, i as u64, len.max(8));
                    map.insert(key, META, Body::Bytes(&v));
                    model.insert(key, v);
                }
            }
        }
        map.compact();
        for key in 0..300u64 {
            prop_assert_eq!(read(&map, key), model.get(&key).cloned());
        }
        for key in 0..300u64 {
            map.remove(key, |_, _| ());
        }
        prop_assert_eq!(map.slab.held.load(Relaxed), 0);
        prop_assert_eq!(map.slab.used.load(Relaxed), 0);
        prop_assert_eq!(map.slab.tails.load(Relaxed), 0);
    }

    #[test]
    fn slots_keep_their_bytes_and_are_reused(
        lens in proptest::collection::vec(1usize..=MAX, 1..200),
        free_every in 1usize..5,
    ) {
        let slab = Slab::default();
        let mut live: Vec<(Slot, Vec<u8>)> = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            let bytes: Vec<u8> = (0..len).map(|j| (i * 31 + j) as u8).collect();
            let slot = slab.store(&bytes);
            prop_assert!(slot.size() >= len && slot.size() < len + GRAIN);
            live.push((slot, bytes));
            if i % free_every == 0 {
                let (slot, _) = live.swap_remove(i % live.len());
                // SAFETY: stored above, freed once, no longer read.
                unsafe { slab.free(slot) };
            }
        }
        for (slot, bytes) in &live {
            // SAFETY: live slots of this slab, written with these bytes.
            prop_assert_eq!(unsafe { slab.bytes(*slot, bytes.len()) }, &bytes[..]);
        }
        // Every chunk goes back once its slots are freed.
        for (slot, _) in live {
            // SAFETY: as above.
            unsafe { slab.free(slot) };
        }
        prop_assert_eq!(slab.held.load(Relaxed), 0);
    }
}
