//! mprotect and madvise on paged memory, made on the program's behalf and remembered in the
//! region's marks (see `marks.rs` for what they change), and ranges given back or mapped over.

use crate::buffer::StoreJob;
use crate::marks::{ForkAdvice, Inherit};
use crate::pager::{Inner, RegionInner};
use crate::stats::Counters;
use crate::sys::{self, PAGE};
use crate::table::{
    kind, FAR, FAR_VALID, FOREIGN, FRAMED, INHERITED, RESIDENT, STORE_OLD, UNTOUCHED, WRITEBACK,
};
use std::io;
use std::ops::Range;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

impl Inner {
    /// mprotect on pages `pages` of a region, remembered.
    pub(crate) fn protect(
        &self,
        region: &RegionInner,
        pages: Range<usize>,
        prot: i32,
    ) -> io::Result<()> {
        let _section = crate::gate::section();
        {
            // Not while an eviction batch may read these pages (see `Inner::protecting`).
            let _protecting = self.protecting.write();
            sys::protect(region.addr(pages.start), pages.len() * PAGE, prot)?;
            let mut marks = region.marks.lock();
            if prot == libc::PROT_READ | libc::PROT_WRITE {
                marks.prot.remove(pages);
            } else {
                marks.prot.insert(pages, prot);
            }
            region.inaccessible.store(marks.any_inaccessible(), Release);
        }
        // Batches evicted nothing while this held the lock.
        if self.local_pages() > self.budget.pages() {
            self.kick_evictor();
        }
        Ok(())
    }

    /// Fork advice on pages `pages` of a region, given to the kernel and remembered.
    pub(crate) fn advise_fork(
        &self,
        region: &RegionInner,
        pages: Range<usize>,
        advice: ForkAdvice,
    ) -> io::Result<()> {
        let _section = crate::gate::section();
        sys::advise(
            region.addr(pages.start),
            pages.len() * PAGE,
            advice.madvise(),
        )?;
        let mut marks = region.marks.lock();
        match advice {
            ForkAdvice::DontFork => marks.inherit.insert(pages, Inherit::No),
            ForkAdvice::WipeOnFork => marks.inherit.insert(pages, Inherit::Wiped),
            ForkAdvice::DoFork | ForkAdvice::KeepOnFork => {
                let undone = if advice == ForkAdvice::DoFork {
                    Inherit::No
                } else {
                    Inherit::Wiped
                };
                let gone: Vec<Range<usize>> = marks
                    .inherit
                    .overlapping(&pages)
                    .filter(|(_, &h)| h == undone)
                    .map(|(r, _)| r.start.max(pages.start)..r.end.min(pages.end))
                    .collect();
                for r in gone {
                    marks.inherit.remove(r);
                }
            }
        }
        Ok(())
    }

    /// Pages the program gave up: zeros, readable and writable, inherited as usual.
    pub(crate) fn reset(&self, region: &Arc<RegionInner>, pages: Range<usize>) {
        let _section = crate::gate::section();
        self.discard_in_section(region, pages.start, pages.end);
        let mut marks = region.marks.lock();
        let protected: Vec<Range<usize>> = marks
            .prot
            .overlapping(&pages)
            .map(|(r, _)| r.start.max(pages.start)..r.end.min(pages.end))
            .collect();
        for r in protected {
            let _ = sys::protect(
                region.addr(r.start),
                r.len() * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
            );
            marks.prot.remove(r);
        }
        let advised: Vec<(Range<usize>, Inherit)> = marks
            .inherit
            .overlapping(&pages)
            .map(|(r, &h)| (r.start.max(pages.start)..r.end.min(pages.end), h))
            .collect();
        for (r, how) in advised {
            let undo = match how {
                Inherit::No => libc::MADV_DOFORK,
                Inherit::Wiped => libc::MADV_KEEPONFORK,
            };
            let _ = sys::advise(region.addr(r.start), r.len() * PAGE, undo);
            marks.inherit.remove(r);
        }
        region.inaccessible.store(marks.any_inaccessible(), Release);
    }

    /// The program maps something else (a file, shared memory) over `pages`: they are no
    /// longer the pager's until [`Inner::reclaim`].
    pub(crate) fn cede(&self, region: &Arc<RegionInner>, pages: Range<usize>) {
        self.reset(region, pages.clone());
        let _section = crate::gate::section();
        for p in pages {
            region.table.lock_any(p);
            if region.table.unlock(p, FOREIGN) {
                self.uffd.wake(region.addr(p), PAGE);
            }
        }
    }

    /// The program unmapped what it had mapped over `pages`: fresh paged memory again.
    pub(crate) fn reclaim(&self, region: &RegionInner, pages: Range<usize>) -> io::Result<()> {
        let _section = crate::gate::section();
        let (addr, len) = (region.addr(pages.start), pages.len() * PAGE);
        sys::map_fixed(addr, len, libc::PROT_READ | libc::PROT_WRITE)?;
        // No huge pages where only 4 KiB pages are installed (see `register_region`).
        let _ = sys::advise(addr, len, libc::MADV_NOHUGEPAGE);
        self.uffd.register(addr, len)?;
        for p in pages {
            region.table.state(p).store(UNTOUCHED, Release);
        }
        Ok(())
    }

    /// In a forked child, before its threads start (the gate is closed: no sections): the
    /// parts the kernel left out become inaccessible reservations (as the kernel leaves a hole,
    /// but the address range stays the region's), the wiped parts read as zeros.
    pub(crate) fn apply_inheritance_in_child(&self, region: &Arc<RegionInner>) {
        let (absent, wiped) = {
            let marks = region.marks.lock();
            (
                marks.inherited(Inherit::No),
                marks.inherited(Inherit::Wiped),
            )
        };
        for r in &absent {
            let (addr, len) = (region.addr(r.start), r.len() * PAGE);
            if sys::map_fixed(addr, len, libc::PROT_NONE).is_ok() {
                let _ = self.uffd.register(addr, len);
            }
        }
        for r in absent.iter().chain(&wiped) {
            self.discard_in_section(region, r.start, r.end);
        }
        let mut marks = region.marks.lock();
        for r in absent {
            marks.inherit.remove(r.clone());
            marks.prot.insert(r, libc::PROT_NONE);
        }
        region.inaccessible.store(marks.any_inaccessible(), Release);
    }
}

impl Inner {
    /// Forgets pages `[first, end)` of a region: their contents are no longer needed and the
    /// next touch reads zeros. Pages the program mapped something else over (FOREIGN) are left
    /// alone.
    pub(crate) fn discard(&self, region: &Arc<RegionInner>, first: usize, end: usize) {
        let _section = crate::gate::section();
        self.discard_in_section(region, first, end);
    }

    /// [`Inner::discard`], for a caller already inside a section (or a forked child's restart,
    /// which runs with the gate closed).
    pub(crate) fn discard_in_section(&self, region: &Arc<RegionInner>, first: usize, end: usize) {
        let end = end.min(region.table.pages());
        let mut removes = Vec::new();
        let mut page = first;
        while page < end {
            let chunk_end = (page + 512).min(end);
            let mut resident = 0;
            let mut words = Vec::with_capacity(chunk_end - page);
            for p in page..chunk_end {
                let w = region.table.lock_any(p);
                words.push(w);
                match kind(w) {
                    RESIDENT => {
                        // A page shared with the parent is not in this process's count.
                        if w & INHERITED == 0 {
                            resident += 1;
                            self.count_resident(region, p, -1);
                        }
                        if w & FAR_VALID != 0 {
                            self.tags.drop_copy(region.key(p), &mut removes);
                        }
                    }
                    // A frame in the probation tier, and perhaps the store's copy.
                    FAR if self.frames.in_probation(w) => {
                        if let Some(tier) = self.frames.probation() {
                            tier.left(w, false);
                        }
                        if w & (FAR_VALID | STORE_OLD) != 0 {
                            self.tags.drop_copy(region.key(p), &mut removes);
                        }
                    }
                    FAR if w & FRAMED != 0 => {}
                    // A page on its way to the store: removed (or kept for a forked child) after
                    // the write in flight lands, the jobs running in order.
                    FAR | WRITEBACK => self.tags.drop_copy(region.key(p), &mut removes),
                    _ => {}
                }
            }
            // Drop the pages in runs that leave out what the program mapped over the region.
            let mut run_start = None;
            for (i, w) in words.iter().chain(std::iter::once(&FOREIGN)).enumerate() {
                match (kind(*w) == FOREIGN, run_start) {
                    (false, None) => run_start = Some(page + i),
                    (true, Some(start)) => {
                        let n = page + i - start;
                        sys::discard(region.addr(start), n * PAGE);
                        if region.shadow.is_some() {
                            sys::discard(region.shadow_addr(start), n * PAGE);
                        }
                        run_start = None;
                    }
                    _ => {}
                }
            }
            // Queued before the pages are released: a page written and evicted again at once
            // must not have its new copy removed by a remove queued after its write.
            if !removes.is_empty() {
                self.jobs
                    .send(StoreJob::Remove(std::mem::take(&mut removes)));
            }
            // Waiters are woken below, the whole chunk at once.
            for (p, w) in (page..chunk_end).zip(words) {
                let _ = region
                    .table
                    .unlock(p, if kind(w) == FOREIGN { w } else { UNTOUCHED });
            }
            self.budget.resident.fetch_sub(resident, Relaxed);
            Counters::add(&self.counters.discarded, resident as u64);
            self.uffd.wake(region.addr(page), (chunk_end - page) * PAGE);
            page = chunk_end;
        }
    }
}
