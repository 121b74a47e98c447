//! The soft arena: one memfd per arena, cut into segments (2 MiB) that objects are appended
//! to, log-structured, from a few allocation heads (a thread keeps to one head).
//!
//! Segment metadata lives in normal memory. Each segment has an incarnation number, bumped
//! whenever its contents stop being what slots say they are (evicted for reuse, revoked): a
//! slot records the incarnation its object was written in, so a reader notices a reused or
//! revoked segment without the segment being walked, and a punched segment is never
//! repopulated while a stale slot could mistake new bytes for its object.

use crate::resilient::{self, Lost};
use crate::slots::{self, SlotTable};
use crate::sys::{ArenaMap, ShmemHugePages};
use crate::SoftError;
use parking_lot::Mutex;
use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{
    fence, AtomicI64, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::*,
};
use std::sync::Arc;

/// Bytes of a segment.
pub const SEGMENT: usize = 2 << 20;
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

/// How to size an arena.
#[derive(Debug, Clone)]
pub struct ArenaConfig {
    /// Most bytes of memory the arena's segments may hold at once.
    pub budget: usize,
    /// Address space reserved for the arena (no memory until populated); at most 64 GiB.
    pub max_bytes: usize,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        ArenaConfig {
            budget: 256 << 20,
            max_bytes: 64 << 30,
        }
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

/// Counters of an arena.
#[derive(Debug, Default)]
pub struct ArenaCounters {
    pub segments_populated: AtomicU64,
    pub segments_evicted: AtomicU64,
    /// Segments evicted whole because allocation found no free one (the evacuator was
    /// behind): their warm objects were lost with the cold.
    pub direct_evictions: AtomicU64,
    pub segments_revoked: AtomicU64,
    pub bytes_allocated: AtomicU64,
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
    map: ArenaMap,
    registration: usize,
    pub(crate) meta: Box<[SegmentMeta]>,
    pub(crate) segments: Mutex<Segments>,
    heads: [Mutex<Head>; HEADS],
    /// Where the evacuator's threads copy live objects to: one head each.
    pub(crate) evacuation_heads: [Mutex<Head>; MAX_EVACUATORS],
    budget_segments: AtomicUsize,
    /// `resilient::forks()` when the arena was made: in a forked child it is not mapped.
    forks: usize,
    pub(crate) slots: SlotTable,
    pub(crate) counters: ArenaCounters,
    /// What its memory is worth (for the coordinator).
    pub(crate) demand: crate::demand::Demand,
    pub(crate) evacuator_idle: Arc<crate::evacuator::Doorbell>,
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
    parents: parking_lot::RwLock<std::collections::HashMap<u32, (u32, u16)>>,
    has_parents: std::sync::atomic::AtomicBool,
    huge_pages: ShmemHugePages,
    /// Bumped by every start and stop of an `auto` budget: a budget thread steps, holding
    /// the lock, while the number is the one it started with.
    pub(crate) auto_epoch: Mutex<u64>,
}

static NEXT_HEAD: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static MY_HEAD: usize = NEXT_HEAD.fetch_add(1, Relaxed) % HEADS;
}

impl SoftArena {
    /// Creates an arena: reserves its address space and registers it; no memory yet.
    pub fn new(config: ArenaConfig) -> Result<Arc<SoftArena>, SoftError> {
        let max = config.max_bytes.clamp(SEGMENT, 64 << 30) / SEGMENT * SEGMENT;
        let map = ArenaMap::create(max, SEGMENT).map_err(SoftError::Arena)?;
        let registration = resilient::register_arena(map.base(), map.base() + map.bytes())
            .ok_or(SoftError::TooManyArenas)?;
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
            forks: resilient::forks(),
            slots: SlotTable::default(),
            counters: ArenaCounters::default(),
            demand: Default::default(),
            evacuator_idle: Default::default(),
            watermarks: Mutex::new((0.0, 0.0)),
            aged_at: AtomicU64::new(0),
            evacuator_threads: AtomicUsize::new(1),
            pass: Mutex::new(()),
            parents: Default::default(),
            has_parents: Default::default(),
            huge_pages,
            auto_epoch: Mutex::new(0),
            map,
            registration,
        });
        crate::coord::join_from_env(&arena);
        Ok(arena)
    }

    /// What the arena has done so far.
    pub fn counters(&self) -> &ArenaCounters {
        &self.counters
    }

    /// The memfd behind the arena.
    pub fn memfd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.map.memfd()
    }

    /// Whether segments are backed by 2 MiB pages (the machine's shmem huge-page policy).
    pub fn huge_pages(&self) -> ShmemHugePages {
        self.huge_pages
    }

    /// Sets the evacuator's watermarks as shares of the budget (at least one and two
    /// segments).
    pub(crate) fn set_watermarks(&self, low: f64, high: f64) {
        *self.watermarks.lock() = (low, high);
    }

    /// The evacuator's watermarks in segments (they follow the budget); (0, 0) without an
    /// evacuator.
    pub(crate) fn watermarks(&self) -> (usize, usize) {
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
    /// ([`SoftArena::stop_auto_budget`]) to keep a fixed one.
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
    fn close_heads(&self) {
        // Heads before segments, the order allocation takes them in.
        for head in self.heads.iter().chain(self.evacuation_heads.iter()) {
            let mut h = head.lock();
            let mut s = self.segments.lock();
            self.close(&mut s, &mut h);
        }
    }

    pub(crate) fn address(&self, offset: usize) -> usize {
        self.map.base() + offset
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

    // ---- objects ---------------------------------------------------------------------------

    /// Writes an object for `slot` (header, then `len` bytes from `src`) into new space;
    /// where it went.
    ///
    /// # Safety
    ///
    /// `src` is valid for reads of `len` bytes.
    pub(crate) unsafe fn append(
        &self,
        slot: u32,
        generation: u16,
        src: *const u8,
        len: usize,
    ) -> Result<Placement, SoftError> {
        if resilient::forks() != self.forks {
            return Err(SoftError::Forked);
        }
        if len > u32::MAX as usize {
            return Err(SoftError::TooLarge {
                bytes: len,
                budget: self.budget(),
            });
        }
        let total = (HEADER + len).next_multiple_of(16);
        let header = [tag(slot, generation), len as u64];
        loop {
            let at = self.allocate(total)?;
            let addr = self.address(at.offset);
            // The segment's incarnation bump (when it was last evicted) happens before this
            // write; the fence makes a reader that sees the bytes also see the bump (it
            // checks after an acquire fence). No instruction on x86.
            fence(Release);
            // SAFETY: [addr, addr + total) was just allocated to us inside the arena; `header`
            // is ours and `src` is the caller's; a revoked page is reported, not faulted on.
            let written = unsafe {
                resilient::copy(addr as *mut u8, header.as_ptr().cast(), HEADER)
                    .and_then(|()| resilient::copy((addr + HEADER) as *mut u8, src, len))
            };
            self.meta[at.offset / SEGMENT].writers.fetch_sub(1, Release);
            match written {
                Ok(()) => return Ok(at),
                // The segment was revoked under us: it is gone; take another.
                Err(Lost) => self.revoked(at),
            }
        }
    }

    /// Copies the payload of the object at `offset` into `sink` after checking that its
    /// header names `slot` and `generation` and that the sink takes its length; returns the
    /// payload length and the header. `Err(Lost)` if a page of it was revoked or
    /// something else is there now. The bytes may be torn by a concurrent reuse of the
    /// segment: the caller checks the incarnation again afterwards.
    pub(crate) fn read(
        &self,
        offset: usize,
        slot: u32,
        generation: u16,
        sink: &mut impl Sink,
    ) -> Result<(usize, [u64; 2]), Lost> {
        let header = self.header(offset, slot, generation)?;
        let len = header[1] as u32 as usize;
        let dst = sink.prepare(len).ok_or(Lost)?;
        // SAFETY: the header said `len` bytes follow, inside the arena (checked in `header`),
        // whose mapping lives as long as `self`; revoked pages are reported; the sink gave
        // room for `len` bytes at `dst`.
        unsafe { resilient::copy(dst, (self.address(offset) + HEADER) as *const u8, len)? };
        Ok((len, header))
    }

    /// The header at `offset`, if readable, naming `slot`, and describing an object inside
    /// the arena.
    fn header(&self, offset: usize, slot: u32, generation: u16) -> Result<[u64; 2], Lost> {
        let mut header = [0u64; 2];
        if offset + HEADER > self.map.bytes() {
            return Err(Lost);
        }
        // SAFETY: the header lies inside the arena (checked just above), whose mapping lives
        // as long as `self`; revoked pages are reported; `header` is ours.
        unsafe {
            resilient::copy(
                header.as_mut_ptr().cast(),
                self.address(offset) as *const u8,
                HEADER,
            )?
        };
        if header[0] != tag(slot, generation)
            || offset + HEADER + header[1] as u32 as usize > self.map.bytes()
        {
            return Err(Lost);
        }
        Ok(header)
    }

    /// The payload length of the object at `offset`, if its segment is still in
    /// `incarnation` and the header is readable.
    pub(crate) fn object_bytes(&self, offset: usize, incarnation: u32) -> Option<usize> {
        if self.incarnation(offset) != incarnation || offset + HEADER > self.map.bytes() {
            return None;
        }
        let mut h = [0u64; 2];
        // SAFETY: inside the arena (checked above); revoked pages are reported.
        unsafe {
            resilient::copy(
                h.as_mut_ptr().cast(),
                self.address(offset) as *const u8,
                HEADER,
            )
            .ok()?
        };
        (h[0] >> 48 == MAGIC).then_some(h[1] as u32 as usize)
    }

    /// An object of `len` payload bytes at `offset` is no longer referenced.
    pub(crate) fn forget(&self, offset: usize, incarnation: u32, len: usize) {
        let m = &self.meta[offset / SEGMENT];
        if m.incarnation.load(Acquire) & INC_MASK == incarnation {
            m.live
                .fetch_sub((HEADER + len).next_multiple_of(16) as i64, Relaxed);
        }
    }

    // ---- segments --------------------------------------------------------------------------

    fn allocate(&self, total: usize) -> Result<Placement, SoftError> {
        self.counters
            .bytes_allocated
            .fetch_add(total as u64, Relaxed);
        if total > SEGMENT {
            return self.allocate_large(total);
        }
        let mut head = self.heads[MY_HEAD.with(|h| *h)].lock();
        if let Some(at) = self.bump(&mut head, total) {
            return Ok(at);
        }
        let mut s = self.segments.lock();
        self.close(&mut s, &mut head);
        let mut waits = 0;
        let seg = loop {
            match self.take_segment(&mut s) {
                Ok(seg) => break seg,
                // Everything evictable has a copy in flight (it cannot be reused until that
                // lands, a matter of microseconds): wait for one rather than fail.
                Err(SoftError::OutOfBudget { .. })
                    if waits < 100_000 && self.copies_in_flight(&s) =>
                {
                    drop(s);
                    std::thread::yield_now();
                    waits += 1;
                    s = self.segments.lock();
                }
                Err(e) => return Err(e),
            }
        };
        drop(s);
        Ok(self.start_head(&mut head, seg, total))
    }

    /// Whether some closed segment still has a copy in flight.
    fn copies_in_flight(&self, s: &Segments) -> bool {
        s.closed
            .iter()
            .any(|&c| self.meta[c as usize].writers.load(Acquire) != 0)
    }

    /// `total` bytes from a head's segment, if they fit; the segment counts one more writer.
    pub(crate) fn bump(&self, head: &mut Head, total: usize) -> Option<Placement> {
        let seg = head.segment?;
        if head.offset + total > (seg as usize + 1) * SEGMENT {
            return None;
        }
        let offset = head.offset;
        head.offset += total;
        let m = &self.meta[seg as usize];
        m.live.fetch_add(total as i64, Relaxed);
        m.writers.fetch_add(1, Acquire);
        Some(Placement {
            offset,
            incarnation: m.incarnation.load(Acquire) & INC_MASK,
        })
    }

    /// Makes an empty segment a head's, with its first `total` bytes allocated.
    pub(crate) fn start_head(&self, head: &mut Head, seg: u32, total: usize) -> Placement {
        let m = &self.meta[seg as usize];
        m.kind.store(ACTIVE, Relaxed);
        m.live.store(0, Relaxed);
        head.segment = Some(seg);
        head.offset = seg as usize * SEGMENT;
        self.bump(head, total)
            .expect("an object fits in an empty segment")
    }

    /// Gives one segment (or run) back to the system: a free one, else the coldest closed
    /// one, whose objects are lost. `false` if only allocation heads are left.
    fn shed(&self, s: &mut Segments) -> bool {
        if let Some(seg) = s.free.pop() {
            self.release(s, seg);
        } else if let Some(seg) = self.pop_quiet_closed(s) {
            if self.meta[seg as usize].kind.load(Relaxed) != REVOKED {
                self.dropping_segment(seg);
            }
            self.evict(seg);
            self.release(s, seg);
        } else {
            return false;
        }
        true
    }

    /// The first closed segment (coldest, or oldest) that no writer is still copying into.
    /// A segment with a copy in flight is never evicted, released or reused: the late copy
    /// would land in whatever was put there next.
    fn pop_quiet_closed(&self, s: &mut Segments) -> Option<u32> {
        let i = s
            .closed
            .iter()
            .position(|&c| self.meta[c as usize].writers.load(Acquire) == 0)?;
        s.closed.remove(i)
    }

    /// Ends a head's segment: it joins the closed list, to be scanned and compacted.
    pub(crate) fn close(&self, s: &mut Segments, head: &mut Head) {
        if let Some(old) = head.segment.take() {
            let m = &self.meta[old as usize];
            m.end.store(head.offset - old as usize * SEGMENT, Relaxed);
            m.kind.store(CLOSED, Relaxed);
            s.closed.push_back(old);
        }
    }

    /// A populated, empty segment: a free one, a new one within the budget, or the coldest
    /// closed one, evicted.
    fn take_segment(&self, s: &mut Segments) -> Result<u32, SoftError> {
        // Closed segments whose objects all died are free for the taking.
        if let Some(i) = s.closed.iter().position(|&c| {
            let m = &self.meta[c as usize];
            m.live.load(Relaxed) <= 0
                && m.writers.load(Acquire) == 0
                && m.kind.load(Relaxed) == CLOSED
        }) {
            let seg = s.closed.remove(i).expect("index from position");
            if self.meta[seg as usize].run.load(Relaxed) <= 1 {
                self.evict(seg);
                return Ok(seg);
            }
            self.evict(seg);
            self.release(s, seg);
        }
        let free = s.free.len() + self.budget_segments().saturating_sub(s.populated);
        if free <= self.watermarks().0 {
            self.evacuator_idle.ring();
        }
        if let Some(seg) = s.free.pop() {
            return Ok(seg);
        }
        if s.populated < self.budget_segments.load(Relaxed) {
            if let Some(seg) = s.unpopulated.pop_first() {
                return self.populate(s, seg, 1).map(|()| seg);
            }
        }
        // The evacuator is behind: take the coldest segment (direct reclamation).
        while let Some(seg) = self.pop_quiet_closed(s) {
            self.counters.direct_evictions.fetch_add(1, Relaxed);
            let revoked = self.meta[seg as usize].kind.load(Relaxed) == REVOKED;
            if !revoked {
                self.dropping_segment(seg);
            }
            self.evict(seg);
            if self.meta[seg as usize].run.load(Relaxed) <= 1 && !revoked {
                return Ok(seg);
            }
            // A large object's run, or a revoked segment (holes where its pages were): give
            // it back and look again.
            self.release(s, seg);
            if s.populated < self.budget_segments.load(Relaxed) {
                if let Some(seg) = s.unpopulated.pop_first() {
                    return self.populate(s, seg, 1).map(|()| seg);
                }
            }
        }
        Err(SoftError::OutOfBudget {
            budget: self.budget(),
        })
    }

    fn allocate_large(&self, total: usize) -> Result<Placement, SoftError> {
        let n = total.div_ceil(SEGMENT) as u32;
        let mut s = self.segments.lock();
        if n as usize > self.budget_segments.load(Relaxed) {
            return Err(SoftError::TooLarge {
                bytes: total,
                budget: self.budget(),
            });
        }
        // A run of the same length whose object died (an overwritten large value): reuse it
        // as it is, populated, instead of punching one run and populating another.
        if let Some(i) = s.closed.iter().position(|&c| {
            let m = &self.meta[c as usize];
            m.run.load(Relaxed) == n
                && m.live.load(Relaxed) <= 0
                && m.writers.load(Acquire) == 0
                && m.kind.load(Relaxed) == CLOSED
        }) {
            let first = s.closed.remove(i).expect("index from position");
            let m = &self.meta[first as usize];
            m.incarnation.fetch_add(1, Release);
            m.live.store(total as i64, Relaxed);
            m.end.store(total, Relaxed);
            m.writers.fetch_add(1, Acquire);
            s.closed.push_back(first);
            return Ok(Placement {
                offset: first as usize * SEGMENT,
                incarnation: m.incarnation.load(Acquire) & INC_MASK,
            });
        }
        while s.populated + n as usize > self.budget_segments.load(Relaxed) {
            if !self.shed(&mut s) {
                return Err(SoftError::OutOfBudget {
                    budget: self.budget(),
                });
            }
        }
        // The first run of n unpopulated segments.
        let mut run_start = None;
        let (mut start, mut len) = (0u32, 0u32);
        for &seg in s.unpopulated.iter() {
            if len > 0 && seg == start + len {
                len += 1;
            } else {
                start = seg;
                len = 1;
            }
            if len == n {
                run_start = Some(start);
                break;
            }
        }
        let first = run_start.ok_or(SoftError::AddressSpace { bytes: total })?;
        for seg in first..first + n {
            s.unpopulated.remove(&seg);
        }
        self.populate(&mut s, first, n)?;
        for seg in first + 1..first + n {
            self.meta[seg as usize].kind.store(CONTINUATION, Relaxed);
        }
        let m = &self.meta[first as usize];
        m.kind.store(CLOSED, Relaxed);
        m.run.store(n, Relaxed);
        m.live.store(total as i64, Relaxed);
        m.end.store(total, Relaxed);
        m.writers.fetch_add(1, Acquire);
        s.closed.push_back(first);
        Ok(Placement {
            offset: first as usize * SEGMENT,
            incarnation: m.incarnation.load(Acquire) & INC_MASK,
        })
    }

    /// Backs a run of segments with memory; on failure they go back to unpopulated.
    pub(crate) fn populate(&self, s: &mut Segments, first: u32, n: u32) -> Result<(), SoftError> {
        if let Err(e) = self
            .map
            .populate(first as usize * SEGMENT, n as usize * SEGMENT)
        {
            s.unpopulated.extend(first..first + n);
            return Err(SoftError::Populate(e));
        }
        s.populated += n as usize;
        self.counters
            .segments_populated
            .fetch_add(n as u64, Relaxed);
        for seg in first..first + n {
            let m = &self.meta[seg as usize];
            m.kind.store(FREE, Relaxed);
            m.run.store(1, Relaxed);
            m.live.store(0, Relaxed);
        }
        Ok(())
    }

    /// Ends the current contents of a segment (run): slots naming them now read as lost.
    pub(crate) fn evict(&self, seg: u32) {
        let m = &self.meta[seg as usize];
        // The bump is ordered before any later write into the segment (x86 keeps stores in
        // order, and the copy that writes is an opaque call), so a reader that saw new bytes
        // sees the new incarnation when it checks after copying.
        m.incarnation.fetch_add(1, Release);
        m.live.store(0, Relaxed);
        m.kind.store(FREE, Relaxed);
        self.counters.segments_evicted.fetch_add(1, Relaxed);
    }

    /// Returns an evicted segment (run) to the system.
    pub(crate) fn release(&self, s: &mut Segments, seg: u32) {
        let n = self.meta[seg as usize].run.load(Relaxed).max(1);
        // Errors cannot happen for a valid range of our own memfd; if one did, the memory
        // would stay populated, which costs memory but never correctness.
        let _ = self.map.punch(seg as usize * SEGMENT, n as usize * SEGMENT);
        for i in seg..seg + n {
            let m = &self.meta[i as usize];
            m.kind.store(UNPOPULATED, Relaxed);
            m.run.store(1, Relaxed);
            s.unpopulated.insert(i);
        }
        s.populated -= n as usize;
    }

    /// A write found the segment at `offset` revoked behind our back (a coordinator punched
    /// it): retire it so nothing is allocated there until it is populated afresh.
    pub(crate) fn revoked(&self, at: Placement) {
        let seg = (at.offset / SEGMENT) as u32;
        // Heads before the segment list, as `allocate` takes them: no head may keep
        // allocating from a revoked segment.
        let mut heads: Vec<_> = self
            .heads
            .iter()
            .chain(self.evacuation_heads.iter())
            .map(|h| h.lock())
            .collect();
        let mut s = self.segments.lock();
        let m = &self.meta[seg as usize];
        if self.incarnation(at.offset) != at.incarnation
            || matches!(m.kind.load(Relaxed), UNPOPULATED | REVOKED)
        {
            return; // someone else retired it already
        }
        for h in heads.iter_mut() {
            if h.segment == Some(seg) {
                h.segment = None;
            }
        }
        s.free.retain(|&c| c != seg);
        if !s.closed.contains(&seg) {
            s.closed.push_back(seg);
        }
        // Out of circulation until writers still copying into it are done: then the
        // evacuator or direct reclamation gives it back (never reuses it as it is).
        self.evict(seg);
        m.kind.store(REVOKED, Relaxed);
        self.counters.segments_revoked.fetch_add(1, Relaxed);
    }

    /// Revokes the first closed segment (the coldest after an evacuation pass, else the
    /// oldest) by punching its hole, as direct reclamation does; its objects read as lost.
    /// Returns the bytes given back.
    pub fn punch_oldest(&self) -> usize {
        let mut s = self.segments.lock();
        let Some(seg) = self.pop_quiet_closed(&mut s) else {
            return 0;
        };
        let n = self.meta[seg as usize].run.load(Relaxed).max(1) as usize;
        self.evict(seg);
        self.release(&mut s, seg); // punches the hole
        self.counters.segments_revoked.fetch_add(1, Relaxed);
        n * SEGMENT
    }

    /// Punches holes in pages of the arena chosen by the caller, without telling the runtime:
    /// an uncooperative coordinator. For tests. `offset` and `len` are page-aligned.
    pub fn punch_behind_back(&self, offset: usize, len: usize) -> std::io::Result<()> {
        self.map.punch(offset, len)
    }

    /// Bytes of address space (the arena's maximum).
    pub fn capacity(&self) -> usize {
        self.map.bytes()
    }
}

impl Drop for SoftArena {
    fn drop(&mut self) {
        resilient::unregister_arena(self.registration);
    }
}

/// Where a read puts an object's bytes.
///
/// # Safety
///
/// `prepare` returns a pointer valid for writes of `len` bytes, or `None`.
pub(crate) unsafe trait Sink {
    /// Room for `len` bytes (or `None`: this is not the object the reader expects).
    fn prepare(&mut self, len: usize) -> Option<*mut u8>;
    /// The bytes are in and validated.
    fn done(&mut self, len: usize);
}

/// A sink of one fixed length.
pub(crate) struct Exact {
    dst: *mut u8,
    len: usize,
}

impl Exact {
    /// # Safety
    ///
    /// `dst` is valid for writes of `len` bytes for as long as the sink is used.
    pub unsafe fn new(dst: *mut u8, len: usize) -> Exact {
        Exact { dst, len }
    }
}

// SAFETY: `dst` is valid for `len` bytes (the contract of `Exact::new`).
unsafe impl Sink for Exact {
    fn prepare(&mut self, len: usize) -> Option<*mut u8> {
        (len == self.len).then_some(self.dst)
    }
    fn done(&mut self, _: usize) {}
}

// SAFETY: the pointer is to the vector's own reserved capacity.
unsafe impl Sink for Vec<u8> {
    fn prepare(&mut self, len: usize) -> Option<*mut u8> {
        self.clear();
        self.reserve(len);
        Some(self.as_mut_ptr())
    }
    fn done(&mut self, len: usize) {
        // SAFETY: `prepare` reserved `len` bytes and the copy filled them.
        unsafe { self.set_len(len) };
    }
}

/// A header's first word: who the object belongs to.
pub(crate) fn tag(slot: u32, generation: u16) -> u64 {
    (MAGIC << 48) | ((generation as u64) << 32) | slot as u64
}

/// The slot word for an object placed at `at`.
pub(crate) fn live_word(generation: u16, at: Placement) -> u64 {
    slots::word(slots::LIVE, generation, at.offset, at.incarnation)
}
