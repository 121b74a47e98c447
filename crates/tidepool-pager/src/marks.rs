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
//! A range given back by the program (munmap, mremap's old range) is `Inner::reset` (`advice.rs`): zeros,
//! readable and writable, inherited as usual.

use rangemap::RangeMap;
use std::ops::Range;

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
    pub(crate) prot: RangeMap<usize, i32>,
    pub(crate) inherit: RangeMap<usize, Inherit>,
}

/// Whether pages with protection `prot` cannot be read: PROT_NONE, or PROT_EXEC alone (which
/// CPUs with protection keys make execute-only).
fn unreadable(prot: i32) -> bool {
    prot & (libc::PROT_READ | libc::PROT_WRITE) == 0
}

impl Marks {
    /// Whether some page of the region is inaccessible.
    pub(crate) fn any_inaccessible(&self) -> bool {
        self.prot.iter().any(|(_, &p)| unreadable(p))
    }

    pub(crate) fn inaccessible(&self, page: usize) -> bool {
        self.prot.get(&page).is_some_and(|&p| unreadable(p))
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

    pub(crate) fn madvise(self) -> i32 {
        match self {
            ForkAdvice::DontFork => libc::MADV_DONTFORK,
            ForkAdvice::DoFork => libc::MADV_DOFORK,
            ForkAdvice::WipeOnFork => libc::MADV_WIPEONFORK,
            ForkAdvice::KeepOnFork => libc::MADV_KEEPONFORK,
        }
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
