//! The pager: fault handlers, the evictor and the write-back thread, sharing one userfaultfd
//! object, one far store and one local-memory budget.
//!
//! ```text
//!  program thread ──fault──► handler (pinned to that CPU) ── zero page / write-back slot / frame / store read ──► region
//!                                 │ stride vote                                                           ▲
//!                                 └─► same handler, before its next fault: one store read, one copy or ──┘ (one wake per batch)
//!                                     move per run of consecutive pages
//!  evictor: pages streams passed, then GCLOCK ─► frames: UFFDIO_MOVE to the shadow
//!                                              └► store: write-protect run ─► clean? drop : copy to slot ─► MADV_DONTNEED
//!  write-back thread: slots ─► store.write_many (in order) ─► page becomes FAR, slot freed
//! ```
//!
//! Fault handling runs on one thread per CPU, each pinned: on the VMs we run on, a wake-up across
//! vCPUs costs 25-160 us against ~8 us for a handler on the faulting CPU. While the faults come
//! from one CPU only that CPU's handler reads them, below the program's priority (`follow.rs`). The handler also
//! prefetches, right after waking the faulting thread: on one CPU a separate prefetch thread
//! lost the race to the program it fetched for, which then faulted page by page (measured on a
//! 96 MiB scan at 2/3 local: 45,000 demand faults a second against 1,500 inline). For the same
//! reason it evicts for room itself rather than waiting for the evictor thread.
//!
//! With [`Config::in_process_frames`] far pages stay in this process as page frames in a shadow
//! mapping beside each region, and move between the two with UFFDIO_MOVE: a page-table change,
//! no copy. Everything else (write protection, hashes, slots, the write-back thread) serves the
//! copying path: other stores, and pages the kernel will not move.
use crate::budget::{pages_for, Budget};
use crate::buffer::{JobQueue, PageWrite, Slots};
use crate::config::Config;
use crate::prefetch::Detector;
use crate::refill::{self, Refill};
pub(crate) use crate::region::RegionInner;
use crate::sections::{SectionCounts, SectionId, SectionMap, Sections};
use crate::staging::{Staging, PREFETCH_BATCH};
use crate::stats::{snapshot, Counters, PagerStats, StoreMemory};
use crate::sys::{self, Mapping, Uffd, PAGE};
use crate::table::{kind, PageTable, RESIDENT};
use crate::tags::{self, Tags};
use crate::tier::Frames;
use crate::victims::{stale, Eviction};
use crate::PagerError;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::*};
use std::sync::Arc;
use std::time::Duration;
use tidepool_store::FarStore;
use tidepool_sys::RawThread;

/// The exit status of a program whose far memory became unreachable.
pub const FATAL_EXIT_CODE: i32 = 70;
/// Pages of write-back buffer (counted in the local budget).
pub(crate) const WRITEBACK_SLOTS: usize = 1024;

pub(crate) fn hash_page(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

pub(crate) static ZERO_PAGE: [u8; PAGE] = [0; PAGE];

/// Whether a page holds only zeroes; stops at the first non-zero 256 bytes.
pub(crate) fn is_zero_page(bytes: &[u8]) -> bool {
    bytes
        .chunks_exact(256)
        .all(|c| c.iter().fold(0u8, |a, &b| a | b) == 0)
}

pub(crate) struct Inner {
    pub(crate) uffd: Uffd,
    pub(crate) store: Arc<dyn FarStore>,
    pub(crate) regions: RwLock<Vec<Arc<RegionInner>>>,
    pub(crate) budget: Budget,
    /// Where eviction takes its victims from, in turn (see `victims/`).
    pub(crate) eviction: Eviction,
    /// In a forked child, the pages it shares with its parent ([`crate::table::INHERITED`]):
    /// a fork of its own write-protects them again.
    pub(crate) inherited: Mutex<Vec<(Arc<RegionInner>, usize)>>,
    pub(crate) evict_seq: AtomicU32,
    /// Non-zero: the evictor should look at the budget now (a futex word: no lock, so a fork
    /// can never leave it held).
    pub(crate) evictor_kick: AtomicU32,
    /// Non-zero once the pager stops: the watchdog's sleep ends at once (a futex word).
    pub(crate) watchdog_stop: AtomicU32,
    /// A registered page nobody maps: a fault on it tells a handler to stop.
    pub(crate) doorbell: Mapping,
    pub(crate) slots: Slots,
    /// Jobs for the write-back thread.
    pub(crate) jobs: JobQueue,
    /// Writes that landed while their page was locked, to finish later (see
    /// `finish_writeback`). Here, not on the write-back thread's stack, so that a forked
    /// child's own thread finishes them: the thread is not copied, this list is.
    pub(crate) deferred: Mutex<Vec<PageWrite>>,
    /// How far copies are named, and which may be removed (see `tags.rs`).
    pub(crate) tags: Tags,
    pub(crate) counters: Counters,
    /// The named parts of the regions and their counters (see `sections.rs`).
    pub(crate) sections: Sections,
    pub(crate) timings: crate::stats::Timings,
    pub(crate) shutdown: AtomicBool,
    pub(crate) window_max: u32,
    /// Whether evicted pages wait as frames in shadow mappings, and as what (see `tier.rs`).
    pub(crate) frames: Frames,
    /// [`Config::drop_far_copies`]; off in a forked child, whose store is a copy-on-write
    /// copy of its parent's (removing from it would copy its memory).
    pub(crate) drop_far_copies: AtomicBool,
    /// [`Config::child_local_budget`].
    pub(crate) child_budget: Option<usize>,
    /// Held (shared) by an eviction batch from choosing its victims to having read them, and
    /// (exclusive) by `mprotect` on a region: a page the batch found readable cannot become
    /// inaccessible before the batch reads it (the read would kill the process with SIGSEGV;
    /// V8 changes its heap's protection while the pager evicts). A batch only tries it (and
    /// evicts nothing if `mprotect` holds it): the program thread in `mprotect` may wait in a
    /// fault that the batch's thread must serve.
    pub(crate) protecting: RwLock<()>,
    /// With [`Config::refill`], what brings evicted pages back while the budget has room.
    pub(crate) refill: Option<Refill>,
    /// What each pager thread is doing, for the watchdog.
    pub(crate) activity: crate::activity::Activity,
    /// [`Config::fault_deadline`].
    pub(crate) fault_deadline: Duration,
    /// [`Config::stall_handlers_after`].
    pub(crate) stall_handlers_after: Option<u64>,
    /// The machine's interrupt counts when the pager started, and the handlers' threads.
    pub(crate) interrupts: crate::cpu::Baseline,
    pub(crate) handler_tids: crate::cpu::HandlerTids,
    /// Which handler reads faults, and where the pager's threads run.
    pub(crate) follow: crate::follow::Follow,
    /// The demand faults, once [`Pager::trace_faults`] asked for them (see `fault_trace.rs`).
    pub(crate) fault_trace: std::sync::OnceLock<crate::fault_trace::Recorder>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pager")
            .field("store", &self.store.describe())
            .field("budget_pages", &self.budget.pages())
            .field("resident", &self.budget.resident.load(Relaxed))
            .finish()
    }
}

/// Owns the pager's threads; dropping the last handle stops them.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) inner: Arc<Inner>,
    pub(crate) threads: Mutex<Vec<RawThread>>,
    /// How many of `threads` are fault handlers.
    pub(crate) handlers: usize,
    /// The CPUs fault handlers are pinned to.
    pub(crate) cpus: Vec<usize>,
    pub(crate) thread_start: Option<fn()>,
    pub(crate) around_child_restart: Option<fn(bool)>,
    pub(crate) before_fork: Option<fn()>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, SeqCst);
        // Each handler reads the doorbell below.
        self.inner.follow.all_read();
        self.inner.kick_evictor();
        self.inner.watchdog_stop.store(1, Release);
        sys::futex_wake(&self.inner.watchdog_stop);
        // Handlers block in read(2) on the userfaultfd: each learns of the shutdown from a
        // fault on the doorbell page, and maps the page (ending this read) as it leaves.
        let bell = self.inner.doorbell.addr();
        for _ in 0..self.handlers {
            // SAFETY: a byte of the pager's own registered doorbell page; the read blocks until
            // a handler maps the page, and reads zero.
            unsafe { std::ptr::read_volatile(bell as *const u8) };
            sys::discard(bell, PAGE);
        }
        for t in self.threads.lock().drain(..) {
            t.join();
        }
        crate::fork::forget_stopped();
    }
}

/// What every thread of the pager does first: the program's hook (before anything on the
/// thread allocates), then its thread-locals with destructors, before it can hold a lock a
/// handler needs or serve a fault (see `tidepool_sys::prime_thread_locals`).
pub(crate) fn thread_begins(thread_start: Option<fn()>) {
    if let Some(hook) = thread_start {
        hook();
    }
    tidepool_sys::prime_thread_locals();
}

/// Starts the fault handlers (one per CPU, at most 8), the evictor, the write-back thread and
/// the watchdog; returns them and how many are handlers. Serves faults on the calling thread
/// until every new thread runs (see [`Inner::serve_while_starting`]).
pub(crate) fn spawn_threads(
    inner: &Arc<Inner>,
    cpus: &[usize],
    thread_start: Option<fn()>,
) -> Result<(Vec<RawThread>, usize), PagerError> {
    let mut threads = Vec::new();
    let started = Arc::new(AtomicU32::new(0));
    // Raw threads: the hook must run before anything on the thread allocates.
    let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
        let (i, started) = (inner.clone(), started.clone());
        tidepool_sys::spawn_raw(&name, move || {
            thread_begins(thread_start);
            // Pages the program tagged with a protection key are read and written here too.
            tidepool_sys::vm::open_protection_keys();
            i.activity.join();
            started.fetch_add(1, Release);
            f()
        })
        .map_err(PagerError::Thread)
    };
    for (n, &cpu) in cpus.iter().take(8).enumerate() {
        let i = inner.clone();
        threads.push(spawn(
            format!("tp-fault-{cpu}"),
            Box::new(move || {
                let _ = tidepool_sys::set_affinity(0, &[cpu]);
                i.handler_loop(n);
            }),
        )?);
    }
    if cpus.is_empty() {
        let i = inner.clone();
        threads.push(spawn(
            "tp-fault".into(),
            Box::new(move || i.handler_loop(0)),
        )?);
    }
    let handlers = threads.len();
    let i = inner.clone();
    threads.push(spawn(
        "tp-evict".into(),
        Box::new(move || {
            i.follow.register(crate::follow::Role::Evictor);
            i.evictor_loop()
        }),
    )?);
    let i = inner.clone();
    threads.push(spawn(
        "tp-writeback".into(),
        Box::new(move || {
            i.follow.register(crate::follow::Role::WriteBack);
            i.store_loop()
        }),
    )?);
    if !inner.fault_deadline.is_zero() {
        let i = inner.clone();
        threads.push(spawn(
            "tp-watchdog".into(),
            Box::new(move || {
                i.follow.register(crate::follow::Role::Watchdog);
                i.watchdog_loop()
            }),
        )?);
    }
    inner.serve_while_starting(&started, threads.len() as u32);
    Ok((threads, handlers))
}

/// A userfaultfd pager: regions whose pages live in a far store, with at most a budget of them
/// mapped locally. Cheap to clone; the threads stop when the last clone and the last region
/// are dropped.
#[derive(Debug, Clone)]
pub struct Pager {
    shared: Arc<Shared>,
}

impl Inner {
    /// The pager's state for `config` over `store`, its fault handlers to run on `cpus`: the
    /// userfaultfd, the budget, the tiers, the write-back slots.
    fn new(config: &Config, store: Arc<dyn FarStore>, cpus: &[usize]) -> Result<Inner, PagerError> {
        let uffd = Uffd::open().map_err(PagerError::Userfaultfd)?;
        let can_move = uffd.can_move();
        let doorbell = Mapping::reserve(PAGE).map_err(PagerError::Reserve)?;
        uffd.register(doorbell.addr(), PAGE)
            .map_err(PagerError::Register)?;
        let slots_buf = Mapping::reserve(WRITEBACK_SLOTS * PAGE).map_err(PagerError::Reserve)?;
        let tags = Tags::new(!store.private_to_process());
        let frames = Frames::new(config, store.private_to_process(), can_move);
        let budget = frames.split_budget(pages_for(config.local_budget));
        Ok(Inner {
            uffd,
            store,
            regions: RwLock::new(Vec::new()),
            budget: Budget::new(budget),
            eviction: Eviction::default(),
            inherited: Mutex::new(Vec::new()),
            evict_seq: AtomicU32::new(1),
            evictor_kick: AtomicU32::new(0),
            watchdog_stop: AtomicU32::new(0),
            doorbell,
            slots: Slots {
                buf: slots_buf,
                free: Mutex::new((0..WRITEBACK_SLOTS as u32).rev().collect()),
                in_use: AtomicUsize::new(0),
            },
            jobs: JobQueue::default(),
            deferred: Mutex::new(Vec::new()),
            tags,
            counters: Counters::default(),
            sections: Sections::new(),
            timings: crate::stats::Timings::new(),
            shutdown: AtomicBool::new(false),
            refill: config.refill.then(Refill::default),
            window_max: config.prefetch_window_max,
            activity: Default::default(),
            fault_deadline: config.fault_deadline,
            stall_handlers_after: config.stall_handlers_after,
            interrupts: Default::default(),
            handler_tids: Default::default(),
            follow: crate::follow::Follow::new(
                config.follow_program && !config.fault_deadline.is_zero(),
                cpus.iter().take(8).copied().collect(),
            ),
            frames,
            drop_far_copies: AtomicBool::new(config.drop_far_copies),
            child_budget: config.child_local_budget,
            protecting: RwLock::new(()),
            fault_trace: std::sync::OnceLock::new(),
        })
    }
}

impl Pager {
    /// Starts a pager over `store`.
    pub fn start(config: Config, store: Arc<dyn FarStore>) -> Result<Pager, PagerError> {
        // A fork in the middle would leave the child half a pager.
        let _section = crate::gate::section();
        let cpus = config.handler_cpus.clone().unwrap_or_else(allowed_cpus);
        let inner = Arc::new(Inner::new(&config, store, &cpus)?);
        inner.interrupts.set_now();
        crate::fork::install();
        let (threads, handlers) = spawn_threads(&inner, &cpus, config.thread_start)?;
        let shared = Arc::new(Shared {
            inner,
            threads: Mutex::new(threads),
            handlers,
            cpus,
            thread_start: config.thread_start,
            around_child_restart: config.around_child_restart,
            before_fork: config.before_fork,
        });
        let hooks: std::sync::Weak<dyn crate::fork::ForkHooks> =
            Arc::downgrade(&shared) as std::sync::Weak<Shared>;
        crate::fork::register(hooks);
        Ok(Pager { shared })
    }

    /// The hook every pager thread runs first ([`Config::thread_start`]).
    pub(crate) fn thread_start(&self) -> Option<fn()> {
        self.shared.thread_start
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.shared.inner
    }

    /// Changes the local-memory budget of a running pager; shrinking evicts at once.
    pub fn set_local_budget(&self, bytes: usize) {
        self.inner().set_budget(bytes);
    }

    /// The local-memory budget in bytes.
    pub fn local_budget(&self) -> usize {
        self.inner().total_budget_pages() * PAGE
    }

    /// Call as the process leaves (its exit handlers, `_exit`): the pager's threads that run at
    /// SCHED_IDLE go back to normal priority, so that they end promptly when the process is
    /// reaped (see `follow.rs`). Allocates nothing and takes no lock.
    pub fn before_exit(&self) {
        let i = self.inner();
        i.follow.leave_idle((0..8).map(|n| i.handler_tids.get(n)));
    }

    /// What the pager has done so far.
    pub fn stats(&self) -> PagerStats {
        let i = self.inner();
        // Reading the timings takes their locks, which a fork must not find held.
        let _section = crate::gate::section();
        let mut s = snapshot(
            &i.counters,
            &i.timings,
            i.budget.resident.load(Relaxed) as u64,
            i.total_budget_pages() as u64,
            i.frames.probation(),
        );
        s.store_health = i.store.topology().and_then(|t| t.health());
        s.handler_sleeps = i.handler_tids.sleeps();
        s.interrupts = i.interrupts.taken();
        s.follow = i.follow.report();
        s.sections = i.sections.snapshot();
        // An in-process store answers at once: what it holds is this process's memory.
        if i.store.private_to_process() {
            s.store_memory = i.store.stats().ok().and_then(|st| {
                let extra = |name: &str| st.extra.iter().find(|(n, _)| n == name).map(|e| e.1);
                Some(StoreMemory {
                    held: st.far_bytes?,
                    original: extra("original_bytes"),
                    packed: extra("packed_bytes"),
                    same_filled: extra("same_filled"),
                    kept_whole: extra("kept_raw"),
                    compacted: extra("compacted_bytes").zip(extra("compacted_values")),
                })
            });
        }
        s
    }

    /// [`Pager::stats`] with each section's resident pages, counted by a walk of the pages
    /// mapped: for reports (`--stats`, `tidepool status`), not for sampling.
    pub fn report(&self) -> PagerStats {
        let mut s = self.stats();
        let i = self.inner();
        let mut resident = vec![0u64; crate::SECTIONS_MAX];
        {
            let _section = crate::gate::section();
            let clock = i.eviction.clock.entries();
            // A page may have more than one live entry (installed again without an eviction
            // between): counted once.
            let mut seen = std::collections::HashSet::with_capacity(clock.len());
            for entry in clock.iter() {
                let (region, page, _) = entry;
                if !stale(entry)
                    && kind(region.table.state(*page).load(Relaxed)) == RESIDENT
                    && seen.insert((region.id, *page))
                {
                    resident[region.sections.of(*page).index()] += 1;
                }
            }
        }
        for section in &mut s.sections {
            section.resident_pages = Some(resident[section.index]);
        }
        s
    }

    /// The section named `name` (made if new): a part of the regions with counters of its own
    /// in [`PagerStats::sections`]. Past [`crate::SECTIONS_MAX`] names, every new one is
    /// counted as `rest`. Name pages with [`crate::AdoptedRegion::set_section`].
    pub fn section(&self, name: &str) -> SectionId {
        let _section = crate::gate::section();
        self.inner().sections.intern(name)
    }

    /// Records the next `capacity` demand faults from now on, for [`Pager::fault_trace`] (a
    /// word each, allocated now; a second call changes nothing).
    pub fn trace_faults(&self, capacity: usize) {
        let _ = self
            .inner()
            .fault_trace
            .get_or_init(|| crate::fault_trace::Recorder::new(capacity));
    }

    /// The demand faults recorded since [`Pager::trace_faults`], if it was called.
    pub fn fault_trace(&self) -> Option<crate::fault_trace::FaultTrace> {
        let inner = self.inner();
        let recorder = inner.fault_trace.get()?;
        Some(recorder.snapshot(inner.sections.names()))
    }

    /// Serves section `id` by `policy` from now on (see [`crate::Policy`]; every section starts
    /// with the default, the pager's behaviour without a profile).
    pub fn set_section_policy(&self, id: SectionId, policy: crate::Policy) {
        self.inner().sections.set_policy(id, policy);
    }

    /// Adds a memory node to the far store while the program runs (a store over several
    /// memory nodes only; others refuse).
    pub fn add_store_node(&self, addr: &str) -> Result<(), tidepool_store::StoreError> {
        tidepool_store::add_node(self.inner().store.as_ref(), addr)
    }

    /// A description of the far store, for messages.
    pub fn store_description(&self) -> String {
        self.inner().store.describe()
    }

    /// Reserves `len` bytes (rounded up to pages) of address space and registers it.
    pub(crate) fn create_region(&self, len: usize) -> Result<Arc<RegionInner>, PagerError> {
        let len = len.div_ceil(PAGE).max(1) * PAGE;
        let mapping = Mapping::reserve(len).map_err(PagerError::Reserve)?;
        let base = mapping.addr();
        self.register_region(base, len, Some(mapping))
    }

    /// Registers someone else's reservation (see [`Pager::adopt`]).
    pub(crate) fn adopt_range(
        &self,
        base: usize,
        len: usize,
    ) -> Result<Arc<RegionInner>, PagerError> {
        self.register_region(base, len / PAGE * PAGE, None)
    }

    /// Registers `[base, base + len)`.
    fn register_region(
        &self,
        base: usize,
        len: usize,
        mapping: Option<Mapping>,
    ) -> Result<Arc<RegionInner>, PagerError> {
        let i = self.inner();
        if len / PAGE > tags::MAX_REGION_PAGES {
            return Err(PagerError::TooLarge(len));
        }
        let _section = crate::gate::section();
        let mut regions = i.regions.write();
        // The lowest free id: ids are 8 bits of every key.
        let id = (1..=tags::MAX_REGIONS as u32)
            .find(|id| regions.iter().all(|r| r.id != *id))
            .ok_or(PagerError::TooManyRegions(tags::MAX_REGIONS))?;
        let table = PageTable::new(len / PAGE).map_err(PagerError::Reserve)?;
        let sections = SectionMap::new(len / PAGE).map_err(PagerError::Reserve)?;
        let shadow = if i.frames.on() {
            // Inherited by forked children like the region itself: a child reads the frames
            // the parent had at the fork (the kernel shares them copy-on-write; a shared
            // frame takes the copying path until one side is done with it).
            let shadow = Mapping::reserve(len).map_err(PagerError::Reserve)?;
            i.uffd
                .register(shadow.addr(), len)
                .map_err(PagerError::Register)?;
            Some(shadow)
        } else {
            None
        };
        i.uffd.register(base, len).map_err(PagerError::Register)?;
        // The pager installs 4 KiB pages; khugepaged must not fold a fully mapped 2 MiB of
        // them into a huge page behind its back (on systems whose THP setting is "always").
        let _ = sys::advise(base, len, libc::MADV_NOHUGEPAGE);
        let region = Arc::new(RegionInner {
            id,
            base,
            len,
            table,
            detector: Mutex::new(Detector::new(i.window_max)),
            sections,
            section_prefetchers: (0..crate::SECTIONS_MAX).map(|_| Mutex::new(None)).collect(),
            touched_end: AtomicUsize::new(0),
            evicted_chunks: RegionInner::chunk_bits(len / PAGE),
            dead: AtomicBool::new(false),
            shadow,
            marks: Mutex::new(Default::default()),
            inaccessible: AtomicBool::new(false),
            _mapping: mapping,
        });
        regions.push(region.clone());
        regions.sort_by_key(|r| r.base);
        Ok(region)
    }

    /// Unregisters a region and forgets its far pages.
    pub(crate) fn remove_region(&self, region: &Arc<RegionInner>) {
        let i = self.inner();
        let _section = crate::gate::section();
        i.discard(region, 0, region.touched_end.load(Relaxed));
        region.dead.store(true, Release);
        let _ = i.uffd.unregister(region.base, region.len);
        if let Some(shadow) = &region.shadow {
            let _ = i.uffd.unregister(shadow.addr(), region.len);
        }
        i.regions.write().retain(|r| !Arc::ptr_eq(r, region));
    }
}

fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-parameter of the size passed.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return (0..tidepool_sys::online_cpus()).collect();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

impl Inner {
    pub(crate) fn region_of(&self, addr: usize) -> Option<Arc<RegionInner>> {
        let regions = self.regions.read();
        let i = regions.partition_point(|r| r.base <= addr);
        let r = regions.get(i.checked_sub(1)?)?;
        (addr < r.base + r.len).then(|| r.clone())
    }

    /// The counters of the section page `page` of `region` is in.
    #[inline]
    pub(crate) fn section_counts(&self, region: &RegionInner, page: usize) -> &SectionCounts {
        self.sections.counts(region.sections.of(page))
    }

    /// Counts page `page` of `region` into (`delta` 1) or out of (-1) its section's resident
    /// pages, as `resident` counts it into or out of the whole pager's.
    #[inline]
    pub(crate) fn count_resident(&self, region: &RegionInner, page: usize, delta: i64) {
        self.section_counts(region, page)
            .resident
            .fetch_add(delta, Relaxed);
    }

    /// Changes the budget; shrinking evicts at once.
    pub(crate) fn set_budget(&self, bytes: usize) {
        self.budget
            .set_pages(self.frames.split_budget(pages_for(bytes)));
        self.kick_evictor();
    }

    /// [`Config::drop_far_copies`], as it stands in this process.
    pub(crate) fn drops_far_copies(&self) -> bool {
        self.drop_far_copies.load(Relaxed)
    }

    pub(crate) fn kick_evictor(&self) {
        if self.evictor_kick.swap(1, AcqRel) == 0 {
            sys::futex_wake(&self.evictor_kick);
        }
    }

    /// The whole budget: mapped pages, write-back slots and the probation tier.
    pub(crate) fn total_budget_pages(&self) -> usize {
        self.frames.whole_budget(self.budget.pages())
    }

    pub(crate) fn local_pages(&self) -> usize {
        // Modular sum: a counter that dips below zero for a moment still adds up right.
        self.budget
            .resident
            .load(Relaxed)
            .wrapping_add(self.slots.in_use.load(Relaxed))
    }

    /// The far store failed: the program cannot get its memory back, so it must stop rather
    /// than read zeros in place of its data.
    pub(crate) fn fatal(&self, what: &str, err: &dyn std::fmt::Display) -> ! {
        let pid = std::process::id();
        let msg = format!(
            "tidepool pager (process {pid}): {what} failed on far store {}: {err}\n\
             tidepool pager (process {pid}): the program's memory is unreachable; stopping it (exit status {FATAL_EXIT_CODE}) rather than let it read zeros\n",
            self.store.describe()
        );
        sys::die(&msg, FATAL_EXIT_CODE)
    }
}

/// Refill brings pages back through the fault path's batch install, under the budget.
impl refill::Host for Inner {
    type Staging = Staging;
    const BATCH: usize = PREFETCH_BATCH;

    fn spare_pages(&self) -> usize {
        self.budget
            .pages()
            .saturating_sub(self.local_pages().saturating_add(2 * self.budget.margin()))
    }

    fn fits(&self, n: usize) -> bool {
        self.local_pages() + n + self.budget.margin() <= self.budget.pages()
            && !self.shutdown.load(Acquire)
    }

    fn regions(&self) -> Vec<Arc<RegionInner>> {
        self.regions.read().clone()
    }

    fn evict_seq(&self) -> u32 {
        self.evict_seq.load(Acquire)
    }

    fn is_refillable(&self, region: &RegionInner, page: usize, w: u64) -> bool {
        // A probation tier's frames are local already.
        self.frames.is_far(w) && region.readable(page)
    }

    fn release(&self, region: &RegionInner, page: usize, w: u64) {
        if region.table.unlock(page, w) {
            // A thread faulted meanwhile, found the page BUSY and waits for us.
            self.uffd.wake(region.addr(page), PAGE);
        }
    }

    fn bring_back(&self, region: &Arc<RegionInner>, batch: &[(usize, u64)], staging: &mut Staging) {
        // Counted before the pages show: whoever sees one back sees it counted.
        Counters::add(&self.counters.refilled, batch.len() as u64);
        self.install_prefetched(region, batch, staging);
    }
}
