//! The in-process backends: packed (the default, compressed with LZ4 or zstd) and plain.

use tidepool_store::{conformance, open, FarStore};

#[test]
fn every_form_passes_the_conformance_suite() {
    for (url, described) in [
        ("local:", "local:?compress=lz4"),
        ("local:?compress=lz4", "local:?compress=lz4"),
        ("local:?compress=zstd", "local:?compress=zstd"),
        ("local:?compress=none", "local:?compress=none"),
    ] {
        let store = open(url).unwrap();
        assert_eq!(store.describe(), described);
        conformance::run_all(&store);
    }
}

fn far_bytes(store: &dyn FarStore) -> u64 {
    store.stats().unwrap().far_bytes.unwrap()
}

fn extra(store: &dyn FarStore, name: &str) -> u64 {
    let stats = store.stats().unwrap();
    stats.extra.iter().find(|(n, _)| n == name).unwrap().1
}

/// Text pages as a program's heap holds them: every line different.
fn text_page(k: u64) -> Vec<u8> {
    let mut page = Vec::with_capacity(4096);
    let mut i = k * 1000;
    while page.len() < 4096 {
        page.extend_from_slice(format!("value-{i}-value-{i}-value-{i};").as_bytes());
        i += 1;
    }
    page.truncate(4096);
    page
}

#[test]
fn the_default_keeps_compressible_pages_small_and_counts_its_overhead() {
    let plain = open("local:?compress=none").unwrap();
    const PAGES: u64 = 4096;
    for codec in ["lz4", "zstd"] {
        let store = open(&format!("local:?compress={codec}")).unwrap();
        for k in 0..PAGES {
            let page = text_page(k);
            store.write(k, &page).unwrap();
            plain.write(k, &page).unwrap();
        }
        let packed = extra(&*store, "packed_bytes");
        let held = far_bytes(&*store);
        // What a page costs, everything counted (chunks, map): under a quarter of a page here.
        assert!(
            held < PAGES * 4096 / 4,
            "{codec}: {held} bytes held for {PAGES} text pages ({packed} packed)"
        );
        // The overhead beyond the slots is small: the map's entries and a partly cut chunk.
        assert!(
            held - packed < PAGES * 64 + (128 << 15),
            "{codec}: {held} held, {packed} in slots"
        );
        assert_eq!(extra(&*store, "original_bytes"), PAGES * 4096);
        for k in [0, 17, PAGES - 1] {
            assert_eq!(store.read(k).unwrap().as_deref(), Some(&text_page(k)[..]));
        }
        // Removing everything gives the slots back.
        let keys: Vec<u64> = (0..PAGES).collect();
        store.remove_many(&keys).unwrap();
        assert_eq!(extra(&*store, "packed_bytes"), 0);
        assert_eq!(store.stats().unwrap().objects, Some(0));
    }
    assert_eq!(far_bytes(&*plain), PAGES * 4096);
}

#[test]
fn same_filled_pages_cost_no_slot_and_incompressible_ones_are_kept_whole() {
    let store = open("local:").unwrap();
    let zero = vec![0u8; 4096];
    let pattern: Vec<u8> = (0..4096).map(|i| [1, 2, 3, 4, 5, 6, 7, 8][i % 8]).collect();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let noise: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    store.write(1, &zero).unwrap();
    store.write(2, &pattern).unwrap();
    store.write(3, &noise).unwrap();
    assert_eq!(extra(&*store, "same_filled"), 2);
    assert_eq!(extra(&*store, "kept_raw"), 1);
    assert_eq!(extra(&*store, "packed_bytes"), 4096);
    assert_eq!(store.read(1).unwrap().as_deref(), Some(&zero[..]));
    assert_eq!(store.read(2).unwrap().as_deref(), Some(&pattern[..]));
    assert_eq!(store.read(3).unwrap().as_deref(), Some(&noise[..]));
    // Replaced by a compressible page, then taken: the counts follow.
    store.write(3, &text_page(3)).unwrap();
    assert_eq!(extra(&*store, "kept_raw"), 0);
    assert_eq!(store.take(3).unwrap().as_deref(), Some(&text_page(3)[..]));
    assert_eq!(store.read(3).unwrap(), None);
    assert_eq!(extra(&*store, "packed_bytes"), 0);
}

#[test]
fn threads_writing_and_reading_the_packed_store_see_their_own_pages() {
    let store = open("local:?compress=zstd").unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let store = &store;
            s.spawn(move || {
                for round in 0..20u64 {
                    for k in 0..64u64 {
                        let key = t << 32 | k;
                        store.write(key, &text_page(key + round)).unwrap();
                    }
                    for k in 0..64u64 {
                        let key = t << 32 | k;
                        let mut out = vec![0u8; 4096];
                        let mut lens = [None];
                        store
                            .read_many_into(&[key], 4096, &mut out, &mut lens)
                            .unwrap();
                        assert_eq!(lens[0], Some(4096));
                        assert_eq!(out, text_page(key + round));
                    }
                }
            });
        }
    });
}
