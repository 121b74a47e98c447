//! Soft pools and soft boxes: objects in soft memory, read by copy, rebuilt by the pool's
//! reconstructor when they are gone.
//!
//! A handle keeps a *hint*: a copy of its slot's word from when it last wrote or read
//! through the slot table. A read first tries the object the hint names, checking only the
//! segment's incarnation (metadata that stays in cache) and the object's header: one cache
//! miss, like dereferencing a `Box`. The hint is sound because every change of value goes
//! through the handle, which updates the hint under a BUSY mark; what changes a slot without
//! the handle (the evacuator moving an object, a segment being reused or revoked) either
//! leaves the hinted bytes as they were or bumps the incarnation the read checks.

use crate::arena::objects::{live_word, Exact, Sink};
use crate::arena::SoftArena;
use crate::counters::{PoolCounters, PoolStats};
use crate::slots::{self, BUSY, LIVE, LOST};
use crate::sync::{fence, spin_loop, AtomicU64};
use crate::SoftError;
use std::convert::Infallible;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::Instant;

/// Where a handle's object is: slot, generation, and the hint (see the module docs).
#[derive(Debug)]
pub(crate) struct Handle {
    hint: AtomicU64,
    pub slot: u32,
    pub generation: u16,
    /// The object lives and dies with a parent (cascading eviction; the arena knows which).
    child: bool,
}

/// The untyped core every soft structure uses.
#[derive(Debug)]
pub(crate) struct Objects {
    pub arena: Arc<SoftArena>,
    /// Every object's payload length, when it is fixed (a pool of one `Copy` type): forgetting
    /// an old version then needs no read of its header.
    pub fixed_len: Option<usize>,
}

impl Objects {
    /// A new handle with an empty slot.
    pub fn handle(&self) -> Handle {
        let (slot, generation) = self.arena.slots.allocate();
        Handle {
            slot,
            generation,
            hint: AtomicU64::new(slots::word(slots::EMPTY, generation, 0, 0)),
            child: false,
        }
    }

    /// A new handle whose object is evicted with `parent`'s (cascading eviction).
    pub fn child_handle(&self, parent: &Handle) -> Handle {
        let mut h = self.handle();
        h.child = true;
        self.arena
            .set_parent(h.slot, parent.slot, parent.generation);
        h
    }

    /// Reads the object into `sink`; `true` on a hit, when the sink holds exactly what a
    /// writer wrote (on a miss it may hold anything). A child whose parent is gone is gone.
    pub fn read(&self, h: &Handle, sink: &mut impl Sink) -> bool {
        let hit = self.read_own(h, sink);
        if hit && h.child && self.arena.orphaned(h.slot) {
            self.evict(h);
            return false;
        }
        hit
    }

    fn read_own(&self, h: &Handle, sink: &mut impl Sink) -> bool {
        let hint = h.hint.load(Acquire);
        if slots::state(hint) == LIVE && self.read_at(h, hint, sink) {
            return true;
        }
        match self.read_slot(h, sink) {
            Some(w) => {
                // Refresh the hint, unless a change is under way (it will set the hint).
                if slots::state(hint) != BUSY && hint != w {
                    let _ = h.hint.compare_exchange(hint, w, AcqRel, Relaxed);
                }
                true
            }
            None => false,
        }
    }

    /// Copies the object `w` names, if its segment still holds it.
    fn read_at(&self, h: &Handle, w: u64, sink: &mut impl Sink) -> bool {
        let offset = slots::location(w);
        if self.arena.incarnation(offset) != slots::incarnation(w) {
            return false;
        }
        let copied = self.arena.read(offset, h.slot, h.generation, sink);
        // The copy is done before the incarnation is checked again (x86 keeps loads in order;
        // this keeps the compiler from moving them).
        fence(Acquire);
        match copied {
            Ok((len, _)) if self.arena.incarnation(offset) == slots::incarnation(w) => {
                sink.done(len);
                self.arena.slots.heat(h.slot);
                true
            }
            _ => false,
        }
    }

    /// Reads through the slot table; the slot word read, on a hit.
    fn read_slot(&self, h: &Handle, sink: &mut impl Sink) -> Option<u64> {
        let s = self.arena.slots.get(h.slot);
        loop {
            let w = s.load(Acquire);
            if slots::state(w) != LIVE || slots::generation(w) != h.generation {
                return None;
            }
            if self.read_at(h, w, sink) {
                return Some(w);
            }
            if s.load(Acquire) == w {
                // Still the slot's object, and unreadable: its page was revoked, or its
                // segment reused.
                self.lose(s, w);
                return None;
            }
            // The object moved or changed while we read: read again.
        }
    }

    /// Marks the object `w` names as lost (if the slot still names it).
    fn lose(&self, s: &AtomicU64, w: u64) {
        if s.compare_exchange(w, slots::with_state(w, LOST), AcqRel, Relaxed)
            .is_ok()
        {
            self.forget(w);
        }
    }

    /// Marks the handle's hint BUSY while its value changes; returns the hint it held.
    fn lock(&self, h: &Handle) -> u64 {
        loop {
            let w = h.hint.load(Acquire);
            if slots::state(w) != BUSY
                && h.hint
                    .compare_exchange_weak(w, slots::with_state(w, BUSY), Acquire, Relaxed)
                    .is_ok()
            {
                return w;
            }
            spin_loop();
        }
    }

    fn unlock(&self, h: &Handle, w: u64) {
        h.hint.store(w, Release);
    }

    /// Writes a new version of the object (`len` bytes from `src`).
    ///
    /// # Safety
    ///
    /// `src` is valid for reads of `len` bytes.
    pub unsafe fn write(&self, h: &Handle, src: *const u8, len: usize) -> Result<(), SoftError> {
        let before = self.lock(h);
        // SAFETY: the caller's `src`.
        let r = unsafe { self.write_locked(h, src, len) };
        self.unlock(h, r.as_ref().copied().unwrap_or(before));
        r.map(|_| ())
    }

    /// Writes a rebuilt value (`len` bytes from `src`) only if the handle holds no object now:
    /// a write that came after the miss the rebuild answers is newer, and must not be
    /// overwritten by it. Whether it was written.
    ///
    /// # Safety
    ///
    /// `src` is valid for reads of `len` bytes.
    pub unsafe fn fill(&self, h: &Handle, src: *const u8, len: usize) -> Result<bool, SoftError> {
        let before = self.lock(h);
        // With the hint BUSY no writer can make the object present behind our back (moves
        // and revocations only change a present object).
        if self.present(h) {
            self.unlock(h, before);
            return Ok(false);
        }
        // SAFETY: the caller's `src`.
        let r = unsafe { self.write_locked(h, src, len) };
        self.unlock(h, r.as_ref().copied().unwrap_or(before));
        r.map(|_| true)
    }

    /// Writes with the hint held BUSY; the new slot word.
    ///
    /// # Safety
    ///
    /// `src` is valid for reads of `len` bytes.
    unsafe fn write_locked(
        &self,
        h: &Handle,
        src: *const u8,
        len: usize,
    ) -> Result<u64, SoftError> {
        // SAFETY: the caller's `src`.
        let at = unsafe { self.arena.append(h.slot, h.generation, src, len)? };
        // A write is an access (an object dropped as cold and rebuilt goes on from the
        // hotness its slot kept).
        self.arena.slots.heat(h.slot);
        let new = live_word(h.generation, at);
        let old = self.arena.slots.get(h.slot).swap(new, AcqRel);
        if slots::state(old) == LIVE {
            self.forget(old);
        }
        Ok(new)
    }

    /// Reads the current value into `cur` and, if `decide()` then says so, writes `len`
    /// bytes from `src` as the new version, with the hint held BUSY throughout so that no other
    /// change comes between. Returns whether the value was there (`false`: gone, nothing
    /// written) and what `decide` said.
    ///
    /// # Safety
    ///
    /// `cur` is valid for writes and `src` for reads of `len` bytes; `decide` is called only
    /// after a hit, with `cur` filled.
    pub unsafe fn update(
        &self,
        h: &Handle,
        cur: *mut u8,
        src: *const u8,
        len: usize,
        decide: impl FnOnce() -> bool,
    ) -> Result<(bool, bool), SoftError> {
        let before = self.lock(h);
        // With the hint BUSY no other change can happen, so the value read is the value
        // replaced.
        // SAFETY: the caller's `cur`.
        let present = self.read_slot(h, &mut unsafe { Exact::new(cur, len) });
        let Some(w) = present else {
            self.unlock(h, before);
            return Ok((false, false));
        };
        if !decide() {
            self.unlock(h, w);
            return Ok((true, false));
        }
        // SAFETY: the caller's `src`.
        let r = unsafe { self.write_locked(h, src, len) };
        self.unlock(h, r.as_ref().copied().unwrap_or(w));
        r.map(|_| (true, true))
    }

    /// Drops the object from soft memory (it reads as missing until written again).
    pub fn evict(&self, h: &Handle) {
        let before = self.lock(h);
        let s = self.arena.slots.get(h.slot);
        let w = s.load(Acquire);
        if slots::state(w) == LIVE && slots::generation(w) == h.generation {
            self.lose(s, w);
        }
        self.unlock(h, slots::with_state(before, LOST));
    }

    /// Whether the slot says the object is present.
    pub fn present(&self, h: &Handle) -> bool {
        self.arena.present(h.slot, h.generation)
    }

    /// Whether the slot keeps some hotness (of its object, or of one dropped as cold that
    /// has not aged away).
    pub fn remembered(&self, h: &Handle) -> bool {
        self.arena.slots.hotness(h.slot) != 0
    }

    /// Frees the handle's slot and forgets its object.
    pub fn release(&self, h: &Handle) {
        if h.child {
            self.arena.clear_parent(h.slot);
        }
        let w = self.arena.slots.release(h.slot);
        if slots::state(w) == LIVE {
            self.forget(w);
        }
    }

    /// Uncounts the object `w` names from its segment's live bytes.
    fn forget(&self, w: u64) {
        let (offset, inc) = (slots::location(w), slots::incarnation(w));
        let len = match self.fixed_len {
            Some(len) => len,
            None => self.arena.object_bytes(offset, inc).unwrap_or(0),
        };
        self.arena.forget(offset, inc, len);
    }
}

type Reconstructor<T, A, E> = dyn Fn(A) -> Result<T, E> + Send + Sync;

struct PoolShared<T, A, E> {
    objects: Objects,
    reconstruct: Box<Reconstructor<T, A, E>>,
    counters: Arc<PoolCounters>,
}

impl<T, A, E> Drop for PoolShared<T, A, E> {
    fn drop(&mut self) {
        self.objects.arena.demand.retire(&self.counters);
    }
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
    /// A pool in `arena` whose lost objects are rebuilt by `reconstruct(args)`. Its name
    /// (for warnings) is the type's; [`SoftPool::named`] gives another.
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
        let counters = Arc::new(PoolCounters::named(std::any::type_name::<T>()));
        arena.demand.register(&counters);
        SoftPool {
            shared: Arc::new(PoolShared {
                objects: Objects {
                    arena: arena.clone(),
                    fixed_len: Some(len_of::<T>()),
                },
                reconstruct: Box::new(reconstruct),
                counters,
            }),
        }
    }

    /// The same pool under a name that warnings and debug reports use.
    pub fn named(self, name: &str) -> Self {
        self.shared.counters.rename(name);
        self
    }

    /// Debug mode (Midas §4.4): every hit is checked against a fresh reconstruction from the
    /// reader's arguments, and mismatches are counted and reported. Slow; for tests.
    pub fn set_debug(&self, on: bool) {
        self.shared.counters.set_debug(on);
    }

    /// A new soft box, empty: its first read reconstructs.
    pub fn new_box(&self) -> SoftBox<T, A, E> {
        SoftBox {
            handle: self.shared.objects.handle(),
            pool: self.clone(),
        }
    }

    /// A new soft box that is evicted whenever `parent`'s object is (cascading eviction: a
    /// cached post's attached picture goes with the post).
    pub fn new_child_box<P: Copy + Send + 'static, PA: 'static, PE: 'static>(
        &self,
        parent: &SoftBox<P, PA, PE>,
    ) -> SoftBox<T, A, E> {
        SoftBox {
            handle: self.shared.objects.child_handle(&parent.handle),
            pool: self.clone(),
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
    handle: Handle,
}

impl<T: Copy + Send + 'static, A: 'static, E: 'static> std::fmt::Debug for SoftBox<T, A, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftBox")
            .field("slot", &self.handle.slot)
            .field("generation", &self.handle.generation)
            .finish()
    }
}

const fn len_of<T>() -> usize {
    std::mem::size_of::<T>()
}

impl<T: Copy + Send + 'static, A: 'static, E: 'static> SoftBox<T, A, E> {
    fn objects(&self) -> &Objects {
        &self.pool.shared.objects
    }

    /// The value if it is still in soft memory; `None` if it was never written or is gone.
    pub fn get(&self) -> Option<T> {
        let mut out = MaybeUninit::<T>::uninit();
        // SAFETY: `out` has room for one T.
        let mut sink = unsafe { Exact::new(out.as_mut_ptr().cast(), len_of::<T>()) };
        let hit = self.objects().read(&self.handle, &mut sink);
        self.pool.shared.counters.hit(hit);
        // SAFETY: on a hit the bytes are those of a T some writer copied in whole, and T is
        // Copy, so a bitwise copy is a valid T.
        hit.then(|| unsafe { out.assume_init() })
    }

    /// Copies the value into `out` if it is still in soft memory, with no copy on the stack
    /// (for values too large for it); `false` if it is gone, and `out` then holds
    /// unspecified bytes. Any bytes are a valid `T` ([`zerocopy::FromBytes`]), so a copy torn
    /// by a concurrent revocation is harmless.
    pub fn get_into(&self, out: &mut T) -> bool
    where
        T: zerocopy::FromBytes,
    {
        // SAFETY: `out` has room for one T, and T accepts any bytes.
        let mut sink = unsafe { Exact::new((out as *mut T).cast(), len_of::<T>()) };
        let hit = self.objects().read(&self.handle, &mut sink);
        self.pool.shared.counters.hit(hit);
        hit
    }

    /// The value, rebuilt by the pool's reconstructor from `args` (and stored again) if it is
    /// gone; the reconstructor's error if that fails.
    pub fn try_read(&self, args: A) -> Result<T, E> {
        if let Some(v) = self.get() {
            return Ok(v);
        }
        self.rebuild(args)
    }

    /// [`SoftBox::try_read`], checking a hit against the reconstructor in debug mode
    /// ([`SoftPool::set_debug`]).
    pub fn try_read_checked(&self, args: A) -> Result<T, E>
    where
        A: Clone,
        T: PartialEq,
    {
        if let Some(v) = self.get() {
            let shared = &self.pool.shared;
            if shared.counters.debugging() {
                if let Ok(fresh) = (shared.reconstruct)(args) {
                    if fresh != v {
                        shared.counters.mismatch();
                    }
                }
            }
            return Ok(v);
        }
        self.rebuild(args)
    }

    fn rebuild(&self, args: A) -> Result<T, E> {
        let shared = &self.pool.shared;
        let t0 = Instant::now();
        let v = (shared.reconstruct)(args);
        match &v {
            Ok(v) => {
                let nanos = t0.elapsed().as_nanos() as u64;
                shared.counters.reconstructed(nanos);
                shared.objects.arena.rebuilt(Some(self.handle.slot), nanos);
                // Best effort: with no room, the value is returned uncached; a value written
                // since the miss stays.
                // SAFETY: `v` is a T, len_of::<T>() bytes.
                let _ = unsafe {
                    shared
                        .objects
                        .fill(&self.handle, (v as *const T).cast(), len_of::<T>())
                };
            }
            Err(_) => shared.counters.failed(),
        }
        v
    }

    /// Stores `value` (a new version; readers see the old or the new one, never a mix).
    pub fn write(&self, value: T) -> Result<(), SoftError> {
        self.write_from(&value)
    }

    /// Stores `*value` without a copy on the stack (for large values).
    pub fn write_from(&self, value: &T) -> Result<(), SoftError> {
        // SAFETY: `value` is a T, len_of::<T>() bytes.
        unsafe {
            self.objects()
                .write(&self.handle, (value as *const T).cast(), len_of::<T>())
        }
    }

    /// Stores `new` if the value is `current` (compared with `==`). `Err(Some(actual))` when
    /// it is something else, `Err(None)` when it is gone (read with arguments to rebuild it)
    /// or there was no room for the new version.
    pub fn compare_exchange(&self, current: &T, new: T) -> Result<(), Option<T>>
    where
        T: PartialEq,
    {
        let mut actual = MaybeUninit::<T>::uninit();
        let cur = actual.as_mut_ptr();
        // SAFETY: `actual` has room for one T and `new` is one; `decide` runs only after a
        // hit, when `actual` holds a T a writer wrote in whole.
        let r = unsafe {
            self.objects().update(
                &self.handle,
                cur.cast(),
                (&raw const new).cast(),
                len_of::<T>(),
                || *cur == *current,
            )
        };
        match r {
            Ok((true, true)) => Ok(()),
            // SAFETY: present, so read in whole, as above.
            Ok((true, false)) => Err(Some(unsafe { actual.assume_init() })),
            _ => Err(None),
        }
    }

    /// Drops the value from soft memory now (the next read reconstructs it).
    pub fn evict(&self) {
        self.objects().evict(&self.handle);
    }

    /// Whether the value is in soft memory now, as far as the slot table knows.
    pub fn is_present(&self) -> bool {
        self.objects().present(&self.handle)
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
        self.objects().release(&self.handle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::{ArenaConfig, SEGMENT};

    /// Objects in a small arena of their own.
    fn small_arena() -> (Arc<SoftArena>, Objects) {
        let arena = SoftArena::new(
            ArenaConfig::default()
                .budget(4 * SEGMENT)
                .max_bytes(64 * SEGMENT),
        )
        .unwrap();
        let objects = Objects {
            arena: arena.clone(),
            fixed_len: None,
        };
        (arena, objects)
    }

    #[test]
    fn a_rebuilt_value_never_overwrites_one_written_since_the_miss() {
        let (_arena, objects) = small_arena();
        let h = objects.handle();
        let read = || {
            let mut v = Vec::new();
            objects.read(&h, &mut v).then_some(v)
        };
        let fill = |v: &[u8]| {
            // SAFETY: a live slice of the stated length.
            unsafe { objects.fill(&h, v.as_ptr(), v.len()) }.unwrap()
        };
        assert!(fill(b"rebuilt"), "an empty handle takes the rebuilt value");
        assert_eq!(read().as_deref(), Some(&b"rebuilt"[..]));
        // A writer came between a reader's miss and its rebuild: the write stays.
        // SAFETY: a static string of 5 bytes.
        unsafe { objects.write(&h, b"newer".as_ptr(), 5) }.unwrap();
        assert!(!fill(b"rebuilt"));
        assert_eq!(read().as_deref(), Some(&b"newer"[..]));
        // Gone again: the next rebuild is stored.
        objects.evict(&h);
        assert_eq!(read(), None);
        assert!(fill(b"again"));
        assert_eq!(read().as_deref(), Some(&b"again"[..]));
        objects.release(&h);
    }

    #[test]
    fn an_object_dropped_as_cold_comes_back_with_the_standing_it_had() {
        let (arena, objects) = small_arena();
        let value = vec![7u8; 4000];
        let write = |h| {
            // SAFETY: `value` holds its length in bytes.
            unsafe { objects.write(h, value.as_ptr(), value.len()) }.unwrap()
        };
        let hot = objects.handle();
        write(&hot);
        for _ in 0..5 {
            assert!(objects.read(&hot, &mut Vec::new()));
        }
        assert_eq!(arena.slots.hotness(hot.slot), 6, "a write and five reads");
        // Enough cold objects to close the first segment, then a pass that must drop
        // everything it scans.
        let cold: Vec<_> = (0..600).map(|_| objects.handle()).collect();
        cold.iter().for_each(write);
        let report = arena.reclaim(usize::MAX / 2);
        assert!(report.objects_dropped > 500, "{report:?}");
        assert!(!objects.present(&hot), "dropped with the rest");
        assert!(objects.remembered(&hot));
        assert_eq!(
            slots::state(arena.slots.get(cold[0].slot).load(Acquire)),
            LOST
        );
        // Rebuilt (written again): it goes on from where it was.
        write(&hot);
        write(&cold[0]);
        assert_eq!(arena.slots.hotness(hot.slot), 7);
        assert_eq!(arena.slots.hotness(cold[0].slot), 2);
        // Freed: the slot's next owner starts cold.
        objects.release(&hot);
        let next = objects.handle();
        assert_eq!(next.slot, hot.slot);
        assert!(!objects.remembered(&next));
    }
}
