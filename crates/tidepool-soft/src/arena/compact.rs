//! Evacuation passes (Midas §4.2.2; the runtime's evacuator thread runs them): they scan
//! closed segments, compact the ones that free the most for the least copying, drop cold
//! objects, and order segments coldest first so that direct reclamation takes the coldest.
//!
//! Hotness is a byte per object, kept beside its slot: reads and writes raise it by one, and
//! it halves each time the arena has allocated two budgets' worth since the last halving (an
//! LFU with decay, which keeps a skewed working set much better than CLOCK's one bit). It
//! stays with the slot when the object is dropped as cold, so a rebuilt object goes on from
//! the standing it had rather than being judged afresh each time it returns. A pass that must free `need`
//! bytes:
//!
//! 1. **Scans** every closed segment (read-only): which objects are live (their slot names
//!    this very copy), and their bytes by hotness class (0, 1, 2-3, 4-7, ... 128-255).
//! 2. **Chooses a threshold**: the lowest class such that dropping every live object at or
//!    under it, from the segments where that leaves least to move, frees `need` bytes net.
//!    Dead objects are always dropped.
//! 3. **Compacts** those segments: objects over the threshold are copied to the evacuation
//!    head and their slots switched by compare-and-swap (a writer that got there first wins,
//!    and the copy is dropped); the rest are dropped (their slots read as lost). The emptied
//!    segment is evicted and freed.
//! 4. **Orders** the closed list by hotness, coldest first, and ages (halves) hotness when
//!    aging is due.
//!
//! Readers need no coordination: a reader holding the old location reads intact bytes until
//! the segment is reused, which bumps its incarnation first.

use super::objects::tag;
use super::{Placement, SoftArena, CLOSED, HEADER, INC_MASK, REVOKED, SEGMENT};
use crate::resilient::Lost;
use crate::slots::{self, LIVE, LOST};
use crate::sync::fence;
use crate::SoftError;
use std::sync::atomic::Ordering::*;

/// What one evacuation pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EvacuationReport {
    pub segments_scanned: u64,
    pub segments_freed: u64,
    pub objects_moved: u64,
    pub bytes_moved: u64,
    /// Cold objects dropped.
    pub objects_dropped: u64,
}

/// One object found by a walk.
struct Found {
    offset: usize,
    total: usize,
    hot: u8,
    /// The slot word naming this copy, if it is live.
    live: Option<(u32, u64)>,
}

impl SoftArena {
    /// Free segments plus room to populate more within the budget.
    pub fn free_segments(&self) -> usize {
        let s = self.segments.lock();
        s.free.len() + self.budget_segments().saturating_sub(s.populated)
    }

    /// Walks the objects of a closed single segment; `Err(Lost)` if it was revoked.
    fn walk(&self, seg: u32, mut f: impl FnMut(Found)) -> Result<(), Lost> {
        let m = &self.meta[seg as usize];
        let start = seg as usize * SEGMENT;
        let end = start + m.end.load(Relaxed).min(SEGMENT);
        let inc = m.incarnation.load(Acquire) & INC_MASK;
        let mut at = start;
        while at + HEADER <= end {
            let mut h = [0u64; 2];
            // SAFETY: the header lies inside the segment, inside the arena; revoked pages are
            // reported; `h` is ours.
            unsafe { self.memory.read(h.as_mut_ptr().cast(), at, HEADER)? };
            let (slot, generation) = (h[0] as u32, (h[0] >> 32) as u16);
            if h[0] != tag(slot, generation) {
                break; // not a header: the segment ends early (cannot happen at rest)
            }
            let len = h[1] as u32 as usize;
            let total = (HEADER + len).next_multiple_of(16);
            let w = self.slots.get(slot).load(Acquire);
            let live = slots::state(w) == LIVE
                && slots::generation(w) == generation
                && slots::location(w) == at
                && slots::incarnation(w) == inc;
            f(Found {
                offset: at,
                total,
                hot: if live { self.slots.hotness(slot) } else { 0 },
                live: live.then_some((slot, w)),
            });
            at += total;
        }
        Ok(())
    }

    /// Calls `f(slot, bytes)` for each live object of a closed segment (or the first of a
    /// run); `Err(Lost)` if it was revoked.
    pub(crate) fn walk_live(&self, seg: u32, mut f: impl FnMut(u32, usize)) -> Result<(), Lost> {
        self.walk(seg, |o| {
            if let Some((slot, _)) = o.live {
                f(slot, o.total)
            }
        })
    }

    /// Compacts at most `max_victims` segments whose live data is at most `max_live` of a
    /// segment (0.0-1.0), lowest first, dropping only dead objects: cooperative reclamation
    /// that keeps every live object.
    pub fn evacuate(&self, max_victims: usize, max_live: f64) -> EvacuationReport {
        let _pass = self.pass.lock();
        let mut report = EvacuationReport::default();
        let mut scanned = self.scan(&mut report);
        scanned.sort_by_key(|x| x.live);
        let limit = (max_live * SEGMENT as f64) as usize;
        let victims: Vec<Scanned> = scanned
            .into_iter()
            .filter(|x| x.live <= limit)
            .take(max_victims)
            .collect();
        self.compact_all(&victims, None, &mut report);
        self.order_closed();
        report
    }

    /// Frees at least `need` bytes net if it can, dropping the coldest live objects as
    /// needed (see the module docs). The evacuator thread's pass.
    pub fn reclaim(&self, need: usize) -> EvacuationReport {
        let _pass = self.pass.lock();
        let mut report = EvacuationReport::default();
        let scanned = self.scan(&mut report);
        // The lowest threshold (None: dead objects only) that frees enough.
        let mut plan = Vec::new();
        let mut chosen = None;
        for threshold in std::iter::once(None).chain((0..CLASSES).map(Some)) {
            plan = Self::plan(&scanned, threshold, need);
            chosen = threshold;
            let freed: usize = plan.iter().map(|x| SEGMENT - x.kept(threshold)).sum();
            if freed >= need {
                break;
            }
        }
        self.compact_all(&plan, chosen, &mut report);
        self.order_closed();
        self.age_if_due();
        report
    }

    /// Victims for a threshold: the segments that keep least, until `need` is freed.
    fn plan(scanned: &[Scanned], threshold: Option<usize>, need: usize) -> Vec<Scanned> {
        let mut by_kept: Vec<&Scanned> = scanned.iter().filter(|x| x.run == 1).collect();
        by_kept.sort_by_key(|x| x.kept(threshold));
        let mut freed = 0;
        let mut plan = Vec::new();
        for x in by_kept {
            if freed >= need {
                break;
            }
            let gain = SEGMENT - x.kept(threshold);
            if gain == 0 {
                break;
            }
            freed += gain;
            plan.push(x.clone());
        }
        // Large objects' runs free whole runs when dropped.
        for x in scanned.iter().filter(|x| x.run > 1) {
            if freed >= need {
                break;
            }
            if x.kept(threshold) == 0 {
                freed += x.run as usize * SEGMENT;
                plan.push(x.clone());
            }
        }
        plan
    }

    /// Reads every closed segment's objects.
    fn scan(&self, report: &mut EvacuationReport) -> Vec<Scanned> {
        let closed: Vec<u32> = self.segments.lock().closed.iter().copied().collect();
        let mut scanned = Vec::with_capacity(closed.len());
        for seg in closed {
            let m = &self.meta[seg as usize];
            if m.writers.load(Acquire) != 0 {
                continue;
            }
            if m.kind.load(Relaxed) == REVOKED {
                self.retire(seg); // its writers are done: give it back
                continue;
            }
            if m.kind.load(Relaxed) != CLOSED {
                continue;
            }
            let mut x = Scanned {
                seg,
                run: m.run.load(Relaxed).max(1),
                live: 0,
                classes: [0; CLASSES],
            };
            let mut hotness = 0u64;
            let walked = self.walk(seg, |o| {
                if o.live.is_some() {
                    x.live += o.total;
                    x.classes[class(o.hot)] += o.total;
                    hotness += o.total as u64 * o.hot as u64;
                }
            });
            if walked.is_err() {
                self.retire(seg);
                continue;
            }
            m.hotness.store(hotness, Relaxed);
            m.live.store(x.live as i64, Relaxed);
            scanned.push(x);
            report.segments_scanned += 1;
        }
        scanned
    }

    fn compact_all(
        &self,
        victims: &[Scanned],
        threshold: Option<usize>,
        report: &mut EvacuationReport,
    ) {
        let threads = self.evacuator_threads.load(Relaxed).max(1);
        if threads > 1 && victims.len() > 1 {
            // The pool: victims split between scoped threads, reports summed.
            let chunk = victims.len().div_ceil(threads);
            let reports: Vec<EvacuationReport> = std::thread::scope(|scope| {
                let handles: Vec<_> = victims
                    .chunks(chunk)
                    .enumerate()
                    .map(|(i, part)| {
                        scope.spawn(move || {
                            let mut r = EvacuationReport::default();
                            self.compact_serial(part, threshold, i, &mut r);
                            r
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            });
            for r in reports {
                report.segments_freed += r.segments_freed;
                report.objects_moved += r.objects_moved;
                report.bytes_moved += r.bytes_moved;
                report.objects_dropped += r.objects_dropped;
            }
            return;
        }
        self.compact_serial(victims, threshold, 0, report);
    }

    /// Compacts victims one after another, copying through evacuation head `head`.
    fn compact_serial(
        &self,
        victims: &[Scanned],
        threshold: Option<usize>,
        head: usize,
        report: &mut EvacuationReport,
    ) {
        for x in victims {
            if x.run > 1 {
                if x.kept(threshold) == 0 {
                    self.drop_objects(x.seg, report);
                    self.free_closed(x.seg);
                    report.segments_freed += 1;
                }
                continue;
            }
            let _ = self.compact(x.seg, threshold, head, report);
        }
    }

    /// Marks the live objects of a segment lost (a large object's run, dropped whole).
    fn drop_objects(&self, seg: u32, report: &mut EvacuationReport) {
        let _ = self.walk(seg, |o| {
            if let Some((slot, w)) = o.live {
                let s = self.slots.get(slot);
                if s.compare_exchange(w, slots::with_state(w, LOST), AcqRel, Relaxed)
                    .is_ok()
                {
                    self.dropped_cold(slot, o.total);
                    report.objects_dropped += 1;
                }
            }
        });
    }

    /// Sorts the closed list coldest first (for direct reclamation).
    fn order_closed(&self) {
        let mut s = self.segments.lock();
        let mut order: Vec<u32> = s.closed.drain(..).collect();
        order.sort_by_key(|&seg| self.meta[seg as usize].hotness.load(Relaxed));
        s.closed.extend(order);
    }

    /// Halves every slot's hotness once [`AGE_BUDGETS`] budgets' worth has been allocated
    /// since the last time.
    fn age_if_due(&self) {
        let allocated = self.counters.bytes_allocated.load(Relaxed);
        let last = self.aged_at.load(Relaxed);
        if allocated.saturating_sub(last) < AGE_BUDGETS * self.budget() as u64 {
            return;
        }
        self.aged_at.store(allocated, Relaxed);
        self.slots.age();
    }

    /// Moves the live objects of `seg` hotter than `threshold` out, drops the others, and
    /// frees it.
    fn compact(
        &self,
        seg: u32,
        threshold: Option<usize>,
        head: usize,
        report: &mut EvacuationReport,
    ) -> Result<(), Lost> {
        let mut objects = Vec::new();
        self.walk(seg, |o| {
            if o.live.is_some() {
                objects.push(o)
            }
        })
        .inspect_err(|_| self.retire(seg))?;
        for o in objects {
            let (slot, w) = o.live.expect("only live objects were kept");
            let s = self.slots.get(slot);
            // Cold, or a child whose parent is gone (cascading eviction): dropped.
            if threshold.is_some_and(|t| class(o.hot) <= t) || self.orphaned(slot) {
                if s.compare_exchange(w, slots::with_state(w, LOST), AcqRel, Relaxed)
                    .is_ok()
                {
                    self.dropped_cold(slot, o.total);
                    report.objects_dropped += 1;
                }
                continue;
            }
            let Ok(to) = self.evacuation_space(o.total, head) else {
                return Err(Lost); // no room to move it: leave the segment be
            };
            // As in `SoftArena::append`: readers that see the copy see the destination's
            // incarnation.
            fence(Release);
            // Both ranges lie inside the arena (`to` was just allocated to us); either may
            // have been revoked, which is reported.
            let copied = self.memory.copy_within(to.offset, o.offset, o.total);
            self.meta[to.offset / SEGMENT].writers.fetch_sub(1, Release);
            match copied {
                Ok(()) => {
                    let moved = slots::word(LIVE, slots::generation(w), to.offset, to.incarnation);
                    if s.compare_exchange(w, moved, AcqRel, Relaxed).is_ok() {
                        report.objects_moved += 1;
                        report.bytes_moved += o.total as u64;
                    } else {
                        self.forget(to.offset, to.incarnation, o.total - HEADER);
                    }
                }
                Err(Lost) => {
                    if self.incarnation(to.offset) != to.incarnation
                        || self.meta[seg as usize].incarnation.load(Acquire) & INC_MASK
                            == slots::incarnation(w)
                    {
                        // The source was revoked: everything in it is gone anyway.
                        self.retire(seg);
                        return Err(Lost);
                    }
                    self.revoked(to);
                }
            }
        }
        self.free_closed(seg);
        report.segments_freed += 1;
        Ok(())
    }

    /// Space for one object in an evacuation head's segment.
    fn evacuation_space(&self, total: usize, head: usize) -> Result<Placement, SoftError> {
        let mut head = self.evacuation_heads[head].lock();
        if let Some(at) = self.bump(&mut head, total) {
            return Ok(at);
        }
        let mut s = self.segments.lock();
        self.close(&mut s, &mut head);
        // The evacuator may go one segment over budget: compaction gives it back.
        let seg = match s.free.pop() {
            Some(seg) => seg,
            None => {
                let seg = s
                    .unpopulated
                    .pop_first()
                    .ok_or(SoftError::AddressSpace { bytes: total })?;
                self.populate(&mut s, seg, 1)?;
                seg
            }
        };
        drop(s);
        Ok(self.start_head(&mut head, seg, total))
    }

    /// A closed segment (or run) holds nothing live any more: evict it and free it, giving
    /// the memory back if the arena is over budget.
    fn free_closed(&self, seg: u32) {
        let mut s = self.segments.lock();
        let Some(i) = s.closed.iter().position(|&c| c == seg) else {
            return;
        };
        s.closed.remove(i);
        self.evict(seg);
        if self.meta[seg as usize].run.load(Relaxed) > 1 || s.populated > self.budget_segments() {
            self.release(&mut s, seg);
        } else {
            s.free.push(seg);
        }
    }

    /// A segment found revoked: out of every list, back to unpopulated.
    fn retire(&self, seg: u32) {
        let mut s = self.segments.lock();
        if let Some(i) = s.closed.iter().position(|&c| c == seg) {
            s.closed.remove(i);
            if self.meta[seg as usize].kind.load(Relaxed) != REVOKED {
                self.counters.segments_revoked.fetch_add(1, Relaxed); // else counted already
            }
            self.evict(seg);
            self.release(&mut s, seg);
        }
    }
}

/// Hotness classes: 0, 1, 2-3, 4-7, ..., 128-255.
const CLASSES: usize = 9;
/// Hotness halves each time this many budgets' worth has been allocated. Slower aging keeps
/// a steady skew better, faster aging follows a shifting one sooner. Zipf 0.99 over 100k
/// 4 KiB objects (`examples/efficiency.rs`), misses at 20 and 50% soft memory, and 15 rounds
/// after the hot half of the keys turned cold (steady: 6.5%): 1 budget, 16.5%, 6.6%, 7.5%;
/// 2 budgets, 15.5%, 6.5%, 8.3%; 4 budgets, 15.0%, 6.5%, 9.3%.
const AGE_BUDGETS: u64 = 2;

fn class(hot: u8) -> usize {
    (u8::BITS - hot.leading_zeros()) as usize
}

/// What a scan found in one closed segment (or large object's run).
#[derive(Debug, Clone)]
struct Scanned {
    seg: u32,
    run: u32,
    /// Bytes of live objects.
    live: usize,
    /// Bytes of live objects by hotness class.
    classes: [usize; CLASSES],
}

impl Scanned {
    /// Bytes compaction would move with this threshold (None: only dead objects dropped).
    fn kept(&self, threshold: Option<usize>) -> usize {
        match threshold {
            None => self.live,
            Some(t) => self.classes[t + 1..].iter().sum(),
        }
    }
}
