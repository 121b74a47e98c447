//! Property: whatever sequence of writes, removals, evacuations, revocations and budget
//! changes runs, a soft map read returns the last value written for the key or nothing, and
//! the arena stays within its budget (plus the segments allocation heads hold).

use proptest::prelude::*;
use std::collections::HashMap;
use tidepool_soft::{ArenaConfig, SoftArena, SoftMap, SEGMENT};

#[derive(Debug, Clone)]
enum Op {
    Write { key: u8, len: usize, seed: u8 },
    Remove { key: u8 },
    Read { key: u8 },
    Evacuate { max_live: u8 },
    PunchOldest,
    Budget { segments: u8 },
    Fill { count: u16 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<u8>(), prop_oneof![8 => 0usize..600, 1 => 0usize..(3 * SEGMENT)], any::<u8>())
            .prop_map(|(key, len, seed)| Op::Write { key, len, seed }),
        1 => any::<u8>().prop_map(|key| Op::Remove { key }),
        6 => any::<u8>().prop_map(|key| Op::Read { key }),
        1 => (0u8..=100).prop_map(|max_live| Op::Evacuate { max_live }),
        1 => Just(Op::PunchOldest),
        1 => (2u8..12).prop_map(|segments| Op::Budget { segments }),
        1 => (1u16..5000).prop_map(|count| Op::Fill { count }),
    ]
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn reads_return_the_last_write_or_nothing(ops in proptest::collection::vec(op(), 1..120)) {
        let arena = SoftArena::new(ArenaConfig::default().budget(8 * SEGMENT).max_bytes(1 << 30)).unwrap();
        let map: SoftMap<u32, Vec<u8>> = SoftMap::new(&arena);
        let mut model: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut filler = 1000u32;
        for op in ops {
            match op {
                Op::Write { key, len, seed } => {
                    let v = bytes(len, seed);
                    match map.insert(key as u32, &v) {
                        Ok(()) => { model.insert(key as u32, v); }
                        // Too large for the budget: the old value may or may not remain.
                        Err(_) => { model.remove(&(key as u32)); map.remove(&(key as u32)); }
                    }
                }
                Op::Remove { key } => {
                    map.remove(&(key as u32));
                    model.remove(&(key as u32));
                }
                Op::Read { key } => {
                    let got = map.get(&(key as u32));
                    if let Some(got) = got {
                        prop_assert_eq!(Some(&got), model.get(&(key as u32)), "key {}", key);
                    }
                }
                Op::Evacuate { max_live } => {
                    arena.evacuate(usize::MAX, max_live as f64 / 100.0);
                }
                Op::PunchOldest => {
                    arena.punch_oldest();
                }
                Op::Budget { segments } => arena.set_budget(segments as usize * SEGMENT),
                Op::Fill { count } => {
                    // Small values that push older ones out.
                    for _ in 0..count {
                        filler += 1;
                        let _ = map.insert(filler, &bytes(64, filler as u8));
                        model.insert(filler, bytes(64, filler as u8));
                    }
                }
            }
            prop_assert!(
                arena.usage() <= arena.budget() + 10 * SEGMENT,
                "usage {} over budget {}", arena.usage(), arena.budget()
            );
        }
        for (k, v) in &model {
            if let Some(got) = map.get(k) {
                prop_assert_eq!(&got, v, "key {}", k);
            }
        }
    }
}
