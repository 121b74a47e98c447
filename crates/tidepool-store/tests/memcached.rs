//! The memcached backend against a real `memcached` on loopback (`-I 2m`).

use tidepool_peers::Memcached;
use tidepool_store::{conformance, open, StoreError};

fn start() -> Memcached {
    Memcached::start(256).expect("start memcached")
}

#[test]
fn passes_the_conformance_suite() {
    let mc = start();
    let store = open(&format!("memcached://{}", mc.addr())).expect("open the memcached store");
    assert_eq!(store.describe(), format!("memcached://{}", mc.addr()));
    conformance::run_all(&store);
    let stats = store.stats().unwrap();
    assert!(stats.far_bytes.is_some(), "bytes missing from {stats:?}");
}

#[test]
fn values_up_to_the_item_limit_fit_and_larger_ones_are_refused() {
    let mc = start();
    let store = open(&format!("memcached://{}", mc.addr())).unwrap();
    let big = conformance::pattern(1, 0, 1_500_000);
    store.write(1, &big).unwrap();
    assert_eq!(store.read(1).unwrap().as_deref(), Some(big.as_slice()));

    // Over the limit: refused before anything is sent, and the batch is not half-written.
    let huge = vec![1u8; Memcached::ITEM_SIZE_LIMIT + 1];
    let e = store
        .write_many(&[(2, b"small"), (3, &huge)])
        .expect_err("a value over -I must be refused");
    assert!(
        matches!(e, StoreError::ValueTooLarge { len, max, .. }
            if len == huge.len() && max == Memcached::ITEM_SIZE_LIMIT),
        "{e:?}"
    );
    assert_eq!(
        store.read(2).unwrap(),
        None,
        "a refused batch must write nothing"
    );

    // Exactly the limit: the item header and key push it over, so the server refuses it.
    let at_limit = vec![2u8; Memcached::ITEM_SIZE_LIMIT];
    let e = store.write(4, &at_limit).expect_err("server must refuse");
    assert!(
        matches!(e, StoreError::ValueTooLarge { len, .. } if len == at_limit.len()),
        "{e:?}"
    );
    // The connection is still in step with the server after the refusal.
    assert_eq!(store.read(1).unwrap().as_deref(), Some(big.as_slice()));
    assert_eq!(store.read(4).unwrap(), None);
}

#[test]
fn duplicate_keys_in_one_batch() {
    let mc = start();
    let store = open(&format!("memcached://{}", mc.addr())).unwrap();
    store.write_many(&[(1, b"old"), (1, b"new")]).unwrap();
    let got = store.read_many(&[1, 2, 1]).unwrap();
    assert_eq!(got[0].as_deref(), Some(&b"new"[..]));
    assert_eq!(got[1], None);
    assert_eq!(got[2].as_deref(), Some(&b"new"[..]));
    // Taking a key twice in one batch yields it once, like two takes in a row.
    let got = store.take_many(&[1, 1]).unwrap();
    assert_eq!(got[0].as_deref(), Some(&b"new"[..]));
    assert_eq!(got[1], None);
    assert_eq!(store.read(1).unwrap(), None);
}

#[test]
fn batches_larger_than_one_round_trip() {
    let mc = start();
    // The longest prefix allowed makes the longest commands, hence the most round trips.
    let prefix = "p".repeat(234);
    let store = open(&format!("memcached://{}?prefix={prefix}", mc.addr())).unwrap();
    let n = 2500u64;
    let values: Vec<Vec<u8>> = (0..n).map(|k| conformance::pattern(k, 9, 4096)).collect();
    let items: Vec<(u64, &[u8])> = values
        .iter()
        .enumerate()
        .map(|(k, v)| (k as u64, v.as_slice()))
        .collect();
    store.write_many(&items).unwrap();
    let keys: Vec<u64> = (0..n).rev().collect();
    let got = store.read_many(&keys).unwrap();
    assert_eq!(got.len(), keys.len());
    for (k, g) in keys.iter().zip(&got) {
        assert_eq!(
            g.as_deref(),
            Some(values[*k as usize].as_slice()),
            "key {k}"
        );
    }
    // Every other key taken, with a missing key and repeats mixed in.
    let take: Vec<u64> = (0..n).step_by(2).chain([n + 5, 0, 2]).collect();
    let got = store.take_many(&take).unwrap();
    for (k, g) in take.iter().zip(&got).take((n / 2) as usize) {
        assert_eq!(
            g.as_deref(),
            Some(values[*k as usize].as_slice()),
            "key {k}"
        );
    }
    assert_eq!(&got[(n / 2) as usize..], &[None, None, None]);
    let left = store.read_many(&(0..n).collect::<Vec<_>>()).unwrap();
    for (k, g) in left.iter().enumerate() {
        assert_eq!(g.is_some(), k % 2 == 1, "key {k}");
    }
    store.remove_many(&(0..n).collect::<Vec<_>>()).unwrap();
    assert!(store
        .read_many(&[1, 3, n - 1])
        .unwrap()
        .iter()
        .all(Option::is_none));
}

#[test]
fn a_stopped_server_is_an_error_naming_it_not_a_missing_value() {
    let mc = start();
    let addr = mc.addr();
    let store = open(&format!("memcached://{addr}")).unwrap();
    conformance::stopped_server_is_an_error(store.as_ref(), &[addr], || drop(mc));
    assert!(store.take_many(&[7, 8]).is_err());
    assert!(store.write(9, b"nine").is_err());
    assert!(store.stats().is_err());
}

#[test]
fn an_unreachable_address_fails_at_open() {
    let mc = start();
    let addr = mc.addr();
    drop(mc);
    let e = open(&format!("memcached://{addr}")).unwrap_err();
    assert!(matches!(e, StoreError::Connect { .. }), "{e:?}");
    assert!(e.to_string().contains(&addr), "{e}");
}
