//! Several memory nodes as one store (`node://t@h1:p1,h2:p2,...?replicas=R` or `?ec=K+M`).
//!
//! **Placement.** Each key's pieces go to the first live nodes of its rendezvous order (highest
//! random weight: every node scores the key, the highest scores win), so adding a node moves
//! about 1/N of the keys and every client agrees on placement without talking to the others.
//! Where each piece of a key went is kept in the client's index, so later losses and
//! re-placements never confuse a read.
//!
//! **Redundancy.** With `replicas=R` a piece is a whole copy, and a read goes to the first live
//! copy. With `ec=K+M` a value is cut into K data pieces, padded to an even length, and M parity
//! pieces are computed from them by Reed-Solomon (reed-solomon-simd); a read asks for the K data
//! pieces while their nodes are up, so it only concatenates, and otherwise for any K pieces,
//! which it decodes. 4+2 keeps 1.5 bytes far per byte, where two copies keep 2.
//!
//! **Batches stay batches.** A call sends one request to every node it needs before it reads
//! any answer, so the round trips to the nodes overlap: a batch costs about one round trip,
//! not one per node.
//!
//! **Writes** are acknowledged once every piece is stored: on `K+M` (or `R`) live nodes, or,
//! while no more nodes are down than the redundancy survives, on all that are up. Either way a
//! value survives as many losses as the URL asks for, counted from the start. With more nodes
//! down than that and too few up to hold every piece, writes fail.
//!
//! **Losses.** A node whose connection fails or does not answer within `timeout_ms` is down for
//! the rest of this client's life (one that came back could hold older versions). Reads then
//! use the other pieces; values that lost a piece are stored again on live nodes, a few with
//! each later call ([`NodeSet::reprotect`]), until every value has all its pieces again or no
//! more nodes are up to take them. When too few pieces of a value are left, reading it is an
//! error naming the nodes down: never a missing value, never zeros, never an older version.
//!
//! A value's pieces are written and read whole: a write holds its keys' stripe locks against
//! reads and other writes of them, so a read never mixes pieces of two versions.

use crate::backends::coding::Coder;
use crate::backends::node::{last_per_key, runs, NodeStore};
use crate::url::{Redundancy, MAX_PIECES};
use crate::{FarStore, ForkAware, Key, StoreError, StoreStats, Topology};
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

mod loss;
mod members;

impl Topology for NodeSet {
    fn add_node(&self, addr: &str) -> Result<(), StoreError> {
        NodeSet::add_node(self, addr)
    }

    fn health(&self) -> Option<String> {
        let live = self.live();
        let (values, bytes) = self.unprotected_bytes();
        let mut h = format!(
            "{live} of {} memory nodes up ({})",
            self.members.len(),
            self.redundancy
        );
        if live < self.members.len() {
            h += &format!("; down: {}", self.down_names());
        }
        h += &format!(
            "; {:.1} MiB in {values} values not yet protected again, {:.1} MiB protected again",
            bytes as f64 / (1 << 20) as f64,
            self.reprotected_bytes.load(Relaxed) as f64 / (1 << 20) as f64
        );
        Some(h)
    }
}

impl ForkAware for NodeSet {
    fn after_fork_in_child(&self) {
        for m in self.members.iter() {
            m.store.after_fork_in_child();
        }
    }
}

#[cfg(test)]
mod tests;

use members::{Member, Members, Placed, MAX_MEMBERS};

const BACKEND: &str = "memory nodes";
/// Shards of the key index.
const SHARDS: usize = 64;
/// Locks over keys (by hash), taken in order by each call.
const STRIPES: usize = 1024;
/// Most values one exchange with the nodes carries, and most bytes: within one request of
/// every node.
const CHUNK_ITEMS: usize = 512;
const CHUNK_BYTES: usize = 4 << 20;
/// Values stored again after each call while some lost a piece with a node.
const REPROTECT_BATCH: usize = 64;
/// "No node": a piece not stored.
const NOWHERE: u8 = u8::MAX;

/// Opens a memory node of the set: its address, and the layout of the set it is told at hello.
pub type Connect = Box<dyn Fn(&str, &Layout) -> Result<NodeStore, StoreError> + Send + Sync>;

/// Memory nodes keeping each key as a [`Redundancy`] says.
pub struct NodeSet {
    members: Members,
    /// Opens a node added later ([`NodeSet::add_node`]) the way the listed ones were.
    connect: Option<Connect>,
    redundancy: Redundancy,
    index: Box<[Mutex<FxHashMap<Key, Placed>>]>,
    stripes: Box<[RwLock<()>]>,
    /// Keys that lost a piece with a node, to be stored again.
    unprotected: Mutex<Vec<Key>>,
    has_unprotected: AtomicBool,
    reprotected_bytes: AtomicU64,
    /// `Some` for `ec=K+M`.
    coder: Option<Coder>,
    url: String,
}

impl std::fmt::Debug for NodeSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSet")
            .field("members", &self.members)
            .field("redundancy", &self.redundancy)
            .field("url", &crate::url::redact(&self.url))
            .finish_non_exhaustive()
    }
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

/// What every node of a set is told the store is at hello: its redundancy over its nodes.
/// Clients sharing a tenant must agree on it; the node compares it in its displayed form
/// (`ec=4+2 over h1,h2,...`, the nodes sorted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    redundancy: Redundancy,
    /// Sorted.
    nodes: Vec<String>,
}

impl Layout {
    /// The layout of `redundancy` over `nodes`, in any order.
    pub fn new(redundancy: Redundancy, nodes: &[&str]) -> Layout {
        let mut nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        nodes.sort_unstable();
        Layout { redundancy, nodes }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} over {}", self.redundancy, self.nodes.join(","))
    }
}

/// Splits a batch into runs of at most [`CHUNK_ITEMS`] items and [`CHUNK_BYTES`] bytes.
fn chunks<T>(items: &[T], bytes: impl Fn(&T) -> usize) -> Vec<&[T]> {
    runs(items, CHUNK_ITEMS, CHUNK_BYTES, bytes)
}

impl NodeSet {
    /// A store over connected nodes, each named by its address (names decide placement: every
    /// client of the same data must list the same nodes).
    pub fn new(
        nodes: Vec<(String, NodeStore)>,
        redundancy: Redundancy,
        url: String,
        connect: Option<Connect>,
    ) -> Result<NodeSet, StoreError> {
        let n = nodes.len();
        let refuse = |reason: String| StoreError::BadUrl {
            url: crate::url::redact(&url),
            reason,
        };
        if redundancy.needed() == 0 || redundancy.pieces() > n.min(MAX_PIECES) {
            return Err(refuse(format!(
                "{redundancy} needs between 1 and {} pieces on as many nodes, and {n} nodes are \
                 listed",
                MAX_PIECES
            )));
        }
        if n > MAX_MEMBERS {
            return Err(refuse(format!(
                "{n} memory nodes listed; at most {} can form one store",
                MAX_MEMBERS
            )));
        }
        Ok(NodeSet {
            members: Members::new(
                nodes
                    .into_iter()
                    .map(|(name, store)| Member {
                        seed: seed_of(&name),
                        name,
                        store,
                        down: AtomicBool::new(false),
                    })
                    .collect(),
            ),
            connect,
            redundancy,
            index: (0..SHARDS)
                .map(|_| Mutex::new(FxHashMap::default()))
                .collect(),
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
            unprotected: Mutex::new(Vec::new()),
            has_unprotected: AtomicBool::new(false),
            reprotected_bytes: AtomicU64::new(0),
            coder: match redundancy {
                Redundancy::Erasure { data, parity } => Some(Coder::new(data, parity)),
                Redundancy::Replicas(_) => None,
            },
            url,
        })
    }

    /// Adds a memory node to the set while it is in use: new writes may place pieces on it,
    /// and values short of pieces (their node lost) are stored again with all of them, the new
    /// node taking its share. What is already stored stays where it is.
    pub fn add_node(&self, addr: &str) -> Result<(), StoreError> {
        let refuse = |reason: String| StoreError::BadUrl {
            url: addr.to_string(),
            reason,
        };
        crate::url::check_addr(addr).map_err(refuse)?;
        let Some(connect) = &self.connect else {
            return Err(refuse(
                "this store was made without a way to add nodes".into(),
            ));
        };
        let _adding = self.members.adding.lock();
        if self.members.iter().any(|m| m.name == addr) {
            return Err(refuse(format!(
                "{addr} is already one of the store's nodes"
            )));
        }
        if self.members.len() >= MAX_MEMBERS {
            return Err(refuse(format!(
                "the store has {MAX_MEMBERS} nodes, the most it can"
            )));
        }
        let mut names: Vec<&str> = self.members.iter().map(|m| m.name.as_str()).collect();
        names.push(addr);
        let store = connect(addr, &Layout::new(self.redundancy, &names))?;
        self.members.push(Member {
            seed: seed_of(addr),
            name: addr.to_string(),
            store,
            down: AtomicBool::new(false),
        });
        let want = self.redundancy.pieces();
        let mut short = vec![];
        for shard in self.index.iter() {
            short.extend(
                shard
                    .lock()
                    .iter()
                    .filter(|(_, p)| {
                        !p.is_broken() && p.pieces().filter(|&(_, m)| self.up(m)).count() < want
                    })
                    .map(|(k, _)| *k),
            );
        }
        eprintln!(
            "tidepool: memory node {addr} joined the store; {} values short of pieces will be \
             stored again with all of them",
            short.len()
        );
        if !short.is_empty() {
            self.unprotected.lock().extend(short);
            self.has_unprotected.store(true, Release);
        }
        Ok(())
    }

    fn shard(&self, key: Key) -> &Mutex<FxHashMap<Key, Placed>> {
        &self.index[(key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS]
    }

    fn placed(&self, key: Key) -> Option<Placed> {
        self.shard(key).lock().get(&key).copied()
    }

    /// The stripes of `keys`, sorted and each once (the order locks are taken in).
    fn stripes_of(&self, keys: impl Iterator<Item = Key>) -> Vec<usize> {
        let mut s: Vec<usize> = keys.map(|k| (mix(k) % STRIPES as u64) as usize).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    fn up(&self, i: usize) -> bool {
        !self.members[i].down.load(Acquire)
    }

    fn live(&self) -> usize {
        (0..self.members.len()).filter(|&i| self.up(i)).count()
    }

    /// Where a value of `len` bytes written now goes: piece `p` on the `p`-th live member of
    /// the key's rendezvous order.
    fn placement(&self, key: Key, len: usize) -> Result<Placed, StoreError> {
        let mut order: Vec<usize> = (0..self.members.len()).filter(|&i| self.up(i)).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(mix(key ^ self.members[i].seed)));
        let (live, pieces) = (order.len(), self.redundancy.pieces());
        let down = self.members.len() - live;
        if live < pieces && down > self.redundancy.tolerates() {
            return Err(self.lost(format!(
                "{down} memory nodes are down, more than {} survives, and the {live} up cannot \
                 hold the {pieces} pieces a new value needs",
                self.redundancy
            )));
        }
        let mut on = [NOWHERE; MAX_PIECES];
        for (p, &m) in order.iter().take(self.redundancy.pieces()).enumerate() {
            on[p] = m as u8;
        }
        let len = u32::try_from(len).map_err(|_| StoreError::ValueTooLarge {
            backend: BACKEND,
            len,
            max: u32::MAX as usize,
        })?;
        Ok(Placed { len, on })
    }

    /// Writes a batch of distinct keys (their stripes held by the caller).
    fn write_locked(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        loop {
            let placements = items
                .iter()
                .map(|&(k, v)| self.placement(k, v.len()))
                .collect::<Result<Vec<Placed>, StoreError>>()?;
            let coded = match &self.coder {
                None => None,
                Some(c) => Some(c.encode(&items.iter().map(|(_, v)| *v).collect::<Vec<_>>())?),
            };
            let mut groups: Vec<Vec<(Key, &[u8])>> = vec![Vec::new(); self.members.len()];
            for (j, (&(k, v), placed)) in items.iter().zip(&placements).enumerate() {
                for (p, m) in placed.pieces() {
                    let piece = match &coded {
                        None => v,
                        Some(c) => c.piece(j, p),
                    };
                    groups[m].push((k, piece));
                }
            }
            let lost_one = match self.send_pieces(&groups) {
                Ok(lost_one) => lost_one,
                Err(e) => {
                    // A node refused (a full quota, say) after others may have taken their
                    // pieces over the old ones: the old value cannot be trusted any more.
                    self.break_values(items, &placements);
                    return Err(e);
                }
            };
            if lost_one {
                // Placed again over the nodes still up; a piece written twice is replaced.
                continue;
            }
            let mut stale: Vec<Vec<Key>> = vec![Vec::new(); self.members.len()];
            for (&(k, _), placed) in items.iter().zip(&placements) {
                if let Some(old) = self.shard(k).lock().insert(k, *placed) {
                    for (_, m) in old.pieces() {
                        if !placed.holds_on(m) && self.up(m) {
                            stale[m].push(k);
                        }
                    }
                }
            }
            return self.remove_pieces(&stale);
        }
    }

    /// Sends every member its pieces, all requests before any answer is read. `Ok(true)`: a
    /// node was lost on the way (the caller places the values again).
    fn send_pieces(&self, groups: &[Vec<(Key, &[u8])>]) -> Result<bool, StoreError> {
        let mut pending = Vec::new();
        let mut lost_one = false;
        for (i, g) in groups.iter().enumerate() {
            if g.is_empty() {
                continue;
            }
            match self.members[i].store.write_begin(g) {
                Ok(w) => pending.push((i, w)),
                Err(e) => {
                    self.failed(i, e)?;
                    lost_one = true;
                }
            }
        }
        for (i, w) in pending {
            if let Err(e) = w.finish() {
                self.failed(i, e)?;
                lost_one = true;
            }
        }
        Ok(lost_one)
    }

    /// After a write that failed part way: each value is marked lost (reading it is an error,
    /// never a mix of old and new pieces) and its pieces are freed where possible.
    fn break_values(&self, items: &[(Key, &[u8])], placements: &[Placed]) {
        let mut pieces: Vec<Vec<Key>> = vec![Vec::new(); self.members.len()];
        for (&(k, _), new) in items.iter().zip(placements) {
            let old = self.shard(k).lock().insert(k, Placed::BROKEN);
            for p in old.iter().chain(Some(new)) {
                for (_, m) in p.pieces() {
                    if !pieces[m].contains(&k) {
                        pieces[m].push(k);
                    }
                }
            }
        }
        if let Err(e) = self.remove_pieces(&pieces) {
            tracing::warn!("freeing the pieces of values whose write failed: {e}");
        }
    }

    /// Removes pieces: `keys[i]` from member `i`.
    fn remove_pieces(&self, keys: &[Vec<Key>]) -> Result<(), StoreError> {
        for (i, ks) in keys.iter().enumerate() {
            if ks.is_empty() || !self.up(i) {
                continue;
            }
            if let Err(e) = self.members[i].store.remove_many(ks) {
                // Its pieces went with it.
                self.failed(i, e)?;
            }
        }
        Ok(())
    }

    /// Reads a batch (the keys' stripes held by the caller).
    fn read_locked(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        let placed: Vec<Option<Placed>> = keys.iter().map(|&k| self.placed(k)).collect();
        let mut got: Vec<Vec<(usize, Bytes)>> = vec![Vec::new(); keys.len()];
        let mut todo: Vec<usize> = (0..keys.len()).filter(|&j| placed[j].is_some()).collect();
        while !todo.is_empty() {
            let groups = self.plan_reads(keys, &placed, &got, &todo)?;
            todo.clear();
            self.read_pieces(keys, &groups, &mut got, &mut todo)?;
            todo.sort_unstable();
            todo.dedup();
        }
        let Some(coder) = &self.coder else {
            return Ok(got
                .into_iter()
                .map(|mut g| g.pop().map(|(_, v)| v))
                .collect());
        };
        // Values whose pieces came back, decoded together.
        let found: Vec<usize> = (0..keys.len()).filter(|&j| placed[j].is_some()).collect();
        let lens: Vec<usize> = found
            .iter()
            .map(|&j| placed[j].map_or(0, |p| p.len as usize))
            .collect();
        let found_keys: Vec<Key> = found.iter().map(|&j| keys[j]).collect();
        let mut pieces: Vec<Vec<(usize, Bytes)>> =
            found.iter().map(|&j| std::mem::take(&mut got[j])).collect();
        let values = coder.decode(&found_keys, &lens, &mut pieces)?;
        let mut out = vec![None; keys.len()];
        for (j, v) in found.into_iter().zip(values) {
            out[j] = Some(v);
        }
        Ok(out)
    }

    /// The (value, piece) pairs to ask each member for so that every value in `todo` has the
    /// pieces it needs: data pieces first, on nodes still up. Refused if a value's last write
    /// failed, or if too few of its pieces are left on nodes still up.
    fn plan_reads(
        &self,
        keys: &[Key],
        placed: &[Option<Placed>],
        got: &[Vec<(usize, Bytes)>],
        todo: &[usize],
    ) -> Result<Vec<Vec<(usize, usize)>>, StoreError> {
        let needed = self.redundancy.needed();
        let mut groups: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.members.len()];
        for &j in todo {
            let p = placed[j].as_ref().expect("only placed keys");
            if p.is_broken() {
                return Err(StoreError::Backend {
                    backend: BACKEND,
                    message: format!(
                        "key {:#x}: its last write failed part way (see that error), so its \
                         value is lost",
                        keys[j]
                    ),
                    source: None,
                });
            }
            let mut want = needed - got[j].len();
            for (piece, m) in p.pieces() {
                if want == 0 {
                    break;
                }
                if self.up(m) && !got[j].iter().any(|(q, _)| *q == piece) {
                    groups[m].push((j, piece));
                    want -= 1;
                }
            }
            if want > 0 {
                return Err(self.lost(format!(
                    "key {:#x} has {} of its pieces on nodes still up and needs {needed} \
                     ({}); its data is lost",
                    keys[j],
                    needed - want,
                    self.redundancy
                )));
            }
        }
        Ok(groups)
    }

    /// Asks every member for its pieces of `groups` at once and adds what comes back to `got`;
    /// the values a member failed to answer for go back on `todo`.
    fn read_pieces(
        &self,
        keys: &[Key],
        groups: &[Vec<(usize, usize)>],
        got: &mut [Vec<(usize, Bytes)>],
        todo: &mut Vec<usize>,
    ) -> Result<(), StoreError> {
        let mut pending = Vec::new();
        for (i, g) in groups.iter().enumerate() {
            if g.is_empty() {
                continue;
            }
            let ks: Vec<Key> = g.iter().map(|&(j, _)| keys[j]).collect();
            match self.members[i].store.read_begin(&ks) {
                Ok(r) => pending.push((i, r)),
                Err(e) => {
                    self.failed(i, e)?;
                    todo.extend(g.iter().map(|&(j, _)| j));
                }
            }
        }
        for (i, r) in pending {
            match r.finish() {
                Ok(values) => {
                    for (&(j, piece), v) in groups[i].iter().zip(values) {
                        let v = v.ok_or_else(|| StoreError::Protocol {
                            backend: BACKEND,
                            detail: format!(
                                "memory node {} has no piece {piece} of key {:#x}",
                                self.members[i].name, keys[j]
                            ),
                        })?;
                        got[j].push((piece, v));
                    }
                }
                Err(e) => {
                    self.failed(i, e)?;
                    todo.extend(groups[i].iter().map(|&(j, _)| j));
                }
            }
        }
        Ok(())
    }
}

impl FarStore for NodeSet {
    fn topology(&self) -> Option<&dyn Topology> {
        Some(self)
    }

    fn fork_aware(&self) -> Option<&dyn ForkAware> {
        Some(self)
    }

    /// A silent member is declared down after its timeout, and the read goes on to the next
    /// copy, which may be as slow to give up on: two timeouts.
    fn patience(&self) -> std::time::Duration {
        self.members
            .iter()
            .map(|m| m.store.timeout() * 2)
            .max()
            .unwrap_or_default()
    }

    fn describe(&self) -> String {
        crate::url::redact(&self.url)
    }

    fn write_many(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        let items = last_per_key(items);
        for c in chunks(&items, |(_, v)| {
            v.len() * self.redundancy.pieces() / self.redundancy.needed()
        }) {
            let _guards: Vec<_> = self
                .stripes_of(c.iter().map(|(k, _)| *k))
                .into_iter()
                .map(|s| self.stripes[s].write())
                .collect();
            self.write_locked(c)?;
        }
        self.reprotect_some();
        Ok(())
    }

    fn read_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        let mut out = Vec::with_capacity(keys.len());
        for c in chunks(keys, |_| 0) {
            let _guards: Vec<_> = self
                .stripes_of(c.iter().copied())
                .into_iter()
                .map(|s| self.stripes[s].read())
                .collect();
            out.extend(self.read_locked(c)?);
        }
        self.reprotect_some();
        Ok(out)
    }

    fn take_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        let values = self.read_many(keys)?;
        self.remove_many(keys)?;
        Ok(values)
    }

    fn remove_many(&self, keys: &[Key]) -> Result<(), StoreError> {
        let _guards: Vec<_> = self
            .stripes_of(keys.iter().copied())
            .into_iter()
            .map(|s| self.stripes[s].write())
            .collect();
        let removed: Vec<(Key, Placed)> = keys
            .iter()
            .filter_map(|&k| Some((k, self.shard(k).lock().remove(&k)?)))
            .collect();
        // Sized after the index was read: a node added since is counted.
        let mut on: Vec<Vec<Key>> = vec![Vec::new(); self.members.len()];
        for (k, p) in removed {
            for (_, m) in p.pieces() {
                on[m].push(k);
            }
        }
        self.remove_pieces(&on)
    }

    fn stats(&self) -> Result<StoreStats, StoreError> {
        let mut far = 0;
        let mut extra = vec![];
        for (i, m) in self.members.iter().enumerate() {
            if !self.up(i) {
                continue;
            }
            match m.store.stats() {
                Ok(s) => far += s.far_bytes.unwrap_or(0),
                Err(e) => self.failed(i, e)?,
            }
        }
        let live = self.live() as u64;
        let (keys, bytes) = self.unprotected_bytes();
        let objects = self.index.iter().map(|s| s.lock().len() as u64).sum();
        extra.push(("nodes_up".to_string(), live));
        extra.push(("nodes_down".to_string(), self.members.len() as u64 - live));
        extra.push(("values_not_protected".to_string(), keys));
        extra.push(("bytes_not_protected".to_string(), bytes));
        extra.push((
            "bytes_reprotected".to_string(),
            self.reprotected_bytes.load(Relaxed),
        ));
        Ok(StoreStats {
            far_bytes: Some(far),
            objects: Some(objects),
            extra,
        })
    }
}
