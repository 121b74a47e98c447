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
    assert!(
        e.contains("more than replicas=2 survives") && e.contains(&lost_addr),
        "{e}"
    );
    assert!(!e.contains("s3cret"), "{e}");
    servers.remove(0).shutdown();
    let e = store.read(7).unwrap_err().to_string();
    assert!(e.contains("down"), "{e}");
}

fn write_all(store: &dyn tidepool_store::FarStore, keys: &[u64], version: u32) {
    let items: Vec<(u64, Vec<u8>)> = keys
        .iter()
        .map(|&k| (k, conformance::pattern(k, version, 4096)))
        .collect();
    let refs: Vec<(u64, &[u8])> = items.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    store.write_many(&refs).unwrap();
}

fn check_all(store: &dyn tidepool_store::FarStore, keys: &[u64], version: u32) {
    let read = store.read_many(keys).unwrap();
    for (k, v) in keys.iter().zip(&read) {
        assert_eq!(
            v.as_deref(),
            Some(conformance::pattern(*k, version, 4096).as_slice()),
            "key {k} at version {version}"
        );
    }
}

fn stat(store: &dyn tidepool_store::FarStore, name: &str) -> u64 {
    let s = store.stats().unwrap();
    s.extra
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {name} in {s:?}"))
}

#[test]
fn six_nodes_erasure_coded_four_plus_two_pass_conformance() {
    let (servers, addrs) = nodes(6);
    let store = open(&format!("node://conformance@{addrs}?ec=4+2")).unwrap();
    conformance::run_all(&store);
    for s in servers {
        s.shutdown();
    }
}

/// 4+2 keeps 1.5 bytes far per byte, reads through the loss of any two nodes (decoding), and
/// refuses, naming the nodes, once a third is gone.
#[test]
fn erasure_coding_survives_two_losses_and_names_the_nodes_after_a_third() {
    let (mut servers, addrs) = nodes(6);
    let store = open(&format!("node://t@{addrs}?ec=4+2")).unwrap();
    let keys: Vec<u64> = (0..2000).collect();
    write_all(store.as_ref(), &keys, 1);
    let far = store.stats().unwrap().far_bytes.unwrap();
    let ratio = far as f64 / (keys.len() * 4096) as f64;
    assert!(
        (1.5..=1.51).contains(&ratio),
        "{far} bytes far: {ratio:.3} per byte"
    );
    check_all(store.as_ref(), &keys, 1);
    let mut lost = vec![];
    for _ in 0..2 {
        let s = servers.remove(1);
        lost.push(s.local_addr().to_string());
        s.shutdown();
        check_all(store.as_ref(), &keys, 1);
    }
    assert_eq!(stat(store.as_ref(), "nodes_down"), 2);
    assert!(stat(store.as_ref(), "bytes_not_protected") > 0);
    // Writes go on over the four left (and survive no further loss: two already happened).
    write_all(store.as_ref(), &keys[..500], 2);
    check_all(store.as_ref(), &keys[..500], 2);
    check_all(store.as_ref(), &keys[500..], 1);
    let s = servers.remove(0);
    lost.push(s.local_addr().to_string());
    s.shutdown();
    let e = store.read_many(&keys).unwrap_err().to_string();
    for a in &lost {
        assert!(e.contains(a.as_str()), "{a} not named in: {e}");
    }
    assert!(e.contains("lost"), "{e}");
    let e = store.write(1, b"x").unwrap_err().to_string();
    assert!(e.contains("more than ec=4+2 survives"), "{e}");
}

/// With a node to spare, values that lost a piece are stored again on the others, so the store
/// then survives as many further losses as before.
#[test]
fn values_that_lost_a_piece_are_protected_again_on_the_nodes_left() {
    for (n, redundancy, more_losses) in [(7, "ec=4+2", 2), (4, "replicas=2", 1)] {
        let (mut servers, addrs) = nodes(n);
        let store = open(&format!("node://t@{addrs}?{redundancy}")).unwrap();
        let keys: Vec<u64> = (0..3000).collect();
        write_all(store.as_ref(), &keys, 1);
        servers.remove(2).shutdown();
        // The loss is noticed by the next call that needs the node.
        check_all(store.as_ref(), &keys, 1);
        assert!(
            stat(store.as_ref(), "bytes_not_protected") > 0,
            "{redundancy}"
        );
        // Everything the lost node held comes back to full strength.
        let set = store.as_ref();
        let mut rounds = 0;
        while stat(set, "bytes_not_protected") > 0 {
            set.read(0).unwrap(); // each call re-protects a few
            rounds += 1;
            assert!(rounds < 1000, "{redundancy}: re-protection stalls");
        }
        assert!(stat(set, "bytes_reprotected") > 0);
        for _ in 0..more_losses {
            servers.remove(0).shutdown();
        }
        check_all(set, &keys, 1);
    }
}

/// Clients sharing a tenant must agree on its nodes and redundancy: a node refuses a client
/// whose store differs from the one its open connections of that tenant belong to (another
/// redundancy, or a node list from another store), naming both; once they close, it is free.
#[test]
fn a_tenant_in_use_by_a_store_with_other_settings_is_refused_naming_both() {
    let (servers, _) = nodes(4);
    let a: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let three = a[..3].join(",");
    let first = open(&format!("node://t@{three}?replicas=2")).unwrap();
    let same = open(&format!("node://t@{three}?replicas=2")).unwrap();
    let e = open(&format!("node://t@{three}?replicas=3"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("kept as replicas=2 over") && e.contains("this client's is replicas=3 over"),
        "{e}"
    );
    assert!(e.contains("use a tenant of their own"), "{e}");
    // Another store's node list (one node differs).
    let other = format!("{},{},{}", a[0], a[1], a[3]);
    let e = open(&format!("node://t@{other}?replicas=2"))
        .unwrap_err()
        .to_string();
    assert!(e.contains(&a[3]) && e.contains(&a[2]), "{e}");
    // Another tenant, or one node alone, is not held to it.
    open(&format!("node://u@{three}?replicas=3")).unwrap();
    open(&format!("node://t@{}", a[0])).unwrap();
    drop((first, same));
    // The node learns of the closes as it serves them: ask until it has.
    let mut tries = 0;
    while let Err(e) = open(&format!("node://t@{three}?replicas=3")) {
        tries += 1;
        assert!(tries < 200, "still refused after the others closed: {e}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for s in servers {
        s.shutdown();
    }
}

/// A write that a node refuses part way (its quota is full) leaves each value it touched an
/// error to read, never a mix of old and new pieces.
#[test]
fn a_write_refused_part_way_leaves_errors_never_mixed_values() {
    let servers: Vec<Server> = (0..6)
        .map(|_| {
            let c = NodeConfig::new("127.0.0.1:0", 256 << 20).tokens(
                tidepool_node::TokensFile::parse(
                    "[[tenant]]\nname = \"t\"\ntoken = \"k\"\nquota = \"64K\"\n",
                )
                .unwrap(),
            );
            Server::start(c).expect("node starts")
        })
        .collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let store = open(&format!("node://t:k@{}?ec=4+2", addrs.join(","))).unwrap();
    let kept: Vec<u64> = (0..20).collect();
    write_all(store.as_ref(), &kept, 1);
    let keys: Vec<u64> = (20..40).collect();
    write_all(store.as_ref(), &keys, 1);
    // 40 KiB of pieces on each node; 70 more values do not fit in 64 KiB.
    let more: Vec<u64> = (20..110).collect();
    let items: Vec<(u64, Vec<u8>)> = more
        .iter()
        .map(|&k| (k, conformance::pattern(k, 2, 4096)))
        .collect();
    let refs: Vec<(u64, &[u8])> = items.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    let e = store.write_many(&refs).unwrap_err().to_string();
    assert!(e.contains("quota"), "{e}");
    for &k in &more {
        match store.read(k) {
            Ok(Some(v)) => assert_eq!(v, conformance::pattern(k, 2, 4096), "key {k}"),
            Ok(None) => assert!(k >= 40, "key {k} vanished"),
            Err(e) => assert!(e.to_string().contains("failed part way"), "{e}"),
        }
    }
    // Values the failed write did not touch are intact on every node (no node dropped this
    // client's session on the way out of the failed call).
    check_all(store.as_ref(), &kept, 1);
    for s in servers {
        s.shutdown();
    }
}

/// A node added to a set that lost one takes the lost node's share: values get all their
/// pieces again, and the store then survives as many further losses as it was built for.
#[test]
fn a_node_added_while_in_use_restores_full_protection() {
    let (mut servers, addrs) = nodes(6);
    let store = open(&format!("node://t@{addrs}?ec=4+2")).unwrap();
    let keys: Vec<u64> = (0..2000).collect();
    write_all(store.as_ref(), &keys, 1);
    servers.remove(0).shutdown();
    check_all(store.as_ref(), &keys, 1);
    // Six pieces, five nodes: nothing can be done until a node joins.
    assert_eq!(stat(store.as_ref(), "bytes_not_protected"), 2000 * 4096);
    let extra = Server::start(NodeConfig::new("127.0.0.1:0", 256 << 20)).unwrap();
    let e =
        tidepool_store::add_node(store.as_ref(), &servers[0].local_addr().to_string()).unwrap_err();
    assert!(e.to_string().contains("already one of"), "{e}");
    tidepool_store::add_node(store.as_ref(), &extra.local_addr().to_string()).unwrap();
    let mut rounds = 0;
    while stat(store.as_ref(), "bytes_not_protected") > 0 {
        store.read(0).unwrap();
        rounds += 1;
        assert!(rounds < 1000, "re-protection stalls");
    }
    servers.remove(0).shutdown();
    servers.remove(0).shutdown();
    check_all(store.as_ref(), &keys, 1);
    // Other stores cannot take nodes.
    let e = tidepool_store::add_node(open("local:").unwrap().as_ref(), "127.0.0.1:1").unwrap_err();
    assert!(
        e.to_string()
            .contains("not a store over several memory nodes"),
        "{e}"
    );
    extra.shutdown();
}
