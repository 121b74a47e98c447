//! The items: an index in normal memory (key, flags, expiry, CAS unique, length, access times)
//! whose values are blobs in soft memory. A value the system took back reads as a miss, as an
//! item memcached evicted would; the key stays in the index until pruned, so that a client's
//! `set` after the miss tells how long the miss cost it (the rebuild time the coordinator
//! weighs this cache's memory by).

use crate::clock::{Clock, EXPIRED};
use crate::counters::Counters;
use crate::far::Spill;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::Arc;
use tidepool_soft::{Blob, SoftArena, SoftBlobs, SoftError};

const SHARDS: usize = 64;
/// Every this many new keys, one shard drops the keys whose values are gone.
const PRUNE_EVERY: u64 = 4096;
/// A `set` this long after a miss on the same key is not taken for the miss's rebuild.
const REBUILD_WINDOW_MS: u32 = 10_000;

/// One item's entry in the index.
#[derive(Debug)]
struct Entry {
    blob: Blob,
    len: u32,
    flags: u32,
    cas: u64,
    /// When it was stored (server seconds; for delayed `flush_all`).
    stored: u32,
    /// When it expires (server seconds; 0: never).
    exptime: AtomicU32,
    /// Server seconds of the last access.
    atime: AtomicU32,
    fetched: AtomicBool,
    /// Server milliseconds of the last miss on its lost value (0: none pending).
    missed_ms: AtomicU32,
}

/// What a lookup tells about an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    pub flags: u32,
    pub cas: u64,
    pub len: usize,
    /// Seconds left to live; -1 for never.
    pub ttl: i64,
    /// Seconds since the access before this one.
    pub idle: u32,
    /// Whether it had been fetched before this lookup.
    pub fetched: bool,
}

/// How a store ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Stored, with this CAS unique.
    Stored(u64),
    NotStored,
    Exists,
    NotFound,
}

/// How a store is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
}

/// An arithmetic command: `incr`/`decr`, or `ma` with its options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arith {
    pub incr: bool,
    pub delta: u64,
    /// Only on the item with this CAS unique.
    pub cas: Option<u64>,
    /// On a miss, create the item with this value and expiry.
    pub create: Option<(u64, i64)>,
    /// A new expiry on success.
    pub ttl: Option<i64>,
}

impl Arith {
    /// A plain `incr` (or `decr`) by `delta`.
    pub fn by(incr: bool, delta: u64) -> Arith {
        Arith {
            incr,
            delta,
            cas: None,
            create: None,
            ttl: None,
        }
    }
}

/// Why an arithmetic command did nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithError {
    NotFound,
    NonNumeric,
    Exists,
    Memory,
}

/// One shard of the index.
type Shard = RwLock<HashMap<Box<[u8]>, Entry>>;

/// How a delete ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    Deleted,
    NotFound,
    /// Another version than the one named is there.
    Exists,
}

/// The items of one server.
pub struct Items {
    blobs: SoftBlobs,
    shards: Box<[Shard]>,
    hasher: RandomState,
    next_cas: AtomicU64,
    clock: Clock,
    /// `flush_all` with a delay: items stored at or before this second are gone once it has
    /// come (0: none pending).
    oldest_live: AtomicU32,
    new_keys: AtomicU64,
    pub(crate) counters: Arc<Counters>,
    spill: Option<Arc<Spill>>,
}

impl std::fmt::Debug for Items {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Items").field("keys", &self.keys()).finish()
    }
}

/// What a store answers without storing, given the current item (`live`: its CAS unique,
/// flags, expiry and access time), if it is refused: a CAS that does not match, an add of an
/// existing key (which counts as an access), a replace or append of a missing one.
fn refused(
    mode: StoreMode,
    cas: Option<u64>,
    live: Option<(u64, u32, u32, &AtomicU32)>,
    now: u32,
) -> Option<Stored> {
    match (mode, cas, live) {
        (_, Some(_), None) => Some(Stored::NotFound),
        (_, Some(c), Some((have, ..))) if have != c => Some(Stored::Exists),
        (StoreMode::Add, _, Some((.., atime))) => {
            // An add of an existing key counts as an access (memcached bumps it).
            atime.store(now, Relaxed);
            Some(Stored::NotStored)
        }
        (StoreMode::Replace | StoreMode::Append | StoreMode::Prepend, _, None) => {
            Some(Stored::NotStored)
        }
        _ => None,
    }
}

/// The scratch buffer read-modify-write commands read the old value into.
fn with_scratch<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        s.clear();
        f(&mut s)
    })
}

/// An unsigned number at the start of a value, as memcached's incr reads it (spaces around
/// it allowed).
fn number(v: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(v).ok()?;
    let t = s.trim_start();
    let end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if end == 0 || !t[end..].chars().all(|c| c.is_ascii_whitespace()) {
        return None;
    }
    t[..end].parse().ok()
}

impl Items {
    /// Items in `arena`, spilling values the arena drops to `spill` if given.
    pub fn new(arena: &Arc<SoftArena>, spill: Option<Arc<Spill>>) -> Items {
        Items {
            blobs: SoftBlobs::new(arena, "tidepool-cache"),
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            hasher: RandomState::new(),
            next_cas: AtomicU64::new(1),
            clock: Clock::start(),
            oldest_live: AtomicU32::new(0),
            new_keys: AtomicU64::new(0),
            counters: Arc::new(Counters::default()),
            spill,
        }
    }

    fn shard(&self, key: &[u8]) -> &Shard {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    /// Seconds since the server started.
    pub fn uptime(&self) -> u32 {
        self.clock.now() - 2
    }

    /// The Unix time now, by the server's clock.
    pub fn unix_now(&self) -> i64 {
        self.clock.unix_start + self.uptime() as i64
    }

    fn cas(&self) -> u64 {
        self.next_cas.fetch_add(1, Relaxed)
    }

    /// Whether the entry is past its expiry or a `flush_all`.
    fn dead(&self, e: &Entry, now: u32) -> bool {
        let exp = e.exptime.load(Relaxed);
        if exp != 0 && exp <= now {
            return true;
        }
        let oldest = self.oldest_live.load(Relaxed);
        oldest != 0 && oldest <= now && e.stored <= oldest
    }

    fn view(&self, e: &Entry, now: u32) -> View {
        let exp = e.exptime.load(Relaxed);
        View {
            flags: e.flags,
            cas: e.cas,
            len: e.len as usize,
            ttl: if exp == 0 {
                -1
            } else {
                exp.saturating_sub(now) as i64
            },
            idle: now.saturating_sub(e.atime.load(Relaxed)),
            fetched: e.fetched.load(Relaxed),
        }
    }

    /// Looks `key` up. On a hit, `header` writes what goes before the value into `out`,
    /// then (if `value`) the value follows it; on a miss `out` is left as it was. `touch`
    /// sets a new expiry (`gat`, `mg T`). A value soft memory let go comes from the far tier
    /// if there is one.
    pub fn get(
        &self,
        key: &[u8],
        value: bool,
        touch: Option<i64>,
        out: &mut Vec<u8>,
        header: impl Fn(&View, &mut Vec<u8>),
    ) -> Option<View> {
        let now = self.clock.now();
        let start = out.len();
        let found = {
            let shard = self.shard(key).read();
            match shard.get(key) {
                None => None,
                Some(e) if self.dead(e, now) => {
                    self.counters.expired.fetch_add(1, Relaxed);
                    None
                }
                Some(e) => {
                    let v = self.view(e, now);
                    header(&v, out);
                    let hit = if value {
                        self.blobs.read_into(&e.blob, out)
                    } else {
                        self.blobs.present(&e.blob)
                    };
                    if hit {
                        if let Some(t) = touch {
                            e.exptime.store(self.clock.expiry(t), Relaxed);
                        }
                        e.atime.store(now, Relaxed);
                        e.fetched.store(true, Relaxed);
                        Some(v)
                    } else {
                        out.truncate(start);
                        self.counters.lost.fetch_add(1, Relaxed);
                        e.missed_ms.store(self.clock.now_ms(), Relaxed);
                        None
                    }
                }
            }
        };
        match found {
            None => self.fetch_far(key, value, touch, out, header),
            found => found,
        }
    }

    /// A value spilled to the far tier, brought back into soft memory. The round trip holds
    /// no lock: other keys of the shard are served meanwhile, and the entry is checked again
    /// after it.
    fn fetch_far(
        &self,
        key: &[u8],
        value: bool,
        touch: Option<i64>,
        out: &mut Vec<u8>,
        header: impl Fn(&View, &mut Vec<u8>),
    ) -> Option<View> {
        let spill = self.spill.as_ref()?;
        let now = self.clock.now();
        let (cas, len) = {
            let shard = self.shard(key).read();
            let e = shard.get(key)?;
            if self.dead(e, now) {
                return None;
            }
            (e.cas, e.len as usize)
        };
        let fetched = spill.fetch(cas, len);
        let mut shard = self.shard(key).write();
        let e = shard.get_mut(key)?;
        if self.dead(e, now) {
            return None;
        }
        if self.blobs.present(&e.blob) {
            // Set again since the miss: that value.
            let v = self.view(e, now);
            let start = out.len();
            header(&v, out);
            if !value || self.blobs.peek_into(&e.blob, out) {
                return Some(v);
            }
            out.truncate(start);
            return None;
        }
        if e.cas != cas {
            // Another version since (and gone too): its own miss will fetch it.
            return None;
        }
        let bytes = match fetched {
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                // Gone from both tiers (or its far copy is still queued): the key goes, and
                // so does a far copy that lands later.
                if let Some(e) = shard.remove(key) {
                    spill.remove(e.cas);
                    self.blobs.release(e.blob);
                }
                return None;
            }
            // The far store is down: a miss now, and the key stays for when it is back.
            Err(_) => return None,
        };
        // Back into soft memory (best effort: a full arena leaves it far).
        let _ = self.blobs.write(&e.blob, &bytes);
        if let Some(t) = touch {
            e.exptime.store(self.clock.expiry(t), Relaxed);
        }
        let v = self.view(e, now);
        e.atime.store(now, Relaxed);
        e.fetched.store(true, Relaxed);
        e.missed_ms.store(0, Relaxed);
        header(&v, out);
        if value {
            out.extend_from_slice(&bytes);
        }
        self.counters.far_hits.fetch_add(1, Relaxed);
        Some(v)
    }

    /// Stores `data` under `key`. `cas`: only over the item with this CAS unique.
    pub fn store(
        &self,
        mode: StoreMode,
        key: &[u8],
        flags: u32,
        exptime: i64,
        data: &[u8],
        cas: Option<u64>,
    ) -> Result<Stored, SoftError> {
        let now = self.clock.now();
        let expiry = self.clock.expiry(exptime);
        let mut shard = self.shard(key).write();
        // The current item, if there is one with its value: its CAS unique, flags, expiry.
        let live = shard
            .get(key)
            .filter(|e| !self.dead(e, now) && self.blobs.present(&e.blob))
            .map(|e| (e.cas, e.flags, e.exptime.load(Relaxed), &e.atime));
        if let Some(refused) = refused(mode, cas, live, now) {
            return Ok(refused);
        }
        let exists = live.is_some();
        let new_cas = self.cas();
        let old_cas = live.map(|(c, ..)| c);
        let (flags, expiry) = match (mode, live) {
            // Appending keeps the item's flags and expiry.
            (StoreMode::Append | StoreMode::Prepend, Some((_, f, exp, _))) => (f, exp),
            _ => (flags, expiry),
        };
        if expiry == EXPIRED {
            // Stored already expired: gone at once.
            if let Some(e) = shard.remove(key) {
                if let Some(s) = &self.spill {
                    s.remove(e.cas);
                }
                self.blobs.release(e.blob);
            }
            return Ok(Stored::Stored(new_cas));
        }
        if !exists {
            self.maybe_prune(&mut shard, key);
        }
        let entry = match shard.get_mut(key) {
            Some(e) => e,
            None => {
                shard.insert(key.into(), self.new_entry());
                shard.get_mut(key).expect("just inserted")
            }
        };
        if !self.write_value(entry, mode, data, new_cas)? {
            // The value went between the check and the read.
            return Ok(Stored::NotStored);
        }
        entry.flags = flags;
        entry.cas = new_cas;
        entry.stored = now;
        entry.exptime.store(expiry, Relaxed);
        entry.atime.store(now, Relaxed);
        entry.fetched.store(false, Relaxed);
        // The new version's far copy was queued with its write; the old one's goes.
        if let (Some(s), Some(old)) = (&self.spill, old_cas) {
            s.remove(old);
        }
        self.counters.total_items.fetch_add(1, Relaxed);
        Ok(Stored::Stored(new_cas))
    }

    /// A new item's entry, empty until its value is written.
    fn new_entry(&self) -> Entry {
        Entry {
            blob: self.blobs.blob(),
            len: 0,
            flags: 0,
            cas: 0,
            stored: 0,
            exptime: AtomicU32::new(0),
            atime: AtomicU32::new(0),
            fetched: AtomicBool::new(false),
            missed_ms: AtomicU32::new(0),
        }
    }

    /// Writes the entry's new value (`data`, or its old value with `data` appended or
    /// prepended) and its far copy; `false` if the old value to append to is gone.
    fn write_value(
        &self,
        entry: &mut Entry,
        mode: StoreMode,
        data: &[u8],
        new_cas: u64,
    ) -> Result<bool, SoftError> {
        Ok(match mode {
            StoreMode::Append | StoreMode::Prepend => with_scratch(|old| {
                if !self.blobs.peek_into(&entry.blob, old) {
                    return Ok(false);
                }
                if mode == StoreMode::Append {
                    old.extend_from_slice(data);
                } else {
                    old.splice(0..0, data.iter().copied());
                }
                self.blobs.write(&entry.blob, old).map(|()| {
                    entry.len = old.len() as u32;
                    if let Some(s) = &self.spill {
                        s.put(new_cas, old);
                    }
                    true
                })
            })?,
            _ => {
                // A set after a miss on this key: the client's rebuild took the time since.
                let missed = entry.missed_ms.swap(0, Relaxed);
                if missed != 0 {
                    let since = self.clock.now_ms().wrapping_sub(missed);
                    if since < REBUILD_WINDOW_MS {
                        self.blobs.rebuilt(&entry.blob, since as u64 * 1_000_000);
                    }
                }
                self.blobs.write(&entry.blob, data)?;
                entry.len = data.len() as u32;
                if let Some(s) = &self.spill {
                    s.put(new_cas, data);
                }
                true
            }
        })
    }

    /// Deletes `key`. With `cas`, only the item with that CAS unique.
    pub fn delete(&self, key: &[u8], cas: Option<u64>) -> Deleted {
        let now = self.clock.now();
        let mut shard = self.shard(key).write();
        let live = shard
            .get(key)
            .map(|e| (!self.dead(e, now) && self.blobs.present(&e.blob), e.cas));
        match (live, cas) {
            (Some((true, c)), Some(want)) if c != want => return Deleted::Exists,
            (None, _) => return Deleted::NotFound,
            _ => {}
        }
        let e = shard.remove(key).expect("looked up under the same lock");
        if let Some(s) = &self.spill {
            s.remove(e.cas);
        }
        self.blobs.release(e.blob);
        if live.is_some_and(|(l, _)| l) {
            Deleted::Deleted
        } else {
            Deleted::NotFound
        }
    }

    /// `incr`/`decr` (and `ma`): the new value and the item after it.
    pub fn arith(&self, key: &[u8], op: &Arith) -> Result<(u64, View), ArithError> {
        let Arith {
            incr,
            delta,
            cas,
            ttl,
            ..
        } = *op;
        let now = self.clock.now();
        let mut shard = self.shard(key).write();
        let found = shard.get_mut(key).filter(|e| !self.dead(e, now));
        let Some(e) = found else {
            drop(shard);
            return self.create(key, op);
        };
        let n = with_scratch(|old| {
            if !self.blobs.peek_into(&e.blob, old) {
                return Err(ArithError::NotFound);
            }
            if cas.is_some_and(|c| c != e.cas) {
                return Err(ArithError::Exists);
            }
            Ok((number(old).ok_or(ArithError::NonNumeric)?, old.len()))
        });
        let (n, old_len) = match n {
            Err(ArithError::NotFound) => {
                drop(shard);
                return self.create(key, op);
            }
            other => other?,
        };
        let new = if incr {
            n.wrapping_add(delta)
        } else {
            n.saturating_sub(delta)
        };
        let mut text = new.to_string().into_bytes();
        // memcached rewrites in place when the number is no longer, padding with spaces.
        if text.len() < old_len {
            text.resize(old_len, b' ');
        }
        self.blobs
            .write(&e.blob, &text)
            .map_err(|_| ArithError::Memory)?;
        let old_cas = e.cas;
        e.len = text.len() as u32;
        e.cas = self.cas();
        if let Some(t) = ttl {
            e.exptime.store(self.clock.expiry(t), Relaxed);
        }
        e.atime.store(now, Relaxed);
        if let Some(s) = &self.spill {
            s.remove(old_cas);
            s.put(e.cas, &text);
        }
        Ok((new, self.view(e, now)))
    }

    /// An arithmetic command's miss: creates the item if asked to.
    fn create(&self, key: &[u8], op: &Arith) -> Result<(u64, View), ArithError> {
        let Some((initial, exptime)) = op.create else {
            return Err(ArithError::NotFound);
        };
        let s = initial.to_string();
        match self.store(StoreMode::Add, key, 0, exptime, s.as_bytes(), None) {
            Ok(Stored::Stored(c)) => Ok((
                initial,
                View {
                    flags: 0,
                    cas: c,
                    len: s.len(),
                    ttl: if exptime == 0 { -1 } else { exptime },
                    idle: 0,
                    fetched: false,
                },
            )),
            // Someone else made it first: apply the delta to theirs.
            Ok(_) => self.arith(
                key,
                &Arith {
                    create: None,
                    ..*op
                },
            ),
            Err(_) => Err(ArithError::Memory),
        }
    }

    /// Sets a new expiry; whether the item was there.
    pub fn touch(&self, key: &[u8], exptime: i64) -> bool {
        let now = self.clock.now();
        let shard = self.shard(key).read();
        match shard.get(key) {
            Some(e) if !self.dead(e, now) && self.blobs.present(&e.blob) => {
                e.exptime.store(self.clock.expiry(exptime), Relaxed);
                e.atime.store(now, Relaxed);
                true
            }
            _ => false,
        }
    }

    /// `flush_all`: every item now, or every item stored before `delay` seconds from now once
    /// they have passed.
    pub fn flush(&self, delay: i64) {
        if delay > 0 {
            let at = self.clock.expiry(delay).saturating_sub(1).max(2);
            self.oldest_live.store(at, Relaxed);
            return;
        }
        self.oldest_live.store(0, Relaxed);
        for s in self.shards.iter() {
            let drained: Vec<Entry> = s.write().drain().map(|(_, e)| e).collect();
            for e in drained {
                if let Some(s) = &self.spill {
                    s.remove(e.cas);
                }
                self.blobs.release(e.blob);
            }
        }
    }

    fn maybe_prune(&self, shard: &mut HashMap<Box<[u8]>, Entry>, key: &[u8]) {
        let n = self.new_keys.fetch_add(1, Relaxed);
        if n % PRUNE_EVERY != PRUNE_EVERY - 1 {
            return;
        }
        let now = self.clock.now();
        // With a far tier a value gone from soft memory is still there.
        let far = self.spill.is_some();
        shard.retain(|k, e| {
            let gone = self.dead(e, now)
                || (!far && !self.blobs.present(&e.blob) && !self.blobs.remembered(&e.blob));
            // The key being stored stays (its entry is reused).
            if gone && &**k != key {
                if let Some(s) = &self.spill {
                    s.remove(e.cas);
                }
                self.blobs
                    .release(std::mem::replace(&mut e.blob, self.blobs.blob()));
                return false;
            }
            true
        });
    }

    /// Items with their values in soft memory, and their bytes (key and value).
    pub fn present(&self) -> (u64, u64) {
        let now = self.clock.now();
        let (mut n, mut bytes) = (0, 0);
        for s in self.shards.iter() {
            for (k, e) in s.read().iter() {
                if !self.dead(e, now) && self.blobs.present(&e.blob) {
                    n += 1;
                    bytes += (k.len() + e.len as usize) as u64;
                }
            }
        }
        (n, bytes)
    }

    /// Keys in the index (some values may be gone).
    pub fn keys(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    /// The soft blobs' hits, misses and rebuilds.
    pub fn soft(&self) -> tidepool_soft::PoolStats {
        self.blobs.stats()
    }

    /// The far tier, if there is one.
    pub fn far(&self) -> Option<&Spill> {
        self.spill.as_deref()
    }

    /// The soft-memory arena the values live in.
    pub fn arena(&self) -> &Arc<SoftArena> {
        self.blobs.arena()
    }
}

impl Drop for Items {
    fn drop(&mut self) {
        for s in self.shards.iter() {
            for (_, e) in s.write().drain() {
                self.blobs.release(e.blob);
            }
        }
    }
}

#[cfg(test)]
mod tests;
