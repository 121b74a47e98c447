//! The conformance suite every backend must pass. Each backend's test starts its real server
//! on loopback, opens the store by URL, and calls [`run_all`]. The checks panic with a message
//! naming the backend and the property that failed.

use crate::{FarStore, FetchMode, Key, StoreError};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

/// A value whose bytes depend on key, version and length, so a value read back under the wrong
/// key or from an older write is caught.
pub fn pattern(key: Key, version: u32, len: usize) -> Vec<u8> {
    let mut state = key
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((version as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93))
        | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Keys far apart from other tests' keys, so suites sharing a server do not collide.
fn base(test: u64) -> Key {
    test << 32
}

pub fn run_all(store: &Arc<dyn FarStore>) {
    missing_keys_read_as_none(store.as_ref());
    round_trip_of_many_sizes(store.as_ref());
    overwrite_replaces(store.as_ref());
    batches_of_pages(store.as_ref());
    read_into_buffers(store.as_ref());
    take_reads_and_removes(store.as_ref());
    remove_is_idempotent(store.as_ref());
    evict_fetch_in_both_modes(store.as_ref());
    concurrent_writers_and_readers(store);
    store.stats().expect("stats must not fail");
}

fn who(store: &dyn FarStore) -> String {
    store.describe()
}

pub fn missing_keys_read_as_none(store: &dyn FarStore) {
    let k = base(1);
    let got = store.read_many(&[k, k + 1]).unwrap();
    assert_eq!(
        got,
        vec![None, None],
        "{}: unknown keys must read as None",
        who(store)
    );
    assert_eq!(
        store.take(k + 2).unwrap(),
        None,
        "{}: take of a missing key",
        who(store)
    );
}

pub fn round_trip_of_many_sizes(store: &dyn FarStore) {
    let k = base(2);
    let sizes = [0usize, 1, 7, 64, 100, 4095, 4096, 4097, 65_536, 300_000];
    let values: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(k + i as u64, 0, n))
        .collect();
    let items: Vec<(Key, &[u8])> = values
        .iter()
        .enumerate()
        .map(|(i, v)| (k + i as u64, v.as_slice()))
        .collect();
    store.write_many(&items).unwrap();
    let keys: Vec<Key> = items.iter().map(|(k, _)| *k).collect();
    let got = store.read_many(&keys).unwrap();
    for (i, (g, want)) in got.iter().zip(&values).enumerate() {
        let g = g
            .as_ref()
            .unwrap_or_else(|| panic!("{}: value of {} bytes vanished", who(store), sizes[i]));
        assert!(
            g.as_ref() == want.as_slice(),
            "{}: value of {} bytes came back different",
            who(store),
            sizes[i]
        );
    }
    store.remove_many(&keys).unwrap();
}

pub fn overwrite_replaces(store: &dyn FarStore) {
    let k = base(3);
    for (version, len) in [(0u32, 4096usize), (1, 100), (2, 20_000), (3, 4096)] {
        let v = pattern(k, version, len);
        store.write(k, &v).unwrap();
        let got = store.read(k).unwrap().expect("overwritten value vanished");
        assert!(
            got.as_ref() == v.as_slice(),
            "{}: overwrite to {len} bytes (version {version}) not seen",
            who(store)
        );
    }
    store.remove(k).unwrap();
}

pub fn batches_of_pages(store: &dyn FarStore) {
    let k = base(4);
    let n = 256u64;
    let pages: Vec<Vec<u8>> = (0..n).map(|i| pattern(k + i, 7, 4096)).collect();
    let items: Vec<(Key, &[u8])> = (0..n)
        .map(|i| (k + i, pages[i as usize].as_slice()))
        .collect();
    for chunk in items.chunks(64) {
        store.write_many(chunk).unwrap();
    }
    // Read back in a different order and batch size than written.
    let mut keys: Vec<Key> = (0..n).map(|i| k + i).collect();
    keys.reverse();
    for chunk in keys.chunks(37) {
        let got = store.read_many(chunk).unwrap();
        assert_eq!(
            got.len(),
            chunk.len(),
            "{}: batch answer length",
            who(store)
        );
        for (key, g) in chunk.iter().zip(got) {
            let g = g.unwrap_or_else(|| panic!("{}: page {key} vanished", who(store)));
            assert!(
                g.as_ref() == pages[(key - k) as usize].as_slice(),
                "{}: page {key} came back wrong",
                who(store)
            );
        }
    }
    store.remove_many(&keys).unwrap();
    assert!(
        store
            .read_many(&keys[..8])
            .unwrap()
            .iter()
            .all(Option::is_none),
        "{}: removed pages still readable",
        who(store)
    );
}

pub fn read_into_buffers(store: &dyn FarStore) {
    let k = base(9);
    // Overwritten several times at one size (the in-process store reuses the allocation),
    // then once at another.
    for version in 0..3 {
        store.write(k, &pattern(k, version, 4096)).unwrap();
    }
    store.write(k + 1, &pattern(k + 1, 0, 4096)).unwrap();
    store.write(k + 1, &pattern(k + 1, 1, 100)).unwrap();
    let keys = [k + 2, k, k + 1];
    let mut out = vec![0xAAu8; 3 * 4096];
    let mut lens = [Some(1); 3];
    store
        .read_many_into(&keys, 4096, &mut out, &mut lens)
        .unwrap();
    assert_eq!(
        lens,
        [None, Some(4096), Some(100)],
        "{}: read_many_into lengths",
        who(store)
    );
    assert!(
        out[4096..8192] == pattern(k, 2, 4096)[..],
        "{}: read_many_into: the last of three overwrites not seen",
        who(store)
    );
    assert!(
        out[8192..8292] == pattern(k + 1, 1, 100)[..],
        "{}: read_many_into: a value overwritten with another size came back wrong",
        who(store)
    );
    let err = store
        .read_many_into(&[k], 1000, &mut out, &mut lens)
        .expect_err("a value larger than its chunk must be an error");
    assert!(
        err.to_string().contains("4096"),
        "{}: the error names the size: {err}",
        who(store)
    );
    store.remove_many(&[k, k + 1]).unwrap();
}

pub fn take_reads_and_removes(store: &dyn FarStore) {
    let k = base(5);
    let a = pattern(k, 1, 4096);
    let b = pattern(k + 1, 1, 33);
    store.write_many(&[(k, &a), (k + 1, &b)]).unwrap();
    let got = store.take_many(&[k, k + 1, k + 2]).unwrap();
    assert_eq!(
        got[0].as_deref(),
        Some(a.as_slice()),
        "{}: take value",
        who(store)
    );
    assert_eq!(
        got[1].as_deref(),
        Some(b.as_slice()),
        "{}: take value",
        who(store)
    );
    assert_eq!(got[2], None, "{}: take of a missing key", who(store));
    assert_eq!(
        store.read_many(&[k, k + 1]).unwrap(),
        vec![None, None],
        "{}: a taken value must be gone",
        who(store)
    );
}

pub fn remove_is_idempotent(store: &dyn FarStore) {
    let k = base(6);
    store.write(k, b"x").unwrap();
    store.remove(k).unwrap();
    store.remove(k).unwrap();
    store.remove_many(&[k, k + 1]).unwrap();
    assert_eq!(
        store.read(k).unwrap(),
        None,
        "{}: removed value readable",
        who(store)
    );
}

pub fn evict_fetch_in_both_modes(store: &dyn FarStore) {
    let k = base(7);
    let old = pattern(k, 0, 4096);
    store.write(k, &old).unwrap();
    let out = pattern(k + 1, 0, 4096);
    // Keep: the fetched value stays far.
    let got = store
        .evict_fetch(&[(k + 1, &out)], &[k], FetchMode::Keep)
        .unwrap();
    assert_eq!(
        got[0].as_deref(),
        Some(old.as_slice()),
        "{}: keep-fetch",
        who(store)
    );
    assert_eq!(store.read(k).unwrap().as_deref(), Some(old.as_slice()));
    // Take: the fetched value leaves; the evicted one arrives.
    let out2 = pattern(k + 2, 0, 1000);
    let got = store
        .evict_fetch(&[(k + 2, &out2)], &[k, k + 1], FetchMode::Take)
        .unwrap();
    assert_eq!(
        got[0].as_deref(),
        Some(old.as_slice()),
        "{}: take-fetch",
        who(store)
    );
    assert_eq!(
        got[1].as_deref(),
        Some(out.as_slice()),
        "{}: evicted then fetched",
        who(store)
    );
    assert_eq!(
        store.read_many(&[k, k + 1]).unwrap(),
        vec![None, None],
        "{}: taken values must be gone",
        who(store)
    );
    assert_eq!(store.read(k + 2).unwrap().as_deref(), Some(out2.as_slice()));
    store.remove(k + 2).unwrap();
}

pub fn concurrent_writers_and_readers(store: &Arc<dyn FarStore>) {
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let store = Arc::clone(store);
            std::thread::spawn(move || {
                let k = base(100 + t);
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let mut version = vec![0u32; 64];
                for round in 0..200u32 {
                    let i = rng.gen_range(0..64u64);
                    if rng.gen_bool(0.5) {
                        version[i as usize] = round + 1;
                        let v = pattern(k + i, round + 1, 512 + (i as usize * 61) % 4096);
                        store.write(k + i, &v).unwrap();
                    } else {
                        let got = store.read(k + i).unwrap();
                        let ver = version[i as usize];
                        if ver == 0 {
                            assert_eq!(got, None);
                        } else {
                            let want = pattern(k + i, ver, 512 + (i as usize * 61) % 4096);
                            assert_eq!(got, Some(Bytes::from(want)), "thread {t} key {i}");
                        }
                    }
                }
                let keys: Vec<Key> = (0..64).map(|i| k + i).collect();
                store.remove_many(&keys).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a conformance thread failed");
    }
}

/// Writes a value, stops the backend's server(s) with `stop`, then reads it twice: each read must
/// fail with an I/O or connect error naming one of `addrs`, never read as `None`. Twice, because
/// the first read finds a pooled connection dead and the second must try a new one.
pub fn stopped_server_is_an_error(store: &dyn FarStore, addrs: &[String], stop: impl FnOnce()) {
    store.write(7, b"seven").unwrap();
    stop();
    for attempt in 0..2 {
        let e = store
            .read(7)
            .expect_err("a read from a stopped server must fail");
        let msg = e.to_string();
        assert!(
            addrs.iter().any(|a| msg.contains(a.as_str())),
            "attempt {attempt}: {msg}"
        );
        assert!(
            matches!(e, StoreError::Io { .. } | StoreError::Connect { .. }),
            "attempt {attempt}: {e:?}"
        );
    }
}
