//! The evacuator (Midas §4.2.2): scans closed segments, compacts the ones with the least live
//! data into fresh segments, drops cold objects, and orders segments coldest first so that
//! direct reclamation takes the coldest.
//!
//! A pass has three stages:
//!
//! 1. **Scan** every closed segment (read-only): which objects are live (their slot names
//!    this very copy), how many bytes they hold, and the segment's hotness (size times
//!    hotness summed).
//! 2. **Compact** the victims, lowest live ratio first: each live object with hotness is
//!    copied to the evacuation head and its slot switched by compare-and-swap (a writer that
//!    got there first wins, and the copy is dropped); an object that cooled to zero is
//!    dropped (its slot reads as lost). The emptied segment is evicted and freed.
//! 3. **Age** the rest (hotness minus one, CLOCK) and sort the closed list by hotness.
//!
//! Readers need no coordination: a reader holding the old location reads intact bytes until
//! the segment is reused, which bumps its incarnation first.

use crate::arena::*;
use crate::resilient::{self, Lost};
use crate::slots::{self, LIVE, LOST};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
            // reported.
            unsafe {
                resilient::copy(h.as_mut_ptr().cast(), self.address(at) as *const u8, HEADER)?
            };
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
                hot: (h[1] >> HOT_SHIFT) as u8,
                live: live.then_some((slot, w)),
            });
            at += total;
        }
        Ok(())
    }

    /// One evacuation pass, compacting at most `max_victims` segments whose live data is at
    /// most `max_live` of a segment (0.0-1.0).
    pub fn evacuate(&self, max_victims: usize, max_live: f64) -> EvacuationReport {
        let mut report = EvacuationReport::default();
        let closed: Vec<u32> = self.segments.lock().closed.iter().copied().collect();
        // 1. Scan.
        let mut scanned: Vec<(u32, usize, u64)> = Vec::with_capacity(closed.len());
        for &seg in &closed {
            let m = &self.meta[seg as usize];
            if m.kind.load(Relaxed) != CLOSED || m.writers.load(Acquire) != 0 {
                continue;
            }
            // `warm`: live objects compaction would keep; `live`: all of them.
            let (mut warm, mut live, mut hotness) = (0usize, 0usize, 0u64);
            let walked = if m.run.load(Relaxed) > 1 {
                let r = self.walk_large(seg, &mut live, &mut hotness);
                warm = live;
                r
            } else {
                self.walk(seg, |o| {
                    if o.live.is_some() {
                        live += o.total;
                        if o.hot > 0 {
                            warm += o.total;
                            hotness += o.total as u64 * o.hot as u64;
                        }
                    }
                })
            };
            if walked.is_err() {
                self.retire(seg);
                continue;
            }
            m.hotness.store(hotness, Relaxed);
            m.live.store(live as i64, Relaxed);
            let live = warm;
            scanned.push((seg, live, hotness));
            report.segments_scanned += 1;
        }
        // 2. Compact, lowest live ratio first.
        scanned.sort_by_key(|&(_, live, _)| live);
        let limit = (max_live * SEGMENT as f64) as usize;
        let mut victims = Vec::new();
        for &(seg, live, _) in scanned.iter().take_while(|&&(_, live, _)| live <= limit) {
            if victims.len() == max_victims {
                break;
            }
            if self.meta[seg as usize].run.load(Relaxed) > 1 {
                if live == 0 {
                    self.free_closed(seg);
                    report.segments_freed += 1;
                }
                continue;
            }
            let _ = live;
            if self.compact(seg, &mut report).is_ok() {
                victims.push(seg);
            }
        }
        // 3. Age the others and order the closed list coldest first.
        for &(seg, _, _) in &scanned {
            if victims.contains(&seg) || self.meta[seg as usize].run.load(Relaxed) > 1 {
                continue;
            }
            let _ = self.walk(seg, |o| {
                if o.live.is_some() && o.hot > 0 {
                    self.set_hot(o.offset, o.hot - 1);
                }
            });
        }
        let mut s = self.segments.lock();
        let mut order: Vec<u32> = s.closed.drain(..).collect();
        order.sort_by_key(|&seg| self.meta[seg as usize].hotness.load(Relaxed));
        s.closed.extend(order);
        report
    }

    /// A large object's run: live if its slot names it.
    fn walk_large(&self, seg: u32, live: &mut usize, hotness: &mut u64) -> Result<(), Lost> {
        let mut large = None;
        self.walk(seg, |o| large = Some((o.total, o.hot, o.live.is_some())))?;
        if let Some((total, hot, true)) = large {
            *live = total;
            *hotness = total as u64 * hot as u64;
            if hot > 0 {
                self.set_hot(seg as usize * SEGMENT, hot - 1);
            }
        }
        Ok(())
    }

    fn set_hot(&self, offset: usize, hot: u8) {
        // SAFETY: the hotness byte of a header inside the arena; revoked pages are reported,
        // and a lost update of hotness is harmless.
        let _ = unsafe {
            resilient::store_u8(
                (self.address(offset) + 8 + HOT_SHIFT as usize / 8) as *mut u8,
                hot,
            )
        };
    }

    /// Moves the live, warm objects of `seg` out, drops the cold ones, and frees it.
    fn compact(&self, seg: u32, report: &mut EvacuationReport) -> Result<(), Lost> {
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
            if o.hot == 0 || self.orphaned(slot) {
                if s.compare_exchange(w, slots::with_state(w, LOST), AcqRel, Relaxed)
                    .is_ok()
                {
                    report.objects_dropped += 1;
                }
                continue;
            }
            let Ok(to) = self.evacuation_space(o.total) else {
                return Err(Lost); // no room to move it: leave the segment be
            };
            // As in `SoftArena::append`: readers that see the copy see the destination's
            // incarnation.
            std::sync::atomic::fence(Release);
            // SAFETY: both ranges lie inside the arena (`to` was just allocated to us); either
            // may have been revoked, which is reported.
            let copied = unsafe {
                resilient::copy(
                    self.address(to.offset) as *mut u8,
                    self.address(o.offset) as *const u8,
                    o.total,
                )
            };
            self.meta[to.offset / SEGMENT].writers.fetch_sub(1, Release);
            match copied {
                Ok(()) => {
                    // The copy keeps its hotness, less one (CLOCK).
                    self.set_hot(to.offset, o.hot - 1);
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

    /// Space for one object in the evacuation head's segment.
    fn evacuation_space(&self, total: usize) -> Result<Placement, crate::SoftError> {
        let mut head = self.evacuation_head.lock();
        if let Some(seg) = head.segment {
            if head.offset + total <= (seg as usize + 1) * SEGMENT {
                let offset = head.offset;
                head.offset += total;
                let m = &self.meta[seg as usize];
                m.live.fetch_add(total as i64, Relaxed);
                m.writers.fetch_add(1, Acquire);
                return Ok(Placement {
                    offset,
                    incarnation: m.incarnation.load(Acquire) & INC_MASK,
                });
            }
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
                    .ok_or(crate::SoftError::AddressSpace { bytes: total })?;
                self.populate(&mut s, seg, 1)?;
                seg
            }
        };
        drop(s);
        let m = &self.meta[seg as usize];
        m.kind.store(ACTIVE, Relaxed);
        m.live.store(total as i64, Relaxed);
        m.writers.fetch_add(1, Acquire);
        head.segment = Some(seg);
        head.offset = seg as usize * SEGMENT + total;
        Ok(Placement {
            offset: seg as usize * SEGMENT,
            incarnation: m.incarnation.load(Acquire) & INC_MASK,
        })
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
            self.evict(seg);
            self.release(&mut s, seg);
            self.counters.segments_revoked.fetch_add(1, Relaxed);
        }
    }

    /// Starts the evacuator thread: whenever free segments fall under `low` of the budget it
    /// compacts until they reach `high` (or nothing more can be gained). It stops when the
    /// arena is dropped.
    pub fn start_evacuator(self: &Arc<Self>, low: f64, high: f64) -> std::io::Result<()> {
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("tp-evacuator".into())
            .spawn(move || loop {
                let Some(arena) = weak.upgrade() else { return };
                let budget = arena.budget_segments() as f64;
                let mut rounds = 0;
                while (arena.free_segments() as f64) < low * budget && rounds < 64 {
                    let r = arena.evacuate(4, 0.9);
                    rounds += 1;
                    if r.segments_freed == 0 || (arena.free_segments() as f64) >= high * budget {
                        break;
                    }
                }
                let idle = arena.evacuator_idle.clone();
                drop(arena);
                idle.wait(Duration::from_millis(20));
            })?;
        Ok(())
    }
}

/// Wakes the evacuator early (allocation found the free list short).
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    rung: parking_lot::Mutex<bool>,
    cv: parking_lot::Condvar,
}

impl Doorbell {
    pub fn ring(&self) {
        *self.rung.lock() = true;
        self.cv.notify_one();
    }

    fn wait(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut rung = self.rung.lock();
        while !*rung {
            if self.cv.wait_until(&mut rung, deadline).timed_out() {
                break;
            }
        }
        *rung = false;
    }
}
