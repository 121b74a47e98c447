//! What each pager thread is doing, and since when: the watchdog's evidence (`watchdog.rs`).
//!
//! Every pager thread takes a slot when it starts and writes its state there with relaxed
//! atomics: no lock, no allocation, nothing a fork could leave half done. A thread finds its
//! slot through a thread-local index, so code deep in a call (a store read inside a fault)
//! can say what it waits for without being handed anything.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::time::Duration;

/// Slots: up to 8 handlers, the evictor, the write-back thread, the watchdog, and a thread
/// that serves faults while the others start.
pub(crate) const SLOTS: usize = 16;

/// What a pager thread is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Doing {
    /// Nothing: waiting for work (a handler blocked in `read`).
    Idle = 0,
    /// Serving faults; `page` is the first, `of` the thread that raised it.
    Serving = 1,
    /// Waiting for the far store.
    Store = 2,
    /// Holding faults it read while a fork holds the gate closed; `of` is the forking thread,
    /// `page` how many.
    Holding = 3,
    /// Evicting pages.
    Evicting = 4,
    /// Serving faults while the pager's threads start (`of`: how many have).
    Starting = 5,
    /// Stopped on purpose, by a test's fault injection.
    Stalled = 6,
}

impl Doing {
    fn from_u8(v: u8) -> Doing {
        match v {
            1 => Doing::Serving,
            2 => Doing::Store,
            3 => Doing::Holding,
            4 => Doing::Evicting,
            5 => Doing::Starting,
            6 => Doing::Stalled,
            _ => Doing::Idle,
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    /// The thread's kernel id; 0: free.
    tid: AtomicU32,
    doing: AtomicU8,
    /// When it started doing it, in milliseconds of the monotonic clock.
    since_ms: AtomicU64,
    page: AtomicU64,
    of: AtomicU32,
}

/// One thread's state, read out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    pub tid: u32,
    pub doing: Doing,
    pub for_: Duration,
    pub page: u64,
    pub of: u32,
}

/// Slots of [`FaultsRead`].
const READ_SLOTS: usize = 256;

/// Fault events the handlers read for each program thread, counted in slots by thread id
/// modulo [`READ_SLOTS`]: the watchdog's evidence that a thread waiting in a page fault is
/// being served. Its own fault count is not enough: the kernel does not count the faults it
/// takes inside a system call that faults a range in (madvise(MADV_POPULATE_READ/WRITE),
/// mlock, MAP_POPULATE: get_user_pages), so a thread populating far more than the budget waits
/// in fault after fault, each one served, without completing a fault of its own. Two threads
/// sharing a slot can only make a hang of one of them look like progress while the other's
/// faults are served; the hang is seen when they stop.
#[derive(Debug)]
struct FaultsRead([AtomicU32; READ_SLOTS]);

impl Default for FaultsRead {
    fn default() -> Self {
        FaultsRead(std::array::from_fn(|_| AtomicU32::new(0)))
    }
}

/// The slots of one pager's threads.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    slots: [Slot; SLOTS],
    /// Slots handed out (the next free index).
    used: AtomicUsize,
    read: FaultsRead,
}

thread_local! {
    /// This thread's slot, if it is a pager thread.
    static MINE: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

use crate::sys::coarse_now_ms as now_ms;

impl Activity {
    /// Gives the calling thread a slot (quietly none if all are taken: the watchdog then knows
    /// less, nothing else changes).
    pub(crate) fn join(&self) {
        let i = self.used.fetch_add(1, Relaxed);
        if i >= SLOTS {
            return;
        }
        let slot = &self.slots[i];
        slot.doing.store(Doing::Idle as u8, Relaxed);
        slot.since_ms.store(now_ms(), Relaxed);
        slot.tid.store(tidepool_sys::gettid(), Release);
        MINE.with(|m| m.set(Some((self as *const Activity as usize, i))));
    }

    /// Forgets every slot: in a forked child, whose pager threads are new.
    pub(crate) fn reset(&self) {
        for s in &self.slots {
            s.tid.store(0, Relaxed);
        }
        self.used.store(0, Relaxed);
    }

    /// The calling thread's slot in this activity table, if it has one.
    fn mine(&self) -> Option<&Slot> {
        let (table, i) = MINE.with(Cell::get)?;
        (table == self as *const Activity as usize).then(|| &self.slots[i])
    }

    /// Says what the calling thread does from now on; returns what it did before, to put back
    /// with [`Activity::restore`].
    pub(crate) fn set(&self, doing: Doing, page: u64, of: u32) -> Option<(u8, u64, u64, u32)> {
        let slot = self.mine()?;
        let before = (
            slot.doing.load(Relaxed),
            slot.since_ms.load(Relaxed),
            slot.page.load(Relaxed),
            slot.of.load(Relaxed),
        );
        slot.page.store(page, Relaxed);
        slot.of.store(of, Relaxed);
        slot.since_ms.store(now_ms(), Relaxed);
        slot.doing.store(doing as u8, Release);
        Some(before)
    }

    /// Puts back what [`Activity::set`] returned.
    pub(crate) fn restore(&self, before: Option<(u8, u64, u64, u32)>) {
        let (Some(slot), Some((doing, since, page, of))) = (self.mine(), before) else {
            return;
        };
        slot.page.store(page, Relaxed);
        slot.of.store(of, Relaxed);
        slot.since_ms.store(since, Relaxed);
        slot.doing.store(doing, Release);
    }

    /// Runs `work` as `doing`, then goes back to what the thread did before.
    pub(crate) fn during<T>(
        &self,
        doing: Doing,
        page: u64,
        of: u32,
        work: impl FnOnce() -> T,
    ) -> T {
        let before = self.set(doing, page, of);
        let result = work();
        self.restore(before);
        result
    }

    /// Every thread's state now.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        let now = now_ms();
        self.slots[..self.used.load(Relaxed).min(SLOTS)]
            .iter()
            .filter_map(|s| {
                let tid = s.tid.load(Acquire);
                (tid != 0).then(|| Seen {
                    tid,
                    doing: Doing::from_u8(s.doing.load(Acquire)),
                    for_: Duration::from_millis(now.saturating_sub(s.since_ms.load(Relaxed))),
                    page: s.page.load(Relaxed),
                    of: s.of.load(Relaxed),
                })
            })
            .collect()
    }

    /// A handler read a fault event of program thread `tid`.
    #[inline]
    pub(crate) fn fault_read(&self, tid: u32) {
        self.read.0[tid as usize % READ_SLOTS].fetch_add(1, Relaxed);
    }

    /// Fault events read so far for `tid` (and the threads sharing its slot), wrapping.
    pub(crate) fn faults_read(&self, tid: u32) -> u32 {
        self.read.0[tid as usize % READ_SLOTS].load(Relaxed)
    }

    /// Whether `tid` is one of these threads.
    pub(crate) fn is_pager_thread(&self, tid: u32) -> bool {
        self.slots[..self.used.load(Relaxed).min(SLOTS)]
            .iter()
            .any(|s| s.tid.load(Relaxed) == tid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_says_what_it_does_and_goes_back_to_it() {
        let a = Activity::default();
        // Not joined: nothing is recorded.
        assert!(a.set(Doing::Serving, 1, 2).is_none());
        a.join();
        a.during(Doing::Serving, 0x1000, 7, || {
            a.during(Doing::Store, 0x1000, 7, || {
                let s = a.seen();
                assert_eq!(s.len(), 1);
                assert_eq!(s[0].doing, Doing::Store);
                assert_eq!(s[0].tid, tidepool_sys::gettid());
            });
            assert_eq!(a.seen()[0].doing, Doing::Serving);
            assert_eq!(a.seen()[0].page, 0x1000);
        });
        assert_eq!(a.seen()[0].doing, Doing::Idle);
        assert!(a.is_pager_thread(tidepool_sys::gettid()));
        // Fault events read are counted per program thread.
        a.fault_read(4000);
        a.fault_read(4000);
        assert_eq!(a.faults_read(4000), 2);
        assert_eq!(a.faults_read(4001), 0);
        a.reset();
        assert!(a.seen().is_empty());
    }
}
