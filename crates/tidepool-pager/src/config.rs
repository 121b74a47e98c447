//! [`Config`]: how to build a pager, with a setter for each setting and its default.

use std::time::Duration;

/// How to build a pager: [`Config::new`] with a budget, then the setters below for what differs
/// from the defaults each one names.
#[derive(Debug, Clone)]
pub struct Config {
    /// Local memory the pager may map, in bytes (rounded down to pages, at least 64 pages).
    /// Faults are served before eviction makes room, so for a moment the pager may hold a
    /// margin more: a 32nd of the budget, at least 64 pages and at most 4096.
    pub(crate) local_budget: usize,
    /// Largest prefetch window in pages.
    pub(crate) prefetch_window_max: u32,
    /// CPUs to run fault handlers on, one pinned handler each (default: every CPU this process
    /// may run on, at most 8).
    pub(crate) handler_cpus: Option<Vec<usize>>,
    /// Runs first on every thread the pager starts (the preload library uses it to keep those
    /// threads' allocations out of the memory they page: a pager thread touching a page out in
    /// far memory would wait for itself).
    pub(crate) thread_start: Option<fn()>,
    /// Called with true in a forked child before the pager's threads are started again, and
    /// with false after: until then nothing serves faults, so the calling thread's allocations
    /// (glibc's, for the new threads) must stay out of paged memory meanwhile.
    pub(crate) around_child_restart: Option<fn(bool)>,
    /// Keep far pages in this process as page frames, in a shadow mapping beside each region,
    /// moved in and out with UFFDIO_MOVE (Linux 6.8): eviction and fault-in change page-table
    /// entries and copy nothing. For the in-process backend only; the store then receives just
    /// the pages the kernel will not move (pages shared with a forked child), and the option
    /// is ignored where the kernel lacks UFFDIO_MOVE.
    pub(crate) in_process_frames: bool,
    /// With a far store elsewhere (not the in-process one), keep a probation tier: evicted pages
    /// wait as frames in the shadow (part of the budget, sized by how often the program touches
    /// them there) before they go to the store, so a page in use that CLOCK evicted comes back
    /// for a fault, not a round trip (see `tier.rs`). Ignored where the kernel lacks UFFDIO_MOVE.
    pub(crate) probation: bool,
    /// Whether the probation tier's share may grow past its least (a hundredth of the budget).
    /// `None`: it grows in front of a store elsewhere and keeps its least share in front of
    /// one in this process (see `tier.rs`).
    pub(crate) probation_grows: Option<bool>,
    /// Keep no far copy of a page once it is back: a page read from the store is removed from
    /// it and installed writable, and written again when next evicted. For a store in this
    /// process, where a copy costs the process memory (the compressed size of every resident
    /// page that came from far), as zram frees a swapped page's copy when it comes back. Costs
    /// a compression per eviction of a page that was only read.
    pub(crate) drop_far_copies: bool,
    /// The budget of a forked child, for the pages it brings in or writes; the pages it
    /// shares with its parent at the fork (copy-on-write) are the parent's and not counted
    /// (the table calls them inherited). `None`: a quarter of the parent's budget at the fork.
    pub(crate) child_local_budget: Option<usize>,
    /// While the budget has room to spare (it grew), bring evicted pages back from far memory
    /// in batches, hottest first, before the program faults on them (see `refill.rs`).
    pub(crate) refill: bool,
    /// The longest a page fault may wait: past it the watchdog stops the program with exit
    /// status [`FATAL_EXIT_CODE`](crate::FATAL_EXIT_CODE) and a message naming the cause and where every pager thread
    /// is, rather than let it hang (see `watchdog.rs`). While the far store is being waited
    /// for, its own patience is added ([`FarStore::patience`](tidepool_store::FarStore::patience)). Zero: no watchdog.
    pub(crate) fault_deadline: Duration,
    /// While the program's faults come from one CPU, one handler reads them there and the
    /// pager's other threads run there below the program (see `follow.rs`). Needs a watchdog
    /// ([`Config::fault_deadline`] not zero), two handler CPUs or more, and the right to
    /// leave SCHED_IDLE.
    pub(crate) follow_program: bool,
    /// Runs in a forking thread just before the fork, once no pager work is under way and none
    /// can start: whatever memory it touches is mapped at the fork and stays so in the child
    /// until its pager runs. The preload library touches glibc's stdio locks there, which
    /// glibc resets in the child before any fork handler could restart a pager.
    pub(crate) before_fork: Option<fn()>,
    /// For tests of the watchdog: fault handlers stop for good once this many faults were
    /// served, as if stuck.
    #[doc(hidden)]
    pub(crate) stall_handlers_after: Option<u64>,
}

/// [`Config::prefetch_window_max`]'s default, in pages.
pub const DEFAULT_PREFETCH_WINDOW_MAX: u32 = 512;

/// [`Config::fault_deadline`]'s default.
pub const DEFAULT_FAULT_DEADLINE: Duration = Duration::from_secs(5);

impl Config {
    pub fn new(local_budget: usize) -> Config {
        Config {
            local_budget,
            prefetch_window_max: DEFAULT_PREFETCH_WINDOW_MAX,
            handler_cpus: None,
            thread_start: None,
            around_child_restart: None,
            in_process_frames: false,
            probation: false,
            probation_grows: None,
            drop_far_copies: false,
            child_local_budget: None,
            refill: false,
            fault_deadline: DEFAULT_FAULT_DEADLINE,
            follow_program: true,
            before_fork: None,
            stall_handlers_after: None,
        }
    }

    /// The local budget given to [`Config::new`], in bytes.
    pub fn local_budget(&self) -> usize {
        self.local_budget
    }

    /// Largest prefetch window in pages.
    /// Default: 512.
    pub fn prefetch_window_max(mut self, value: u32) -> Config {
        self.prefetch_window_max = value;
        self
    }

    /// CPUs to run fault handlers on, one pinned handler each (default: every CPU this process
    /// may run on, at most 8).
    pub fn handler_cpus(mut self, value: Vec<usize>) -> Config {
        self.handler_cpus = Some(value);
        self
    }

    /// Runs first on every thread the pager starts (the preload library uses it to keep those
    /// threads' allocations out of the memory they page: a pager thread touching a page out in
    /// far memory would wait for itself).
    /// Default: none.
    pub fn thread_start(mut self, value: fn()) -> Config {
        self.thread_start = Some(value);
        self
    }

    /// Called with true in a forked child before the pager's threads are started again, and
    /// with false after: until then nothing serves faults, so the calling thread's allocations
    /// (glibc's, for the new threads) must stay out of paged memory meanwhile.
    /// Default: none.
    pub fn around_child_restart(mut self, value: fn(bool)) -> Config {
        self.around_child_restart = Some(value);
        self
    }

    /// Keep far pages in this process as page frames, in a shadow mapping beside each region,
    /// moved in and out with UFFDIO_MOVE (Linux 6.8): eviction and fault-in change page-table
    /// entries and copy nothing. For the in-process backend only; the store then receives just
    /// the pages the kernel will not move (pages shared with a forked child), and the option
    /// is ignored where the kernel lacks UFFDIO_MOVE.
    /// Default: off.
    pub fn in_process_frames(mut self, value: bool) -> Config {
        self.in_process_frames = value;
        self
    }

    /// With a far store elsewhere (not the in-process one), keep a probation tier: evicted pages
    /// wait as frames in the shadow (part of the budget, sized by how often the program touches
    /// them there) before they go to the store, so a page in use that CLOCK evicted comes back
    /// for a fault, not a round trip (see `tier.rs`). Ignored where the kernel lacks UFFDIO_MOVE.
    /// Default: off.
    pub fn probation(mut self, value: bool) -> Config {
        self.probation = value;
        self
    }

    /// Whether the probation tier's share may grow past its least (a hundredth of the budget).
    /// `None`: it grows in front of a store elsewhere and keeps its least share in front of
    /// one in this process (see `tier.rs`).
    /// Default: it grows in front of a store elsewhere, not in front of one in this process.
    pub fn probation_grows(mut self, value: bool) -> Config {
        self.probation_grows = Some(value);
        self
    }

    /// Keep no far copy of a page once it is back: a page read from the store is removed from
    /// it and installed writable, and written again when next evicted. For a store in this
    /// process, where a copy costs the process memory (the compressed size of every resident
    /// page that came from far), as zram frees a swapped page's copy when it comes back. Costs
    /// a compression per eviction of a page that was only read.
    /// Default: off.
    pub fn drop_far_copies(mut self, value: bool) -> Config {
        self.drop_far_copies = value;
        self
    }

    /// The budget of a forked child, for the pages it brings in or writes; the pages it
    /// shares with its parent at the fork (copy-on-write) are the parent's and not counted
    /// (the table calls them inherited). `None`: a quarter of the parent's budget at the fork.
    /// Default: a quarter of the parent's budget at the fork.
    pub fn child_local_budget(mut self, value: usize) -> Config {
        self.child_local_budget = Some(value);
        self
    }

    /// While the budget has room to spare (it grew), bring evicted pages back from far memory
    /// in batches, hottest first, before the program faults on them (see `refill.rs`).
    /// Default: off.
    pub fn refill(mut self, value: bool) -> Config {
        self.refill = value;
        self
    }

    /// The longest a page fault may wait: past it the watchdog stops the program with exit
    /// status [`FATAL_EXIT_CODE`](crate::FATAL_EXIT_CODE) and a message naming the cause and where every pager thread
    /// is, rather than let it hang (see `watchdog.rs`). While the far store is being waited
    /// for, its own patience is added ([`FarStore::patience`](tidepool_store::FarStore::patience)). Zero: no watchdog.
    /// Default: [`DEFAULT_FAULT_DEADLINE`].
    pub fn fault_deadline(mut self, value: Duration) -> Config {
        self.fault_deadline = value;
        self
    }

    /// While the program's faults come from one CPU, one handler reads them there and the
    /// pager's other threads run there below the program (see `follow.rs`). Needs a watchdog
    /// ([`Config::fault_deadline`] not zero), two handler CPUs or more, and the right to
    /// leave SCHED_IDLE.
    /// Default: on.
    pub fn follow_program(mut self, value: bool) -> Config {
        self.follow_program = value;
        self
    }

    /// Runs in a forking thread just before the fork, once no pager work is under way and none
    /// can start: whatever memory it touches is mapped at the fork and stays so in the child
    /// until its pager runs. The preload library touches glibc's stdio locks there, which
    /// glibc resets in the child before any fork handler could restart a pager.
    /// Default: none.
    pub fn before_fork(mut self, value: fn()) -> Config {
        self.before_fork = Some(value);
        self
    }

    /// For tests of the watchdog: fault handlers stop for good once this many faults were
    /// served, as if stuck.
    /// Default: never.
    #[doc(hidden)]
    pub fn stall_handlers_after(mut self, value: u64) -> Config {
        self.stall_handlers_after = Some(value);
        self
    }
}
