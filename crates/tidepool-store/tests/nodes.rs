//! Several memory nodes as one store, against real nodes on loopback.

use tidepool_node::{NodeConfig, Server};
use tidepool_store::{conformance, open, NodeClient};

fn nodes(n: usize) -> (Vec<Server>, String) {
    let servers: Vec<Server> = (0..n)
        .map(|_| Server::start(NodeConfig::new("127.0.0.1:0", 256 << 20)).expect("node starts"))
        .collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
    (servers, addrs.join(","))
}

#[test]
fn three_nodes_with_two_replicas_pass_conformance() {
    let (servers, addrs) = nodes(3);
    let store = open(&format!("node://conformance@{addrs}?replicas=2")).unwrap();
    conformance::run_all(&store);
    for s in servers {
        s.shutdown();
    }
}

#[test]
fn losing_a_node_loses_nothing_and_losing_every_copy_is_an_error_naming_the_nodes() {
    let (mut servers, addrs) = nodes(3);
    let store = open(&format!("node://t:s3cret@{addrs}?replicas=2")).unwrap();
    let value = |k: u64, v: u32| conformance::pattern(k, v, 4096);
    let keys: Vec<u64> = (0..3000).collect();
    let items: Vec<(u64, Vec<u8>)> = keys.iter().map(|&k| (k, value(k, 1))).collect();
    let refs: Vec<(u64, &[u8])> = items.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    store.write_many(&refs).unwrap();
    // Every node holds about two thirds of the keys.
    for s in &servers {
        let c = NodeClient::connect(&s.local_addr().to_string(), "t", "s3cret").unwrap();
        let stats = c.stats().unwrap();
        let objects = stats
            .iter()
            .find(|(k, _)| k == "tenant.objects")
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no objects count in {stats:?}"));
        assert!((1500..2500).contains(&objects), "{objects} of 3000 keys");
    }
    let lost = servers.remove(1);
    let lost_addr = lost.local_addr().to_string();
    lost.shutdown();
    let read = store.read_many(&keys).unwrap();
    for (k, v) in keys.iter().zip(&read) {
        assert_eq!(v.as_deref(), Some(value(*k, 1).as_slice()), "key {k}");
    }
    // Writes go on, two copies each, on the two nodes left.
    let items: Vec<(u64, Vec<u8>)> = keys.iter().map(|&k| (k, value(k, 2))).collect();
    let refs: Vec<(u64, &[u8])> = items.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    store.write_many(&refs).unwrap();
    let second = servers.remove(0);
    second.shutdown();
    let read = store.read_many(&keys).unwrap();
    for (k, v) in keys.iter().zip(&read) {
        assert_eq!(v.as_deref(), Some(value(*k, 2).as_slice()), "key {k}");
    }
    // One node left: a write cannot be kept twice.
    let e = store.write(7, &value(7, 3)).unwrap_err().to_string();
    assert!(e.contains("fewer than 2") && e.contains(&lost_addr), "{e}");
    assert!(!e.contains("s3cret"), "{e}");
    servers.remove(0).shutdown();
    let e = store.read(7).unwrap_err().to_string();
    assert!(e.contains("down"), "{e}");
}
