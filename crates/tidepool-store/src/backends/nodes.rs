//! Several memory nodes as one store (`node://t@h1:p1,h2:p2,h3:p3?replicas=R`).
//!
//! Each key lives on the first `R` nodes of its rendezvous order (highest random weight:
//! every node scores the key, the highest scores win), so adding a node moves about 1/N of the
//! keys and every client agrees on placement without talking to the others. A write goes to
//! the key's `R` holders and is acknowledged only when all of them took it, so it survives
//! `R - 1` losses. A read goes to the first live holder in that order that has the key (the
//! client knows which: each node's store remembers the handles it issued).
//!
//! A node whose connection fails is down for the rest of this client's life: its keys are read
//! from the other holders, and new writes go to the next live node in each key's order. A
//! node that came back could hold older versions, so it is never read again. When every holder
//! of a key is down, reading it is an error naming them (never a missing value, never zeros);
//! when fewer than `R` nodes are up, writes fail the same way.

use crate::backends::node::NodeStore;
use crate::{FarStore, Key, StoreError};
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, Ordering::*};

const BACKEND: &str = "memory nodes";

#[derive(Debug)]
struct Member {
    name: String,
    seed: u64,
    store: NodeStore,
    down: AtomicBool,
}

/// Memory nodes holding each key `replicas` times.
#[derive(Debug)]
pub struct NodeSet {
    members: Vec<Member>,
    replicas: usize,
    url: String,
}

/// A 64-bit mix (splitmix64's finalizer): the rendezvous score of a key on a node.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A node's name as a seed (FNV-1a): the same on every client.
fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether an error means the node is gone (as opposed to a refusal it answered with).
fn node_lost(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Connect { .. } | StoreError::Io { .. } | StoreError::Tls { .. }
    )
}

impl NodeSet {
    /// A store over connected nodes, each named by its address (names decide placement: every
    /// client of the same data must list the same nodes).
    pub fn new(
        nodes: Vec<(String, NodeStore)>,
        replicas: usize,
        url: String,
    ) -> Result<NodeSet, StoreError> {
        if replicas == 0 || replicas > nodes.len() {
            return Err(StoreError::BadUrl {
                url,
                reason: format!(
                    "replicas={replicas} needs between 1 and {} (the nodes listed)",
                    nodes.len()
                ),
            });
        }
        Ok(NodeSet {
            members: nodes
                .into_iter()
                .map(|(name, store)| Member {
                    seed: seed_of(&name),
                    name,
                    store,
                    down: AtomicBool::new(false),
                })
                .collect(),
            replicas,
            url,
        })
    }

    /// The members in the key's rendezvous order.
    fn order(&self, key: Key) -> Vec<usize> {
        let mut o: Vec<usize> = (0..self.members.len()).collect();
        o.sort_by_key(|&i| std::cmp::Reverse(mix(key ^ self.members[i].seed)));
        o
    }

    fn up(&self, i: usize) -> bool {
        !self.members[i].down.load(Acquire)
    }

    fn mark_down(&self, i: usize, e: &StoreError) {
        if !self.members[i].down.swap(true, AcqRel) {
            eprintln!(
                "tidepool: memory node {} is down ({e}); its data is read from the other copies",
                self.members[i].name
            );
        }
    }

    fn down_names(&self) -> String {
        let names: Vec<&str> = self
            .members
            .iter()
            .filter(|m| m.down.load(Acquire))
            .map(|m| m.name.as_str())
            .collect();
        names.join(", ")
    }

    fn lost(&self, what: String) -> StoreError {
        StoreError::Backend {
            backend: BACKEND,
            message: format!("{what}; nodes down: {}", self.down_names()),
            source: None,
        }
    }

    /// The key's holders now: the first `replicas` live members of its order.
    fn holders(&self, key: Key) -> Result<Vec<usize>, StoreError> {
        let h: Vec<usize> = self
            .order(key)
            .into_iter()
            .filter(|&i| self.up(i))
            .take(self.replicas)
            .collect();
        if h.len() < self.replicas {
            return Err(self.lost(format!(
                "fewer than {} memory nodes are up, so a write cannot be kept {} times",
                self.replicas, self.replicas
            )));
        }
        Ok(h)
    }

    /// The member to read `key` from: the first live one in its order that has it. None if no
    /// member ever stored it; an error if only members that are down did.
    fn reader(&self, key: Key) -> Result<Option<usize>, StoreError> {
        let mut held_by_lost = false;
        for i in self.order(key) {
            if self.members[i].store.holds(key) {
                if self.up(i) {
                    return Ok(Some(i));
                }
                held_by_lost = true;
            }
        }
        if held_by_lost {
            return Err(self.lost(format!(
                "every copy of key {key:#x} was on a node that is down"
            )));
        }
        Ok(None)
    }
}

impl FarStore for NodeSet {
    fn describe(&self) -> String {
        crate::url::redact(&self.url)
    }

    fn write_many(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        loop {
            let mut groups: Vec<Vec<(Key, &[u8])>> = vec![Vec::new(); self.members.len()];
            for &(k, v) in items {
                for i in self.holders(k)? {
                    groups[i].push((k, v));
                }
            }
            let mut again = false;
            for (i, g) in groups.iter().enumerate() {
                if g.is_empty() {
                    continue;
                }
                if let Err(e) = self.members[i].store.write_many(g) {
                    if !node_lost(&e) {
                        return Err(e);
                    }
                    // Placed again: the next live node in each key's order takes its copy.
                    self.mark_down(i, &e);
                    again = true;
                }
            }
            if !again {
                return Ok(());
            }
        }
    }

    fn read_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        let mut out: Vec<Option<Bytes>> = vec![None; keys.len()];
        let mut todo: Vec<usize> = (0..keys.len()).collect();
        while !todo.is_empty() {
            let mut groups: Vec<Vec<usize>> = vec![Vec::new(); self.members.len()];
            for &j in &todo {
                if let Some(i) = self.reader(keys[j])? {
                    groups[i].push(j);
                }
            }
            todo.clear();
            for (i, g) in groups.iter().enumerate() {
                if g.is_empty() {
                    continue;
                }
                let ks: Vec<Key> = g.iter().map(|&j| keys[j]).collect();
                match self.members[i].store.read_many(&ks) {
                    Ok(values) => {
                        for (&j, v) in g.iter().zip(values) {
                            out[j] = v;
                        }
                    }
                    Err(e) if node_lost(&e) => {
                        self.mark_down(i, &e);
                        todo.extend(g);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(out)
    }

    fn take_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        let values = self.read_many(keys)?;
        self.remove_many(keys)?;
        Ok(values)
    }

    fn remove_many(&self, keys: &[Key]) -> Result<(), StoreError> {
        for (i, m) in self.members.iter().enumerate() {
            if !self.up(i) {
                continue;
            }
            let held: Vec<Key> = keys.iter().copied().filter(|&k| m.store.holds(k)).collect();
            if held.is_empty() {
                continue;
            }
            match m.store.remove_many(&held) {
                Ok(()) => {}
                // Its copies went with it.
                Err(e) if node_lost(&e) => self.mark_down(i, &e),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn after_fork_in_child(&self) {
        for m in &self.members {
            m.store.after_fork_in_child();
        }
    }
}

#[cfg(test)]
mod tests {
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
}
