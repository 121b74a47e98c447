//! Write-back: dirty pages wait in slots of a pager-private buffer (served from there on a
//! fault) while one thread writes them to the far store, in the order they were queued.

use crate::buffer::{PageWrite, StoreJob};
use crate::pager::Inner;
use crate::stats::Counters;
use crate::sys::PAGE;
use crate::table::{kind, BUSY, FAR, HEAT, SLOT_SHIFT, WAS_DIRTY, WRITEBACK};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::Duration;
use tidepool_store::Key;

/// Jobs the write-back thread takes per round, between looks at its deferred writes.
const JOBS_PER_ROUND: usize = 64;

impl Inner {
    /// Applies writes and removes in the order they were queued (so a page's far copy is
    /// never overtaken by an older one).
    pub(crate) fn store_loop(self: Arc<Self>) {
        let mut swept = std::time::Instant::now();
        // At once at first: a forked child may start with its parent's deferred writes.
        let mut pause = Duration::ZERO;
        loop {
            if !pause.is_zero() {
                self.jobs.wait(pause);
            }
            let _section = crate::gate::section();
            // Only this thread takes the list, inside a section: a fork sees it whole.
            let mut deferred = self.deferred.lock();
            let deferred = &mut *deferred;
            let mut jobs = Vec::new();
            while jobs.len() < JOBS_PER_ROUND {
                match self.jobs.pop() {
                    Some(job) => jobs.push(job),
                    None => break,
                }
            }
            if jobs.is_empty() && self.shutdown.load(Acquire) {
                return;
            }
            if !deferred.is_empty() {
                for w in std::mem::take(deferred) {
                    self.finish_writeback(w, deferred);
                }
            }
            if swept.elapsed() >= Duration::from_millis(100) {
                swept = std::time::Instant::now();
                // Copies kept for forked children that are gone now.
                self.remove_keys(&self.tags.sweep());
            }
            // Neighbouring jobs of a kind go in one call (one round trip), in queue order.
            let (mut pages, mut keys) = (Vec::new(), Vec::new());
            for job in jobs {
                match job {
                    StoreJob::Write(more) => {
                        self.remove_keys(&std::mem::take(&mut keys));
                        pages.extend(more);
                        if pages.len() >= 256 {
                            self.write_pages(std::mem::take(&mut pages), deferred);
                        }
                    }
                    StoreJob::Remove(more) => {
                        self.write_pages(std::mem::take(&mut pages), deferred);
                        keys.extend(more);
                    }
                }
            }
            self.write_pages(pages, deferred);
            self.remove_keys(&keys);
            // Sleep only with nothing queued: a burst of jobs kicks this thread once, and
            // sleeping on a queue that is not empty held every write-back slot for seconds
            // while the budget overran (CPython's dict at 25% local: 299 MiB resident of 142).
            // With writes waiting for their pages, look again soon.
            pause = if !self.jobs.is_empty() {
                Duration::ZERO
            } else if !deferred.is_empty() {
                Duration::from_millis(1)
            } else {
                Duration::from_millis(100)
            };
        }
    }

    fn remove_keys(&self, keys: &[Key]) {
        if keys.is_empty() {
            return;
        }
        let removed = self
            .activity
            .during(crate::activity::Doing::Store, keys[0], 0, || {
                self.store.remove_many(keys)
            });
        if let Err(e) = removed {
            self.fatal("removing pages", &e);
        }
    }

    pub(crate) fn write_pages(&self, pages: Vec<PageWrite>, deferred: &mut Vec<PageWrite>) {
        if pages.is_empty() {
            return;
        }
        let items: Vec<(Key, &[u8])> = pages
            .iter()
            .map(|w| (w.key, self.slots.bytes(w.slot)))
            .collect();
        let written = self
            .activity
            .during(crate::activity::Doing::Store, items[0].0, 0, || {
                self.store.write_many(&items)
            });
        if let Err(e) = written {
            self.fatal("writing pages back", &e);
        }
        drop(items);
        Counters::add(&self.counters.written_back, pages.len() as u64);
        Counters::add(&self.counters.bytes_written, (pages.len() * PAGE) as u64);
        for w in pages {
            self.finish_writeback(w, deferred);
        }
        if self.local_pages() > self.budget.pages() {
            // An evictor short of slots may be waiting for these.
            self.kick_evictor();
        }
    }

    /// A page's write has landed: the page becomes FAR (if it is still in this slot) and the
    /// slot is freed. If the page is BUSY, its owner may be a handler copying out of the slot,
    /// so the slot is kept and the page looked at again later (`deferred`). Never wait here:
    /// the owner may be an evictor waiting for a free slot, which only this thread frees (a
    /// spin at this point hung a 512 MiB scan at 75% local on one CPU).
    pub(crate) fn finish_writeback(&self, w: PageWrite, deferred: &mut Vec<PageWrite>) {
        let (region, page, slot) = (&w.region, w.page, w.slot);
        let s = region.table.state(page);
        let mut cur = s.load(Acquire);
        loop {
            if kind(cur) == BUSY {
                deferred.push(w);
                return;
            }
            if kind(cur) != WRITEBACK || cur >> SLOT_SHIFT != slot as u64 {
                // Faulted back in (or discarded) meanwhile: the slot is no longer needed.
                break;
            }
            match s.compare_exchange(cur, FAR | WAS_DIRTY | (cur & HEAT), AcqRel, Acquire) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        self.slots.give(slot);
    }
}

#[cfg(test)]
mod tests {
    use crate::testkit::*;

    #[test]
    fn slots_are_taken_without_waiting_and_given_back() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let (pager, _region) = pager(Recorder::new(), false, 1);
        let slots = &inner(&pager).slots;
        let all = slots.try_take_up_to(usize::MAX);
        assert_eq!(all.len(), crate::pager::WRITEBACK_SLOTS);
        assert!(slots.try_take_up_to(1).is_empty(), "none left, and no wait");
        slots.give_many(all);
        assert_eq!(slots.try_take_up_to(3).len(), 3);
    }

    #[test]
    fn a_page_discarded_on_its_way_out_is_removed_after_its_write() {
        tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
        let store = Recorder::new();
        let (pager, mut region) = pager(store.clone(), false, 4);
        fill(&mut region, 0, 3);
        evict_all(&pager, &region);
        let key = region_inner(&region).key(0);
        region.discard(0, crate::PAGE);
        let start = std::time::Instant::now();
        while !store.log.lock().contains(&Op::Remove(key)) {
            assert!(start.elapsed().as_secs() < 10, "{:?}", store.log.lock());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let log = store.log.lock().clone();
        let w = log.iter().position(|o| *o == Op::Write(key)).unwrap();
        let r = log.iter().position(|o| *o == Op::Remove(key)).unwrap();
        assert!(w < r, "{log:?}");
        assert!(holds(&region, 0, 0));
    }
}
