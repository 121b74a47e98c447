//! The soft arena: one memfd per arena, cut into segments (2 MiB) that objects are appended
//! to, log-structured, from a few allocation heads (a thread keeps to one head).
//!
//! Segment metadata lives in normal memory. Each segment has an incarnation number, bumped
//! whenever its contents stop being what slots say they are (evicted for reuse, revoked): a
//! slot records the incarnation its object was written in, so a reader notices a reused or
//! revoked segment without the segment being walked, and a punched segment is never
//! repopulated while a stale slot could mistake new bytes for its object.

pub mod compact;
pub mod objects;
pub mod revocation;
pub mod segments;

use crate::demand::{Demand, DemandStats, MARK_SHIFT};
use crate::doorbell::Doorbell;
use crate::memory::{ArenaMemory, CreateError};
use crate::slots::{self, SlotTable};
use crate::sync::{
    AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Mutex, RwLock,
};
use crate::SoftError;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use tidepool_proto::coord::ghost_bucket;
use tidepool_sys::memfd::ShmemHugePages;

/// Bytes of a segment (a few words under loom, whose tests walk every state of a handful).
#[cfg(not(loom))]
pub const SEGMENT: usize = 2 << 20;
#[cfg(loom)]
pub const SEGMENT: usize = 64;
/// Bytes of an object header.
pub const HEADER: usize = 16;
/// Allocation heads (threads are spread over them).
const HEADS: usize = 8;
/// Threads the evacuator's pool may have.
pub const MAX_EVACUATORS: usize = 8;
/// Bits of a segment's incarnation kept in slots.
const INC_BITS: u32 = 12;
pub const INC_MASK: u32 = (1 << INC_BITS) - 1;
/// Marks a header (with the slot and generation, a header cannot be mistaken for payload).
const MAGIC: u64 = 0x50f7;
// Headers are two words: the tag (magic, generation, slot), then the payload length (low 32
// bits; the rest zero). Hotness is kept beside the slot, in normal memory (see
// `slots::SlotTable`).

/// Segment kinds.
pub(crate) const UNPOPULATED: u8 = 0;
pub(crate) const FREE: u8 = 1;
pub(crate) const ACTIVE: u8 = 2;
pub(crate) const CLOSED: u8 = 3;
pub(crate) const CONTINUATION: u8 = 4;
/// Found revoked while writers may still be copying into it: kept out of circulation (in the
/// closed list) until they are done, then given back.
pub(crate) const REVOKED: u8 = 5;

/// How to size an arena: [`ArenaConfig::default`], then the setters below for what differs
/// from the defaults each one names.
#[derive(Debug, Clone)]
pub struct ArenaConfig {
    /// Most bytes of memory the arena's segments may hold at once.
    pub(crate) budget: usize,
    /// Address space reserved for the arena (no memory until populated); at most 64 GiB.
    pub(crate) max_bytes: usize,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        ArenaConfig {
            budget: 256 << 20,
            max_bytes: 64 << 30,
        }
    }
}

impl ArenaConfig {
    /// Most bytes of memory the arena's segments may hold at once, to start with (rounded up
    /// to whole segments, at least one); the arena's budget may be changed later.
    /// Default: 256 MiB.
    pub fn budget(mut self, value: usize) -> ArenaConfig {
        self.budget = value;
        self
    }

    /// Address space reserved for the arena, in bytes (no memory until populated): rounded
    /// down to whole segments, at least one segment and at most 64 GiB.
    /// Default: 64 GiB.
    pub fn max_bytes(mut self, value: usize) -> ArenaConfig {
        self.max_bytes = value;
        self
    }
}

#[derive(Debug, Default)]
pub(crate) struct SegmentMeta {
    pub incarnation: AtomicU32,
    /// Bytes of objects (headers included) that slots still point to; approximate while
    /// writers race, exact at rest.
    pub live: AtomicI64,
    pub kind: AtomicU8,
    /// Segments in the run this one starts (1 but for large objects).
    pub run: AtomicU32,
    /// Bytes allocated in the segment (where a walk of its objects stops).
    pub end: AtomicUsize,
    /// Objects allocated here whose bytes are still being copied in.
    pub writers: AtomicU32,
    /// Sum of size times hotness of its live objects at the last scan.
    pub hotness: AtomicU64,
}

#[derive(Debug, Default)]
pub(crate) struct Segments {
    pub unpopulated: BTreeSet<u32>,
    /// Populated and holding nothing.
    pub free: Vec<u32>,
    /// Full segments (and large-object runs, by first segment), coldest first after a scan
    /// (oldest first before).
    pub closed: VecDeque<u32>,
    /// Segments holding memory (free, active, closed, continuation).
    pub populated: usize,
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Head {
    pub segment: Option<u32>,
    /// Arena offset of the next allocation.
    pub offset: usize,
}

/// Counters of an arena (statistics: the standard library's atomics even under loom).
#[derive(Debug, Default)]
pub struct ArenaCounters {
    pub segments_populated: std::sync::atomic::AtomicU64,
    pub segments_evicted: std::sync::atomic::AtomicU64,
    /// Segments evicted whole because allocation found no free one (the evacuator was
    /// behind): their warm objects were lost with the cold.
    pub direct_evictions: std::sync::atomic::AtomicU64,
    pub segments_revoked: std::sync::atomic::AtomicU64,
    pub bytes_allocated: std::sync::atomic::AtomicU64,
}

/// Where a new object was placed.
#[derive(Debug, Clone, Copy)]
pub struct Placement {
    pub offset: usize,
    pub incarnation: u32,
}

/// A soft-memory arena.
#[derive(Debug)]
pub struct SoftArena {
    memory: ArenaMemory,
    pub(crate) meta: Box<[SegmentMeta]>,
    pub(crate) segments: Mutex<Segments>,
    heads: [Mutex<Head>; HEADS],
    /// Where the evacuator's threads copy live objects to: one head each.
    pub(crate) evacuation_heads: [Mutex<Head>; MAX_EVACUATORS],
    budget_segments: AtomicUsize,
    pub(crate) slots: SlotTable,
    pub(crate) counters: ArenaCounters,
    /// What its memory is worth (for the coordinator).
    pub(crate) demand: Demand,
    /// Rung when allocation finds free segments at the low watermark (an evacuator waits on
    /// it).
    low_space: Arc<Doorbell>,
    /// Evacuator watermarks, as shares of the budget: wake under `low` free, reclaim up to
    /// `high`. Zero until an evacuator starts.
    watermarks: Mutex<(f64, f64)>,
    /// Held through an evacuation pass: passes run one at a time (two would pick the same
    /// victims, and one could walk a segment the other freed and a head reused).
    pub(crate) pass: Mutex<()>,
    /// Threads compacting in a pass (the evacuator's pool).
    pub(crate) evacuator_threads: AtomicUsize,
    /// `bytes_allocated` when hotness was last halved.
    pub(crate) aged_at: AtomicU64,
    /// Child slot to parent (slot, generation), for cascading eviction.
    parents: RwLock<HashMap<u32, (u32, u16)>>,
    has_parents: AtomicBool,
    huge_pages: ShmemHugePages,
}

static NEXT_HEAD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
thread_local! {
    static MY_HEAD: usize = NEXT_HEAD.fetch_add(1, Relaxed) % HEADS;
}

impl SoftArena {
    /// Creates an arena: reserves its address space and registers it; no memory yet.
    pub fn new(config: ArenaConfig) -> Result<Arc<SoftArena>, SoftError> {
        let max = config.max_bytes.clamp(SEGMENT, 64 << 30) / SEGMENT * SEGMENT;
        let memory = ArenaMemory::create(max, SEGMENT).map_err(|e| match e {
            CreateError::Map(e) => SoftError::Arena(e),
            CreateError::TooManyArenas => SoftError::TooManyArenas,
        })?;
        let count = max / SEGMENT;
        let huge_pages = ShmemHugePages::detect();
        if huge_pages != ShmemHugePages::Enabled {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::info!(
                    "soft memory: shmem huge pages are off on this machine, so segments use 4 KiB \
                     pages (taking memory back runs at ~5 GiB/s instead of ~200); to turn them \
                     on: echo within_size > /sys/kernel/mm/transparent_hugepage/shmem_enabled"
                )
            });
        }
        let arena = Arc::new(SoftArena {
            meta: (0..count).map(|_| SegmentMeta::default()).collect(),
            segments: Mutex::new(Segments {
                unpopulated: (0..count as u32).collect(),
                ..Default::default()
            }),
            heads: Default::default(),
            evacuation_heads: Default::default(),
            budget_segments: AtomicUsize::new(config.budget.div_ceil(SEGMENT).max(1)),
            slots: SlotTable::default(),
            counters: ArenaCounters::default(),
            demand: Default::default(),
            low_space: Default::default(),
            watermarks: Mutex::new((0.0, 0.0)),
            aged_at: AtomicU64::new(0),
            evacuator_threads: AtomicUsize::new(1),
            pass: Mutex::new(()),
            parents: Default::default(),
            has_parents: Default::default(),
            huge_pages,
            memory,
        });
        Ok(arena)
    }

    /// What the arena has done so far.
    pub fn counters(&self) -> &ArenaCounters {
        &self.counters
    }

    /// The memfd behind the arena.
    pub fn memfd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.memory.memfd()
    }

    /// Whether segments are backed by 2 MiB pages (the machine's shmem huge-page policy).
    pub fn huge_pages(&self) -> ShmemHugePages {
        self.huge_pages
    }

    /// Sets the evacuator's watermarks as shares of the budget (at least one and two
    /// segments): allocation rings [`SoftArena::low_space`] when free segments fall to `low`.
    pub fn set_watermarks(&self, low: f64, high: f64) {
        *self.watermarks.lock() = (low, high);
    }

    /// The evacuator's watermarks in segments (they follow the budget); (0, 0) without an
    /// evacuator.
    pub fn watermarks(&self) -> (usize, usize) {
        let (low, high) = *self.watermarks.lock();
        if high == 0.0 {
            return (0, 0);
        }
        let b = self.budget_segments() as f64;
        let low = ((low * b).ceil() as usize).max(1);
        (low, ((high * b).ceil() as usize).max(low + 1))
    }

    pub(crate) fn set_budget_segments(&self, segments: usize) {
        self.budget_segments.store(segments.max(1), Relaxed);
    }

    pub(crate) fn budget_segments(&self) -> usize {
        self.budget_segments.load(Relaxed)
    }

    /// The budget in bytes.
    pub fn budget(&self) -> usize {
        self.budget_segments.load(Relaxed) * SEGMENT
    }

    /// Bytes of memory the arena's segments hold now.
    pub fn usage(&self) -> usize {
        self.segments.lock().populated * SEGMENT
    }

    /// Changes the budget; shrinking gives memory back at once (free segments first, then the
    /// oldest, whose objects are lost; then, if that is not enough, the segments threads are
    /// allocating from, which they replace on their next allocation). A budget of 0 takes
    /// every object back. An `auto` budget moves on from the new value: stop it first
    /// ([`crate::SoftRuntime::stop_auto_budget`]) to keep a fixed one.
    pub fn set_budget(&self, bytes: usize) {
        // Allocation always has a segment to go to, but a cut to nothing keeps none.
        let target = bytes.div_ceil(SEGMENT);
        self.budget_segments.store(target.max(1), Relaxed);
        let mut s = self.segments.lock();
        while s.populated > target && self.shed(&mut s) {}
        if s.populated > target {
            drop(s);
            self.close_heads();
            let mut s = self.segments.lock();
            while s.populated > target && self.shed(&mut s) {}
        }
    }

    /// Ends every allocation head's segment, so that it can be shed.
    pub(crate) fn close_heads(&self) {
        // Heads before segments, the order allocation takes them in.
        for head in self.heads.iter().chain(self.evacuation_heads.iter()) {
            let mut h = head.lock();
            let mut s = self.segments.lock();
            self.close(&mut s, &mut h);
        }
    }

    /// Marks the objects of segments evicted whole as dropped too, for the ghost hits a
    /// coordinator reads (a walk of each such segment, so only when someone reads them).
    pub fn track_dropped_segments(&self) {
        self.demand.track_segments.store(true, Relaxed);
    }

    /// Splits the copying of each evacuation pass between `threads` threads (at most
    /// [`MAX_EVACUATORS`]).
    pub fn set_evacuation_threads(&self, threads: usize) {
        self.evacuator_threads
            .store(threads.clamp(1, MAX_EVACUATORS), Relaxed);
    }

    /// What an evacuator waits on: rung when allocation finds few free segments.
    pub fn low_space(&self) -> &Arc<Doorbell> {
        &self.low_space
    }

    /// Bytes of address space (the arena's maximum).
    pub fn capacity(&self) -> usize {
        self.memory.bytes()
    }

    pub(crate) fn set_parent(&self, child: u32, parent: u32, generation: u16) {
        self.parents.write().insert(child, (parent, generation));
        self.has_parents.store(true, Relaxed);
    }

    pub(crate) fn clear_parent(&self, child: u32) {
        self.parents.write().remove(&child);
    }

    /// The parent of a child slot whose parent's object is gone (the child must go too).
    pub(crate) fn orphaned(&self, child: u32) -> bool {
        if !self.has_parents.load(Relaxed) {
            return false;
        }
        match self.parents.read().get(&child) {
            Some(&(slot, generation)) => !self.present(slot, generation),
            None => false,
        }
    }

    /// Whether the object of `slot` (in `generation`) is in soft memory, as far as the slot
    /// and its segment's incarnation tell.
    pub(crate) fn present(&self, slot: u32, generation: u16) -> bool {
        let w = self.slots.get(slot).load(Acquire);
        slots::state(w) == slots::LIVE
            && slots::generation(w) == generation
            && self.incarnation(slots::location(w)) == slots::incarnation(w)
    }

    /// The incarnation a segment is in (low bits, as slots keep it).
    pub(crate) fn incarnation(&self, offset: usize) -> u32 {
        self.meta[offset / SEGMENT].incarnation.load(Acquire) & INC_MASK
    }

    // ---- demand ---------------------------------------------------------------------------

    /// The evacuator dropped slot `slot`'s object (`bytes` long) as cold.
    pub(crate) fn dropped_cold(&self, slot: u32, bytes: usize) {
        let before = self.demand.bytes_dropped.fetch_add(bytes as u64, Relaxed);
        let mark = ((before >> MARK_SHIFT) as u32).wrapping_add(1).max(1);
        self.slots.mark_dropped(slot, mark);
    }

    /// A closed segment (or run) is about to be evicted whole to make room: its live objects
    /// are dropped as the evacuator would drop them, marks included (call before the
    /// eviction bumps its incarnation).
    pub(crate) fn dropping_segment(&self, seg: u32) {
        // A walk of the segment's headers (tens of thousands for small objects) under the
        // segment lock: only when a coordinator reads the ghost hits.
        if !self.demand.track_segments.load(Relaxed) {
            return;
        }
        let mut live = Vec::new();
        let walked = self.walk_live(seg, |slot, total| live.push((slot, total)));
        if walked.is_err() {
            return; // revoked: nothing of it to remember
        }
        for (slot, total) in live {
            self.dropped_cold(slot, total);
        }
    }

    /// A reconstruction of slot `slot`'s object (if it has one) took `nanos`.
    pub(crate) fn rebuilt(&self, slot: Option<u32>, nanos: u64) {
        let d = &self.demand;
        d.reconstructions.fetch_add(1, Relaxed);
        d.reconstruct_nanos.fetch_add(nanos, Relaxed);
        let Some(mark) = slot.and_then(|s| self.slots.take_dropped(s)) else {
            return;
        };
        let now = (d.bytes_dropped.load(Relaxed) >> MARK_SHIFT) as u32;
        let distance = (now.wrapping_sub(mark.wrapping_sub(1)) as u64) << MARK_SHIFT;
        let k = ghost_bucket(distance);
        d.ghost_hits[k].fetch_add(1, Relaxed);
        d.ghost_nanos[k].fetch_add(nanos, Relaxed);
    }

    /// Hits, misses, reconstruction time and ghost hits so far.
    pub fn demand(&self) -> DemandStats {
        self.demand.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_miss_on_a_dropped_object_is_a_ghost_hit_at_its_distance() {
        let arena = SoftArena::new(ArenaConfig::default()).unwrap();
        arena.dropped_cold(7, 4096);
        arena
            .demand
            .bytes_dropped
            .fetch_add(4 << 20, std::sync::atomic::Ordering::Relaxed); // 4 MiB dropped after it
        arena.rebuilt(Some(7), 1000);
        arena.rebuilt(Some(7), 500); // rebuilt again: no longer a ghost
        arena.rebuilt(Some(8), 10); // never dropped
        arena.rebuilt(None, 10);
        let d = arena.demand();
        assert_eq!(d.reconstructions, 4);
        assert_eq!(d.reconstruct_nanos, 1520);
        // 4 MiB + 4 KiB: bucket 3 (4-8 MiB).
        assert_eq!(d.ghost_hits.iter().sum::<u64>(), 1);
        assert_eq!(d.ghost_hits[3], 1);
        assert_eq!(d.ghost_nanos[3], 1000);
    }
}
