//! Soft pools and soft boxes: objects in soft memory, read by copy, rebuilt by the pool's
//! reconstructor when they are gone.

use crate::arena::{live_word, SoftArena};
use crate::slots::{self, HOT_MAX, LIVE, LOST};
use crate::SoftError;
use std::convert::Infallible;
use std::mem::MaybeUninit;
use std::sync::atomic::{fence, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::Instant;

/// What a pool counts (per pool).
#[derive(Debug, Default)]
pub struct PoolCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub reconstructions: AtomicU64,
    pub reconstruct_nanos: AtomicU64,
    pub reconstruct_failures: AtomicU64,
}

/// A snapshot of [`PoolCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PoolStats {
    pub hits: u64,
    pub misses: u64,
    pub reconstructions: u64,
    pub reconstruct_failures: u64,
    /// Mean time of one reconstruction, in microseconds.
    pub reconstruct_us: f64,
}

impl PoolCounters {
    pub(crate) fn snapshot(&self) -> PoolStats {
        let n = self.reconstructions.load(Relaxed);
        PoolStats {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            reconstructions: n,
            reconstruct_failures: self.reconstruct_failures.load(Relaxed),
            reconstruct_us: if n == 0 {
                0.0
            } else {
                self.reconstruct_nanos.load(Relaxed) as f64 / n as f64 / 1e3
            },
        }
    }
}

/// Outcome of reading an object's bytes.
pub(crate) enum Read {
    Hit,
    /// Never written, freed, evicted or revoked.
    Miss,
}

/// The untyped core every soft structure uses: objects named by slot and generation.
#[derive(Debug)]
pub(crate) struct Objects {
    pub arena: Arc<SoftArena>,
}

impl Objects {
    /// Reads the object of `slot` into `dst` (`len` bytes, which must be its length).
    ///
    /// # Safety
    ///
    /// `dst` is valid for writes of `len` bytes. On `Read::Hit` they hold exactly what a
    /// writer wrote; on a miss they may hold anything.
    pub unsafe fn read(&self, slot: u32, generation: u16, dst: *mut u8, len: usize) -> Read {
        let s = self.arena.slots.get(slot);
        loop {
            let w = s.load(Acquire);
            if slots::state(w) != LIVE || slots::generation(w) != generation {
                return Read::Miss;
            }
            let offset = slots::location(w);
            if self.arena.incarnation(offset) != slots::incarnation(w) {
                self.lose(s, w, len);
                return Read::Miss;
            }
            // SAFETY: the caller's `dst`; `offset` came from the slot.
            let copied = unsafe { self.arena.read(offset, slot, generation, dst, len) };
            // The copy is done before the slot and the segment are checked again.
            fence(Acquire);
            let now = s.load(Relaxed);
            if !slots::same(now, w) {
                continue; // rewritten or moved meanwhile: read the new version
            }
            if copied.is_err() || self.arena.incarnation(offset) != slots::incarnation(w) {
                self.lose(s, w, len);
                return Read::Miss;
            }
            let hot = slots::hot(now);
            if hot < HOT_MAX {
                let _ = s.compare_exchange(now, slots::with_hot(now, hot + 1), Relaxed, Relaxed);
            }
            return Read::Hit;
        }
    }

    /// Marks the object `w` names as lost (if the slot still names it).
    fn lose(&self, s: &AtomicU64, w: u64, len: usize) {
        if s.compare_exchange(w, slots::with_state(w, LOST), AcqRel, Relaxed)
            .is_ok()
        {
            self.arena
                .forget(slots::location(w), slots::incarnation(w), len);
        }
    }

    /// Writes a new version of the object of `slot`; the old one (if any) is forgotten.
    ///
    /// # Safety
    ///
    /// `src` is valid for reads of `len` bytes.
    pub unsafe fn write(
        &self,
        slot: u32,
        generation: u16,
        src: *const u8,
        len: usize,
    ) -> Result<(), SoftError> {
        // SAFETY: the caller's `src`.
        let at = unsafe { self.arena.append(slot, generation, src, len)? };
        let new = live_word(generation, at, 1);
        let s = self.arena.slots.get(slot);
        let mut w = s.load(Acquire);
        loop {
            if slots::generation(w) != generation {
                // The handle was freed meanwhile (cannot happen through a live handle).
                self.arena.forget(at.offset, at.incarnation, len);
                return Ok(());
            }
            match s.compare_exchange_weak(w, new, AcqRel, Acquire) {
                Ok(_) => break,
                Err(now) => w = now,
            }
        }
        if slots::state(w) == LIVE {
            let old_len = self
                .arena
                .length(slots::location(w), slot, generation)
                .unwrap_or(len);
            self.arena
                .forget(slots::location(w), slots::incarnation(w), old_len);
        }
        Ok(())
    }

    /// Replaces the object `expected` names (a word read by the caller) with a new version;
    /// `Ok(false)` if the slot changed meanwhile (nothing written).
    ///
    /// # Safety
    ///
    /// `src` is valid for reads of `len` bytes.
    pub unsafe fn replace(
        &self,
        slot: u32,
        generation: u16,
        expected: u64,
        src: *const u8,
        len: usize,
    ) -> Result<bool, SoftError> {
        // SAFETY: the caller's `src`.
        let at = unsafe { self.arena.append(slot, generation, src, len)? };
        let new = live_word(generation, at, 1);
        let s = self.arena.slots.get(slot);
        let mut w = expected;
        loop {
            match s.compare_exchange_weak(w, new, AcqRel, Acquire) {
                Ok(_) => break,
                // Only hotness moved: still the same version.
                Err(now) if slots::same(now, expected) => w = now,
                Err(_) => {
                    self.arena.forget(at.offset, at.incarnation, len);
                    return Ok(false);
                }
            }
        }
        if slots::state(expected) == LIVE {
            self.arena
                .forget(slots::location(expected), slots::incarnation(expected), len);
        }
        Ok(true)
    }

    /// The slot's current word.
    pub fn word(&self, slot: u32) -> u64 {
        self.arena.slots.get(slot).load(Acquire)
    }

    /// A new, empty slot.
    pub fn allocate(&self) -> (u32, u16) {
        self.arena.slots.allocate()
    }

    /// Frees a slot and forgets its object.
    pub fn release(&self, slot: u32, len: usize) {
        let w = self.arena.slots.release(slot);
        if slots::state(w) == LIVE {
            self.arena
                .forget(slots::location(w), slots::incarnation(w), len);
        }
    }

    /// Drops the object of `slot` (it reads as missing until written again).
    pub fn evict(&self, slot: u32, generation: u16, len: usize) {
        let s = self.arena.slots.get(slot);
        let w = s.load(Acquire);
        if slots::generation(w) == generation && slots::state(w) == LIVE {
            self.lose(s, w, len);
        }
    }
}

type Reconstructor<T, A, E> = dyn Fn(A) -> Result<T, E> + Send + Sync;

struct PoolShared<T, A, E> {
    objects: Objects,
    reconstruct: Box<Reconstructor<T, A, E>>,
    counters: PoolCounters,
}

/// A pool of soft objects of type `T` that share a reconstructor taking `A` (the arguments a
/// reader passes). `E` is the reconstructor's error type: [`Infallible`] for pools made with
/// [`SoftPool::new`].
///
/// `T` is plain data (`Copy`): objects are read and written by copying their bytes, so a
/// revoked page can never leave a half-built value behind.
pub struct SoftPool<T, A = (), E = Infallible> {
    shared: Arc<PoolShared<T, A, E>>,
}

impl<T, A, E> Clone for SoftPool<T, A, E> {
    fn clone(&self) -> Self {
        SoftPool {
            shared: self.shared.clone(),
        }
    }
}

impl<T, A, E> std::fmt::Debug for SoftPool<T, A, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftPool")
            .field("object_bytes", &std::mem::size_of::<T>())
            .field("stats", &self.shared.counters.snapshot())
            .finish()
    }
}

impl<T: Copy + Send + 'static, A: 'static> SoftPool<T, A, Infallible> {
    /// A pool in `arena` whose lost objects are rebuilt by `reconstruct(args)`.
    pub fn new(
        arena: &Arc<SoftArena>,
        reconstruct: impl Fn(A) -> T + Send + Sync + 'static,
    ) -> SoftPool<T, A, Infallible> {
        Self::fallible(arena, move |a| Ok(reconstruct(a)))
    }
}

impl<T: Copy + Send + 'static, A: 'static, E: 'static> SoftPool<T, A, E> {
    /// A pool whose reconstructor may fail (the source is down, say): reads then return the
    /// error, and nothing is cached.
    pub fn fallible(
        arena: &Arc<SoftArena>,
        reconstruct: impl Fn(A) -> Result<T, E> + Send + Sync + 'static,
    ) -> SoftPool<T, A, E> {
        SoftPool {
            shared: Arc::new(PoolShared {
                objects: Objects {
                    arena: arena.clone(),
                },
                reconstruct: Box::new(reconstruct),
                counters: PoolCounters::default(),
            }),
        }
    }

    /// A new soft box, empty: its first read reconstructs.
    pub fn new_box(&self) -> SoftBox<T, A, E> {
        let (slot, generation) = self.shared.objects.allocate();
        SoftBox {
            pool: self.clone(),
            slot,
            generation,
        }
    }

    /// A new soft box holding `value`.
    pub fn new_box_with(&self, value: T) -> Result<SoftBox<T, A, E>, SoftError> {
        let b = self.new_box();
        b.write(value)?;
        Ok(b)
    }

    /// Hits, misses and reconstructions so far.
    pub fn stats(&self) -> PoolStats {
        self.shared.counters.snapshot()
    }

    /// The arena the pool allocates from.
    pub fn arena(&self) -> &Arc<SoftArena> {
        &self.shared.objects.arena
    }
}

/// A soft object with one owner: read by copy (rebuilt from the reader's arguments when it
/// is gone), written, compared and exchanged. Dropping it frees the object.
pub struct SoftBox<T: Copy + Send + 'static, A: 'static = (), E: 'static = Infallible> {
    pool: SoftPool<T, A, E>,
    slot: u32,
    generation: u16,
}

impl<T: Copy + Send + 'static, A: 'static, E: 'static> std::fmt::Debug for SoftBox<T, A, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftBox")
            .field("slot", &self.slot)
            .field("generation", &self.generation)
            .finish()
    }
}

const fn len_of<T>() -> usize {
    std::mem::size_of::<T>()
}

impl<T: Copy + Send + 'static, A: 'static, E: 'static> SoftBox<T, A, E> {
    /// The value if it is still in soft memory; `None` if it was never written or is gone.
    pub fn get(&self) -> Option<T> {
        let shared = &self.pool.shared;
        let mut out = MaybeUninit::<T>::uninit();
        // SAFETY: `out` has room for one T.
        match unsafe {
            shared.objects.read(
                self.slot,
                self.generation,
                out.as_mut_ptr().cast(),
                len_of::<T>(),
            )
        } {
            Read::Hit => {
                shared.counters.hits.fetch_add(1, Relaxed);
                // SAFETY: on a hit the bytes are those of a T some writer copied in whole,
                // and T is Copy, so a bitwise copy is a valid T.
                Some(unsafe { out.assume_init() })
            }
            Read::Miss => {
                shared.counters.misses.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// Copies the value into `out` if it is still in soft memory, with no copy on the stack
    /// (for values too large for it); `false` if it is gone, and `out` then holds
    /// unspecified bytes. Any bytes are a valid `T` ([`zerocopy::FromBytes`]), so a copy torn
    /// by a concurrent revocation is harmless.
    pub fn get_into(&self, out: &mut T) -> bool
    where
        T: zerocopy::FromBytes,
    {
        let shared = &self.pool.shared;
        // SAFETY: `out` has room for one T, and T accepts any bytes.
        let read = unsafe {
            shared.objects.read(
                self.slot,
                self.generation,
                (out as *mut T).cast(),
                len_of::<T>(),
            )
        };
        let hit = matches!(read, Read::Hit);
        let counter = if hit {
            &shared.counters.hits
        } else {
            &shared.counters.misses
        };
        counter.fetch_add(1, Relaxed);
        hit
    }

    /// The value, rebuilt by the pool's reconstructor from `args` (and stored again) if it is
    /// gone; the reconstructor's error if that fails.
    pub fn try_read(&self, args: A) -> Result<T, E> {
        if let Some(v) = self.get() {
            return Ok(v);
        }
        let shared = &self.pool.shared;
        let t0 = Instant::now();
        let v = (shared.reconstruct)(args);
        let nanos = t0.elapsed().as_nanos() as u64;
        match &v {
            Ok(v) => {
                shared.counters.reconstructions.fetch_add(1, Relaxed);
                shared.counters.reconstruct_nanos.fetch_add(nanos, Relaxed);
                // Best effort: with no room, the value is returned uncached.
                let _ = self.write(*v);
            }
            Err(_) => {
                shared.counters.reconstruct_failures.fetch_add(1, Relaxed);
            }
        }
        v
    }

    /// Stores `value` (a new version; readers see the old or the new one, never a mix).
    pub fn write(&self, value: T) -> Result<(), SoftError> {
        // SAFETY: `value` is a T on our stack, len_of::<T>() bytes.
        unsafe {
            self.pool.shared.objects.write(
                self.slot,
                self.generation,
                (&raw const value).cast(),
                len_of::<T>(),
            )
        }
    }

    /// Stores `new` if the value is `current` (compared with `==`). `Err(Some(actual))` when
    /// it is something else, `Err(None)` when it is gone (read with arguments to rebuild it).
    pub fn compare_exchange(&self, current: &T, new: T) -> Result<(), Option<T>>
    where
        T: PartialEq,
    {
        let objects = &self.pool.shared.objects;
        loop {
            let w = objects.word(self.slot);
            let mut out = MaybeUninit::<T>::uninit();
            // SAFETY: `out` has room for one T.
            let read = unsafe {
                objects.read(
                    self.slot,
                    self.generation,
                    out.as_mut_ptr().cast(),
                    len_of::<T>(),
                )
            };
            if matches!(read, Read::Miss) {
                return Err(None);
            }
            // SAFETY: a hit, as in `get`.
            let actual = unsafe { out.assume_init() };
            if actual != *current {
                return Err(Some(actual));
            }
            // SAFETY: `new` is a T on our stack.
            match unsafe {
                objects.replace(
                    self.slot,
                    self.generation,
                    w,
                    (&raw const new).cast(),
                    len_of::<T>(),
                )
            } {
                Ok(true) => return Ok(()),
                Ok(false) => continue, // changed between our read and our write
                Err(_) => return Err(None),
            }
        }
    }

    /// Drops the value from soft memory now (the next read reconstructs it).
    pub fn evict(&self) {
        self.pool
            .shared
            .objects
            .evict(self.slot, self.generation, len_of::<T>());
    }

    /// Whether the value is in soft memory now.
    pub fn is_present(&self) -> bool {
        slots::state(self.pool.shared.objects.word(self.slot)) == LIVE
    }
}

impl<T: Copy + Send + 'static, A: 'static> SoftBox<T, A, Infallible> {
    /// The value, rebuilt from `args` by the pool's reconstructor if it is gone.
    pub fn read(&self, args: A) -> T {
        match self.try_read(args) {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }
}

impl<T: Copy + Send + 'static, A: 'static, E: 'static> Drop for SoftBox<T, A, E> {
    fn drop(&mut self) {
        self.pool.shared.objects.release(self.slot, len_of::<T>());
    }
}
