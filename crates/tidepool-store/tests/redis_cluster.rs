//! The Redis Cluster backend against three real cluster-enabled `redis-server`s on loopback.

use tidepool_peers::RedisCluster;
use tidepool_store::{conformance, open};

#[test]
fn passes_the_conformance_suite() {
    let cluster = RedisCluster::start(3).expect("start a 3-master Redis Cluster");
    let url = format!("redis+cluster://{}", cluster.url_hosts());
    let store = open(&url).expect("open the redis cluster store");
    assert_eq!(store.describe(), url);
    conformance::run_all(&store);
}

#[test]
fn batches_spread_over_every_node() {
    let cluster = RedisCluster::start(3).expect("start a 3-master Redis Cluster");
    let store = open(&format!("redis+cluster://{}", cluster.url_hosts())).unwrap();
    // 512 keys land in many hash slots, so one batch must reach all three masters.
    let keys: Vec<u64> = (0..512).collect();
    let values: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| conformance::pattern(*k, 3, 1000))
        .collect();
    let items: Vec<(u64, &[u8])> = keys
        .iter()
        .copied()
        .zip(values.iter().map(Vec::as_slice))
        .collect();
    store.write_many(&items).unwrap();
    for addr in cluster.addrs() {
        let node = redis::Client::open(format!("redis://{addr}/")).unwrap();
        let mut conn = node.get_connection().unwrap();
        let n: u64 = redis::cmd("DBSIZE").query(&mut conn).unwrap();
        assert!(n > 0, "no keys on cluster node {addr}");
    }
    let got = store.read_many(&keys).unwrap();
    for (g, v) in got.iter().zip(&values) {
        assert_eq!(g.as_deref(), Some(v.as_slice()));
    }
    store.remove_many(&keys).unwrap();
    assert!(store.read_many(&keys).unwrap().iter().all(Option::is_none));
}

#[test]
fn a_stopped_cluster_is_an_error_naming_it_not_a_missing_value() {
    let cluster = RedisCluster::start(3).expect("start a 3-master Redis Cluster");
    let addrs = cluster.addrs();
    let store = open(&format!("redis+cluster://{}", cluster.url_hosts())).unwrap();
    conformance::stopped_server_is_an_error(store.as_ref(), &addrs, || drop(cluster));
}
