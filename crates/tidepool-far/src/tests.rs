//! Unit tests: far vectors over an in-process store that can be made to fail.

use crate::{Far, FarError, FarVec, Section, SectionConfig, Structure};
use bytes::Bytes;
use proptest::prelude::*;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tidepool_store::{FarStore, Key, LocalStore, StoreError};

/// An in-process store that counts the keys read and written and fails while told to.
#[derive(Debug)]
struct Flaky {
    inner: LocalStore,
    fail: AtomicBool,
    read: AtomicU64,
    written: AtomicU64,
}

impl Flaky {
    fn new() -> Arc<Flaky> {
        Arc::new(Flaky {
            inner: LocalStore::new(),
            fail: AtomicBool::new(false),
            read: AtomicU64::new(0),
            written: AtomicU64::new(0),
        })
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.fail.load(Relaxed) {
            return Err(StoreError::Io {
                backend: "test store",
                op: "anything",
                cause: std::io::Error::other("told to fail"),
            });
        }
        Ok(())
    }
}

impl FarStore for Flaky {
    fn describe(&self) -> String {
        "flaky".into()
    }
    fn write_many(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        self.check()?;
        self.written.fetch_add(items.len() as u64, Relaxed);
        self.inner.write_many(items)
    }
    fn read_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        self.check()?;
        self.read.fetch_add(keys.len() as u64, Relaxed);
        self.inner.read_many(keys)
    }
    fn take_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        self.check()?;
        self.inner.take_many(keys)
    }
    fn remove_many(&self, keys: &[Key]) -> Result<(), StoreError> {
        self.check()?;
        self.inner.remove_many(keys)
    }
}

const STRUCTURES: [Structure; 3] = [
    Structure::Direct,
    Structure::SetAssociative(4),
    Structure::Full,
];

fn section(structure: Structure, line: usize, lines: usize) -> Rc<Section> {
    Section::new(SectionConfig::new(structure, line, line * lines)).unwrap()
}

#[test]
fn a_vector_larger_than_its_section_reads_back_in_every_structure() {
    for st in STRUCTURES {
        let far = Far::new(Flaky::new());
        let sec = section(st, 256, 8);
        let values: Vec<u64> = (0..10_000).map(|i| i * 7 + 1).collect();
        let v = FarVec::from_slice(&far, &sec, &values).unwrap();
        assert_eq!(v.to_vec().unwrap(), values, "{st}");
        // Random access too.
        for i in (0..10_000).step_by(997) {
            assert_eq!(v.get(i).unwrap(), values[i], "{st} at {i}");
        }
        let s = sec.stats();
        assert!(s.misses >= v.lines() as u64, "{st}: {s:?}");
    }
}

#[test]
fn writes_survive_eviction_and_drop_takes_the_far_copies() {
    for st in STRUCTURES {
        let store = Flaky::new();
        let far = Far::new(store.clone());
        let sec = section(st, 64, 4);
        let v: FarVec<u32> = FarVec::new(&far, &sec, 5000).unwrap();
        for i in 0..5000 {
            v.set(i, i as u32 ^ 0xABCD).unwrap();
        }
        for i in (0..5000).rev() {
            assert_eq!(v.get(i).unwrap(), i as u32 ^ 0xABCD, "{st} at {i}");
        }
        assert!(sec.stats().writebacks > 0);
        drop(v);
        assert_eq!(store.inner.stats().unwrap().objects, Some(0), "{st}");
        // Nothing of it stays in the section.
        let w: FarVec<u32> = FarVec::new(&far, &sec, 16).unwrap();
        assert_eq!(w.get(3).unwrap(), 0);
    }
}

#[test]
fn a_failing_store_loses_no_written_line() {
    for st in STRUCTURES {
        let store = Flaky::new();
        let far = Far::new(store.clone());
        let sec = section(st, 64, 4);
        let v: FarVec<u64> = FarVec::new(&far, &sec, 512).unwrap();
        for i in 0..64 {
            v.set(i, 1000 + i as u64).unwrap();
        }
        store.fail.store(true, Relaxed);
        // Every miss now fails, and says why.
        let mut failed = 0;
        for i in 0..512 {
            match v.set(i, 1000 + i as u64) {
                Ok(()) => {}
                Err(FarError::Store(_)) => failed += 1,
                Err(e) => panic!("{st}: {e}"),
            }
        }
        assert!(failed > 0, "{st}: the store never failed");
        store.fail.store(false, Relaxed);
        for i in 0..64 {
            assert_eq!(v.get(i).unwrap(), 1000 + i as u64, "{st}: lost {i}");
        }
    }
}

#[test]
fn whole_line_writes_skip_the_fetch() {
    let store = Flaky::new();
    let far = Far::new(store.clone());
    let sec = section(Structure::Direct, 128, 4);
    let v: FarVec<u64> = FarVec::new(&far, &sec, 1600).unwrap();
    for first in (0..1600).step_by(v.per_line()) {
        let mut l = v.overwrite_line(first).unwrap();
        for (j, x) in l.iter_mut().enumerate() {
            *x = (first + j) as u64;
        }
    }
    assert_eq!(store.read.load(Relaxed), 0, "an overwrite fetched");
    v.flush().unwrap();
    assert_eq!(v.to_vec().unwrap(), (0..1600).collect::<Vec<u64>>());
}

#[test]
fn a_scan_fetches_many_lines_a_round_trip() {
    let far = Far::new(Flaky::new());
    let sec = section(Structure::Direct, 64, 64);
    let v = FarVec::from_slice(&far, &sec, &(0..8000u64).collect::<Vec<_>>()).unwrap();
    v.set_prefetch(15);
    assert_eq!(
        v.iter().map(|x| x.unwrap()).sum::<u64>(),
        (0..8000).sum::<u64>()
    );
    let s = sec.stats();
    assert_eq!(s.misses, v.lines() as u64);
    assert_eq!(s.fetches, (v.lines() as u64).div_ceil(16), "{s:?}");
}

#[test]
fn a_request_brings_scattered_lines_in_one_round_trip() {
    let store = Flaky::new();
    let far = Far::new(store.clone());
    let sec = section(Structure::SetAssociative(4), 64, 64);
    let v = FarVec::from_slice(&far, &sec, &(0..10_000u64).collect::<Vec<_>>()).unwrap();
    let wanted = [9_000, 17, 4_321, 5_555, 18, 777, 9_999, 3_000];
    v.request(&wanted).unwrap();
    let s = sec.stats();
    assert_eq!(
        (s.fetches, s.misses),
        (1, 7),
        "two of the indices share a line: {s:?}"
    );
    for &i in &wanted {
        assert_eq!(v.get(i).unwrap(), i as u64);
    }
    assert_eq!(sec.stats().fetches, 1, "an access after the request missed");
    // Out-of-range indices are ignored, not an error (it is a hint).
    v.request(&[10_000, 123_456]).unwrap();
}

#[test]
fn guards_on_every_way_give_an_error_not_a_panic() {
    let far = Far::new(Flaky::new());
    let sec = section(Structure::Direct, 64, 1);
    let v: FarVec<u64> = FarVec::new(&far, &sec, 64).unwrap();
    let held = v.line(0).unwrap();
    assert!(matches!(
        v.get(40),
        Err(FarError::AllBorrowed { index: 40 })
    ));
    // The same line read twice is fine; written while read is not.
    assert_eq!(v.line(1).unwrap().len(), 8);
    assert!(matches!(v.line_mut(2), Err(FarError::Borrowed { .. })));
    drop(held);
    assert_eq!(v.get(40).unwrap(), 0);
}

#[test]
fn evictable_lines_go_first_and_pinned_lines_stay() {
    let store = Flaky::new();
    let far = Far::new(store.clone());
    let sec = section(Structure::Full, 64, 4);
    let v = FarVec::from_slice(&far, &sec, &(0..64u64).collect::<Vec<_>>()).unwrap();
    v.set_prefetch(0);
    for line in 0..4 {
        v.get(line * 8).unwrap();
    }
    v.pin(0).unwrap();
    v.evictable(16);
    v.get(32).unwrap(); // needs a slot: line 2 (evictable) gives it
    let before = store.read.load(Relaxed);
    v.get(0).unwrap();
    v.get(8).unwrap();
    v.get(24).unwrap();
    assert_eq!(store.read.load(Relaxed), before, "a kept line was evicted");
    // However much else is read, the pinned line stays.
    for i in 0..64 {
        v.get(i).unwrap();
    }
    let before = store.read.load(Relaxed);
    v.get(0).unwrap();
    assert_eq!(
        store.read.load(Relaxed),
        before,
        "the pinned line was evicted"
    );
}

#[test]
fn a_vector_alone_in_a_section_that_holds_it_is_one_plain_slice() {
    let store = Flaky::new();
    let far = Far::new(store.clone());
    let sec = section(Structure::Direct, 64, 20);
    let values: Vec<u64> = (0..150).map(|i| i * 3).collect(); // 19 lines, the last short
    let v = FarVec::from_slice(&far, &sec, &values).unwrap();
    assert!(v.local().is_none(), "nothing is resident yet");
    v.load_all().unwrap();
    assert_eq!(&v.local().unwrap()[..], &values[..]);
    {
        let mut l = v.local_mut().unwrap();
        l[149] = 7;
        assert!(v.line(0).is_err(), "the slice borrows every line");
        // A second vector's miss cannot take a line from under the slice.
        let w: FarVec<u64> = FarVec::new(&far, &sec, 1000).unwrap();
        let refused = (0..1000)
            .step_by(8)
            .filter(|&i| match w.get(i) {
                Ok(_) => false,
                Err(FarError::AllBorrowed { .. }) => true,
                Err(e) => panic!("{e}"),
            })
            .count();
        // 125 lines, and only one slot (the 20th) is not the slice's.
        assert!(refused >= 100, "{refused}");
    }
    // Written back like any line, once evicted.
    v.flush().unwrap();
    let w: FarVec<u64> = FarVec::new(&far, &sec, 20 * 8).unwrap();
    for i in 0..w.len() {
        w.set(i, 1).unwrap();
    }
    assert!(v.local().is_none(), "evicted");
    assert_eq!(v.get(149).unwrap(), 7);
    assert_eq!(v.get(148).unwrap(), 148 * 3);
}

#[test]
fn a_section_too_small_never_gives_a_slice() {
    let far = Far::new(Flaky::new());
    let sec = section(Structure::Direct, 64, 4);
    let v = FarVec::from_slice(&far, &sec, &[1u64; 100]).unwrap();
    v.load_all().unwrap();
    assert!(v.local().is_none());
    assert_eq!(v.iter().map(|x| x.unwrap()).sum::<u64>(), 100);
}

#[test]
fn line_iter_yields_every_line_in_order() {
    let far = Far::new(Flaky::new());
    let sec = section(Structure::SetAssociative(2), 128, 8);
    let values: Vec<u32> = (0..1000).collect();
    let v = FarVec::from_slice(&far, &sec, &values).unwrap();
    let mut seen = Vec::new();
    for l in v.line_iter() {
        let l = l.unwrap();
        assert_eq!(l.first, seen.len());
        seen.extend_from_slice(&l);
    }
    assert_eq!(seen, values);
}

#[test]
fn update_lands_wherever_its_closure_moved_the_line() {
    let far = Far::new(Flaky::new());
    // One slot: any other line's access inside the closure evicts the element's line.
    let sec = section(Structure::Full, 64, 1);
    let v: FarVec<u64> = FarVec::new(&far, &sec, 64).unwrap();
    v.set(0, 1).unwrap();
    v.set(40, 5).unwrap();
    v.update(0, |x| {
        *x += v.get(40).unwrap();
    })
    .unwrap();
    assert_eq!(v.get(0).unwrap(), 6);
    assert_eq!(v.get(40).unwrap(), 5);
    // A guard the closure leaves alive on the line makes it an error, not a silent write.
    let kept = std::cell::RefCell::new(None);
    let r = v.update(1, |x| {
        *x = 9;
        *kept.borrow_mut() = Some(v.line(1).unwrap());
    });
    assert!(matches!(r, Err(FarError::Borrowed { .. })), "{r:?}");
    drop(kept);
    assert_eq!(v.get(1).unwrap(), 0);
}

#[test]
fn bad_configurations_are_refused_with_reasons() {
    let e = Section::new(SectionConfig::new(Structure::Direct, 60, 600)).unwrap_err();
    assert!(e.to_string().contains("multiple of 8"), "{e}");
    let e = Section::new(SectionConfig::new(Structure::SetAssociative(8), 64, 256)).unwrap_err();
    assert!(e.to_string().contains("fewer than one set"), "{e}");
    let far = Far::new(Flaky::new());
    let sec = section(Structure::Direct, 64, 4);
    let e = FarVec::<[u8; 24]>::new(&far, &sec, 10).unwrap_err();
    assert!(e.to_string().contains("whole elements"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Any sequence of reads, writes, overwrites, range copies, hints and flushes reads like
    /// a Vec.
    #[test]
    fn behaves_like_a_vec(
        st in 0..3usize,
        lines in 1..6usize,
        ops in prop::collection::vec((0..7u8, 0..300usize, any::<u32>()), 1..400),
    ) {
        let far = Far::new(Flaky::new());
        let sec = section(STRUCTURES[st], 32, lines.max(if st == 1 { 4 } else { 1 }));
        let v: FarVec<u32> = FarVec::new(&far, &sec, 300).unwrap();
        let mut model = vec![0u32; 300];
        for (op, i, x) in ops {
            match op {
                0 => prop_assert_eq!(v.get(i).unwrap(), model[i]),
                1 => { v.set(i, x).unwrap(); model[i] = x; }
                2 => {
                    let mut l = v.overwrite_line(i).unwrap();
                    let first = l.first;
                    for (j, e) in l.iter_mut().enumerate() {
                        *e = x.wrapping_add(j as u32);
                        model[first + j] = *e;
                    }
                }
                3 => v.evictable(i),
                4 => v.flush().unwrap(),
                5 => {
                    let n = (x as usize % 40).min(300 - i);
                    let src: Vec<u32> = (0..n as u32).map(|j| x ^ j).collect();
                    v.write_from(i, &src).unwrap();
                    model[i..i + n].copy_from_slice(&src);
                }
                _ => {
                    let n = (x as usize % 40).min(300 - i);
                    let mut out = vec![0; n];
                    v.read_into(i, &mut out).unwrap();
                    prop_assert_eq!(&out[..], &model[i..i + n]);
                }
            }
        }
        prop_assert!(v.read_into(290, &mut [0; 11]).is_err());
        prop_assert!(v.write_from(usize::MAX, &[1]).is_err());
        prop_assert_eq!(v.to_vec().unwrap(), model);
    }
}

/// A fully associative section wider than the sets searched whole: its counts of empty slots
/// and eviction hints must lead `victim` to the same choices a full search would.
#[test]
fn a_wide_full_section_takes_empty_slots_then_hints_then_clock() {
    let far = Far::new(Flaky::new());
    let sec = section(Structure::Full, 64, 64);
    let values: Vec<u64> = (0..8 * 200).collect();
    let v = FarVec::from_slice(&far, &sec, &values).unwrap();
    // One line per miss, whatever the stride.
    v.set_prefetch(0);
    let resident = |v: &FarVec<u64>| (0..v.lines()).filter(|&l| v.is_resident(l)).count();
    for l in 0..64 {
        assert_eq!(v.get(l * 8).unwrap(), (l * 8) as u64);
    }
    assert_eq!(resident(&v), 64);
    // The hinted line goes first, however referenced the others are.
    v.evictable(10 * 8);
    assert_eq!(v.get(64 * 8).unwrap(), 64 * 8);
    assert!(!v.is_resident(10) && v.is_resident(11) && v.is_resident(64));
    // A second vector's slots come back empty when it is dropped, and are taken before any
    // of the first vector's lines.
    let w = FarVec::from_slice(&far, &sec, &values[..8 * 8]).unwrap();
    for l in 0..8 {
        assert_eq!(w.get(l * 8).unwrap(), (l * 8) as u64);
    }
    assert_eq!(resident(&v), 56);
    drop(w);
    for l in 100..108 {
        assert_eq!(v.get(l * 8).unwrap(), (l * 8) as u64);
    }
    assert_eq!(resident(&v), 64);
    // Then CLOCK, for as long as it likes.
    for l in (0..200).rev() {
        assert_eq!(v.get(l * 8).unwrap(), (l * 8) as u64);
    }
    assert_eq!(resident(&v), 64);
}

mod profiling {
    use super::*;
    use crate::profile::Profile;
    use crate::tune::{tune, Config};

    /// Runs `f` on a profiled far vector of `len` u64s in a section of `lines` 64 B lines and
    /// returns the profile.
    fn profiled(len: usize, lines: usize, f: impl FnOnce(&FarVec<u64>)) -> Profile {
        let far = Far::new(Flaky::new());
        far.enable_profiling();
        let sec = section(Structure::SetAssociative(8), 64, lines);
        let v: FarVec<u64> = FarVec::named(&far, &sec, len, "site").unwrap();
        f(&v);
        drop(v);
        far.profile()
    }

    /// SplitMix64, for random indices.
    fn mix(i: u64) -> u64 {
        let mut z = i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[test]
    fn a_scan_is_a_stream_and_reuses_nothing_across_lines() {
        let p = profiled(1 << 16, 64, |v| {
            for x in v.iter() {
                x.unwrap();
            }
        });
        let s = &p.sites[0];
        assert_eq!((s.site.as_str(), s.reads, s.writes), ("site", 1 << 16, 0));
        assert!(s.strides.sequential() > 0.99, "{:?}", s.strides);
        assert!(s.misses >= (1 << 16) / 8, "{s:?}");
        // Every line is touched once in a row: cold once, then only reuses at distance 0.
        for c in &s.curves {
            assert_eq!(c.distances[1..].iter().sum::<u64>(), 0, "{c:?}");
            assert!(
                (c.miss_ratio(1) - 8.0 / c.line_bytes as f64).abs() < 0.01,
                "{c:?}"
            );
        }
    }

    #[test]
    fn random_access_gives_a_miss_ratio_curve_of_the_working_set() {
        // 4096 lines of 64 B, read at random many times over.
        let n = 4096 * 8;
        let p = profiled(n, 64, |v| {
            for i in 0..200_000u64 {
                v.get((mix(i) % n as u64) as usize).unwrap();
            }
        });
        let s = &p.sites[0];
        assert!(s.strides.sequential() < 0.1, "{:?}", s.strides);
        let c = s.curves.iter().find(|c| c.line_bytes == 64).unwrap();
        // LRU over uniform random access: about 1 - C/N missed with C of N lines.
        for (lines, want) in [(1024, 0.75), (2048, 0.5), (3072, 0.25)] {
            let got = c.miss_ratio(lines);
            assert!(
                (got - want).abs() < 0.12,
                "{lines} lines: {got} (want {want})"
            );
        }
        assert!(c.miss_ratio(8192) < 0.05);
        // Through JSON and back.
        assert_eq!(Profile::from_json(&p.to_json()).unwrap(), p);
    }

    #[test]
    fn tune_gives_a_stream_a_window_and_the_rest_to_random_access() {
        let stream = profiled(1 << 18, 64, |v| {
            for x in v.iter() {
                x.unwrap();
            }
        });
        let random = profiled(1 << 18, 64, |v| {
            for i in 0..300_000u64 {
                v.update((mix(i) % (1 << 18)) as usize, |x| *x += 1)
                    .unwrap();
            }
        });
        let mut p = Profile::default();
        let mut s = stream.sites[0].clone();
        s.site = "edges".into();
        p.sites.push(s);
        let mut r = random.sites[0].clone();
        r.site = "nodes".into();
        p.sites.push(r);
        // A quarter of the 2 MiB of data.
        let t = tune(&p, 1 << 19);
        let e = &t.config.site["edges"];
        assert_eq!((e.structure.as_str(), e.line_bytes), ("direct", 4096));
        assert!(e.prefetch > 0);
        let n = &t.config.site["nodes"];
        assert_eq!(
            (n.structure.as_str(), n.line_bytes),
            ("set-associative", 64)
        );
        let total: usize = t.config.site.values().map(|s| s.capacity).sum();
        assert!(total <= 1 << 19, "{total}");
        // Nodes get the rest, less their line table (4 bytes a line: 128 KiB of 64 B lines).
        let tables = (2 << 20) / 4096 * 4 + (2 << 20) / 64 * 4;
        assert!(total + tables > (1 << 19) - 8 * 64, "{t:?}");
        assert!(n.capacity > e.capacity, "{t:?}");
        // With room for everything, the random site gets all of its vector.
        let t = tune(&p, 8 << 20);
        let n = &t.config.site["nodes"];
        assert_eq!(n.structure, "direct");
        assert!(n.capacity >= 2 << 20, "{t:?}");
        // The configuration makes its sections, through TOML and back.
        let c = Config::from_toml(&t.config.to_toml()).unwrap();
        assert_eq!(c, t.config);
        for s in c.site.values() {
            s.section().unwrap();
        }
        let err = Config::from_toml(
            "[site.x]\nstructure = \"ring\"\nline_bytes = 64\ncapacity = 4096\nprefetch = 0\n",
        )
        .unwrap()
        .site["x"]
            .section()
            .unwrap_err()
            .to_string();
        assert!(err.contains("ring"), "{err}");
    }
}

#[test]
fn fill_with_writes_whole_lines_without_fetching() {
    let store = Flaky::new();
    let far = Far::new(store.clone());
    let sec = section(Structure::Direct, 64, 4);
    let v: FarVec<u32> = FarVec::new(&far, &sec, 1000).unwrap();
    v.fill_with(|i| i as u32 * 3).unwrap();
    assert_eq!(store.read.load(Relaxed), 0, "nothing was fetched to fill");
    assert_eq!(
        v.to_vec().unwrap(),
        (0..1000).map(|i| i * 3).collect::<Vec<u32>>()
    );
}

mod map_and_box {
    use super::*;
    use crate::{FarBox, FarMap};
    use std::collections::HashMap;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// A far map in a small section (so lines are evicted and fetched again), growing from
        /// a small capacity, against a HashMap, in every structure.
        #[test]
        fn a_far_map_matches_a_hash_map(
            ops in proptest::collection::vec((0u8..3, 0u32..300, any::<u64>()), 1..600),
            st in 0usize..3,
        ) {
            let far = Far::new(Flaky::new());
            let sec = section(STRUCTURES[st], 128, 8);
            let mut m: FarMap<u32, u64> = FarMap::with_capacity(&far, &sec, 4).unwrap();
            let mut model = HashMap::new();
            for (op, k, v) in ops {
                match op {
                    0 => prop_assert_eq!(m.insert(k, v).unwrap(), model.insert(k, v)),
                    1 => prop_assert_eq!(m.remove(&k).unwrap(), model.remove(&k)),
                    _ => prop_assert_eq!(m.get(&k).unwrap(), model.get(&k).copied()),
                }
                prop_assert_eq!(m.len(), model.len());
            }
            let mut got = m.entries().unwrap();
            got.sort_unstable();
            let mut want: Vec<(u32, u64)> = model.into_iter().collect();
            want.sort_unstable();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn a_map_that_cannot_grow_keeps_its_entries() {
        let store = Flaky::new();
        let far = Far::new(store.clone());
        let sec = section(Structure::Full, 128, 4);
        let mut m: FarMap<u64, u64> = FarMap::with_capacity(&far, &sec, 8).unwrap();
        let mut k = 0;
        // Fill until the next insert must grow, with everything written back.
        while (m.len() + 2) * 4 <= 11 * 3 {
            m.insert(k, k * 10).unwrap();
            k += 1;
        }
        m.flush().unwrap();
        store.fail.store(true, Relaxed);
        for i in 0..40 {
            if m.insert(1000 + i, 0).is_err() {
                break;
            }
        }
        store.fail.store(false, Relaxed);
        for i in 0..k {
            assert_eq!(m.get(&i).unwrap(), Some(i * 10), "key {i}");
        }
    }

    #[derive(
        Clone,
        Copy,
        Debug,
        PartialEq,
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::Immutable,
        zerocopy::KnownLayout,
    )]
    #[repr(C)]
    struct Big {
        head: u64,
        body: [u64; 100],
        tail: u64,
    }

    #[test]
    fn a_far_box_spans_lines_and_reads_only_the_part_asked_for() {
        let store = Flaky::new();
        let far = Far::new(store.clone());
        let sec = section(Structure::Full, 64, 16);
        let mut v = Big {
            head: 1,
            body: [7; 100],
            tail: 99,
        };
        let b = FarBox::new(&far, &sec, v).unwrap();
        // Evict it all by reading something else.
        let other = FarVec::from_slice(&far, &sec, &[0u64; 16 * 8]).unwrap();
        other.to_vec().unwrap();
        let before = store.read.load(Relaxed);
        assert_eq!(b.field::<u64>(808).unwrap(), 99);
        assert_eq!(
            store.read.load(Relaxed) - before,
            1,
            "one line for the tail"
        );
        assert_eq!(b.get().unwrap(), v);
        v.body[50] = 3;
        b.set(v).unwrap();
        b.update(|x| x.head += 1).unwrap();
        other.to_vec().unwrap();
        v.head = 2;
        assert_eq!(b.get().unwrap(), v);
        assert_eq!(b.read(8 + 400..8 + 408).unwrap(), 3u64.to_le_bytes());
        assert!(b.read(800..900).is_err());
    }
}

#[test]
fn the_prefetch_distance_follows_the_measured_round_trip() {
    use crate::section::FetchModel;
    let mut m = FetchModel::default();
    assert_eq!(m.fit(), None);
    // 10 us per round trip and 100 ns per line, at two batch sizes.
    for (lines, ns) in [(4.0, 10_400.0), (8.0, 10_800.0), (4.0, 10_400.0)] {
        m.add(lines, ns);
    }
    let (fixed, per_line) = m.fit().unwrap();
    assert!((fixed - 10_000.0).abs() < 1.0 && (per_line - 100.0).abs() < 0.01);
    // Through a section: 10 us / (10% of 100 ns) = 1000 lines, within a quarter of 8192.
    let sec = section(Structure::Full, 64, 8192);
    assert_eq!(
        sec.distance(),
        64,
        "no round trips yet: a quarter of the section, at most 64"
    );
    sec.observe_fetch(64, 16_400);
    assert_eq!(sec.distance(), 32, "one batch size so far: try another");
    sec.observe_fetch(32, 13_200);
    assert_eq!(sec.distance(), 1000);
    // A store with no fixed cost per round trip keeps the starting distance (a quarter of
    // these 64 lines).
    let sec = section(Structure::Full, 64, 64);
    sec.observe_fetch(2, 200);
    sec.observe_fetch(4, 400);
    assert_eq!(sec.distance(), 16);
}

#[test]
fn misses_at_a_constant_stride_fetch_along_it() {
    let store = Flaky::new();
    let far = Far::new(store.clone());
    let sec = section(Structure::Full, 64, 256);
    let values: Vec<u64> = (0..30_000).collect();
    let v = FarVec::from_slice(&far, &sec, &values).unwrap();
    v.set_prefetch(15);
    // Every third line (24 elements apart): 1000 lines touched.
    for i in (0..24_000).step_by(24) {
        assert_eq!(v.get(i).unwrap(), i as u64);
    }
    let s = sec.stats();
    assert!(s.misses >= 1000, "{s:?}");
    // Two misses find the stride; then each round trip brings 16 lines of it.
    assert!(s.fetches <= 2 + 1000 / 16 + 1, "{s:?}");
    // Random access does not prefetch.
    let before = sec.stats();
    for k in 0..200u64 {
        v.get(((k * 7919 + 13) % 30_000) as usize).unwrap();
    }
    let after = sec.stats();
    assert!(after.misses - before.misses <= 200 + 16, "{after:?}");
}

mod threads {
    use super::*;
    use crate::SharedFarVec;

    #[test]
    fn readers_in_threads_read_through_sections_of_their_own() {
        let far = Far::new(Flaky::new());
        let sec = section(Structure::Direct, 256, 8);
        let v: FarVec<u64> = FarVec::new(&far, &sec, 20_000).unwrap();
        // Written through the cache: the dirty lines reach the store with share().
        for i in 0..20_000 {
            v.set(i, i as u64 * 3).unwrap();
        }
        let share = v.share().unwrap();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|t| {
                    let share = share.clone();
                    s.spawn(move || {
                        let mine = section(Structure::SetAssociative(2), 256, 16);
                        let r = share.open(&mine).unwrap();
                        let mut sum = 0;
                        for i in (t..20_000).step_by(2) {
                            sum += r.get(i).unwrap();
                        }
                        sum
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(
            sums.iter().sum::<u64>(),
            (0..20_000u64).map(|i| i * 3).sum::<u64>()
        );
        // Once the owner is gone, a reader's misses say so instead of reading zeros.
        let wrong = section(Structure::Direct, 128, 4);
        let err = share.open(&wrong).unwrap_err().to_string();
        assert!(err.contains("256 bytes"), "{err}");
        let mine = section(Structure::Direct, 256, 4);
        let r = share.open(&mine).unwrap();
        assert_eq!(r.get(5).unwrap(), 15);
        drop(v);
        assert!(matches!(r.get(19_999), Err(FarError::Gone)));
    }

    #[test]
    fn threads_write_one_shared_vector() {
        let far = Far::new(Flaky::new());
        let v: SharedFarVec<u64> = SharedFarVec::new(
            &far,
            SectionConfig::new(Structure::SetAssociative(2), 128, 8 * 128),
            1000,
        )
        .unwrap();
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let v = v.clone();
                s.spawn(move || {
                    for k in 0..5000u64 {
                        // Both threads hit every element: updates must not be lost.
                        v.update(((k * 7 + t) % 1000) as usize, |x| *x += 1)
                            .unwrap();
                    }
                });
            }
        });
        let all = v.read(0..1000).unwrap();
        assert_eq!(all.iter().sum::<u64>(), 10_000);
        v.set(3, 42).unwrap();
        assert_eq!(v.get(3).unwrap(), 42);
    }
}

mod pointers {
    use super::*;
    use crate::{FarHeap, FarPtr};

    /// A linked-list node whose link is a far pointer, stored in far memory itself.
    #[derive(
        Clone,
        Copy,
        Debug,
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::Immutable,
        zerocopy::KnownLayout,
    )]
    #[repr(C)]
    struct Node {
        value: u64,
        next: FarPtr<Node>,
    }

    #[test]
    fn a_linked_list_lives_in_far_memory() {
        let far = Far::new(Flaky::new());
        // Room for 32 of 100,000 nodes: almost every hop misses.
        let sec = section(Structure::Full, 64, 8);
        let mut heap: FarHeap<Node> = FarHeap::new(&far, &sec);
        let mut head = FarPtr::NULL;
        for v in 0..100_000u64 {
            head = heap
                .alloc(Node {
                    value: v,
                    next: head,
                })
                .unwrap();
        }
        let (mut p, mut sum, mut n) = (head, 0u64, 0);
        while !p.is_null() {
            let node = heap.get(p).unwrap();
            sum += node.value;
            n += 1;
            p = node.next;
        }
        assert_eq!((n, sum), (100_000, (0..100_000u64).sum::<u64>()));
        // Freed slots are reused; a double free and a null are errors, not corruption.
        let second = heap.get(head).unwrap().next;
        heap.free(head).unwrap();
        assert!(heap.free(head).is_err());
        let again = heap
            .alloc(Node {
                value: 7,
                next: second,
            })
            .unwrap();
        assert_eq!(again, head);
        assert_eq!(heap.len(), 100_000);
        assert!(heap.get(FarPtr::NULL).is_err());
        heap.update(again, |n| n.value += 1).unwrap();
        assert_eq!(heap.get(again).unwrap().value, 8);
        heap.request(&[again, second]).unwrap();
    }
}

mod ahead {
    use super::*;

    /// A stream fetches its next lines on another thread while it uses these. A line on its
    /// way that is meanwhile fetched, written and written back (evicted by a line mapping to
    /// the same slot) must be read as written, not as the copy fetched ahead.
    #[test]
    fn a_line_written_back_while_on_its_way_is_read_as_written() {
        let far = Far::new(Flaky::new());
        // Direct-mapped, 8 slots: line L of the vector lives in slot L % 8.
        let sec = section(Structure::Direct, 64, 8);
        let lines = 400;
        let v: FarVec<u64> = FarVec::from_slice(&far, &sec, &vec![1u64; lines * 8]).unwrap();
        v.set_prefetch(1);
        let set = |line: usize| {
            if line < lines {
                for k in 0..8 {
                    v.update(line * 8 + k, |x| *x = 2).unwrap();
                }
            }
        };
        for (l, line) in v.line_iter().enumerate() {
            let line = line.unwrap();
            let want = 1 + (l % 4 == 3) as u64;
            assert!(line.iter().all(|&x| x == want), "line {l}: {:?}", &line[..]);
            drop(line);
            if l % 4 == 0 {
                // Line l + 3 is likely on its way; writing it, then line l + 11 (same slot),
                // writes it back behind the stream's back.
                set(l + 3);
                set(l + 11);
            }
        }
        assert!(sec.stats().prefetched > 0);
    }

    #[test]
    fn a_store_failing_under_a_stream_is_an_error_and_loses_nothing() {
        let store = Flaky::new();
        let far = Far::new(store.clone());
        let sec = section(Structure::Full, 64, 16);
        let v: FarVec<u64> =
            FarVec::from_slice(&far, &sec, &(0..8000).collect::<Vec<u64>>()).unwrap();
        v.set_prefetch(4);
        let mut it = v.iter();
        for i in 0..100 {
            assert_eq!(it.next().unwrap().unwrap(), i);
        }
        store.fail.store(true, Relaxed);
        let err = it.find_map(|x| x.err());
        assert!(err.is_some(), "a failing store must show as an error");
        store.fail.store(false, Relaxed);
        assert_eq!(v.to_vec().unwrap(), (0..8000).collect::<Vec<u64>>());
    }
}
