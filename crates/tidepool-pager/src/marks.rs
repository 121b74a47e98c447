//! What the program said about parts of a region besides their contents: protections
//! (mprotect), inheritance across fork (MADV_DONTFORK, MADV_WIPEONFORK), and ranges it mapped
//! something else over (a file with MAP_FIXED). The system calls are made here, on the
//! program's behalf, and remembered, because they change what the pager may do:
//!
//! - a page the program made inaccessible (PROT_NONE) cannot be read to be saved: it stays
//!   resident until the program opens it again (moving it as a frame needs no read, but the
//!   kernel refuses to move between mappings of different protection);
//! - a forked child lacks the DONTFORK parts (they become inaccessible reservations there, as
//!   the kernel leaves a hole) and sees zeros in the WIPEONFORK parts, whatever the parent's
//!   page table says;
//! - a range the program mapped a file or shared memory over is FOREIGN in the page table
//!   until the program unmaps it, when it becomes fresh paged memory again.
//!
//! A range given back by the program (munmap, mremap's old range) is [`Inner::reset`]: zeros,
//! readable and writable, inherited as usual.

use crate::pager::{Inner, RegionInner};
use crate::sys::{self, PAGE};
use crate::table::*;
use rangemap::RangeMap;
use std::io;
use std::ops::Range;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

/// How a range is inherited by a forked child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inherit {
    /// MADV_DONTFORK: absent in the child.
    No,
    /// MADV_WIPEONFORK: zeros in the child.
    Wiped,
}

/// A region's marks, by page index. Ranges with neither mark are read-write and inherited.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    prot: RangeMap<usize, i32>,
    inherit: RangeMap<usize, Inherit>,
}

impl Marks {
    /// Whether some page of the region is inaccessible.
    pub(crate) fn any_inaccessible(&self) -> bool {
        self.prot.iter().any(|(_, &p)| p == libc::PROT_NONE)
    }

    pub(crate) fn inaccessible(&self, page: usize) -> bool {
        self.prot.get(&page) == Some(&libc::PROT_NONE)
    }

    /// The ranges marked `how`.
    pub(crate) fn inherited(&self, how: Inherit) -> Vec<Range<usize>> {
        self.inherit
            .iter()
            .filter(|(_, &h)| h == how)
            .map(|(r, _)| r.clone())
            .collect()
    }
}

/// The program's advice about inheritance, in madvise's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkAdvice {
    /// MADV_DONTFORK
    DontFork,
    /// MADV_DOFORK (undoes DONTFORK)
    DoFork,
    /// MADV_WIPEONFORK
    WipeOnFork,
    /// MADV_KEEPONFORK (undoes WIPEONFORK)
    KeepOnFork,
}

impl ForkAdvice {
    pub fn from_madvise(advice: i32) -> Option<ForkAdvice> {
        Some(match advice {
            libc::MADV_DONTFORK => ForkAdvice::DontFork,
            libc::MADV_DOFORK => ForkAdvice::DoFork,
            libc::MADV_WIPEONFORK => ForkAdvice::WipeOnFork,
            libc::MADV_KEEPONFORK => ForkAdvice::KeepOnFork,
            _ => return None,
        })
    }

    fn madvise(self) -> i32 {
        match self {
            ForkAdvice::DontFork => libc::MADV_DONTFORK,
            ForkAdvice::DoFork => libc::MADV_DOFORK,
            ForkAdvice::WipeOnFork => libc::MADV_WIPEONFORK,
            ForkAdvice::KeepOnFork => libc::MADV_KEEPONFORK,
        }
    }
}

impl Inner {
    /// mprotect on pages `pages` of a region, remembered.
    pub(crate) fn protect(
        &self,
        region: &RegionInner,
        pages: Range<usize>,
        prot: i32,
    ) -> io::Result<()> {
        let _section = crate::fork::section();
        sys::protect(region.addr(pages.start), pages.len() * PAGE, prot)?;
        let mut marks = region.marks.lock();
        if prot == libc::PROT_READ | libc::PROT_WRITE {
            marks.prot.remove(pages);
        } else {
            marks.prot.insert(pages, prot);
        }
        region.inaccessible.store(marks.any_inaccessible(), Release);
        Ok(())
    }

    /// Fork advice on pages `pages` of a region, given to the kernel and remembered.
    pub(crate) fn advise_fork(
        &self,
        region: &RegionInner,
        pages: Range<usize>,
        advice: ForkAdvice,
    ) -> io::Result<()> {
        let _section = crate::fork::section();
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
        let _section = crate::fork::section();
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
        let _section = crate::fork::section();
        for p in pages {
            region.table.lock_any(p);
            region.table.unlock(p, FOREIGN);
        }
    }

    /// The program unmapped what it had mapped over `pages`: fresh paged memory again.
    pub(crate) fn reclaim(&self, region: &RegionInner, pages: Range<usize>) -> io::Result<()> {
        let _section = crate::fork::section();
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

    /// Whether a page may be read to be saved (a page the program made inaccessible may not).
    #[inline]
    pub(crate) fn readable(&self, region: &RegionInner, page: usize) -> bool {
        !region.inaccessible.load(Acquire) || !region.marks.lock().inaccessible(page)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_answer_per_page() {
        let mut m = Marks::default();
        m.prot.insert(10..20, libc::PROT_NONE);
        m.prot.insert(15..30, libc::PROT_READ);
        assert!(m.inaccessible(10) && m.inaccessible(14));
        assert!(!m.inaccessible(15) && !m.inaccessible(29) && !m.inaccessible(30));
        assert!(m.any_inaccessible());
        m.prot.remove(0..15);
        assert!(!m.any_inaccessible());
        m.inherit.insert(0..4, Inherit::No);
        m.inherit.insert(8..12, Inherit::Wiped);
        m.inherit.insert(2..3, Inherit::Wiped);
        assert_eq!(m.inherited(Inherit::No), vec![0..2, 3..4]);
        assert_eq!(m.inherited(Inherit::Wiped), vec![2..3, 8..12]);
    }

    #[test]
    fn madvise_numbers_map_to_fork_advice_and_back() {
        for a in [
            libc::MADV_DONTFORK,
            libc::MADV_DOFORK,
            libc::MADV_WIPEONFORK,
            libc::MADV_KEEPONFORK,
        ] {
            assert_eq!(ForkAdvice::from_madvise(a).unwrap().madvise(), a);
        }
        assert_eq!(ForkAdvice::from_madvise(libc::MADV_DONTNEED), None);
    }
}
