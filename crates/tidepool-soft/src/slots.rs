//! The slot table: where each soft object lives, in normal memory (a revoked page never takes
//! it with it). Handles name objects by slot index and generation; nothing in soft memory
//! points back into the program's memory, so objects move by rewriting one slot.
//!
//! A slot is one `AtomicU64`:
//!
//! ```text
//!  63                   32 31         20 19          4 3   2 1   0
//! +-----------------------+-------------+-------------+-----+-----+
//! | location / 16         | incarnation | generation  |  0  |state|
//! +-----------------------+-------------+-------------+-----+-----+
//! ```
//!
//! The location is the object's offset in the arena (so arenas are at most 64 GiB); the
//! incarnation is that of its segment when it was written (see [`crate::arena`]). `state` is
//! EMPTY (no value: never written, or freed), LIVE (the object is at `location`)
//! or LOST (it was, until its page was revoked or it was evicted); handles use a fourth,
//! BUSY, in their hint of the slot (see [`crate::pool`]). The generation changes when a slot is freed, so a handle to a freed slot never reads
//! its successor's object.

use crate::sync::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Mutex};
use std::sync::atomic::Ordering::*;

pub const EMPTY: u64 = 0;
pub const LIVE: u64 = 1;
pub const LOST: u64 = 2;
pub const BUSY: u64 = 3;
const STATE_MASK: u64 = 3;
const GEN_SHIFT: u32 = 4;
const GEN_MASK: u64 = 0xFFFF << GEN_SHIFT;
const INC_SHIFT: u32 = 20;
const INC_MASK: u64 = 0xFFF << INC_SHIFT;
const LOC_SHIFT: u32 = 32;

/// Slots per chunk; chunks are allocated as the table grows and never move.
#[cfg(not(loom))]
const CHUNK: usize = 1 << 16;
/// Chunks at most: 2^32 slots.
#[cfg(not(loom))]
const CHUNKS: usize = 1 << 16;
// Under loom, a few slots (each is a loom atomic, and every test makes its table afresh).
#[cfg(loom)]
const CHUNK: usize = 4;
#[cfg(loom)]
const CHUNKS: usize = 4;

pub fn state(word: u64) -> u64 {
    word & STATE_MASK
}
pub fn generation(word: u64) -> u16 {
    ((word & GEN_MASK) >> GEN_SHIFT) as u16
}
/// The object's arena offset (meaningful when LIVE, and kept when LOST).
pub fn location(word: u64) -> usize {
    ((word >> LOC_SHIFT) << 4) as usize
}
/// The incarnation of the object's segment when it was written.
pub fn incarnation(word: u64) -> u32 {
    ((word & INC_MASK) >> INC_SHIFT) as u32
}
pub fn word(state: u64, generation: u16, location: usize, incarnation: u32) -> u64 {
    debug_assert!(location.is_multiple_of(16) && location >> 36 == 0);
    ((location as u64 >> 4) << LOC_SHIFT)
        | (((incarnation as u64) << INC_SHIFT) & INC_MASK)
        | ((generation as u64) << GEN_SHIFT)
        | state
}
/// The same word in another state (LIVE to LOST keeps where the object was).
pub fn with_state(word: u64, state: u64) -> u64 {
    (word & !STATE_MASK) | state
}

/// A growable array of slots with a free list.
///
/// Beside each slot is its object's *hotness*, a byte in normal memory: reads and writes raise
/// it with a plain load and store (no locked instruction on the read path, and a read never
/// writes to soft memory), the evacuator halves it as it ages. It stays with the slot when the
/// object moves, and when the object is dropped as cold: rebuilt, it comes back with the
/// standing it had, so an object that keeps returning is not judged afresh each time (the
/// history TinyLFU keeps in a sketch; here the slot is already there).
pub struct SlotTable {
    chunks: Box<[AtomicPtr<AtomicU64>]>,
    hotness: Box<[AtomicPtr<AtomicU8>]>,
    /// Beside each slot whose object was dropped as cold: where the arena's count of dropped
    /// bytes stood then (in 4 KiB units, plus one; 0: not dropped). A miss on it tells how
    /// much more memory would have kept it (a ghost hit, for the coordinator).
    dropped: Box<[AtomicPtr<AtomicU32>]>,
    /// Slots handed out so far (the high-water mark).
    next: AtomicU32,
    free: Mutex<Vec<u32>>,
}

impl std::fmt::Debug for SlotTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotTable")
            .field("allocated", &self.next.load(Relaxed))
            .field("free", &self.free.lock().len())
            .finish()
    }
}

impl Default for SlotTable {
    fn default() -> Self {
        SlotTable {
            chunks: (0..CHUNKS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            hotness: (0..CHUNKS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            dropped: (0..CHUNKS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            next: AtomicU32::new(0),
            free: Mutex::new(Vec::new()),
        }
    }
}

impl SlotTable {
    /// A slot for a new handle, EMPTY; its index and current generation.
    pub fn allocate(&self) -> (u32, u16) {
        let index = match self.free.lock().pop() {
            Some(i) => i,
            None => {
                let i = self.next.fetch_add(1, Relaxed);
                assert!(i != u32::MAX, "soft memory: more than 2^32 live handles");
                i
            }
        };
        let w = self.get(index).load(Acquire);
        (index, generation(w))
    }

    /// Empties a slot, moves it to its next generation and returns it to the free list; the
    /// word it held (so the caller can account for the object it named).
    pub fn release(&self, index: u32) -> u64 {
        let s = self.get(index);
        let mut w = s.load(Acquire);
        loop {
            let next = word(EMPTY, generation(w).wrapping_add(1), 0, 0);
            match s.compare_exchange_weak(w, next, AcqRel, Acquire) {
                Ok(_) => break,
                Err(now) => w = now,
            }
        }
        self.heat_of(index).store(0, Relaxed);
        if let Some(d) = element_if(&self.dropped, index) {
            d.store(0, Relaxed);
        }
        self.free.lock().push(index);
        w
    }

    /// The slot at `index` (allocating its chunk on first use).
    pub fn get(&self, index: u32) -> &AtomicU64 {
        element(&self.chunks, index)
    }

    /// The hotness byte beside slot `index`.
    fn heat_of(&self, index: u32) -> &AtomicU8 {
        element(&self.hotness, index)
    }

    /// An access to slot `index`'s object: its hotness rises by one. A plain load and store;
    /// a racing raise may be lost (hotness is a statistic).
    pub fn heat(&self, index: u32) {
        let h = self.heat_of(index);
        let v = h.load(Relaxed);
        if v < u8::MAX {
            h.store(v + 1, Relaxed);
        }
    }

    /// The hotness of slot `index`'s object (or of the one it held, if that was dropped).
    pub fn hotness(&self, index: u32) -> u8 {
        self.heat_of(index).load(Relaxed)
    }

    /// Slot `index`'s object was dropped as cold when `stamp` (nonzero) was the arena's
    /// dropped-bytes mark.
    pub fn mark_dropped(&self, index: u32, stamp: u32) {
        element(&self.dropped, index).store(stamp, Relaxed);
    }

    /// The mark slot `index`'s object was dropped at, if it was (and forgets it: the object
    /// is being rebuilt).
    pub fn take_dropped(&self, index: u32) -> Option<u32> {
        let d = element_if(&self.dropped, index)?;
        match d.load(Relaxed) {
            0 => None,
            stamp => {
                d.store(0, Relaxed);
                Some(stamp)
            }
        }
    }

    /// Halves every slot's hotness.
    pub fn age(&self) {
        let n = self.high_water() as usize;
        for c in self.hotness.iter().take(n.div_ceil(CHUNK)) {
            let p = c.load(Acquire);
            if p.is_null() {
                continue;
            }
            // SAFETY: a published chunk is a live CHUNK-long slice freed only in Drop.
            let chunk = unsafe { std::slice::from_raw_parts(p, CHUNK) };
            for h in chunk {
                let v = h.load(Relaxed);
                if v != 0 {
                    // A raise racing with this may be lost, or undo the halving: a statistic.
                    h.store(v / 2, Relaxed);
                }
            }
        }
    }

    /// Slots handed out so far (live or free).
    pub fn high_water(&self) -> u32 {
        self.next.load(Relaxed)
    }
}

/// Element `index` of a chunked array (allocating its chunk on first use).
fn element<T: Default>(chunks: &[AtomicPtr<T>], index: u32) -> &T {
    let (c, i) = (index as usize / CHUNK, index as usize % CHUNK);
    let mut chunk = chunks[c].load(Acquire);
    if chunk.is_null() {
        let fresh: Box<[T]> = (0..CHUNK).map(|_| T::default()).collect();
        let fresh = Box::into_raw(fresh).cast::<T>();
        match chunks[c].compare_exchange(std::ptr::null_mut(), fresh, AcqRel, Acquire) {
            Ok(_) => chunk = fresh,
            Err(winner) => {
                // SAFETY: `fresh` came from Box::into_raw of a CHUNK-long slice just above
                // and was never shared.
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, CHUNK)) });
                chunk = winner;
            }
        }
    }
    // SAFETY: a published chunk is a live CHUNK-long slice that is freed only when the table
    // is dropped, and `i < CHUNK`.
    unsafe { &*chunk.add(i) }
}

/// Element `index` of a chunked array, if its chunk exists (allocates nothing).
fn element_if<T>(chunks: &[AtomicPtr<T>], index: u32) -> Option<&T> {
    let (c, i) = (index as usize / CHUNK, index as usize % CHUNK);
    let chunk = chunks[c].load(Acquire);
    // SAFETY: as in `element`: a published chunk is a live CHUNK-long slice freed only when
    // the table is dropped, and `i < CHUNK`.
    (!chunk.is_null()).then(|| unsafe { &*chunk.add(i) })
}

/// Frees the published chunks of a chunked array.
fn free_chunks<T>(chunks: &[AtomicPtr<T>]) {
    for c in chunks {
        let p = c.load(Acquire);
        if !p.is_null() {
            // SAFETY: published chunks came from Box::into_raw of CHUNK-long slices.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, CHUNK)) });
        }
    }
}

impl Drop for SlotTable {
    fn drop(&mut self) {
        free_chunks(&self.chunks);
        free_chunks(&self.hotness);
        free_chunks(&self.dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hotness_rises_ages_and_dies_with_its_slot() {
        let t = SlotTable::default();
        let (a, _) = t.allocate();
        let (b, _) = t.allocate();
        assert_eq!(t.hotness(a), 0);
        (0..9).for_each(|_| t.heat(a));
        t.heat(b);
        t.age();
        assert_eq!((t.hotness(a), t.hotness(b)), (4, 0), "halved");
        (0..300).for_each(|_| t.heat(a));
        assert_eq!(t.hotness(a), u8::MAX, "saturates");
        t.release(a);
        let (again, _) = t.allocate();
        assert_eq!(again, a, "the freed slot is reused");
        assert_eq!(
            t.hotness(again),
            0,
            "a new handle does not inherit a stranger's standing"
        );
    }

    #[test]
    fn slots_beyond_the_first_chunk_age_too() {
        let t = SlotTable::default();
        let last = (0..CHUNK as u32 + 10)
            .map(|_| t.allocate().0)
            .last()
            .unwrap();
        (0..200).for_each(|_| t.heat(last));
        t.age();
        assert_eq!(t.hotness(last), 100);
    }
}
