//! The memory-node backend: a client of `tidepool node`.
//!
//! [`NodeClient`] speaks the protocol. It keeps a pool of connections and gives each calling
//! thread its own for the length of a call, so threads never queue behind one another on a
//! socket and no answer has to be handed from a reader thread to a waiting caller (a wake-up
//! across CPUs costs more than the request itself on small VMs). One call may still carry many
//! outstanding requests: [`NodeClient::pipeline`] sends them together and matches the answers by
//! request id, in whatever order they come.
//!
//! All connections of one client share a session id, so the objects it put belong to the client
//! as a whole and are released by the node only when its last connection closes.
//!
//! A forked child ([`NodeClient::after_fork_in_child`]) takes a session of its own for what it
//! puts, and keeps its copies of the parent's connections open without ever using them: while
//! they are open, the parent's session (whose objects the child may still read) lives on, even
//! after the parent has exited. They close when the child exits or execs.
//!
//! [`NodeStore`] is the [`FarStore`] over it: it maps the caller's keys to the node's handles.

use crate::{FarStore, FetchMode, ForkAware, Key, Offload, StoreError, StoreStats};
use bytes::Bytes;
use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use tidepool_proto::scan::{Column, Scan};
use tidepool_proto::{ErrorCode, Handle, ItemResult, Request, Response};

mod client;
mod conn;

pub use client::{InFlight, NodeClient, NodeOptions, DEFAULT_POLL};
use conn::{item_error, unexpected, Batch, BACKEND};

const SHARDS: usize = 64;
/// Most keys one read asks for: the node's frames are limited (16 MiB by default, said at
/// hello), and 1024 values of a page each answer in 4 MiB.
const CHUNK_ITEMS: usize = 1024;
/// Most items one write carries (the protocol's limit is 65536).
const CHUNK_WRITES: usize = 8192;
/// Most handles one free request carries (16 bytes each).
const CHUNK_FREES: usize = 32768;

/// Splits `items` into runs of at most `max_items` items and `max_bytes` bytes (as `bytes`
/// counts them; a single larger item goes alone).
pub(crate) fn runs<T>(
    items: &[T],
    max_items: usize,
    max_bytes: usize,
    bytes: impl Fn(&T) -> usize,
) -> Vec<&[T]> {
    let mut out = Vec::new();
    let (mut start, mut sum) = (0, 0);
    for (i, it) in items.iter().enumerate() {
        if i > start && (i - start == max_items || sum + bytes(it) > max_bytes) {
            out.push(&items[start..i]);
            start = i;
            sum = 0;
        }
        sum += bytes(it);
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

/// Splits a write into runs of at most [`CHUNK_WRITES`] items and `max_bytes` payload bytes.
fn write_chunks<'a, 'b>(
    items: &'b [(Key, &'a [u8])],
    max_bytes: usize,
) -> Vec<&'b [(Key, &'a [u8])]> {
    runs(items, CHUNK_WRITES, max_bytes, |(_, v)| v.len())
}

/// A [`FarStore`] on a memory node: keys map to the handles the node issued.
#[derive(Debug)]
pub struct NodeStore {
    client: NodeClient,
    handles: Box<[Mutex<FxHashMap<Key, Handle>>]>,
}

impl NodeStore {
    /// How long a request waits for an answer (the URL's `timeout_ms`).
    pub(crate) fn timeout(&self) -> std::time::Duration {
        self.client.options.timeout
    }

    pub fn connect(addr: &str, tenant: &str, token: &str) -> Result<NodeStore, StoreError> {
        Ok(Self::with_client(NodeClient::connect(addr, tenant, token)?))
    }

    /// A store over a client already connected (over TLS, with options: see
    /// [`NodeClient::connect_with_options`]).
    pub fn with_client(client: NodeClient) -> NodeStore {
        NodeStore {
            client,
            handles: (0..SHARDS)
                .map(|_| Mutex::new(FxHashMap::default()))
                .collect(),
        }
    }

    pub fn client(&self) -> &NodeClient {
        &self.client
    }

    fn shard(&self, key: Key) -> &Mutex<FxHashMap<Key, Handle>> {
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.handles[h as usize % SHARDS]
    }

    /// Payload bytes one write may carry: half the node's frame limit.
    fn max_write_bytes(&self) -> usize {
        (self.client.info().max_body as usize / 2).max(1 << 16)
    }

    fn lookup(&self, key: Key) -> Option<Handle> {
        self.shard(key).lock().get(&key).copied()
    }

    /// A column named by keys, named by the handles the node knows (`None`: never written).
    fn column(&self, c: &Column<Key>) -> Column<Option<Handle>> {
        Column {
            ty: c.ty,
            line_elems: c.line_elems,
            lines: c.lines.iter().map(|&k| self.lookup(k)).collect(),
        }
    }

    fn forget(&self, key: Key) -> Option<Handle> {
        self.shard(key).lock().remove(&key)
    }

    /// Records a new handle; returns the one it replaced (a concurrent writer's), to be freed.
    fn remember(&self, key: Key, h: Handle) -> Option<Handle> {
        self.shard(key)
            .lock()
            .insert(key, h)
            .filter(|old| *old != h)
    }

    fn free_quietly(&self, handles: Vec<Handle>) -> Result<(), StoreError> {
        for chunk in handles.chunks(CHUNK_FREES) {
            // Stale answers are fine here: the object is gone either way.
            self.client.free_many(chunk.to_vec())?;
        }
        Ok(())
    }

    /// Puts values for keys that had no handle (or whose block was too small), remembering the
    /// new handles and freeing any they replace.
    fn put_new(&self, items: Vec<(Key, &[u8])>) -> Result<(), StoreError> {
        if items.is_empty() {
            return Ok(());
        }
        let (keys, data): (Vec<Key>, Vec<&[u8]>) = items.into_iter().unzip();
        let mut b = Batch::new();
        b.put_many(&data);
        match self.client.exchange(&b)?.pop() {
            Some(Response::Handles(v)) => self.adopt(&keys, v, "put"),
            Some(other) => Err(unexpected("put-many", &other)),
            None => unreachable!("one answer per request"),
        }
    }

    fn adopt(
        &self,
        keys: &[Key],
        results: Vec<ItemResult<Handle>>,
        op: &'static str,
    ) -> Result<(), StoreError> {
        let mut replaced = vec![];
        let mut first_err = None;
        for (key, r) in keys.iter().zip(results) {
            match r {
                Ok(h) => replaced.extend(self.remember(*key, h)),
                Err(code) => {
                    first_err.get_or_insert(item_error(op, code));
                }
            }
        }
        self.free_quietly(replaced)?;
        first_err.map_or(Ok(()), Err)
    }

    fn data_results(
        &self,
        op: &'static str,
        keys: &[Key],
        handles: &[Option<Handle>],
        results: Vec<ItemResult<Bytes>>,
    ) -> Result<Vec<Option<Bytes>>, StoreError> {
        let mut results = results.into_iter();
        let mut out = Vec::with_capacity(keys.len());
        for h in handles {
            out.push(match h {
                None => None,
                // A key we hold a handle for must be there: a refusal means the data was lost
                // (node restarted, session released), which must never read as "empty".
                Some(_) => Some(
                    results
                        .next()
                        .ok_or_else(|| StoreError::Protocol {
                            backend: BACKEND,
                            detail: format!("{op} answered too few items"),
                        })?
                        .map_err(|code| item_error(op, code))?,
                ),
            });
        }
        Ok(out)
    }
}

impl NodeStore {
    /// Sends a write and returns without waiting for the node; [`PendingWrite::finish`]
    /// completes it. Writes to several nodes begun one after another wait out their round trips
    /// together. A write too large for one request is done whole here.
    pub fn write_begin<'a>(
        &self,
        items: &[(Key, &'a [u8])],
    ) -> Result<PendingWrite<'_, 'a>, StoreError> {
        let mut w = PendingWrite {
            store: self,
            in_place: vec![],
            in_place_keys: vec![],
            fresh_keys: vec![],
            sent: None,
        };
        let items = last_per_key(items);
        if write_chunks(&items, self.max_write_bytes()).len() > 1 {
            self.write_many(&items)?;
            return Ok(w);
        }
        let mut fresh_data: Vec<&[u8]> = vec![];
        for (k, v) in items {
            match self.lookup(k) {
                Some(h) => {
                    w.in_place.push((h, v));
                    w.in_place_keys.push(k);
                }
                None => {
                    w.fresh_keys.push(k);
                    fresh_data.push(v);
                }
            }
        }
        let mut b = Batch::new();
        if !w.in_place.is_empty() {
            b.write_many(&w.in_place);
        }
        if !fresh_data.is_empty() {
            b.put_many(&fresh_data);
        }
        if !b.is_empty() {
            w.sent = Some(self.client.send(&b)?);
        }
        Ok(w)
    }

    /// Sends a read and returns without waiting, as [`NodeStore::write_begin`] does.
    pub fn read_begin(&self, keys: &[Key]) -> Result<PendingRead<'_>, StoreError> {
        if keys.len() > CHUNK_ITEMS {
            return Ok(PendingRead::Done(self.read_many(keys)?));
        }
        let handles: Vec<Option<Handle>> = keys.iter().map(|k| self.lookup(*k)).collect();
        let present: Vec<Handle> = handles.iter().flatten().copied().collect();
        if present.is_empty() {
            return Ok(PendingRead::Done(vec![None; keys.len()]));
        }
        let mut b = Batch::new();
        b.push(&Request::GetMany { handles: present });
        Ok(PendingRead::Sent {
            store: self,
            keys: keys.to_vec(),
            handles,
            sent: self.client.send(&b)?,
        })
    }
}

/// A write sent by [`NodeStore::write_begin`].
#[derive(Debug)]
pub struct PendingWrite<'s, 'a> {
    store: &'s NodeStore,
    in_place: Vec<(Handle, &'a [u8])>,
    in_place_keys: Vec<Key>,
    fresh_keys: Vec<Key>,
    sent: Option<InFlight<'s>>,
}

impl PendingWrite<'_, '_> {
    /// Waits for the node's answers and records the handles it issued.
    pub fn finish(self) -> Result<(), StoreError> {
        let Some(sent) = self.sent else {
            return Ok(());
        };
        let store = self.store;
        let mut answers = sent.finish()?.into_iter();
        let mut regrow = vec![];
        if !self.in_place.is_empty() {
            match answers.next() {
                Some(Response::DoneMany(v)) => {
                    for ((key, (_, data)), r) in
                        self.in_place_keys.iter().zip(&self.in_place).zip(v)
                    {
                        match r {
                            Ok(()) => {}
                            // The old block is too small for the new value, or a concurrent
                            // remove freed it: put it anew (a replaced handle is freed when the
                            // new one is remembered).
                            Err(ErrorCode::TooLarge | ErrorCode::StaleHandle) => {
                                regrow.push((*key, *data))
                            }
                            Err(code) => return Err(item_error("write", code)),
                        }
                    }
                }
                Some(other) => return Err(unexpected("write-many", &other)),
                None => unreachable!("one answer per request"),
            }
        }
        if !self.fresh_keys.is_empty() {
            match answers.next() {
                Some(Response::Handles(v)) => store.adopt(&self.fresh_keys, v, "put")?,
                Some(other) => return Err(unexpected("put-many", &other)),
                None => unreachable!("one answer per request"),
            }
        }
        store.put_new(regrow)
    }
}

/// A read sent by [`NodeStore::read_begin`].
#[derive(Debug)]
pub enum PendingRead<'s> {
    Done(Vec<Option<Bytes>>),
    Sent {
        store: &'s NodeStore,
        keys: Vec<Key>,
        handles: Vec<Option<Handle>>,
        sent: InFlight<'s>,
    },
}

impl PendingRead<'_> {
    /// Waits for the node's answer: each key's value, `None` for a key never written.
    pub fn finish(self) -> Result<Vec<Option<Bytes>>, StoreError> {
        match self {
            PendingRead::Done(v) => Ok(v),
            PendingRead::Sent {
                store,
                keys,
                handles,
                sent,
            } => match sent.finish()?.pop() {
                Some(Response::DataMany(results)) => {
                    store.data_results("get", &keys, &handles, results)
                }
                Some(other) => Err(unexpected("get-many", &other)),
                None => unreachable!("one answer per request"),
            },
        }
    }
}

/// The last value for each key, in first-seen order: a batch naming a key twice means its last
/// value.
pub(crate) fn last_per_key<'a>(items: &[(Key, &'a [u8])]) -> Vec<(Key, &'a [u8])> {
    if items.len() < 2 {
        return items.to_vec();
    }
    let mut index: FxHashMap<Key, usize> = FxHashMap::default();
    let mut out: Vec<(Key, &[u8])> = Vec::with_capacity(items.len());
    for &(k, v) in items {
        match index.get(&k) {
            Some(&i) => out[i].1 = v,
            None => {
                index.insert(k, out.len());
                out.push((k, v));
            }
        }
    }
    out
}

impl FarStore for NodeStore {
    fn offload(&self) -> Option<&dyn Offload> {
        Some(self)
    }

    fn fork_aware(&self) -> Option<&dyn ForkAware> {
        Some(self)
    }

    fn describe(&self) -> String {
        let tls = if self.client.uses_tls() { "?tls=1" } else { "" };
        format!("node://{}{tls}", self.client.addr)
    }

    fn write_many(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        let chunks = write_chunks(items, self.max_write_bytes());
        if chunks.len() > 1 {
            return chunks.into_iter().try_for_each(|c| self.write_many(c));
        }
        self.write_begin(items)?.finish()
    }

    fn read_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        if keys.len() > CHUNK_ITEMS {
            let mut out = Vec::with_capacity(keys.len());
            for c in keys.chunks(CHUNK_ITEMS) {
                out.extend(self.read_many(c)?);
            }
            return Ok(out);
        }
        self.read_begin(keys)?.finish()
    }

    fn take_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        if keys.len() > CHUNK_ITEMS {
            let mut out = Vec::with_capacity(keys.len());
            for c in keys.chunks(CHUNK_ITEMS) {
                out.extend(self.take_many(c)?);
            }
            return Ok(out);
        }
        let handles: Vec<Option<Handle>> = keys.iter().map(|k| self.forget(*k)).collect();
        let present: Vec<Handle> = handles.iter().flatten().copied().collect();
        if present.is_empty() {
            return Ok(vec![None; keys.len()]);
        }
        let results = self.client.take_many(present)?;
        self.data_results("take", keys, &handles, results)
    }

    fn remove_many(&self, keys: &[Key]) -> Result<(), StoreError> {
        let handles: Vec<Handle> = keys.iter().filter_map(|k| self.forget(*k)).collect();
        self.free_quietly(handles)
    }

    fn evict_fetch(
        &self,
        evict: &[(Key, &[u8])],
        fetch: &[Key],
        mode: FetchMode,
    ) -> Result<Vec<Option<Bytes>>, StoreError> {
        if evict.len() + fetch.len() > CHUNK_ITEMS
            || evict.iter().map(|(_, v)| v.len()).sum::<usize>() > self.max_write_bytes()
        {
            // Too much for one request: in parts, the writes first (a fetched key that is also
            // evicted must see the evicted value).
            self.write_many(evict)?;
            return match mode {
                FetchMode::Keep => self.read_many(fetch),
                FetchMode::Take => self.take_many(fetch),
            };
        }
        let evict = last_per_key(evict);
        // A key both evicted and fetched is answered from the evicted value; with Take it need
        // not travel at all.
        let evicted_here: FxHashMap<Key, &[u8]> = evict.iter().copied().collect();
        let fetched_keys: FxHashSet<Key> = fetch.iter().copied().collect();
        let mut items: Vec<(Option<Handle>, &[u8])> = vec![];
        let mut item_keys = vec![];
        let mut drop_handles = vec![];
        for &(k, v) in &evict {
            if mode == FetchMode::Take && fetched_keys.contains(&k) {
                drop_handles.extend(self.forget(k));
                continue;
            }
            items.push((self.lookup(k), v));
            item_keys.push(k);
        }
        let fetch_handles: Vec<Option<Handle>> = fetch
            .iter()
            .map(|k| {
                if evicted_here.contains_key(k) {
                    None
                } else if mode == FetchMode::Take {
                    self.forget(*k)
                } else {
                    self.lookup(*k)
                }
            })
            .collect();
        let fetch_flat: Vec<Handle> = fetch_handles.iter().flatten().copied().collect();
        let mut b = Batch::new();
        b.evict_fetch(&items, &fetch_flat, mode == FetchMode::Take);
        let (evicted, fetched) = match self.client.exchange(&b)?.pop() {
            Some(Response::EvictFetch { evicted, fetched }) => (evicted, fetched),
            Some(other) => return Err(unexpected("evict-fetch", &other)),
            None => unreachable!("one answer per request"),
        };
        let mut regrow = vec![];
        for ((k, (handle, data)), r) in item_keys.iter().zip(&items).zip(evicted) {
            match r {
                Ok(h) => drop_handles.extend(self.remember(*k, h)),
                Err(ErrorCode::TooLarge | ErrorCode::StaleHandle) if handle.is_some() => {
                    regrow.push((*k, *data))
                }
                Err(code) => return Err(item_error("evict", code)),
            }
        }
        self.free_quietly(drop_handles)?;
        self.put_new(regrow)?;
        let mut from_node = self.data_results("fetch", fetch, &fetch_handles, fetched)?;
        for (i, k) in fetch.iter().enumerate() {
            if let Some(v) = evicted_here.get(k) {
                from_node[i] = Some(Bytes::copy_from_slice(v));
            }
        }
        Ok(from_node)
    }

    fn stats(&self) -> Result<StoreStats, StoreError> {
        let counters = self.client.stats()?;
        let get = |name: &str| counters.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
        Ok(StoreStats {
            far_bytes: get("tenant.bytes_allocated"),
            objects: get("tenant.objects"),
            extra: counters,
        })
    }
}

/// A memory node runs scans and gathers next to the data.
impl Offload for NodeStore {
    fn scan(&self, scan: &Scan<Key>) -> Result<Vec<u64>, StoreError> {
        let req = Request::Scan(Scan {
            rows: scan.rows,
            columns: scan.columns.iter().map(|c| self.column(c)).collect(),
            filter: scan.filter,
            group: scan.group,
            aggs: scan.aggs.clone(),
        });
        match self.client.call(&req)? {
            Response::Values(v) => Ok(v),
            other => Err(unexpected("scan", &other)),
        }
    }

    fn gather(&self, column: &Column<Key>, indices: &[u64]) -> Result<Bytes, StoreError> {
        let req = Request::Gather {
            column: self.column(column),
            indices: indices.to_vec(),
        };
        match self.client.call(&req)? {
            Response::Data(d) => Ok(d),
            other => Err(unexpected("gather", &other)),
        }
    }
}

impl ForkAware for NodeStore {
    fn after_fork_in_child(&self) {
        self.client.after_fork_in_child();
    }
}
