//! The Redis backend against a real `redis-server` on loopback.

use tidepool_peers::RedisServer;
use tidepool_store::{conformance, open, StoreError};

#[test]
fn passes_the_conformance_suite() {
    let redis = RedisServer::start().expect("start redis-server");
    let store = open(&format!("redis://{}", redis.addr())).expect("open the redis store");
    assert_eq!(store.describe(), format!("redis://{}", redis.addr()));
    conformance::run_all(&store);
    let stats = store.stats().unwrap();
    assert!(
        stats.far_bytes.is_some_and(|b| b > 0),
        "used_memory missing from {stats:?}"
    );
}

#[test]
fn stores_with_different_prefixes_do_not_see_each_other() {
    let redis = RedisServer::start().expect("start redis-server");
    let a = open(&format!("redis://{}?prefix=a:", redis.addr())).unwrap();
    let b = open(&format!("redis://{}?prefix=b:", redis.addr())).unwrap();
    a.write(1, b"from a").unwrap();
    assert_eq!(b.read(1).unwrap(), None);
    b.write(1, b"from b").unwrap();
    assert_eq!(a.read(1).unwrap().as_deref(), Some(&b"from a"[..]));
    // The same prefix is the same store.
    let a2 = open(&format!("redis://{}?prefix=a:", redis.addr())).unwrap();
    assert_eq!(a2.read(1).unwrap().as_deref(), Some(&b"from a"[..]));
}

#[test]
fn a_stopped_server_is_an_error_naming_it_not_a_missing_value() {
    let redis = RedisServer::start().expect("start redis-server");
    let addr = redis.addr();
    let store = open(&format!("redis://{addr}")).unwrap();
    conformance::stopped_server_is_an_error(store.as_ref(), &[addr], || drop(redis));
    assert!(store.take_many(&[7, 8]).is_err());
    assert!(store.write(9, b"nine").is_err());
}

#[test]
fn an_unreachable_address_fails_at_open() {
    let redis = RedisServer::start().expect("start redis-server");
    let addr = redis.addr();
    drop(redis);
    let e = open(&format!("redis://{addr}")).unwrap_err();
    assert!(matches!(e, StoreError::Connect { .. }), "{e:?}");
    assert!(e.to_string().contains(&addr), "{e}");
}

#[test]
fn many_threads_share_one_store() {
    let redis = RedisServer::start().expect("start redis-server");
    let store = open(&format!("redis://{}", redis.addr())).unwrap();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for round in 0..50u64 {
                    let keys: Vec<u64> = (0..16).map(|i| (t << 32) | (round << 8) | i).collect();
                    let values: Vec<Vec<u8>> = keys
                        .iter()
                        .map(|k| conformance::pattern(*k, 0, 4096))
                        .collect();
                    let items: Vec<(u64, &[u8])> = keys
                        .iter()
                        .copied()
                        .zip(values.iter().map(Vec::as_slice))
                        .collect();
                    store.write_many(&items).unwrap();
                    let got = store.take_many(&keys).unwrap();
                    for (g, v) in got.iter().zip(&values) {
                        assert_eq!(g.as_deref(), Some(v.as_slice()));
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
