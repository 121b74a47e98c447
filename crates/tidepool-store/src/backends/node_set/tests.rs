//! Placement properties, without nodes (tests/nodes.rs runs real ones).

use super::*;

/// Rendezvous placement: a key's holders are spread evenly, and adding a node moves about
/// 1/N of the keys (only onto the new node).
#[test]
fn adding_a_node_moves_about_a_share_of_the_keys() {
    let names: Vec<String> = (0..5).map(|i| format!("10.0.0.{i}:7070")).collect();
    let first = |names: &[String], key: Key| {
        names
            .iter()
            .max_by_key(|n| mix(key ^ seed_of(n)))
            .unwrap()
            .clone()
    };
    let keys = 100_000u64;
    let mut per_node = std::collections::HashMap::new();
    for k in 0..keys {
        *per_node.entry(first(&names[..4], k)).or_insert(0u64) += 1;
    }
    for (n, c) in &per_node {
        assert!((20_000..30_000).contains(c), "{n}: {c} of {keys}");
    }
    let mut moved = 0;
    for k in 0..keys {
        let before = first(&names[..4], k);
        let after = first(&names, k);
        if before != after {
            assert_eq!(after, names[4], "a key moved between old nodes");
            moved += 1;
        }
    }
    // 1/5 of the keys, give or take.
    assert!((17_000..23_000).contains(&moved), "{moved}");
}
