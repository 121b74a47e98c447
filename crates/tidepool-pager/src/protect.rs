//! Write-protect faults: the first write to a page installed clean (write-protected), which
//! makes it dirty, and in a forked child the first write to a page it shares with its parent,
//! which makes it the child's own.

use crate::pager::{Inner, RegionInner};
use crate::stats::Counters;
use crate::sys::PAGE;
use crate::table::{
    kind, BUSY, DIRTY, INHERITED, KIND_MASK, REFERENCED, RESIDENT, WAS_DIRTY, WP_CLEAN,
};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::Duration;

impl Inner {
    /// The first write to a page installed write-protected: it is dirty from now on.
    pub(crate) fn serve_write_protect(&self, region: &Arc<RegionInner>, page: usize) {
        Counters::add(&self.counters.wp_faults, 1);
        let addr = region.addr(page);
        let mut spins = 0u32;
        let word_before = loop {
            if let Some(w) = region.table.try_lock(page, &[RESIDENT]) {
                break w;
            }
            if kind(region.table.state(page).load(Acquire)) != BUSY {
                // Evicted since the fault: the retried write faults the page back in. (The
                // evictor woke the writer too, but maybe before it went to sleep.)
                self.uffd.wake(addr, PAGE);
                return;
            }
            // Being installed or evicted. An installer's wake-up came before this fault (the
            // writer was woken by the install, then found the page write-protected), so
            // nobody else will wake the writer: wait for the owner, then decide.
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        };
        if let Err(e) = self.uffd.write_protect(addr, PAGE, false) {
            if !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH)) {
                self.fatal("lifting a write protection", &e);
            }
        }
        let word = (word_before & !(WP_CLEAN | BUSY | KIND_MASK | INHERITED))
            | RESIDENT
            | DIRTY
            | WAS_DIRTY
            | REFERENCED;
        self.adopt_inherited(region, page, word_before);
        // Lifting the protection woke the page's waiters.
        let _ = region.table.unlock(page, word);
    }

    /// A page a forked child shared with its parent (`word`, [`INHERITED`]) and now has a
    /// frame of its own: counted in its budget and on its clock from now on.
    pub(crate) fn adopt_inherited(&self, region: &Arc<RegionInner>, page: usize, word: u64) {
        if word & INHERITED != 0 {
            self.budget.resident.fetch_add(1, Relaxed);
            self.count_resident(region, page, 1);
            self.eviction.clock.push(region, page);
            if self.local_pages() > self.budget.pages() {
                self.kick_evictor();
            }
        }
    }
}
