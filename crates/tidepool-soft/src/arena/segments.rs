//! Segments: allocation from the heads, taking, populating, evicting and releasing
//! segments, and retiring the ones found revoked.

use super::{
    Head, Placement, Segments, SoftArena, ACTIVE, CLOSED, CONTINUATION, FREE, INC_MASK, MY_HEAD,
    REVOKED, SEGMENT, UNPOPULATED,
};
use crate::sync::yield_now;
use crate::SoftError;
use std::sync::atomic::Ordering::*;

impl SoftArena {
    pub(crate) fn allocate(&self, total: usize) -> Result<Placement, SoftError> {
        self.counters
            .bytes_allocated
            .fetch_add(total as u64, Relaxed);
        if total > SEGMENT {
            return self.allocate_large(total);
        }
        let mine = MY_HEAD.with(|h| *h);
        let mut head = self.heads[mine].lock();
        if let Some(at) = self.bump(&mut head, total) {
            return Ok(at);
        }
        let mut s = self.segments.lock();
        self.close(&mut s, &mut head);
        let (mut waits, mut took_over) = (0, false);
        let seg = loop {
            match self.take_segment(&mut s) {
                Ok(seg) => break seg,
                // Everything evictable has a copy in flight (it cannot be reused until that
                // lands, a matter of microseconds): wait for one rather than fail.
                Err(SoftError::OutOfBudget { .. })
                    if waits < 100_000 && self.copies_in_flight(&s) =>
                {
                    drop(s);
                    yield_now();
                    waits += 1;
                    s = self.segments.lock();
                }
                // Other threads' heads hold the whole budget (a budget cut to its floor):
                // close them, so that their segments can be evicted like any other.
                Err(SoftError::OutOfBudget { .. }) if !took_over => {
                    drop(s);
                    self.close_other_heads(mine);
                    took_over = true;
                    s = self.segments.lock();
                }
                Err(e) => return Err(e),
            }
        };
        drop(s);
        Ok(self.start_head(&mut head, seg, total))
    }

    /// Ends the segments of the allocation and evacuation heads other than `mine` that no
    /// thread is using this instant (a head whose lock is held is mid-allocation: it is
    /// skipped rather than waited for, since this thread holds its own head's lock).
    fn close_other_heads(&self, mine: usize) {
        let others = self.heads.iter().enumerate().filter(|&(i, _)| i != mine);
        let evacuation = self.evacuation_heads.iter();
        for head in others.map(|(_, h)| h).chain(evacuation) {
            if let Some(mut h) = head.try_lock() {
                let mut s = self.segments.lock();
                self.close(&mut s, &mut h);
            }
        }
    }

    /// Whether some closed segment still has a copy in flight.
    pub(crate) fn copies_in_flight(&self, s: &Segments) -> bool {
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
    pub(crate) fn shed(&self, s: &mut Segments) -> bool {
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
    pub(crate) fn pop_quiet_closed(&self, s: &mut Segments) -> Option<u32> {
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
    pub(crate) fn take_segment(&self, s: &mut Segments) -> Result<u32, SoftError> {
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
            self.low_space.ring();
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

    pub(crate) fn allocate_large(&self, total: usize) -> Result<Placement, SoftError> {
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
            .memory
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
        let _ = self
            .memory
            .punch(seg as usize * SEGMENT, n as usize * SEGMENT);
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
        self.memory.punch(offset, len)
    }
}
