//! fork(2): the child gets a copy of the address space but not the pager (its threads are not
//! copied, and the kernel drops userfaultfd registrations in the child). Left alone, a page
//! that lived in far memory would read as zeros in the child.
//!
//! So the child re-registers every region with a userfaultfd object of its own in SIGBUS mode:
//! touching a page that is not mapped raises SIGBUS in the touching thread, and the handler
//! (async-signal-safe: atomic loads and ioctls only) serves what the child can have correctly:
//! zero pages for untouched memory, and pages still in the write-back buffer (the buffer was
//! copied with the address space). A page that lives only in the far store cannot be given to
//! the child without racing the parent's later writes, so the child stops with a message saying
//! so. fork followed by exec, the common case, never touches such pages.

use crate::sys::PAGE;
use crate::table::{kind, BUSY, FAR, SLOT_SHIFT, WRITEBACK};
use linux_raw_sys::general as uapi;
use linux_raw_sys::ioctl as ioc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering::*};

const MAX_REGIONS: usize = 32;

struct Snapshot {
    base: AtomicUsize,
    len: AtomicUsize,
    states: AtomicUsize,
}

static REGIONS: [Snapshot; MAX_REGIONS] = [const {
    Snapshot {
        base: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        states: AtomicUsize::new(0),
    }
}; MAX_REGIONS];
static SLOTS_BASE: AtomicUsize = AtomicUsize::new(0);
static CHILD_UFFD: AtomicI32 = AtomicI32::new(-1);
static FORKED: AtomicBool = AtomicBool::new(false);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Whether this process is a forked child of a process with a pager.
pub fn in_forked_child() -> bool {
    FORKED.load(Relaxed)
}

/// Records a region for the child (called whenever the parent's region list changes).
pub(crate) fn publish(regions: &[(usize, usize, usize)], slots_base: usize) {
    for (i, slot) in REGIONS.iter().enumerate() {
        let (b, l, s) = regions.get(i).copied().unwrap_or((0, 0, 0));
        slot.len.store(0, Relaxed);
        slot.base.store(b, Relaxed);
        slot.states.store(s, Relaxed);
        slot.len.store(l, Release);
    }
    SLOTS_BASE.store(slots_base, Relaxed);
}

/// Installs the fork handler once per process.
pub(crate) fn install() {
    if INSTALLED.swap(true, AcqRel) {
        return;
    }
    // SAFETY: registering a function with no preconditions to run in the child after fork.
    unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
}

extern "C" fn in_child() {
    FORKED.store(true, Relaxed);
    let Ok(uffd) = open_sigbus_uffd() else {
        return;
    };
    CHILD_UFFD.store(uffd, Relaxed);
    for r in &REGIONS {
        let len = r.len.load(Acquire);
        if len == 0 {
            continue;
        }
        // SAFETY: plain data.
        let mut reg: uapi::uffdio_register = unsafe { std::mem::zeroed() };
        reg.range.start = r.base.load(Relaxed) as u64;
        reg.range.len = len as u64;
        reg.mode = uapi::UFFDIO_REGISTER_MODE_MISSING as u64;
        // SAFETY: registers a range of this (child) process's own address space.
        unsafe { libc::ioctl(uffd, ioc::UFFDIO_REGISTER as _, &mut reg) };
    }
    // SAFETY: a zeroed sigaction with a valid handler and flags.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

fn open_sigbus_uffd() -> Result<i32, ()> {
    // SAFETY: open, ioctl and close on descriptors this function owns; no memory is touched
    // beyond the local structures passed.
    unsafe {
        let dev = libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        let fd = if dev >= 0 {
            let fd = libc::ioctl(dev, 0xAA00, libc::O_CLOEXEC as libc::c_long);
            libc::close(dev);
            fd
        } else {
            libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC as libc::c_long) as i32
        };
        if fd < 0 {
            return Err(());
        }
        let mut api: uapi::uffdio_api = std::mem::zeroed();
        api.api = uapi::UFFD_API as u64;
        api.features = uapi::UFFD_FEATURE_SIGBUS as u64;
        if libc::ioctl(fd, ioc::UFFDIO_API as _, &mut api) != 0 {
            libc::close(fd);
            return Err(());
        }
        Ok(fd)
    }
}

fn say(msg: &[u8]) {
    // SAFETY: write(2) of a static buffer is async-signal-safe.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

extern "C" fn on_sigbus(_sig: i32, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    let uffd = CHILD_UFFD.load(Relaxed);
    for r in &REGIONS {
        let len = r.len.load(Acquire);
        let base = r.base.load(Relaxed);
        if len == 0 || addr.wrapping_sub(base) >= len {
            continue;
        }
        let page = (addr - base) / PAGE;
        let states = r.states.load(Relaxed) as *const AtomicU64;
        // SAFETY: `states` is the region's page table (copied into this child with the
        // address space), which has an entry for every page of the region.
        let word = unsafe { &*states.add(page) }.load(Acquire);
        let page_addr = base + page * PAGE;
        match kind(word) {
            WRITEBACK => {
                let src = SLOTS_BASE.load(Relaxed) + (word >> SLOT_SHIFT) as usize * PAGE;
                // SAFETY: plain data; UFFDIO_COPY reads one page of the (copied) write-back
                // buffer and installs it into this process's registered range.
                unsafe {
                    let mut c: uapi::uffdio_copy = std::mem::zeroed();
                    c.dst = page_addr as u64;
                    c.src = src as u64;
                    c.len = PAGE as u64;
                    libc::ioctl(uffd, ioc::UFFDIO_COPY as _, &mut c);
                }
            }
            FAR | BUSY => {
                say(
                    b"tidepool: a forked child touched memory that lives in far memory; \
only fork followed by exec (or posix_spawn) is supported under the pager. Stopping the child.\n",
                );
                // SAFETY: ending the child without running handlers on memory it cannot trust.
                unsafe { libc::_exit(crate::FATAL_EXIT_CODE) };
            }
            _ => {
                // Untouched (or dropped by the program): zeros.
                // SAFETY: plain data; maps the zero page into our own registered range.
                unsafe {
                    let mut z: uapi::uffdio_zeropage = std::mem::zeroed();
                    z.range.start = page_addr as u64;
                    z.range.len = PAGE as u64;
                    libc::ioctl(uffd, ioc::UFFDIO_ZEROPAGE as _, &mut z);
                }
            }
        }
        return;
    }
    // Not ours: restore the default action and return, so the fault repeats and kills the
    // process as it would have.
    // SAFETY: resetting a signal's disposition is async-signal-safe.
    unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
}
