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
//! vCPUs costs 25-160 us against ~8 us for a handler on the faulting CPU. The handler also
//! prefetches, right after waking the faulting thread: on one CPU a separate prefetch thread
//! lost the race to the program it fetched for, which then faulted page by page (measured on a
//! 96 MiB scan at 2/3 local: 45,000 demand faults a second against 1,500 inline). For the same
//! reason it evicts for room itself rather than waiting for the evictor thread.
//!
//! With [`Config::in_process_frames`] far pages stay in this process as page frames in a shadow
//! mapping beside each region, and move between the two with UFFDIO_MOVE: a page-table change,
//! no copy. Everything else (write protection, hashes, slots, the write-back thread) serves the
//! copying path: other stores, and pages the kernel will not move.
use crate::prefetch::{Detector, Plan};
use crate::stats::{snapshot, Counters, PagerStats};
use crate::sys::{self, page_bytes, Fault, Mapping, Uffd, PAGE};
use crate::table::*;
use crate::PagerError;
use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::*};
use std::sync::Arc;
use std::time::Duration;
use tidepool_store::{FarStore, Key};
use tidepool_sys::RawThread;

/// The exit status of a program whose far memory became unreachable.
pub const FATAL_EXIT_CODE: i32 = 70;
/// Pages evicted in one batch.
const EVICT_BATCH: usize = 64;
/// Pages prefetched in one store round trip.
const PREFETCH_BATCH: usize = 64;
/// Pages of write-back buffer (counted in the local budget).
const WRITEBACK_SLOTS: usize = 1024;
/// Bits of a key that number pages within a region.
const REGION_SHIFT: u32 = 40;

fn hash_page(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

static ZERO_PAGE: [u8; PAGE] = [0; PAGE];

/// Whether a page holds only zeroes; stops at the first non-zero 256 bytes.
fn is_zero_page(bytes: &[u8]) -> bool {
    bytes
        .chunks_exact(256)
        .all(|c| c.iter().fold(0u8, |a, &b| a | b) == 0)
}

/// A fault handler's own buffer for pages read from the store on their way into the region:
/// the store copies into it ([`FarStore::read_many_into`]) and one UFFDIO_COPY installs a run
/// of consecutive pages from it.
struct Staging {
    buf: Vec<u8>,
    lens: Vec<Option<usize>>,
}

impl Staging {
    fn new() -> Staging {
        Staging {
            buf: vec![0; PREFETCH_BATCH * PAGE],
            lens: vec![None; PREFETCH_BATCH],
        }
    }
    fn page(&self, i: usize) -> &[u8] {
        &self.buf[i * PAGE..(i + 1) * PAGE]
    }
}

/// A run of pages saved for eviction, not yet dropped.
struct SavedRun {
    new_words: Vec<u64>,
    writes: Vec<(Arc<RegionInner>, usize, u32)>,
    removes: Vec<Key>,
}

/// How to build a pager.
#[derive(Debug, Clone)]
pub struct Config {
    /// Local memory the pager may map, in bytes (rounded down to pages, at least 64 pages).
    /// Faults are served before eviction makes room, so for a moment the pager may hold a
    /// margin more: a 32nd of the budget, at least 64 pages and at most 4096.
    pub local_budget: usize,
    /// Largest prefetch window in pages.
    pub prefetch_window_max: u32,
    /// CPUs to run fault handlers on, one pinned handler each (default: every CPU this process
    /// may run on, at most 8).
    pub handler_cpus: Option<Vec<usize>>,
    /// Runs first on every thread the pager starts (the preload library uses it to keep those
    /// threads' allocations out of the memory they page).
    pub thread_start: Option<fn()>,
    /// Keep far pages in this process as page frames, in a shadow mapping beside each region,
    /// moved in and out with UFFDIO_MOVE (Linux 6.8): eviction and fault-in change page-table
    /// entries and copy nothing. For the in-process backend only; the store then receives just
    /// the pages the kernel will not move (pages shared with a forked child), and the option
    /// is ignored where the kernel lacks UFFDIO_MOVE.
    pub in_process_frames: bool,
}

impl Config {
    pub fn new(local_budget: usize) -> Config {
        Config {
            local_budget,
            prefetch_window_max: 512,
            handler_cpus: None,
            thread_start: None,
            in_process_frames: false,
        }
    }
}

pub(crate) struct RegionInner {
    pub id: u32,
    pub base: usize,
    pub len: usize,
    pub table: PageTable,
    detector: Mutex<Detector>,
    /// Highest page index ever mapped + 1 (bounds the walk when the region is dropped).
    touched_end: AtomicUsize,
    dead: AtomicBool,
    /// Where the region's far pages live as frames ([`Config::in_process_frames`]): page `i`
    /// of the region at page `i` of the shadow. Registered too (UFFDIO_MOVE wants both ends
    /// registered), and never touched where it holds no frame.
    shadow: Option<Mapping>,
    /// The reservation, if the pager made it.
    _mapping: Option<Mapping>,
}

impl std::fmt::Debug for RegionInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("id", &self.id)
            .field("base", &format_args!("{:#x}", self.base))
            .field("len", &self.len)
            .finish()
    }
}

impl RegionInner {
    #[inline]
    fn key(&self, page: usize) -> Key {
        ((self.id as u64) << REGION_SHIFT) | page as u64
    }
    #[inline]
    fn addr(&self, page: usize) -> usize {
        self.base + page * PAGE
    }
    #[inline]
    fn shadow_addr(&self, page: usize) -> usize {
        self.shadow.as_ref().expect("a framed region").addr() + page * PAGE
    }
    fn note_touched(&self, page: usize) {
        self.touched_end.fetch_max(page + 1, Relaxed);
    }

    /// The new word of locked page `page` (word `w`), just moved out to its frame, and whether
    /// the frame holds only zeros (the caller drops it before releasing the page: once
    /// released, the page could come back and go out again into the same frame, which a late
    /// drop would destroy).
    fn framed(&self, page: usize, w: u64, seq: u32, removes: &mut Vec<Key>) -> (u64, bool) {
        if w & FAR_VALID != 0 {
            // The frame is the far copy now (or nothing, if zero).
            removes.push(self.key(page));
        }
        self.table.evicted_at(page).store(seq, Relaxed);
        let history = (w & HISTORY) | if w & DIRTY != 0 { WAS_DIRTY } else { 0 };
        // Checked in the shadow, where nobody writes: zero pages are never kept.
        // SAFETY: the page was just moved there, so the frame exists (possibly the shared zero
        // page), and only this thread, holding the page's lock, uses it.
        if is_zero_page(unsafe { page_bytes(self.shadow_addr(page)) }) {
            (UNTOUCHED | history, true)
        } else {
            (FAR | FRAMED | history, false)
        }
    }
}

struct Slots {
    buf: Mapping,
    free: Mutex<Vec<u32>>,
    freed: Condvar,
    in_use: AtomicUsize,
}

impl Slots {
    fn slot_addr(&self, slot: u32) -> usize {
        self.buf.addr() + slot as usize * PAGE
    }
    fn bytes(&self, slot: u32) -> &[u8] {
        // SAFETY: slot buffers are pager-private memory (never registered), each slot owned by
        // exactly one page in WRITEBACK state until freed.
        unsafe { std::slice::from_raw_parts(self.slot_addr(slot) as *const u8, PAGE) }
    }
    fn fill(&self, slot: u32, src: &[u8]) {
        assert_eq!(src.len(), PAGE);
        // SAFETY: the evictor fills a slot it just took from the free list, which nobody else
        // references; the slot is PAGE writable bytes of pager-private memory.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.slot_addr(slot) as *mut u8, PAGE)
        }
    }
    fn take(&self) -> u32 {
        let mut free = self.free.lock();
        loop {
            if let Some(s) = free.pop() {
                self.in_use.fetch_add(1, Relaxed);
                return s;
            }
            self.freed.wait_for(&mut free, Duration::from_millis(50));
        }
    }
    fn give(&self, slot: u32) {
        self.free.lock().push(slot);
        self.in_use.fetch_sub(1, Relaxed);
        self.freed.notify_all();
    }
}

enum StoreJob {
    Write(Vec<(Arc<RegionInner>, usize, u32)>),
    Remove(Vec<Key>),
}

pub(crate) struct Inner {
    uffd: Uffd,
    store: Arc<dyn FarStore>,
    regions: RwLock<Vec<Arc<RegionInner>>>,
    next_region: AtomicU32,
    budget_pages: AtomicUsize,
    resident: AtomicUsize,
    clock: Mutex<VecDeque<(Arc<RegionInner>, usize)>>,
    /// Pages streams walked past ([`Plan::behind_count`]), evicted first, newest first.
    done: Mutex<VecDeque<(Arc<RegionInner>, usize)>>,
    evict_seq: AtomicU32,
    evictor_kick: (Mutex<bool>, Condvar),
    /// A registered page nobody maps: a fault on it tells a handler to stop.
    doorbell: Mapping,
    slots: Slots,
    store_tx: Sender<StoreJob>,
    counters: Counters,
    shutdown: AtomicBool,
    window_max: u32,
    /// Far pages are frames in shadow mappings ([`Config::in_process_frames`]).
    frames: bool,
    /// Pages the prefetcher is waiting to have room for.
    room_wanted: AtomicUsize,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pager")
            .field("store", &self.store.describe())
            .field("budget_pages", &self.budget_pages.load(Relaxed))
            .field("resident", &self.resident.load(Relaxed))
            .finish()
    }
}

/// Owns the pager's threads; dropping the last handle stops them.
#[derive(Debug)]
struct Shared {
    inner: Arc<Inner>,
    threads: Mutex<Vec<RawThread>>,
    /// How many of `threads` are fault handlers.
    handlers: usize,
    thread_start: Option<fn()>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Release);
        self.inner.kick_evictor();
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
    }
}

/// A userfaultfd pager: regions whose pages live in a far store, with at most a budget of them
/// mapped locally. Cheap to clone; the threads stop when the last clone and the last region
/// are dropped.
#[derive(Debug, Clone)]
pub struct Pager {
    shared: Arc<Shared>,
}

impl Pager {
    /// Starts a pager over `store`.
    pub fn start(config: Config, store: Arc<dyn FarStore>) -> Result<Pager, PagerError> {
        let uffd = Uffd::open().map_err(PagerError::Userfaultfd)?;
        let can_move = uffd.can_move();
        let doorbell = Mapping::reserve_unforked(PAGE).map_err(PagerError::Reserve)?;
        uffd.register(doorbell.addr(), PAGE)
            .map_err(PagerError::Register)?;
        let slots_buf = Mapping::reserve(WRITEBACK_SLOTS * PAGE).map_err(PagerError::Reserve)?;
        let (store_tx, store_rx) = crossbeam_channel::unbounded();
        let inner = Arc::new(Inner {
            uffd,
            store,
            regions: RwLock::new(Vec::new()),
            next_region: AtomicU32::new(1),
            budget_pages: AtomicUsize::new(budget_pages(config.local_budget)),
            resident: AtomicUsize::new(0),
            clock: Mutex::new(VecDeque::new()),
            done: Mutex::new(VecDeque::new()),
            evict_seq: AtomicU32::new(1),
            evictor_kick: (Mutex::new(false), Condvar::new()),
            doorbell,
            slots: Slots {
                buf: slots_buf,
                free: Mutex::new((0..WRITEBACK_SLOTS as u32).rev().collect()),
                freed: Condvar::new(),
                in_use: AtomicUsize::new(0),
            },
            store_tx,
            counters: Counters::default(),
            shutdown: AtomicBool::new(false),
            room_wanted: AtomicUsize::new(0),
            window_max: config.prefetch_window_max,
            frames: config.in_process_frames && can_move,
        });
        let cpus = config.handler_cpus.unwrap_or_else(allowed_cpus);
        let mut threads = Vec::new();
        let thread_start = config.thread_start;
        // Raw threads: the hook must run before anything on the thread allocates.
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            tidepool_sys::spawn_raw(&name, move || {
                if let Some(hook) = thread_start {
                    hook();
                }
                f()
            })
            .map_err(PagerError::Thread)
        };
        for &cpu in cpus.iter().take(8) {
            let i = inner.clone();
            threads.push(spawn(
                format!("tp-fault-{cpu}"),
                Box::new(move || {
                    let _ = tidepool_sys::set_affinity(0, &[cpu]);
                    i.handler_loop();
                }),
            )?);
        }
        if cpus.is_empty() {
            let i = inner.clone();
            threads.push(spawn(
                "tp-fault".into(),
                Box::new(move || i.handler_loop()),
            )?);
        }
        let handlers = threads.len();
        crate::fork::install();
        let i = inner.clone();
        threads.push(spawn(
            "tp-evict".into(),
            Box::new(move || i.evictor_loop()),
        )?);
        let i = inner.clone();
        threads.push(spawn(
            "tp-writeback".into(),
            Box::new(move || i.store_loop(store_rx)),
        )?);
        Ok(Pager {
            shared: Arc::new(Shared {
                inner,
                threads: Mutex::new(threads),
                handlers,
                thread_start,
            }),
        })
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
        self.inner()
            .budget_pages
            .store(budget_pages(bytes), Relaxed);
        self.inner().kick_evictor();
    }

    /// The local-memory budget in bytes.
    pub fn local_budget(&self) -> usize {
        self.inner().budget_pages.load(Relaxed) * PAGE
    }

    /// What the pager has done so far.
    pub fn stats(&self) -> PagerStats {
        let i = self.inner();
        snapshot(
            &i.counters,
            i.resident.load(Relaxed) as u64,
            i.budget_pages.load(Relaxed) as u64,
        )
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
        let table = PageTable::new(len / PAGE).map_err(PagerError::Reserve)?;
        let shadow = if i.frames {
            // Not inherited by forked children: the parent's frames stay its own, so that
            // moving them never fails for being shared.
            let shadow = Mapping::reserve_unforked(len).map_err(PagerError::Reserve)?;
            i.uffd
                .register(shadow.addr(), len)
                .map_err(PagerError::Register)?;
            Some(shadow)
        } else {
            None
        };
        i.uffd.register(base, len).map_err(PagerError::Register)?;
        let region = Arc::new(RegionInner {
            id: i.next_region.fetch_add(1, Relaxed),
            base,
            len,
            table,
            detector: Mutex::new(Detector::new(i.window_max)),
            touched_end: AtomicUsize::new(0),
            dead: AtomicBool::new(false),
            shadow,
            _mapping: mapping,
        });
        let mut regions = i.regions.write();
        regions.push(region.clone());
        regions.sort_by_key(|r| r.base);
        i.publish_for_fork(&regions);
        Ok(region)
    }

    /// Unregisters a region and forgets its far pages.
    pub(crate) fn remove_region(&self, region: &Arc<RegionInner>) {
        let i = self.inner();
        i.discard(region, 0, region.touched_end.load(Relaxed));
        region.dead.store(true, Release);
        let _ = i.uffd.unregister(region.base, region.len);
        if let Some(shadow) = &region.shadow {
            let _ = i.uffd.unregister(shadow.addr(), region.len);
        }
        let mut regions = i.regions.write();
        regions.retain(|r| !Arc::ptr_eq(r, region));
        i.publish_for_fork(&regions);
    }
}

/// Splits sorted victims into runs of consecutive pages of one region.
fn runs_of(victims: &[(Arc<RegionInner>, usize, u64)]) -> Vec<std::ops::Range<usize>> {
    let n = victims.len();
    let mut runs = Vec::new();
    let mut start = 0;
    while start < n {
        let mut end = start + 1;
        while end < n
            && victims[end].0.id == victims[start].0.id
            && victims[end].1 == victims[end - 1].1 + 1
        {
            end += 1;
        }
        runs.push(start..end);
        start = end;
    }
    runs
}

fn budget_pages(bytes: usize) -> usize {
    (bytes / PAGE).max(64)
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
    fn region_of(&self, addr: usize) -> Option<Arc<RegionInner>> {
        let regions = self.regions.read();
        let i = regions.partition_point(|r| r.base <= addr);
        let r = regions.get(i.checked_sub(1)?)?;
        (addr < r.base + r.len).then(|| r.clone())
    }

    fn publish_for_fork(&self, regions: &[Arc<RegionInner>]) {
        let list: Vec<(usize, usize, usize)> = regions
            .iter()
            .map(|r| (r.base, r.len, r.table.states_addr()))
            .collect();
        crate::fork::publish(&list, self.slots.buf.addr());
    }

    fn kick_evictor(&self) {
        let (m, cv) = &self.evictor_kick;
        *m.lock() = true;
        cv.notify_one();
    }

    fn local_pages(&self) -> usize {
        // Modular sum: a counter that dips below zero for a moment still adds up right.
        self.resident
            .load(Relaxed)
            .wrapping_add(self.slots.in_use.load(Relaxed))
    }

    /// Pages kept free below the budget so that faults rarely wait for eviction.
    fn margin(&self) -> usize {
        (self.budget_pages.load(Relaxed) / 32).clamp(EVICT_BATCH, 4096)
    }

    /// The far store failed: the program cannot get its memory back, so it must stop rather
    /// than read zeros in place of its data.
    fn fatal(&self, what: &str, err: &dyn std::fmt::Display) -> ! {
        let msg = format!(
            "tidepool pager: {what} failed on far store {}: {err}\n\
             tidepool pager: the program's memory is unreachable; stopping it (exit status {FATAL_EXIT_CODE}) rather than let it read zeros\n",
            self.store.describe()
        );
        // SAFETY: writing a buffer to standard error, then exiting without running the
        // program's handlers (its memory cannot be trusted).
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::_exit(FATAL_EXIT_CODE)
        }
    }

    // ---- fault handling -------------------------------------------------------------------

    fn handler_loop(self: Arc<Self>) {
        let mut faults = Vec::with_capacity(32);
        let mut staging = Staging::new();
        let bell = self.doorbell.addr();
        loop {
            // One system call a fault: the read blocks until there are some (a poll first
            // would be a second).
            if let Err(e) = self.uffd.read_faults(&mut faults) {
                self.fatal("reading fault events", &e);
            }
            let mut stop = false;
            for f in faults.drain(..) {
                if f.page_addr != bell {
                    self.serve(f, &mut staging);
                } else if self.shutdown.load(Acquire) && !stop {
                    // Mapping the page lets the ringer go on to the next handler.
                    stop = true;
                    let _ = self.uffd.zeropage(bell);
                } else {
                    self.uffd.wake(bell, PAGE);
                }
            }
            if stop {
                return;
            }
        }
    }

    fn serve(&self, f: Fault, staging: &mut Staging) {
        let Some(region) = self.region_of(f.page_addr) else {
            self.uffd.wake(f.page_addr, PAGE);
            return;
        };
        let page = (f.page_addr - region.base) / PAGE;
        if f.wp {
            self.serve_write_protect(&region, page);
            return;
        }
        Counters::add(&self.counters.missing_faults, 1);
        let word = loop {
            if let Some(w) = region
                .table
                .try_lock(page, &[UNTOUCHED, FAR, WRITEBACK, RESIDENT])
            {
                break w;
            }
            if region.table.flag_waiters(page) {
                // Another thread is moving the page and wakes the faulting thread when done.
                return;
            }
        };
        if kind(word) == RESIDENT {
            self.refill_resident(&region, page, word);
            return;
        }
        self.install_demand(&region, page, word, f.write, staging);
        let budget = self.budget_pages.load(Relaxed);
        if self.local_pages() > budget {
            self.kick_evictor();
            // Far over budget (the evictor is behind): reclaim here before going on.
            while self.local_pages() > budget + self.margin() && self.evict_batch() > 0 {}
        }
        let (plan, credited) = {
            let mut d = region.detector.lock();
            let before = d.credited;
            let table = &region.table;
            let plan = d.on_fault(page as i64, |p| {
                p >= 0
                    && (p as usize) < table.pages()
                    && kind(table.state(p as usize).load(Relaxed)) == RESIDENT
            });
            (plan, d.credited - before)
        };
        Counters::add(&self.counters.prefetch_credited, credited);
        if let Some(plan) = plan {
            Counters::add(&self.counters.prefetch_planned, plan.count as u64);
            if plan.behind_count > 0 {
                self.note_done(&region, &plan);
            }
            self.prefetch(&region, plan, staging);
        }
    }

    /// Remembers the pages a stream walked past as the first to evict.
    fn note_done(&self, region: &Arc<RegionInner>, plan: &Plan) {
        let pages = region.table.pages() as i64;
        let mut done = self.done.lock();
        for i in 0..plan.behind_count as i64 {
            let p = plan.behind_start + i * plan.stride;
            if (0..pages).contains(&p) {
                done.push_back((region.clone(), p as usize));
            }
        }
        // Old hints are the least useful: the newest are taken first.
        let cap = self.budget_pages.load(Relaxed);
        while done.len() > cap {
            done.pop_front();
        }
    }

    /// A missing fault on a page we think is mapped: either a stale event (a second thread
    /// faulted on the page before it was installed) or the program dropped the page behind our
    /// back (a direct MADV_DONTNEED system call), which reads as zeros.
    fn refill_resident(&self, region: &Arc<RegionInner>, page: usize, word: u64) {
        if region.shadow.is_some() && self.adopt_moved(region, page, false) {
            // The kernel moved the page out to its frame without a request: bring it back.
            self.move_in(region, page, 1, true);
            region.table.unlock(page, word);
            return;
        }
        if self.copy_in(region.addr(page), &ZERO_PAGE, false) {
            crate::tr!(page, "refill_zero", word);
            if word & FAR_VALID != 0 {
                let _ = self.store_tx.send(StoreJob::Remove(vec![region.key(page)]));
            }
            region
                .table
                .unlock(page, RESIDENT | DIRTY | (word & HISTORY));
        } else {
            region.table.unlock(page, word);
            // Installed by another thread after the fault, perhaps without a wake-up (it wakes
            // only waiters it knows of).
            self.uffd.wake(region.addr(page), PAGE);
        }
    }

    /// Maps one page a thread is waiting for; `word` is its state before the lock.
    fn install_demand(
        &self,
        region: &Arc<RegionInner>,
        page: usize,
        word: u64,
        write: bool,
        staging: &mut Staging,
    ) {
        let addr = region.addr(page);
        let history = word & HISTORY;
        let referenced = self.recently_evicted(region, page);
        let new = match kind(word) {
            UNTOUCHED => {
                Counters::add(&self.counters.zero_fills, 1);
                if write {
                    self.copy_in(addr, &ZERO_PAGE, false);
                    RESIDENT | DIRTY | history
                } else {
                    // The shared zero page: no memory until written; a write is a private
                    // copy the kernel makes without us, so the page's state is "unknown"
                    // and eviction hashes it.
                    match self.uffd.zeropage(addr) {
                        Ok(()) => {}
                        // Mapped already; whoever did may not have woken the thread (owners
                        // wake only waiters they know of).
                        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                            self.uffd.wake(addr, PAGE)
                        }
                        Err(e) => self.fatal("mapping a zero page", &e),
                    }
                    RESIDENT | history
                }
            }
            WRITEBACK => {
                Counters::add(&self.counters.writeback_hits, 1);
                let slot = (word >> SLOT_SHIFT) as u32;
                self.copy_in(addr, self.slots.bytes(slot), false);
                // The write in flight will land; the page is written again at next eviction.
                RESIDENT | DIRTY | history
            }
            _ if word & FRAMED != 0 => {
                Counters::add(&self.counters.far_fetches, 1);
                Counters::add(&self.counters.bytes_read, PAGE as u64);
                self.move_in(region, page, 1, true);
                RESIDENT | if write { DIRTY } else { 0 } | history
            }
            _ => {
                Counters::add(&self.counters.far_fetches, 1);
                self.read_pages(&[region.key(page)], staging, "reading a page");
                let data = staging.page(0);
                Counters::add(&self.counters.bytes_read, PAGE as u64);
                let predicted_write = write || history & WAS_DIRTY != 0;
                if predicted_write && !write {
                    // Installed writable on a guess: eviction compares hashes to tell whether
                    // it was written.
                    region.table.hash(page).store(hash_page(data), Relaxed);
                }
                self.copy_in(addr, data, !predicted_write);
                let clean = if predicted_write {
                    if write {
                        DIRTY
                    } else {
                        0
                    }
                } else {
                    WP_CLEAN
                };
                RESIDENT | FAR_VALID | clean | history
            }
        };
        // A page fetched again soon after its eviction heats up, one fetched late cools
        // down; the hotter, the more passes of the clock hand it survives.
        let heat = (new & HEAT) >> HEAT_SHIFT;
        let heat = if referenced {
            (heat + 1).min(3)
        } else {
            heat / 2
        };
        let new = (new & !(HEAT | CHANCES)) | (heat << HEAT_SHIFT) | (heat << CHANCE_SHIFT);
        self.resident.fetch_add(1, Relaxed);
        region.note_touched(page);
        region.table.unlock(page, new);
        self.clock.lock().push_back((region.clone(), page));
    }

    /// Reads whole pages from the store into the staging buffer; a missing or short page is
    /// fatal (the program would read garbage).
    fn read_pages(&self, keys: &[Key], staging: &mut Staging, what: &str) {
        let Staging { buf, lens } = staging;
        if let Err(e) = self.store.read_many_into(keys, PAGE, buf, lens) {
            self.fatal(what, &e);
        }
        for len in &lens[..keys.len()] {
            match len {
                Some(PAGE) => {}
                Some(n) => self.fatal(
                    what,
                    &format!("the store returned {n} bytes for a 4096-byte page"),
                ),
                None => self.fatal(what, &"the store lost a page"),
            }
        }
    }

    /// Moves pages `[first, first + count)` of a framed region in from its shadow, waking
    /// whoever waits there if `wake`. A page the kernel will not move (shared with a forked
    /// child, EBUSY) is copied instead and its frame dropped.
    fn move_in(&self, region: &RegionInner, first: usize, count: usize, wake: bool) {
        let (mut p, end) = (first, first + count);
        while p < end {
            let (n, err) = self.uffd.move_pages(
                region.addr(p),
                region.shadow_addr(p),
                (end - p) * PAGE,
                wake,
            );
            #[cfg(feature = "trace")]
            crate::trace::move_call(
                region.base,
                region.shadow_addr(0),
                p,
                end - p,
                n,
                &err,
                true,
            );
            p += n / PAGE;
            let Some(e) = err else { break };
            crate::tr!(p, "move_in_err", e.raw_os_error().unwrap_or(0));
            match e.raw_os_error() {
                Some(libc::EBUSY) => {
                    // SAFETY: a FRAMED page has a frame in the shadow, which only the pager
                    // touches, and only where it has frames.
                    let bytes = unsafe { page_bytes(region.shadow_addr(p)) };
                    self.install(region.addr(p), bytes, false, wake);
                    sys::discard(region.shadow_addr(p), PAGE);
                    p += 1;
                }
                // The process is exiting.
                Some(libc::ESRCH) => return,
                // A page already in the region (EEXIST) or no frame (ENOENT): if the frame is
                // in the region and not in the shadow, the kernel moved it without a request.
                Some(libc::EEXIST) | Some(libc::ENOENT) if self.adopt_moved(region, p, true) => {
                    if wake {
                        self.uffd.wake(region.addr(p), PAGE);
                    }
                    p += 1;
                }
                _ => {
                    #[cfg(feature = "trace")]
                    eprintln!(
                        "region {}\nshadow {}\npage {p}:\n{}calls nearby:\n{}",
                        crate::trace::page_report(region.addr(p)),
                        crate::trace::page_report(region.shadow_addr(p)),
                        crate::trace::dump_page(p),
                        crate::trace::dump_calls(p.saturating_sub(64), p + 64)
                    );
                    self.fatal("moving a page in from its frame", &e)
                }
            }
        }
    }

    /// A move found a framed page where it should not be: moving in (`into_region`), a page
    /// already in the region or no frame in the shadow; moving out, a frame already in the
    /// shadow. If the page is on the side the move was to make it and not on the other, the
    /// kernel already moved it without a request: true, and it counts as moved. Seen on Linux
    /// 6.18 with UFFDIO_MOVE under CPU contention, about once in a hundred runs of the
    /// verification workload; how it happens is not known. False otherwise (a genuine
    /// error, or a stale frame).
    fn adopt_moved(&self, region: &RegionInner, page: usize, into_region: bool) -> bool {
        let in_region = sys::is_mapped(region.addr(page));
        let in_shadow = sys::is_mapped(region.shadow_addr(page));
        let adopted = if into_region {
            in_region && !in_shadow
        } else {
            in_shadow && !in_region
        };
        if adopted {
            crate::tr!(page, "adopt", into_region);
            Counters::add(&self.counters.frames_repaired, 1);
        }
        adopted
    }

    /// Installs a page; false if it was already present (EEXIST, left as it is) or the range
    /// is gone.
    fn copy_in(&self, addr: usize, src: &[u8], write_protect: bool) -> bool {
        self.install(addr, src, write_protect, true) == src.len() / PAGE
    }

    /// Installs consecutive pages with as few UFFDIO_COPY calls as the kernel allows, waking
    /// nobody if not `wake`; returns how many were installed. A page already present (EEXIST)
    /// is left as it is and skipped.
    fn install(&self, addr: usize, src: &[u8], write_protect: bool, wake: bool) -> usize {
        let (mut done, mut skipped) = (0, 0);
        while done < src.len() {
            let r = self
                .uffd
                .copy(addr + done, &src[done..], write_protect, wake);
            #[cfg(feature = "trace")]
            if let Some(region) = self.region_of(addr) {
                let (ok, err) = match &r {
                    Ok(n) => (n / PAGE, None),
                    Err(e) => (0, Some(e)),
                };
                let arg = crate::trace::call_arg(false, (src.len() - done) / PAGE, ok, err);
                crate::trace::event((addr + done - region.base) / PAGE, "copy_call", arg);
            }
            match r {
                Ok(n) => done += n,
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    done += PAGE;
                    skipped += 1;
                }
                // The program unmapped the range (or is exiting): nothing to install into.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH)) => {
                    return done / PAGE - skipped
                }
                Err(e) => self.fatal("installing a page", &e),
            }
        }
        done / PAGE - skipped
    }

    /// A page evicted within the last half budget of evictions that is wanted again is hot.
    fn recently_evicted(&self, region: &RegionInner, page: usize) -> bool {
        let at = region.table.evicted_at(page).load(Relaxed);
        at != 0
            && self.evict_seq.load(Relaxed).wrapping_sub(at) as usize
                <= self.budget_pages.load(Relaxed) / 2
    }

    /// The first write to a page installed write-protected: it is dirty from now on.
    fn serve_write_protect(&self, region: &Arc<RegionInner>, page: usize) {
        Counters::add(&self.counters.wp_faults, 1);
        let addr = region.addr(page);
        let mut spins = 0u32;
        let word = loop {
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
        let word =
            (word & !(WP_CLEAN | BUSY | KIND_MASK)) | RESIDENT | DIRTY | WAS_DIRTY | REFERENCED;
        region.table.unlock(page, word);
    }

    // ---- prefetch ---------------------------------------------------------------------------

    fn prefetch(&self, region: &Arc<RegionInner>, plan: Plan, staging: &mut Staging) {
        let pages = region.table.pages() as i64;
        let mut batch: Vec<(usize, u64)> = Vec::with_capacity(PREFETCH_BATCH);
        let mut i = 0;
        while i < plan.count as i64 {
            // Never prefetch past the budget: that would evict pages to make room for guesses.
            batch.clear();
            while i < plan.count as i64 && batch.len() < PREFETCH_BATCH {
                let p = plan.start + i * plan.stride;
                i += 1;
                if p < 0 || p >= pages || p == plan.trigger {
                    continue;
                }
                if let Some(w) = region.table.try_lock(p as usize, &[FAR, UNTOUCHED]) {
                    batch.push((p as usize, w));
                }
            }
            if batch.is_empty() {
                continue;
            }
            if !self.make_room(batch.len()) {
                // The evictor cannot keep up: drop the rest of the plan.
                for &(p, w) in &batch {
                    region.table.unlock(p, w);
                    // A thread that faulted meanwhile found the page BUSY and waits for us.
                    self.uffd.wake(region.addr(p), PAGE);
                }
                return;
            }
            self.install_prefetched(region, &batch, staging);
            if self.local_pages() > self.budget_pages.load(Relaxed) {
                self.kick_evictor();
            }
        }
    }

    /// Makes room for `pages` more pages under the budget, evicting on this thread (a hand-off
    /// to the evictor costs two context switches and, if it runs on another CPU, a slow wake-up);
    /// false if there is none to be had.
    fn make_room(&self, pages: usize) -> bool {
        for _ in 0..10 {
            while self.local_pages() + pages > self.budget_pages.load(Relaxed) {
                if self.evict_batch() == 0 {
                    break;
                }
            }
            if self.local_pages() + pages <= self.budget_pages.load(Relaxed) {
                return true;
            }
            // Everything evictable is locked by others right now.
            self.room_wanted.fetch_max(pages, Relaxed);
            self.kick_evictor();
            std::thread::sleep(Duration::from_micros(100));
            if self.shutdown.load(Acquire) {
                return false;
            }
        }
        false
    }

    fn install_prefetched(
        &self,
        region: &Arc<RegionInner>,
        batch: &[(usize, u64)],
        staging: &mut Staging,
    ) {
        debug_assert!(batch.len() <= PREFETCH_BATCH);
        // Read the far pages in one call, then spread them so that page `i` of the batch sits
        // in chunk `i` (the rest are fresh pages, zero-filled), ready to install in runs.
        let in_store = |w: u64| kind(w) == FAR && w & FRAMED == 0;
        let mut keys = [0 as Key; PREFETCH_BATCH];
        let mut far = 0;
        for &(p, w) in batch {
            if in_store(w) {
                keys[far] = region.key(p);
                far += 1;
            }
        }
        if far > 0 {
            self.read_pages(&keys[..far], staging, "prefetching pages");
            Counters::add(&self.counters.bytes_read, (far * PAGE) as u64);
        }
        let mut j = far;
        for (i, &(_, w)) in batch.iter().enumerate().rev() {
            let chunk = i * PAGE..(i + 1) * PAGE;
            if w & FRAMED != 0 {
                // Moved in, not copied.
            } else if kind(w) == FAR {
                j -= 1;
                if j != i {
                    staging
                        .buf
                        .copy_within(j * PAGE..(j + 1) * PAGE, chunk.start);
                }
            } else {
                // A stream over fresh memory: map zero pages ahead so the program does not
                // fault on each one.
                staging.buf[chunk].fill(0);
            }
        }
        // How a page goes in: moved from its frame, or copied write-protected or writable.
        #[derive(PartialEq, Clone, Copy)]
        enum How {
            Move,
            Copy { wp: bool },
        }
        let how = |w: u64| {
            if w & FRAMED != 0 {
                How::Move
            } else {
                How::Copy {
                    wp: in_store(w) && w & WAS_DIRTY == 0,
                }
            }
        };
        let mut list = Vec::with_capacity(batch.len());
        let mut run = 0;
        for (i, &(p, w)) in batch.iter().enumerate() {
            let this = how(w);
            let wp = this == How::Copy { wp: true };
            let new = if this == How::Move {
                Counters::add(&self.counters.bytes_read, PAGE as u64);
                RESIDENT | PREFETCHED | (w & HISTORY)
            } else if kind(w) == FAR {
                if !wp {
                    // Installed writable on a guess (see `install_demand`).
                    region
                        .table
                        .hash(p)
                        .store(hash_page(staging.page(i)), Relaxed);
                }
                RESIDENT | FAR_VALID | PREFETCHED | if wp { WP_CLEAN } else { 0 } | (w & HISTORY)
            } else {
                RESIDENT | PREFETCHED | (w & HISTORY)
            };
            list.push((p, new));
            // One UFFDIO_COPY or UFFDIO_MOVE per run of consecutive pages that go in the same
            // way.
            let run_ends = batch
                .get(i + 1)
                .is_none_or(|&(q, v)| q != p + 1 || how(v) != this);
            if run_ends {
                let first = batch[run].0;
                if this == How::Move {
                    self.move_in(region, first, i + 1 - run, false);
                } else {
                    self.install(
                        region.addr(first),
                        &staging.buf[run * PAGE..(i + 1) * PAGE],
                        wp,
                        false,
                    );
                }
                run = i + 1;
            }
        }
        // Counted before the pages are published: once unlocked, another thread may evict or
        // discard them and subtract them again.
        self.resident.fetch_add(batch.len(), Relaxed);
        let mut waiters = false;
        for &(p, new) in &list {
            region.note_touched(p);
            waiters |= region.table.unlock(p, new);
        }
        // One wake-up for the batch, if a thread waits on one of its pages: woken page by page,
        // a program walking the stream on this CPU would run, fault on the next page and sleep
        // again for every page.
        if let (true, Some(&(first, _)), Some(&(last, _))) =
            (waiters, batch.iter().min(), batch.iter().max())
        {
            self.uffd
                .wake(region.addr(first), (last + 1 - first) * PAGE);
        }
        Counters::add(&self.counters.prefetched, batch.len() as u64);
        self.clock
            .lock()
            .extend(list.into_iter().map(|(p, _)| (region.clone(), p)));
    }

    // ---- eviction ---------------------------------------------------------------------------

    fn evictor_loop(self: Arc<Self>) {
        loop {
            {
                let (m, cv) = &self.evictor_kick;
                let mut kicked = m.lock();
                if !*kicked {
                    cv.wait_for(&mut kicked, Duration::from_millis(20));
                }
                *kicked = false;
            }
            if self.shutdown.load(Acquire) {
                return;
            }
            // Over budget: evict down to a margin below it, so that the next faults find room
            // without waiting. At or under budget nothing is evicted, so a working set that
            // fits the budget never churns.
            let wanted = self.room_wanted.swap(0, Relaxed);
            if self.local_pages() + wanted > self.budget_pages.load(Relaxed) {
                while self.local_pages() + self.margin() > self.budget_pages.load(Relaxed)
                    && !self.shutdown.load(Acquire)
                {
                    if self.evict_batch() == 0 {
                        break;
                    }
                }
            }
        }
    }

    /// Chooses victims with CLOCK (second chance for referenced pages) and evicts them.
    /// Returns how many pages were evicted.
    fn evict_batch(&self) -> usize {
        let mut victims: Vec<(Arc<RegionInner>, usize, u64)> = Vec::with_capacity(EVICT_BATCH);
        {
            // Pages a stream is done with go first.
            let mut done = self.done.lock();
            while victims.len() < EVICT_BATCH {
                let Some((region, page)) = done.pop_back() else {
                    break;
                };
                let word = region.table.state(page).load(Acquire);
                if region.dead.load(Acquire) || kind(word) != RESIDENT || word & REFERENCED != 0 {
                    continue;
                }
                if let Some(w) = region.table.try_lock(page, &[RESIDENT]) {
                    victims.push((region, page, w));
                }
            }
        }
        {
            let mut clock = self.clock.lock();
            let mut budget = clock.len().min(EVICT_BATCH * 8);
            while victims.len() < EVICT_BATCH && budget > 0 {
                budget -= 1;
                let Some((region, page)) = clock.pop_front() else {
                    break;
                };
                if region.dead.load(Acquire) {
                    continue;
                }
                let s = region.table.state(page);
                let word = s.load(Acquire);
                if kind(word) != RESIDENT {
                    continue; // stale entry: evicted or discarded already
                }
                // Second chances: a reference, then each chance the page's heat gave it.
                let spared = if word & REFERENCED != 0 {
                    Some(word & !REFERENCED)
                } else if word & CHANCES != 0 {
                    Some(word - (1 << CHANCE_SHIFT))
                } else {
                    None
                };
                if let Some(spared) = spared {
                    if s.compare_exchange(word, spared, AcqRel, Relaxed).is_ok() {
                        clock.push_back((region, page));
                        continue;
                    }
                }
                if let Some(w) = region.table.try_lock(page, &[RESIDENT]) {
                    victims.push((region, page, w));
                } else {
                    clock.push_back((region, page));
                }
            }
        }
        if victims.is_empty() {
            return 0;
        }
        victims.sort_by_key(|(r, p, _)| (r.id, *p));
        let n = victims.len();
        if self.frames {
            let mut refused = Vec::new();
            for run in runs_of(&victims) {
                self.move_out(&victims[run], &mut refused);
            }
            victims = refused;
        }
        if !victims.is_empty() {
            self.copy_out(&victims);
        }
        n
    }

    /// Evicts locked pages (sorted) by copying them out: the write-back path.
    fn copy_out(&self, victims: &[(Arc<RegionInner>, usize, u64)]) {
        let runs = runs_of(victims);
        // Save every run, drop all of their pages in one call, then release them.
        let saved: Vec<SavedRun> = runs
            .iter()
            .map(|r| self.save_run(&victims[r.clone()]))
            .collect();
        let ranges: Vec<(usize, usize)> = runs
            .iter()
            .map(|r| (victims[r.start].0.addr(victims[r.start].1), r.len() * PAGE))
            .collect();
        sys::discard_many(&ranges);
        for (r, saved) in runs.into_iter().zip(saved) {
            self.release_run(&victims[r], saved);
        }
    }

    /// Evicts a run of consecutive locked pages of a framed region by moving them into its
    /// shadow; pages the kernel will not move (shared with a forked child) go to `refused`,
    /// for [`Inner::copy_out`].
    fn move_out(
        &self,
        run: &[(Arc<RegionInner>, usize, u64)],
        refused: &mut Vec<(Arc<RegionInner>, usize, u64)>,
    ) {
        let region = &run[0].0;
        let first = run[0].1;
        let mut removes = Vec::new();
        let mut zeros = Vec::new();
        let mut zero_count = 0;
        let seq = self.evict_seq.fetch_add(run.len() as u32, Relaxed).max(1);
        let mut waiters = false;
        let (mut i, mut moved) = (0, 0u64);
        while i < run.len() {
            let p = first + i;
            let (n, err) = self.uffd.move_pages(
                region.shadow_addr(p),
                region.addr(p),
                (run.len() - i) * PAGE,
                false,
            );
            #[cfg(feature = "trace")]
            crate::trace::move_call(
                region.base,
                region.shadow_addr(0),
                p,
                run.len() - i,
                n,
                &err,
                false,
            );
            let done = &run[i..i + n / PAGE];
            zeros.clear();
            let mut new_words = Vec::with_capacity(done.len());
            for (_, page, w) in done {
                let (new, zero) = region.framed(*page, *w, seq, &mut removes);
                if zero {
                    zeros.push((region.shadow_addr(*page), PAGE));
                }
                new_words.push(new);
            }
            sys::discard_many(&zeros);
            zero_count += zeros.len() as u64;
            for ((_, page, _), new) in done.iter().zip(new_words) {
                crate::tr!(*page, "move_out", new);
                waiters |= region.table.unlock(*page, new);
            }
            moved += (n / PAGE) as u64;
            i += n / PAGE;
            let Some(e) = err else { break };
            let (_, page, w) = &run[i];
            crate::tr!(*page, "move_out_err", e.raw_os_error().unwrap_or(0));
            match e.raw_os_error() {
                Some(libc::EBUSY) => refused.push(run[i].clone()),
                // No page there: the program dropped it behind our back (a direct
                // MADV_DONTNEED system call), so it reads as zeros.
                Some(libc::ENOENT) => {
                    if w & FAR_VALID != 0 {
                        removes.push(region.key(*page));
                    }
                    self.resident.fetch_sub(1, Relaxed);
                    waiters |= region.table.unlock(*page, UNTOUCHED);
                }
                // A frame already in the shadow. If the page is not in the region, the kernel
                // moved it there without a request: it is the page, keep it.
                Some(libc::EEXIST) if self.adopt_moved(region, *page, false) => {
                    let (new, zero) = region.framed(*page, *w, seq, &mut removes);
                    if zero {
                        sys::discard(region.shadow_addr(*page), PAGE);
                        zero_count += 1;
                    }
                    moved += 1;
                    waiters |= region.table.unlock(*page, new);
                }
                // Both hold a page: the shadow's is stale (the region's is the one the program
                // used). Drop it and try again.
                Some(libc::EEXIST) => {
                    sys::discard(region.shadow_addr(*page), PAGE);
                    continue;
                }
                Some(libc::ESRCH) => {
                    // The process is exiting.
                    for (_, page, w) in &run[i..] {
                        region.table.unlock(*page, *w);
                    }
                    self.uffd.wake(region.addr(first), run.len() * PAGE);
                    return;
                }
                _ => self.fatal("moving a page out to its frame", &e),
            }
            i += 1;
        }
        self.resident.fetch_sub(moved as usize, Relaxed);
        Counters::add(&self.counters.evicted_zero, zero_count);
        if waiters {
            // Threads that faulted on the pages meanwhile retry now and find them framed.
            self.uffd.wake(region.addr(first), run.len() * PAGE);
        }
        Counters::add(&self.counters.evicted, moved);
        Counters::add(&self.counters.moved_out, moved);
        Counters::add(&self.counters.bytes_written, moved * PAGE as u64);
        if !removes.is_empty() {
            let _ = self.store_tx.send(StoreJob::Remove(removes));
        }
    }

    /// Saves consecutive locked pages of one region for eviction.
    fn save_run(&self, run: &[(Arc<RegionInner>, usize, u64)]) -> SavedRun {
        let region = &run[0].0;
        let first = run[0].1;
        let addr = region.addr(first);
        let len = run.len() * PAGE;
        // Freeze the contents: a write from now on waits in a write-protect fault until the
        // page is gone, then faults it back in. Pages installed write-protected and never
        // written need nothing.
        if run.iter().any(|(_, _, w)| w & WP_CLEAN == 0) {
            if let Err(e) = self.uffd.write_protect(addr, len, true) {
                if !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH)) {
                    self.fatal("write-protecting pages for eviction", &e);
                }
            }
        }
        let seq = self.evict_seq.fetch_add(run.len() as u32, Relaxed);
        let mut new_words = Vec::with_capacity(run.len());
        let mut writes = Vec::new();
        let mut removes = Vec::new();
        let (mut clean, mut zero) = (0u64, 0u64);
        for (_, page, w) in run {
            let page = *page;
            let history = w & HISTORY;
            let far_valid = w & FAR_VALID != 0;
            let new = if w & WP_CLEAN != 0 {
                clean += 1;
                if far_valid {
                    FAR | history
                } else {
                    zero += 1;
                    UNTOUCHED | history
                }
            } else {
                // SAFETY: the page is RESIDENT and locked by us, so mapped (only lock holders
                // unmap pages), and write-protected above, so nobody writes it meanwhile.
                let bytes = unsafe { page_bytes(region.addr(page)) };
                let was_written = w & DIRTY != 0;
                if is_zero_page(bytes) {
                    zero += 1;
                    if far_valid {
                        removes.push(region.key(page));
                    }
                    UNTOUCHED | (history & HEAT) | if was_written { WAS_DIRTY } else { history }
                } else if !was_written
                    && far_valid
                    && hash_page(bytes) == region.table.hash(page).load(Relaxed)
                {
                    // Installed writable on a guess (the install hashed it) and not written
                    // this time: install it write-protected next time, which saves the hash.
                    clean += 1;
                    FAR | (history & HEAT)
                } else {
                    let slot = self.slots.take();
                    self.slots.fill(slot, bytes);
                    writes.push((region.clone(), page, slot));
                    WRITEBACK | ((slot as u64) << SLOT_SHIFT) | WAS_DIRTY | (history & HEAT)
                }
            };
            new_words.push(new);
            region.table.evicted_at(page).store(seq.max(1), Relaxed);
        }
        let c = &self.counters;
        Counters::add(&c.evicted_clean, clean);
        Counters::add(&c.evicted_zero, zero);
        SavedRun {
            new_words,
            writes,
            removes,
        }
    }

    /// Publishes the new states of a saved run whose pages are gone, wakes its waiters, and
    /// only then queues its write-back (which expects the pages in their new states).
    fn release_run(&self, run: &[(Arc<RegionInner>, usize, u64)], saved: SavedRun) {
        let region = &run[0].0;
        let addr = region.addr(run[0].1);
        let len = run.len() * PAGE;
        let mut waiters = false;
        for ((_, page, _), new) in run.iter().zip(saved.new_words) {
            waiters |= region.table.unlock(*page, new);
        }
        self.resident.fetch_sub(run.len(), Relaxed);
        if waiters {
            // Threads that faulted after the discard retry now and find the pages' new
            // states. (Writers that hit the write protection wait the eviction out in
            // `serve_write_protect` and wake themselves.)
            self.uffd.wake(addr, len);
        }
        Counters::add(&self.counters.evicted, run.len() as u64);
        if !saved.removes.is_empty() {
            let _ = self.store_tx.send(StoreJob::Remove(saved.removes));
        }
        if !saved.writes.is_empty() {
            let _ = self.store_tx.send(StoreJob::Write(saved.writes));
        }
    }

    // ---- write-back -------------------------------------------------------------------------

    /// Applies writes and removes in the order they were queued (so a page's far copy is
    /// never overtaken by an older one).
    fn store_loop(self: Arc<Self>, rx: Receiver<StoreJob>) {
        // Slots whose page was BUSY when its write finished (see `finish_writeback`).
        let mut deferred: Vec<(Arc<RegionInner>, usize, u32)> = Vec::new();
        loop {
            let wait = if deferred.is_empty() { 100 } else { 1 };
            let job = match rx.recv_timeout(Duration::from_millis(wait)) {
                Ok(j) => Some(j),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    if self.shutdown.load(Acquire) {
                        return;
                    }
                    None
                }
                Err(_) => return,
            };
            if !deferred.is_empty() {
                for (region, page, slot) in std::mem::take(&mut deferred) {
                    self.finish_writeback(region, page, slot, &mut deferred);
                }
            }
            match job {
                None => {}
                Some(StoreJob::Remove(keys)) => {
                    if let Err(e) = self.store.remove_many(&keys) {
                        self.fatal("removing pages", &e);
                    }
                }
                Some(StoreJob::Write(mut pages)) => {
                    // Gather whatever else is queued into the same round trip.
                    while pages.len() < 256 {
                        match rx.try_recv() {
                            Ok(StoreJob::Write(more)) => pages.extend(more),
                            Ok(StoreJob::Remove(keys)) => {
                                self.write_pages(std::mem::take(&mut pages), &mut deferred);
                                if let Err(e) = self.store.remove_many(&keys) {
                                    self.fatal("removing pages", &e);
                                }
                            }
                            Err(_) => break,
                        }
                    }
                    self.write_pages(pages, &mut deferred);
                }
            }
        }
    }

    fn write_pages(
        &self,
        pages: Vec<(Arc<RegionInner>, usize, u32)>,
        deferred: &mut Vec<(Arc<RegionInner>, usize, u32)>,
    ) {
        if pages.is_empty() {
            return;
        }
        let items: Vec<(Key, &[u8])> = pages
            .iter()
            .map(|(r, p, s)| (r.key(*p), self.slots.bytes(*s)))
            .collect();
        if let Err(e) = self.store.write_many(&items) {
            self.fatal("writing pages back", &e);
        }
        drop(items);
        Counters::add(&self.counters.written_back, pages.len() as u64);
        Counters::add(&self.counters.bytes_written, (pages.len() * PAGE) as u64);
        for (region, page, slot) in pages {
            self.finish_writeback(region, page, slot, deferred);
        }
    }

    /// A page's write has landed: the page becomes FAR (if it is still in this slot) and the
    /// slot is freed. If the page is BUSY, its owner may be a handler copying out of the slot,
    /// so the slot is kept and the page looked at again later (`deferred`). Never wait here:
    /// the owner may be an evictor waiting for a free slot, which only this thread frees (a
    /// spin at this point hung a 512 MiB scan at 75% local on one CPU).
    fn finish_writeback(
        &self,
        region: Arc<RegionInner>,
        page: usize,
        slot: u32,
        deferred: &mut Vec<(Arc<RegionInner>, usize, u32)>,
    ) {
        let s = region.table.state(page);
        let mut cur = s.load(Acquire);
        loop {
            if kind(cur) == BUSY {
                deferred.push((region, page, slot));
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

    // ---- the program gives memory back ------------------------------------------------------

    /// Forgets pages `[first, end)` of a region: their contents are no longer needed and the
    /// next touch reads zeros.
    pub(crate) fn discard(&self, region: &Arc<RegionInner>, first: usize, end: usize) {
        let end = end.min(region.table.pages());
        if crate::fork::in_forked_child() {
            // No pager threads here and the parent's locks may be held by threads that were
            // not copied: just forget the pages (their far copies belong to the parent).
            for p in first..end {
                region.table.state(p).store(UNTOUCHED, Release);
            }
            sys::discard(region.addr(first), (end - first) * PAGE);
            return;
        }
        let mut removes = Vec::new();
        let mut page = first;
        while page < end {
            let chunk_end = (page + 512).min(end);
            let mut resident = 0;
            for p in page..chunk_end {
                let w = region.table.lock_any(p);
                match kind(w) {
                    RESIDENT => {
                        resident += 1;
                        if w & FAR_VALID != 0 {
                            removes.push(region.key(p));
                        }
                    }
                    FAR if w & FRAMED != 0 => {}
                    FAR | WRITEBACK => removes.push(region.key(p)),
                    _ => {}
                }
            }
            sys::discard(region.addr(page), (chunk_end - page) * PAGE);
            if region.shadow.is_some() {
                sys::discard(region.shadow_addr(page), (chunk_end - page) * PAGE);
            }
            for p in page..chunk_end {
                region.table.unlock(p, UNTOUCHED);
            }
            self.resident.fetch_sub(resident, Relaxed);
            Counters::add(&self.counters.discarded, resident as u64);
            self.uffd.wake(region.addr(page), (chunk_end - page) * PAGE);
            page = chunk_end;
        }
        if !removes.is_empty() {
            let _ = self.store_tx.send(StoreJob::Remove(removes));
        }
    }
}
