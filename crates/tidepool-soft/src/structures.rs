//! Soft data structures (Midas §4.1.2): their index lives in normal memory, their values in
//! soft memory, each value an object with its own slot. A value that vanished is rebuilt by
//! the structure's reconstructor (by index, or by key), or skipped (queues).

use crate::arena::SoftArena;
use crate::counters::{PoolCounters, PoolStats};
use crate::pool::{Handle, Objects};
use crate::value::SoftValue;
use crate::SoftError;
use parking_lot::{Mutex, RwLock};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::Arc;
use std::time::Instant;

thread_local! {
    /// Encoding and decoding scratch, reused across calls.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// What structures share: the objects, the counters, and the encode/decode plumbing.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) objects: Objects,
    pub(crate) counters: Arc<PoolCounters>,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.objects.arena.demand.retire(&self.counters);
    }
}

/// Debug mode's comparison of a cached value with a fresh reconstruction.
type Same<V> = fn(&V, &V) -> bool;

impl Core {
    pub(crate) fn new(arena: &Arc<SoftArena>, name: &str) -> Core {
        let counters = Arc::new(PoolCounters::named(name));
        arena.demand.register(&counters);
        Core {
            objects: Objects {
                arena: arena.clone(),
                fixed_len: None,
            },
            counters,
        }
    }

    /// In debug mode, compares a hit with what the reconstructor builds.
    fn check<V, E>(&self, same: Option<Same<V>>, v: &V, fresh: impl FnOnce() -> Result<V, E>) {
        if let (Some(same), true) = (same, self.counters.debugging()) {
            if let Ok(f) = fresh() {
                if !same(v, &f) {
                    self.counters.mismatch();
                }
            }
        }
    }

    fn get<V: SoftValue>(&self, h: &Handle) -> Option<V> {
        let v = SCRATCH.with(|s| {
            let mut buf = s.borrow_mut();
            if self.objects.read(h, &mut *buf) {
                V::decode(&buf)
            } else {
                None
            }
        });
        self.counters.hit(v.is_some());
        v
    }

    fn put<V: SoftValue>(&self, h: &Handle, v: &V) -> Result<(), SoftError> {
        SCRATCH.with(|s| {
            let mut buf = s.borrow_mut();
            buf.clear();
            v.encode(&mut buf);
            // SAFETY: the buffer's bytes, valid for its length.
            unsafe { self.objects.write(h, buf.as_ptr(), buf.len()) }
        })
    }

    /// Stores a rebuilt value unless one was written since the miss (best effort).
    fn fill<V: SoftValue>(&self, h: &Handle, v: &V) {
        SCRATCH.with(|s| {
            let mut buf = s.borrow_mut();
            buf.clear();
            v.encode(&mut buf);
            // SAFETY: the buffer's bytes, valid for its length.
            let _ = unsafe { self.objects.fill(h, buf.as_ptr(), buf.len()) };
        })
    }

    /// Runs a reconstructor, timing it, and stores what it made (best effort, and never over
    /// a value written meanwhile).
    fn rebuild<V: SoftValue, E>(
        &self,
        h: &Handle,
        f: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E> {
        let t0 = Instant::now();
        let v = f();
        match &v {
            Ok(v) => {
                let nanos = t0.elapsed().as_nanos() as u64;
                self.counters.reconstructed(nanos);
                self.objects.arena.rebuilt(Some(h.slot), nanos);
                self.fill(h, v);
            }
            Err(_) => self.counters.failed(),
        }
        v
    }
}

// ---- SoftVec ----------------------------------------------------------------------------------

type ByIndex<T, E> = dyn Fn(usize) -> Result<T, E> + Send + Sync;

/// A fixed-length array of soft values, each rebuilt from its index when it is gone.
pub struct SoftVec<T, E = Infallible> {
    core: Core,
    handles: Box<[Handle]>,
    reconstruct: Box<ByIndex<T, E>>,
    same: Option<Same<T>>,
}

impl<T, E> std::fmt::Debug for SoftVec<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftVec")
            .field("len", &self.handles.len())
            .field("stats", &self.core.counters.snapshot())
            .finish()
    }
}

impl<T: SoftValue> SoftVec<T, Infallible> {
    /// `len` elements, all empty until read (which reconstructs) or set.
    pub fn new(
        arena: &Arc<SoftArena>,
        len: usize,
        reconstruct: impl Fn(usize) -> T + Send + Sync + 'static,
    ) -> Self {
        Self::fallible(arena, len, move |i| Ok(reconstruct(i)))
    }

    /// Element `i`, rebuilt if it is gone. Panics if `i` is out of bounds.
    pub fn get(&self, i: usize) -> T {
        match self.try_get(i) {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }
}

impl<T: SoftValue, E> SoftVec<T, E> {
    /// With a reconstructor that may fail.
    pub fn fallible(
        arena: &Arc<SoftArena>,
        len: usize,
        reconstruct: impl Fn(usize) -> Result<T, E> + Send + Sync + 'static,
    ) -> Self {
        let core = Core::new(arena, std::any::type_name::<Self>());
        let handles = (0..len).map(|_| core.objects.handle()).collect();
        SoftVec {
            core,
            handles,
            reconstruct: Box::new(reconstruct),
            same: None,
        }
    }

    /// Debug mode (Midas §4.4): every hit is checked against a fresh reconstruction, and
    /// mismatches are counted ([`PoolStats::mismatches`]) and reported. Slow; for tests.
    pub fn set_debug(&mut self, on: bool)
    where
        T: PartialEq,
    {
        self.same = Some(<T as PartialEq>::eq);
        self.core.counters.set_debug(on);
    }

    /// Element `i` if it is in soft memory.
    pub fn get_cached(&self, i: usize) -> Option<T> {
        self.core.get(&self.handles[i])
    }

    /// Element `i`, rebuilt if it is gone; the reconstructor's error if that fails.
    pub fn try_get(&self, i: usize) -> Result<T, E> {
        let h = &self.handles[i];
        if let Some(v) = self.core.get(h) {
            self.core.check(self.same, &v, || (self.reconstruct)(i));
            return Ok(v);
        }
        self.core.rebuild(h, || (self.reconstruct)(i))
    }

    /// Stores element `i`.
    pub fn set(&self, i: usize, value: &T) -> Result<(), SoftError> {
        self.core.put(&self.handles[i], value)
    }

    pub fn len(&self) -> usize {
        self.handles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Hits, misses and reconstructions so far.
    pub fn stats(&self) -> PoolStats {
        self.core.counters.snapshot()
    }
}

impl<T, E> Drop for SoftVec<T, E> {
    fn drop(&mut self) {
        for h in self.handles.iter() {
            self.core.objects.release(h);
        }
    }
}

// ---- SoftMap ----------------------------------------------------------------------------------

type ByKey<K, V, E> = dyn Fn(&K) -> Result<V, E> + Send + Sync;
const MAP_SHARDS: usize = 32;
/// Every this many new keys, one shard of the index drops keys whose values are gone, so an
/// index over an unbounded key space stays about as large as what soft memory holds.
const PRUNE_EVERY: u64 = 4096;

/// A hash map whose values live in soft memory: `get` finds them while they last,
/// `get_or_reconstruct` rebuilds a vanished one from its key. Keys and the index stay in
/// normal memory.
pub struct SoftMap<K, V, E = Infallible> {
    core: Core,
    shards: Box<[RwLock<HashMap<K, Handle>>]>,
    hasher: RandomState,
    reconstruct: Option<Box<ByKey<K, V, E>>>,
    same: Option<Same<V>>,
    new_keys: std::sync::atomic::AtomicU64,
}

impl<K, V, E> std::fmt::Debug for SoftMap<K, V, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftMap")
            .field(
                "keys",
                &self.shards.iter().map(|s| s.read().len()).sum::<usize>(),
            )
            .field("stats", &self.core.counters.snapshot())
            .finish()
    }
}

impl<K: Hash + Eq, V: SoftValue> SoftMap<K, V, Infallible> {
    /// A map with no reconstructor: a vanished value reads as absent.
    pub fn new(arena: &Arc<SoftArena>) -> Self {
        Self::build(arena, None)
    }

    /// A map whose vanished values `reconstruct(key)` rebuilds.
    pub fn with_reconstructor(
        arena: &Arc<SoftArena>,
        reconstruct: impl Fn(&K) -> V + Send + Sync + 'static,
    ) -> Self {
        Self::build(arena, Some(Box::new(move |k: &K| Ok(reconstruct(k)))))
    }

    /// The value of `key`, rebuilt by the reconstructor if it vanished or was never there
    /// (then inserted). Without a reconstructor, the same as [`SoftMap::get`] for a key that
    /// is there; `None` otherwise.
    pub fn get_or_reconstruct(&self, key: K) -> Option<V> {
        match self.try_get_or_reconstruct(key) {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }
}

impl<K: Hash + Eq, V: SoftValue, E> SoftMap<K, V, E> {
    /// A map whose reconstructor may fail.
    pub fn fallible(
        arena: &Arc<SoftArena>,
        reconstruct: impl Fn(&K) -> Result<V, E> + Send + Sync + 'static,
    ) -> Self {
        Self::build(arena, Some(Box::new(reconstruct)))
    }

    fn build(arena: &Arc<SoftArena>, reconstruct: Option<Box<ByKey<K, V, E>>>) -> Self {
        SoftMap {
            core: Core::new(arena, std::any::type_name::<Self>()),
            shards: (0..MAP_SHARDS).map(|_| RwLock::default()).collect(),
            hasher: RandomState::new(),
            reconstruct,
            same: None,
            new_keys: Default::default(),
        }
    }

    /// Debug mode (Midas §4.4): every hit of `get_or_reconstruct` is checked against a fresh
    /// reconstruction, and mismatches are counted ([`PoolStats::mismatches`]) and reported.
    /// Slow; for tests.
    pub fn set_debug(&mut self, on: bool)
    where
        V: PartialEq,
    {
        self.same = Some(<V as PartialEq>::eq);
        self.core.counters.set_debug(on);
    }

    fn shard(&self, key: &K) -> &RwLock<HashMap<K, Handle>> {
        &self.shards[self.hasher.hash_one(key) as usize % MAP_SHARDS]
    }

    /// The value of `key` if it is in soft memory.
    pub fn get(&self, key: &K) -> Option<V> {
        let shard = self.shard(key).read();
        match shard.get(key) {
            Some(h) => self.core.get(h),
            None => {
                self.core.counters.hit(false);
                None
            }
        }
    }

    /// Like [`SoftMap::get_or_reconstruct`], with the reconstructor's error.
    pub fn try_get_or_reconstruct(&self, key: K) -> Result<Option<V>, E> {
        if let Some(v) = self.get(&key) {
            if let Some(f) = &self.reconstruct {
                self.core.check(self.same, &v, || f(&key));
            }
            return Ok(Some(v));
        }
        let Some(f) = &self.reconstruct else {
            return Ok(None);
        };
        let t0 = Instant::now();
        let v = f(&key);
        match v {
            Ok(v) => {
                let nanos = t0.elapsed().as_nanos() as u64;
                self.core.counters.reconstructed(nanos);
                let slot = self.shard(&key).read().get(&key).map(|h| h.slot);
                self.core.objects.arena.rebuilt(slot, nanos);
                self.fill(key, &v);
                Ok(Some(v))
            }
            Err(e) => {
                self.core.counters.failed();
                Err(e)
            }
        }
    }

    /// Stores a rebuilt value for `key` unless one was inserted since the miss (best effort).
    fn fill(&self, key: K, value: &V) {
        self.with_handle(key, |h| self.core.fill(h, value))
    }

    /// Sets the value of `key`.
    pub fn insert(&self, key: K, value: &V) -> Result<(), SoftError> {
        self.with_handle(key, |h| self.core.put(h, value))
    }

    /// Runs `f` on `key`'s handle, made if the key is new.
    fn with_handle<R>(&self, key: K, f: impl FnOnce(&Handle) -> R) -> R {
        {
            let shard = self.shard(&key).read();
            if let Some(h) = shard.get(&key) {
                return f(h);
            }
        }
        let n = self
            .new_keys
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n % PRUNE_EVERY == PRUNE_EVERY - 1 {
            self.prune_shard((n / PRUNE_EVERY) as usize % MAP_SHARDS);
        }
        let mut shard = self.shard(&key).write();
        let h = shard
            .entry(key)
            .or_insert_with(|| self.core.objects.handle());
        f(h)
    }

    /// Drops the keys whose values are gone from the index (done a shard at a time as new
    /// keys arrive; this does every shard now). Returns how many were dropped.
    pub fn prune(&self) -> usize {
        (0..MAP_SHARDS).map(|i| self.prune_shard(i)).sum()
    }

    fn prune_shard(&self, i: usize) -> usize {
        let mut shard = self.shards[i].write();
        let before = shard.len();
        shard.retain(|_, h| {
            // A key whose value was dropped as cold stays while its slot remembers how hot
            // it was (until that ages away), so that it comes back with that standing.
            let keep = self.core.objects.present(h) || self.core.objects.remembered(h);
            if !keep {
                self.core.objects.release(h);
            }
            keep
        });
        before - shard.len()
    }

    /// Removes `key`; whether it was there (with a value or not).
    pub fn remove(&self, key: &K) -> bool {
        match self.shard(key).write().remove(key) {
            Some(h) => {
                self.core.objects.release(&h);
                true
            }
            None => false,
        }
    }

    /// Whether the value of `key` is in soft memory now (as far as its slot tells: a read
    /// may still find it gone). Neither reads the value nor counts a hit or a miss.
    pub fn contains_key(&self, key: &K) -> bool {
        let shard = self.shard(key).read();
        shard.get(key).is_some_and(|h| self.core.objects.present(h))
    }

    /// The keys whose values are in soft memory now, in no particular order (for iterating:
    /// a value may still vanish before it is read).
    pub fn keys(&self) -> Vec<K>
    where
        K: Clone,
    {
        let mut keys = Vec::new();
        for s in self.shards.iter() {
            let shard = s.read();
            keys.extend(
                shard
                    .iter()
                    .filter(|(_, h)| self.core.objects.present(h))
                    .map(|(k, _)| k.clone()),
            );
        }
        keys
    }

    /// How many keys have their values in soft memory now (the length of [`SoftMap::keys`]).
    pub fn present_len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let shard = s.read();
                shard
                    .values()
                    .filter(|h| self.core.objects.present(h))
                    .count()
            })
            .sum()
    }

    /// Keys in the index (their values may have vanished).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hits, misses and reconstructions so far.
    pub fn stats(&self) -> PoolStats {
        self.core.counters.snapshot()
    }
}

impl<K, V, E> Drop for SoftMap<K, V, E> {
    fn drop(&mut self) {
        for s in self.shards.iter() {
            for h in s.read().values() {
                self.core.objects.release(h);
            }
        }
    }
}

// ---- SoftQueue --------------------------------------------------------------------------------

/// A FIFO queue of soft values: items may vanish while queued; `pop` skips them.
pub struct SoftQueue<T> {
    core: Core,
    items: Mutex<VecDeque<Handle>>,
    _values: std::marker::PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for SoftQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftQueue")
            .field("queued", &self.items.lock().len())
            .finish()
    }
}

impl<T: SoftValue> SoftQueue<T> {
    pub fn new(arena: &Arc<SoftArena>) -> Self {
        SoftQueue {
            core: Core::new(arena, std::any::type_name::<Self>()),
            items: Mutex::new(VecDeque::new()),
            _values: std::marker::PhantomData,
        }
    }

    /// Appends an item.
    pub fn push(&self, value: &T) -> Result<(), SoftError> {
        let h = self.core.objects.handle();
        if let Err(e) = self.core.put(&h, value) {
            self.core.objects.release(&h);
            return Err(e);
        }
        self.items.lock().push_back(h);
        Ok(())
    }

    /// The oldest item still in soft memory (vanished ones before it are dropped).
    pub fn pop(&self) -> Option<T> {
        loop {
            let h = self.items.lock().pop_front()?;
            let v = self.core.get(&h);
            self.core.objects.release(&h);
            if v.is_some() {
                return v;
            }
        }
    }

    /// Items queued, vanished ones included.
    pub fn len(&self) -> usize {
        self.items.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Items popped or skipped so far: hits and misses.
    pub fn stats(&self) -> PoolStats {
        self.core.counters.snapshot()
    }
}

impl<T> Drop for SoftQueue<T> {
    fn drop(&mut self) {
        for h in self.items.get_mut().iter() {
            self.core.objects.release(h);
        }
    }
}
