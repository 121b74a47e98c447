//! The write-back buffer: slots of a pager-private mapping where dirty pages wait for the
//! write-back thread (`writeback.rs`), and the jobs that thread runs.

use crate::region::RegionInner;
use crate::sys::{Mapping, PAGE};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::*};
use std::sync::Arc;
use tidepool_store::Key;

/// The buffer's slots, a page each.
pub(crate) struct Slots {
    pub(crate) buf: Mapping,
    pub(crate) free: Mutex<Vec<u32>>,
    pub(crate) in_use: AtomicUsize,
}

impl Slots {
    pub(crate) fn slot_addr(&self, slot: u32) -> usize {
        self.buf.addr() + slot as usize * PAGE
    }
    pub(crate) fn bytes(&self, slot: u32) -> &[u8] {
        // SAFETY: slot buffers are pager-private memory (never registered), each slot owned by
        // exactly one page in WRITEBACK state until freed.
        unsafe { std::slice::from_raw_parts(self.slot_addr(slot) as *const u8, PAGE) }
    }
    pub(crate) fn fill(&self, slot: u32, src: &[u8]) {
        assert_eq!(src.len(), PAGE);
        // SAFETY: the evictor fills a slot it just took from the free list, which nobody else
        // references; the slot is PAGE writable bytes of pager-private memory.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.slot_addr(slot) as *mut u8, PAGE)
        }
    }
    /// Up to `n` free slots, without waiting.
    pub(crate) fn try_take_up_to(&self, n: usize) -> Vec<u32> {
        if n == 0 {
            return Vec::new();
        }
        let mut free = self.free.lock();
        let at = free.len().saturating_sub(n);
        let taken = free.split_off(at);
        self.in_use.fetch_add(taken.len(), Relaxed);
        taken
    }

    /// Gives back slots taken and not used.
    pub(crate) fn give_many(&self, slots: Vec<u32>) {
        if slots.is_empty() {
            return;
        }
        let n = slots.len();
        self.free.lock().extend(slots);
        self.in_use.fetch_sub(n, Relaxed);
    }

    pub(crate) fn give(&self, slot: u32) {
        self.free.lock().push(slot);
        self.in_use.fetch_sub(1, Relaxed);
    }
}

/// A dirty page on its way to the store: page `page` of `region`, in slot `slot`, to be
/// written under `key` (named when the page was saved: its tag may change after a fork).
pub(crate) struct PageWrite {
    pub(crate) region: Arc<RegionInner>,
    pub(crate) page: usize,
    pub(crate) slot: u32,
    pub(crate) key: Key,
}

pub(crate) enum StoreJob {
    Write(Vec<PageWrite>),
    Remove(Vec<Key>),
}

/// The write-back thread's queue of jobs, in order.
///
/// Fork-safe by construction: its lock is taken only inside the fork gate's sections (so a
/// fork never copies it held), and the write-back thread waits for work on a futex word, which
/// keeps no record of its waiters in user memory. (A channel's receiver registers itself under
/// a lock while it waits, outside any section, and a child forked at that moment would
/// inherit the lock held.)
#[derive(Default)]
pub(crate) struct JobQueue {
    jobs: Mutex<VecDeque<StoreJob>>,
    /// Non-zero: jobs were queued since the write-back thread last looked.
    kick: AtomicU32,
}

impl JobQueue {
    /// Queues a job (inside a section) and wakes the write-back thread.
    pub(crate) fn send(&self, job: StoreJob) {
        self.jobs.lock().push_back(job);
        if self.kick.swap(1, AcqRel) == 0 {
            crate::sys::futex_wake(&self.kick);
        }
    }

    /// Waits (outside any section) until a job may be queued, or `timeout`.
    pub(crate) fn wait(&self, timeout: std::time::Duration) {
        if self.kick.swap(0, AcqRel) == 0 {
            crate::sys::futex_wait(&self.kick, 0, timeout);
            self.kick.store(0, Release);
        }
    }

    /// Whether no job is queued (inside a section).
    pub(crate) fn is_empty(&self) -> bool {
        self.jobs.lock().is_empty()
    }

    /// The next job, if any (inside a section).
    pub(crate) fn pop(&self) -> Option<StoreJob> {
        self.jobs.lock().pop_front()
    }
}
