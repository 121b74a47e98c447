//! `libtidepool_preload.so`: what `tidepool run` loads into an unmodified program.
//!
//! It is `libtidepool_malloc.so` (the whole malloc family) plus a pager: at load, before the
//! program's own constructors, it starts a [`tidepool_pager::Pager`] with the budget and far
//! store named by the environment `tidepool run` sets, registers the allocator's heap region
//! with it, and serves objects larger than the heap's classes, and the program's own private
//! anonymous mmaps (see `mmap.rs`), from a second registered region. So every byte the program
//! allocates lives in far memory, with at most the budget mapped.
//!
//! What `tidepool run` asks for (the budget, the store, a profile, a coordinator, the
//! comparison switches) comes in the environment as one [`tidepool_pager::run_env::RunEnv`],
//! read once at start; the README's table of environment variables lists every variable with
//! its default. The variables stay in the environment, so a wrapper script (a pyenv shim, say)
//! passes them on to the program it runs, and programs the program starts get pagers of their
//! own.
//!
//! While the program runs, `tidepool resize PID SIZE` changes its budget through a Unix socket
//! in the abstract namespace, `tidepool-run-PID` (see `tidepool_pager::control`).

mod exit;
mod libc_alloc;
mod mmap;
mod ranges;
mod sites;
mod stdio;
mod syscall;

use core::ffi::c_int;
use rangemap::RangeSet;
use ranges::Ranges;
use std::cell::RefCell;
use std::sync::OnceLock;
use std::sync::{Mutex, MutexGuard};
use tidepool_alloc::PageSource;
use tidepool_pager::run_env::RunEnv;
use tidepool_pager::{AdoptedRegion, Config, Pager, SectionId, PAGE};

// The malloc family's C symbols.
use tidepool_malloc as _;

#[global_allocator]
static LIBC: libc_alloc::LibcAlloc = libc_alloc::LibcAlloc;

/// Address space for objects too large for the heap's classes and for the program's own
/// anonymous mappings (reused after free).
const LARGE_SPAN: usize = 1 << 40;

struct Runtime {
    pager: Pager,
    heap: Option<AdoptedRegion>,
    large: AdoptedRegion,
    /// A std mutex, not parking_lot's: a thread waiting for it at a fork would otherwise stay
    /// in parking_lot's global queue of waiters in the child, where it does not exist.
    space: Mutex<Space>,
    /// What `tidepool run` said, read once at start (a forked child joins the coordinator with
    /// it again).
    env: RunEnv,
}

/// The large region's address space, by offset from its base.
struct Space {
    ranges: Ranges,
    /// Parts the program mapped something else over (MAP_FIXED of a file or shared memory):
    /// not paged until it unmaps them.
    foreign: RangeSet<usize>,
}

impl Runtime {
    fn space(&self) -> MutexGuard<'_, Space> {
        // A panic while holding it cannot leave the list half changed (its methods check
        // their arguments first), so a poisoned lock is still good.
        self.space.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `[addr, addr + len)` lies wholly in the large region.
    fn holds(&self, addr: usize, len: usize) -> bool {
        addr >= self.large.base()
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.large.base() + self.large.len())
    }

    /// Takes `len` bytes (rounded up to pages) of the large region: its address. The pages read
    /// as zero (released ranges were reset), and are counted in `section` if given.
    fn take(&self, len: usize, section: Option<SectionId>) -> Option<usize> {
        let len = len.checked_next_multiple_of(PAGE)?;
        let offset = self.space().ranges.take(len)?;
        let addr = self.large.base() + offset;
        if let Some(id) = section {
            let _ = self.large.set_section(addr, len, id);
        }
        Some(addr)
    }

    /// Gives back whatever part of `[addr, addr + len)` in the large region is in use: its
    /// pages read as zero again, readable and writable; what the program had mapped over parts
    /// of it is unmapped and the parts paged again.
    ///
    /// # Safety
    /// Nothing may use the range any more.
    unsafe fn release(&self, addr: usize, len: usize) {
        let end = addr
            .saturating_add(len.next_multiple_of(PAGE))
            .min(self.large.base() + self.large.len());
        let Some(len) = end.checked_sub(addr) else {
            return;
        };
        // The lock is held while the pages are dropped, so that nobody takes a range whose old
        // contents are still there.
        let mut space = self.space();
        let base = self.large.base();
        for (offset, l) in space.ranges.release(addr - base, len) {
            // SAFETY: per the caller; these parts were in use until now.
            unsafe { self.clear(&mut space, base + offset, l) };
        }
    }

    /// Zeros, read-write, inherited, and paged again where a foreign mapping was.
    ///
    /// # Safety
    /// Nothing may reference the bytes of the range.
    unsafe fn clear(&self, space: &mut Space, addr: usize, len: usize) {
        let base = self.large.base();
        let range = addr - base..addr - base + len;
        let foreign: Vec<std::ops::Range<usize>> = space
            .foreign
            .overlapping(&range)
            .map(|r| r.start.max(range.start)..r.end.min(range.end))
            .collect();
        for r in foreign {
            if let Err(e) = self.large.reclaim(base + r.start, r.len()) {
                fail(&format!(
                    "cannot take back memory the program unmapped: {e}"
                ));
            }
            space.foreign.remove(r);
        }
        // SAFETY: per the caller.
        unsafe { self.large.reset(addr, len) };
    }

    /// MAP_FIXED of private anonymous memory at `[addr, addr + len)`, wholly in the large
    /// region: whatever was there goes, and fresh zeros with protection `prot` take its place.
    ///
    /// # Safety
    /// The program gives up what it had mapped there (mmap's contract).
    unsafe fn place(&self, addr: usize, len: usize, prot: c_int) -> Result<(), c_int> {
        let mut space = self.space();
        if !space.ranges.claim(addr - self.large.base(), len) {
            return Err(libc::ENOMEM);
        }
        // SAFETY: per the caller.
        unsafe { self.clear(&mut space, addr, len) };
        if prot != libc::PROT_READ | libc::PROT_WRITE {
            self.large
                .protect(addr, len, prot)
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))?;
        }
        Ok(())
    }

    /// The program maps something else (a file, shared memory) at `[addr, addr + len)`,
    /// wholly in the large region: the pager lets go of those pages until it unmaps them.
    ///
    /// # Safety
    /// As for [`Runtime::place`].
    unsafe fn cede(&self, addr: usize, len: usize) -> Result<(), c_int> {
        let mut space = self.space();
        let offset = addr - self.large.base();
        if !space.ranges.claim(offset, len) {
            return Err(libc::ENOMEM);
        }
        // SAFETY: per the caller.
        unsafe { self.large.cede(addr, len) };
        space.foreign.insert(offset..offset + len);
        Ok(())
    }

    /// Whether `[addr, addr + len)` is free for MAP_FIXED_NOREPLACE.
    fn is_free(&self, addr: usize, len: usize) -> bool {
        self.space().ranges.is_free(addr - self.large.base(), len)
    }

    /// Whether part of `[addr, addr + len)` is a foreign mapping.
    fn any_foreign(&self, addr: usize, len: usize) -> bool {
        let offset = addr - self.large.base();
        self.space().foreign.overlaps(&(offset..offset + len))
    }

    /// Grows a range of the large region in place; false if the bytes after it are taken.
    fn grow_in_place(&self, addr: usize, old: usize, new: usize) -> bool {
        let offset = addr - self.large.base();
        self.space().ranges.grow_in_place(offset, old, new)
    }
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The runtime, if memory the calling thread maps now should be paged: the pager runs and this
/// is not a pager thread.
fn paging() -> Option<&'static Runtime> {
    RUNTIME.get().filter(|_| !tidepool_alloc::thread_unpaged())
}

/// The runtime, if `addr` lies in its large region.
fn owning(addr: usize) -> Option<&'static Runtime> {
    RUNTIME.get().filter(|rt| rt.large.contains(addr))
}

/// The paged region `addr` lies in: the allocator's heap or the large region.
fn paged_region(addr: usize) -> Option<&'static AdoptedRegion> {
    let rt = RUNTIME.get()?;
    if rt.large.contains(addr) {
        return Some(&rt.large);
    }
    rt.heap.as_ref().filter(|h| h.contains(addr))
}

/// The lowest start of a paged region strictly inside `(start, end)`: a range that begins
/// outside the pager's regions and reaches into one.
fn paged_region_start_in(start: usize, end: usize) -> Option<usize> {
    let rt = RUNTIME.get()?;
    [Some(&rt.large), rt.heap.as_ref()]
        .into_iter()
        .flatten()
        .map(|r| r.base())
        .filter(|&b| b > start && b < end)
        .min()
}

static SOURCE: PageSource = PageSource {
    reserve: tidepool_alloc::KERNEL_PAGES.reserve,
    discard: discard_pages,
    map_large,
    unmap_large,
    remap_large: None,
};

unsafe fn discard_pages(addr: usize, len: usize) {
    match RUNTIME.get().and_then(|r| r.heap.as_ref()) {
        // SAFETY: the allocator passes only ranges that hold no live objects.
        Some(heap) if heap.contains(addr) => unsafe { heap.discard(addr, len) },
        // SAFETY: as above, for pages outside the pager's regions.
        _ => unsafe { (tidepool_alloc::KERNEL_PAGES.discard)(addr, len) },
    }
}

fn map_large(len: usize) -> Option<usize> {
    match paging() {
        Some(rt) => rt.take(len, Some(sites::caller_section(rt, "malloc"))),
        None => (tidepool_alloc::KERNEL_PAGES.map_large)(len),
    }
}

unsafe fn unmap_large(addr: usize, len: usize) {
    match owning(addr) {
        // SAFETY: the allocator unmaps only objects nobody references any more.
        Some(rt) => unsafe { rt.release(addr, len) },
        // SAFETY: a whole mapping from the kernel source (made before the pager started).
        None => unsafe { (tidepool_alloc::KERNEL_PAGES.unmap_large)(addr, len) },
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("tidepool run: {msg}");
    // SAFETY: ending the process before the program starts; nothing of it has run.
    unsafe { libc::_exit(tidepool_pager::FATAL_EXIT_CODE) }
}

/// Starts the pager and hands it the allocator's heap. Runs before ordinary constructors.
extern "C" fn start() {
    let env = RunEnv::from_env();
    if matches!(env, Ok(None)) {
        return; // paging is off
    }
    libc_alloc::resolve();
    // First of all fork handlers: in a forked child the pager must be running again before
    // any other child handler (the allocator's among them) touches paged memory.
    tidepool_pager::install_fork_handlers();
    let env = match env {
        Ok(Some(env)) => env,
        Ok(None) => return,
        Err(e) => fail(&e.to_string()),
    };
    // Fails only if something allocated before this constructor; the heap is adopted anyway
    // and large objects made before now stay ordinary memory.
    let _ = tidepool_alloc::set_page_source(&SOURCE);
    // Make sure the heap is reserved.
    // SAFETY: a zero-byte allocation and its release.
    unsafe { tidepool_alloc::api::free(tidepool_alloc::api::malloc(0)) };
    // What glibc allocates while the pager starts (the DTVs of the threads it creates, for
    // one) is read by pager threads, so it must not be paged: this thread allocates from the
    // kernel until the pager runs, and pager threads always do.
    tidepool_alloc::set_thread_unpaged(true);
    let store = tidepool_store::open(&env.backend).unwrap_or_else(|e| {
        fail(&format!(
            "cannot open far store {}: {e}",
            tidepool_store::redact(&env.backend)
        ))
    });
    let pager = Pager::start(pager_config(&env), store).unwrap_or_else(|e| {
        fail(&format!(
            "cannot start the pager: {e}; {}",
            tidepool_sys::probe::DOCTOR_HINT
        ))
    });
    if env.sections_out.is_some() && env.fault_trace > 0 {
        pager.trace_faults(env.fault_trace);
    }
    let heap = tidepool_alloc::region().map(|(base, len)| {
        // SAFETY: the allocator's reservation: private, anonymous, read-write, never unmapped,
        // and registered nowhere else.
        unsafe { pager.adopt(base, len) }
            .unwrap_or_else(|e| fail(&format!("cannot register the heap: {e}")))
    });
    if let Some((path, pid)) = &env.profile {
        apply_profile(&pager, path, *pid);
    }
    if let Some(heap) = &heap {
        name_classes(&pager, heap);
    }
    let large_base = (tidepool_alloc::KERNEL_PAGES.reserve)(LARGE_SPAN)
        .unwrap_or_else(|| fail("cannot reserve address space for large objects"));
    // SAFETY: a fresh private anonymous reservation that stays mapped for the process's life.
    let large = unsafe { pager.adopt(large_base, LARGE_SPAN) }
        .unwrap_or_else(|e| fail(&format!("cannot register the large-object region: {e}")));
    let rt = Runtime {
        pager,
        heap,
        large,
        space: Mutex::new(Space {
            ranges: Ranges::new(LARGE_SPAN),
            foreign: RangeSet::new(),
        }),
        env,
    };
    if RUNTIME.set(rt).is_ok() {
        exit::owned_by_this_process();
        serve_control();
        join_coordinator();
        // SAFETY: registering functions with no preconditions (after the pager's and the
        // allocator's, so these run last in a child and first before a fork).
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    }
    tidepool_alloc::set_thread_unpaged(false);
}

/// The pager's configuration for the settings `tidepool run` gave.
fn pager_config(env: &RunEnv) -> Config {
    use tidepool_store::{Compression, StoreUrl};
    let in_process = match StoreUrl::parse(&env.backend) {
        Ok(StoreUrl::Local { compression }) => Some(compression),
        _ => None,
    };
    let mut config = Config::new(env.local as usize)
        .thread_start(|| tidepool_alloc::set_thread_unpaged(true))
        .around_child_restart(tidepool_alloc::set_arenas_aside)
        .before_fork(stdio::touch_locks)
        // The plain in-process store keeps far pages as frames moved with UFFDIO_MOVE (copying
        // nothing); the compressing one keeps no copy of a page that came back (it would cost
        // this process the page's compressed size).
        .in_process_frames(env.switches.frames && in_process == Some(Compression::None))
        .drop_far_copies(
            env.switches.drop_copies && in_process.is_some_and(|c| c != Compression::None),
        )
        // Any other store gets a probation tier in front of it.
        .probation(env.switches.probation)
        // A budget that grows brings evicted pages back before they are asked for.
        .refill(env.switches.refill)
        // One fault handler follows the program's CPU (see the pager's `follow.rs`).
        .follow_program(env.switches.follow);
    if let Some(bytes) = env.child_local {
        config = config.child_local_budget(bytes as usize);
    }
    if let Some(deadline) = env.fault_deadline {
        config = config.fault_deadline(deadline);
    }
    if let Some(faults) = env.stall_after {
        config = config.stall_handlers_after(faults);
    }
    config
}

/// Applies the profile `tidepool run --profile` named, in a process running the program it is
/// for. `tidepool run` checked it against the program it starts and said so if it did not fit;
/// other programs that program runs ignore it silently.
fn apply_profile(pager: &Pager, path: &std::path::Path, reporter: u32) {
    use tidepool_pager::profile::{Fit, Profile};
    let profile = match Profile::read(path) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("tidepool run: {e}; this process runs without it");
            return;
        }
    };
    let me = own_program();
    if me
        .as_ref()
        .is_some_and(|me| profile.fit(me) == Fit::Applies)
    {
        profile.apply(pager);
        return;
    }
    // The program `tidepool run` started, in an image the profile does not fit (a script's
    // interpreter may exec the one it does, under this pid): said at exit if none did.
    let started = reporter == std::process::id();
    if let (true, Some(me)) = (started, me) {
        let _ = UNFIT_PROFILE.set(format!(
            "tidepool run: the profile {} is for {}{}, and this program ran {}{}: it changed \
             nothing",
            path.display(),
            profile.program.name,
            build(&profile.program),
            me.name,
            build(&me)
        ));
    }
}

fn build(p: &tidepool_pager::profile::Program) -> String {
    p.build_id
        .as_ref()
        .map_or(String::new(), |b| format!(" (build {b})"))
}

/// What to say at exit about a profile that fitted this process's program in none of its
/// images.
static UNFIT_PROFILE: OnceLock<String> = OnceLock::new();

/// The program this process runs: its executable, or under `tidepool __exec-static PATH`
/// (a statically linked program, loaded by tidepool itself) PATH.
fn own_program() -> Option<tidepool_pager::profile::Program> {
    use tidepool_pager::profile::Program;
    let exe = std::fs::read_link("/proc/self/exe").ok()?;
    let cmdline = std::fs::read("/proc/self/cmdline").ok()?;
    let mut args = cmdline.split(|&b| b == 0);
    if exe.file_name().is_some_and(|n| n == "tidepool") && args.nth(1) == Some(b"__exec-static") {
        use std::os::unix::ffi::OsStrExt;
        let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(args.next()?));
        return Program::of_file(&path).ok();
    }
    Program::of_this_process().ok()
}

/// Writes what the sections did for `tidepool tune` (`RunEnv::sections_out`), and the fault
/// trace if one was asked for (`RunEnv::fault_trace`).
fn write_sections(pager: &Pager, dir: &std::path::Path) {
    use tidepool_pager::fault_trace::FaultTrace;
    use tidepool_pager::profile::Observed;
    let Some(me) = own_program() else {
        return;
    };
    if let Err(e) = Observed::of(pager, me).write_to(dir) {
        eprintln!(
            "tidepool run: cannot write this process's sections to {}: {e}",
            dir.display()
        );
    }
    if let Some(trace) = pager.fault_trace() {
        let path = dir.join(FaultTrace::file_name(std::process::id()));
        if let Err(e) = trace.write_to(&path) {
            eprintln!(
                "tidepool run: cannot write this process's fault trace to {}: {e}",
                path.display()
            );
        }
    }
}

/// Names the heap's sections: one per size class (their spans are equal and aligned), and the
/// medium heap's span after them.
fn name_classes(pager: &Pager, heap: &AdoptedRegion) {
    use tidepool_alloc::classes::{class_size, CLASSES};
    let mut ids: Vec<SectionId> = (0..CLASSES)
        .map(|c| pager.section(&format!("heap {}B", class_size(c))))
        .collect();
    ids.push(pager.section("heap medium"));
    heap.set_section_spans(tidepool_alloc::span_shift(), &ids);
}

/// Serves `tidepool resize` and `tidepool status` for this process.
fn serve_control() {
    if let Some(rt) = RUNTIME.get() {
        if let Err(e) = tidepool_pager::control::serve(&rt.pager, std::process::id()) {
            eprintln!("tidepool run: live resizing is unavailable: {e}");
        }
    }
}

/// Registers this process with the coordinator `tidepool run` named, if it did.
fn join_coordinator() {
    let Some(rt) = RUNTIME.get() else {
        return;
    };
    let Some(join) = &rt.env.coord else {
        return;
    };
    let name = join.name.clone().unwrap_or_else(|| {
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
        comm.trim().to_string()
    });
    let reg = tidepool_pager::coord::Registration {
        socket: join.socket.clone(),
        name,
        weight: join.weight,
        min: join.min.unwrap_or(0),
        max: join.max.unwrap_or(u64::MAX),
    };
    if let Err(e) = tidepool_pager::coord::join(&rt.pager, reg) {
        eprintln!("tidepool run: cannot join the coordinator: {e}");
    }
}

thread_local! {
    /// The list of ranges, held by the forking thread across a fork.
    static HELD: RefCell<Option<MutexGuard<'static, Space>>> = const { RefCell::new(None) };
}

/// The list of ranges must be whole in a forked child: nobody may be changing it at the fork.
extern "C" fn fork_prepare() {
    if let Some(rt) = RUNTIME.get() {
        let guard = rt.space();
        HELD.with(|h| *h.borrow_mut() = Some(guard));
    }
}

extern "C" fn fork_parent() {
    HELD.with(|h| h.borrow_mut().take());
}

extern "C" fn fork_child() {
    HELD.with(|h| h.borrow_mut().take());
    exit::owned_by_this_process();
    // The control socket is named by process id; the parent's thread serving it is not here,
    // nor is its coordinator link: the child registers as a program of its own.
    serve_control();
    join_coordinator();
}

/// The pager of this process, once started.
pub fn pager() -> Option<&'static Pager> {
    RUNTIME.get().map(|r| &r.pager)
}

extern "C" fn at_exit() {
    exit::before_exit();
    if let Some(rt) = RUNTIME.get() {
        if let (Some(dir), false) = (&rt.env.sections_out, tidepool_pager::in_forked_child()) {
            write_sections(&rt.pager, dir);
        }
        if let (Some(why), false) = (UNFIT_PROFILE.get(), tidepool_pager::in_forked_child()) {
            eprintln!("{why}");
        }
        if rt.env.stats && !tidepool_pager::in_forked_child() {
            let name = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
            eprintln!(
                "tidepool run: process {} ({}), far store {}\n{}",
                std::process::id(),
                name.trim(),
                rt.pager.store_description(),
                rt.pager.report()
            );
        }
    }
}

#[used]
#[link_section = ".init_array.00100"]
static INIT: extern "C" fn() = start;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = at_exit;
