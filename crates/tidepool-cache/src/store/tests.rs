//! The items' tests: memcached's storage semantics, expiry, lost values and the far tier.

use super::*;
use tidepool_soft::ArenaConfig;

fn items() -> Items {
    Items::new(&SoftArena::new(ArenaConfig::default()).unwrap(), None)
}

fn get(items: &Items, key: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    items.get(key, true, None, &mut out, |_, _| {})?;
    Some(out)
}

#[test]
fn storage_modes_follow_memcached() {
    let it = items();
    assert_eq!(
        it.store(StoreMode::Replace, b"k", 0, 0, b"x", None)
            .unwrap(),
        Stored::NotStored
    );
    let Stored::Stored(c) = it.store(StoreMode::Add, b"k", 5, 0, b"mid", None).unwrap() else {
        panic!()
    };
    assert_eq!(
        it.store(StoreMode::Add, b"k", 0, 0, b"x", None).unwrap(),
        Stored::NotStored
    );
    it.store(StoreMode::Append, b"k", 0, 0, b">", None).unwrap();
    it.store(StoreMode::Prepend, b"k", 0, 0, b"<", None)
        .unwrap();
    assert_eq!(get(&it, b"k").unwrap(), b"<mid>");
    assert_eq!(
        it.store(StoreMode::Set, b"k", 0, 0, b"y", Some(c)).unwrap(),
        Stored::Exists
    );
    assert_eq!(
        it.store(StoreMode::Set, b"zz", 0, 0, b"y", Some(c))
            .unwrap(),
        Stored::NotFound
    );
    let mut out = Vec::new();
    let v = it.get(b"k", true, None, &mut out, |_, _| {}).unwrap();
    assert_eq!(v.flags, 5, "append keeps the flags");
    assert!(matches!(
        it.store(StoreMode::Set, b"k", 0, 0, b"y", Some(v.cas))
            .unwrap(),
        Stored::Stored(_)
    ));
    assert_eq!(it.delete(b"k", None), Deleted::Deleted);
    assert_eq!(it.delete(b"k", None), Deleted::NotFound);
}

#[test]
fn incr_and_decr_pad_and_floor_as_memcached_does() {
    let it = items();
    it.store(StoreMode::Set, b"n", 0, 0, b"100", None).unwrap();
    assert_eq!(it.arith(b"n", &Arith::by(false, 1)).unwrap().0, 99);
    assert_eq!(get(&it, b"n").unwrap(), b"99 ");
    assert_eq!(it.arith(b"n", &Arith::by(false, 1000)).unwrap().0, 0);
    it.store(StoreMode::Set, b"n", 0, 0, b"18446744073709551615", None)
        .unwrap();
    assert_eq!(it.arith(b"n", &Arith::by(true, 1)).unwrap().0, 0);
    it.store(StoreMode::Set, b"s", 0, 0, b"abc", None).unwrap();
    assert_eq!(
        it.arith(b"s", &Arith::by(true, 1)).unwrap_err(),
        ArithError::NonNumeric
    );
    assert_eq!(
        it.arith(b"none", &Arith::by(true, 1)).unwrap_err(),
        ArithError::NotFound
    );
    assert_eq!(
        it.arith(
            b"made",
            &Arith {
                create: Some((7, 0)),
                ..Arith::by(true, 1)
            }
        )
        .unwrap()
        .0,
        7
    );
}

#[test]
fn expired_and_flushed_items_read_as_missing() {
    let it = items();
    it.store(StoreMode::Set, b"a", 0, -1, b"x", None).unwrap();
    assert_eq!(get(&it, b"a"), None);
    it.store(StoreMode::Set, b"b", 0, 0, b"x", None).unwrap();
    assert!(it.touch(b"b", -1));
    assert_eq!(get(&it, b"b"), None);
    it.store(StoreMode::Set, b"c", 0, 0, b"x", None).unwrap();
    it.flush(0);
    assert_eq!(get(&it, b"c"), None);
    assert_eq!(it.keys(), 0);
}

#[test]
fn a_lost_value_is_a_miss_and_a_set_after_it_counts_a_rebuild() {
    let it = items();
    it.store(StoreMode::Set, b"k", 0, 0, b"value", None)
        .unwrap();
    {
        let shard = it.shard(b"k").read();
        it.blobs.evict(&shard.get(&b"k"[..]).unwrap().blob);
    }
    assert_eq!(get(&it, b"k"), None);
    assert_eq!(it.counters.lost.load(Relaxed), 1);
    it.store(StoreMode::Set, b"k", 0, 0, b"value", None)
        .unwrap();
    assert_eq!(it.soft().reconstructions, 1);
    assert_eq!(get(&it, b"k").unwrap(), b"value");
}

#[test]
fn a_value_soft_memory_let_go_comes_back_from_the_far_tier() {
    let far = tidepool_store::open("local:").unwrap();
    let spill = Spill::start(far.clone()).unwrap();
    let arena = SoftArena::new(ArenaConfig::default()).unwrap();
    let it = Items::new(&arena, Some(spill.clone()));
    it.store(StoreMode::Set, b"k", 3, 0, b"far value", None)
        .unwrap();
    it.store(StoreMode::Set, b"gone", 0, 0, b"x", None).unwrap();
    while spill.counters.writes.load(Relaxed) < 2 {
        std::thread::yield_now();
    }
    let drop_soft = |key: &[u8]| {
        let shard = it.shard(key).read();
        it.blobs.evict(&shard.get(key).unwrap().blob);
    };
    drop_soft(b"k");
    let mut out = Vec::new();
    let v = it
        .get(b"k", true, None, &mut out, |v, out| {
            out.extend_from_slice(format!("{} ", v.flags).as_bytes())
        })
        .expect("a far hit");
    assert_eq!(out, b"3 far value");
    assert_eq!(v.len, 9);
    assert_eq!(it.counters.far_hits.load(Relaxed), 1);
    // Back in soft memory: the next read is a soft hit.
    assert_eq!(get(&it, b"k").unwrap(), b"far value");
    assert_eq!(it.counters.far_hits.load(Relaxed), 1);
    // Gone from both: a miss, and the key leaves the index.
    far.remove_many(&[spill_key(&spill, &it, b"gone")]).unwrap();
    drop_soft(b"gone");
    assert_eq!(get(&it, b"gone"), None);
    assert_eq!(it.keys(), 1);
}

fn spill_key(spill: &Spill, it: &Items, key: &[u8]) -> u64 {
    let cas = it.shard(key).read().get(key).unwrap().cas;
    spill.key(cas)
}
