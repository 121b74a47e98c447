//! The system calls the pager makes, each behind a small safe function: the userfaultfd object
//! and its ioctls, address-space reservations, and reads of pages the pager has pinned in place.
//!
//! Everything unsafe in the crate lives here. The invariant that makes the page reads sound is
//! stated once, at [`page_bytes`].

use linux_raw_sys::general as uapi;
use linux_raw_sys::ioctl as ioc;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// Bytes in a page (x86-64 and arm64 with 4 KiB pages; checked against the kernel at startup).
pub const PAGE: usize = 4096;

/// The features the pager asks for.
///
/// Faults raised by the kernel itself (a `read(2)` into an evicted buffer) must reach us, so the
/// object is a full one (not `UFFD_USER_MODE_ONLY`): opened through /dev/userfaultfd, which
/// grants that without `CAP_SYS_PTRACE`, or the system call as a fallback.
const FEATURES: u64 = uapi::UFFD_FEATURE_THREAD_ID as u64;

/// `UFFDIO_MOVE`: `_IOWR(0xAA, 0x05, struct uffdio_move)` (Linux 6.8).
const UFFDIO_MOVE: libc::c_ulong =
    0xC000_AA05 | ((std::mem::size_of::<uapi::uffdio_move>() as libc::c_ulong) << 16);
const UFFDIO_MOVE_MODE_DONTWAKE: u64 = 1;

/// A userfaultfd object, close-on-exec; reading it blocks until there are events.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    can_move: bool,
}

/// One page-fault event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The faulting address, rounded down to its page.
    pub page_addr: usize,
    /// The access was a write.
    pub write: bool,
    /// A write to a write-protected page (not a missing page).
    pub wp: bool,
}

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

/// Repeats an ioctl while it fails with EAGAIN (the mapping changed under it).
fn retry_eagain(mut call: impl FnMut() -> libc::c_int) -> io::Result<()> {
    loop {
        if call() == 0 {
            return Ok(());
        }
        let e = last_err();
        if e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
    }
}

impl Uffd {
    /// Opens a userfaultfd object through /dev/userfaultfd (or the system call).
    pub fn open() -> io::Result<Uffd> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page != PAGE as libc::c_long {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the pager needs 4 KiB pages; this kernel uses {page}-byte pages"),
            ));
        }
        // UFFDIO_MOVE where the kernel has it (6.8 and later), else without.
        match Self::open_with(FEATURES | uapi::UFFD_FEATURE_MOVE as u64) {
            Ok(fd) => Ok(Uffd { fd, can_move: true }),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(Uffd {
                fd: Self::open_with(FEATURES)?,
                can_move: false,
            }),
            Err(e) => Err(e),
        }
    }

    /// In a forked child: a new object with the same features takes the place (and the
    /// descriptor number) of the one inherited from the parent, which this process must
    /// neither read (it would take the parent's faults) nor keep open.
    pub fn reopen(&self) -> io::Result<()> {
        let features = if self.can_move {
            FEATURES | uapi::UFFD_FEATURE_MOVE as u64
        } else {
            FEATURES
        };
        let fresh = Self::open_with(features)?;
        // SAFETY: dup3 onto a descriptor this value owns; the old object's last reference in
        // this process goes, and the number now names the new one (close-on-exec, like it).
        if unsafe { libc::dup3(fresh.as_raw_fd(), self.fd.as_raw_fd(), libc::O_CLOEXEC) } < 0 {
            return Err(last_err());
        }
        Ok(())
    }

    /// Registers the mapped parts of `[addr, addr + len)`: all of it if it is one run of
    /// anonymous mappings, else each private anonymous mapping inside it that /proc/self/maps
    /// lists (a forked child lacks the parts the program marked MADV_DONTFORK, and a file the
    /// program mapped over part of a region is not the pager's).
    pub fn register_present(&self, addr: usize, len: usize) -> io::Result<()> {
        if self.register(addr, len).is_ok() {
            return Ok(());
        }
        let maps = std::fs::read_to_string("/proc/self/maps")?;
        let end = addr + len;
        for line in maps.lines() {
            let Some((range, rest)) = line.split_once(' ') else {
                continue;
            };
            // "rw-p 00000000 00:00 0": private and anonymous (inode 0, no path); a file or
            // shared mapping the program placed over part of a region is not ours.
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let anonymous_private = fields.first().is_some_and(|p| p.ends_with('p'))
                && fields.get(3) == Some(&"0")
                && fields.len() <= 4;
            if !anonymous_private {
                continue;
            }
            let Some((a, b)) = range.split_once('-') else {
                continue;
            };
            let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            else {
                continue;
            };
            let (from, to) = (a.max(addr), b.min(end));
            if from < to {
                self.register(from, to - from)?;
            }
        }
        Ok(())
    }

    /// Whether [`Uffd::move_pages`] is available.
    pub fn can_move(&self) -> bool {
        self.can_move
    }

    fn open_with(features: u64) -> io::Result<OwnedFd> {
        tidepool_sys::userfaultfd(features, tidepool_sys::FaultsFrom::UserAndKernel)
    }

    /// Registers `[addr, addr + len)` for missing-page and write-protect faults.
    pub fn register(&self, addr: usize, len: usize) -> io::Result<()> {
        // SAFETY: plain data.
        let mut reg: uapi::uffdio_register = unsafe { std::mem::zeroed() };
        reg.range.start = addr as u64;
        reg.range.len = len as u64;
        reg.mode = (uapi::UFFDIO_REGISTER_MODE_MISSING | uapi::UFFDIO_REGISTER_MODE_WP) as u64;
        // SAFETY: UFFDIO_REGISTER reads and writes one uffdio_register.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), ioc::UFFDIO_REGISTER as _, &mut reg) } != 0 {
            return Err(last_err());
        }
        Ok(())
    }

    /// Unregisters a range; faults there become ordinary anonymous-memory faults.
    pub fn unregister(&self, addr: usize, len: usize) -> io::Result<()> {
        let mut range = uapi::uffdio_range {
            start: addr as u64,
            len: len as u64,
        };
        // SAFETY: UFFDIO_UNREGISTER reads one uffdio_range.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), ioc::UFFDIO_UNREGISTER as _, &mut range) } != 0
        {
            return Err(last_err());
        }
        Ok(())
    }

    /// Installs `src` (any alignment, a whole number of pages) at the registered `dst` and, if
    /// `wake`, wakes whoever waits there (else the caller must). `write_protect` installs the
    /// pages write-protected, so that the first write raises a fault we see. Returns the bytes
    /// installed; `EEXIST` (a page already present) is an error the caller decides about.
    pub fn copy(
        &self,
        dst: usize,
        src: &[u8],
        write_protect: bool,
        wake: bool,
    ) -> io::Result<usize> {
        debug_assert!(dst.is_multiple_of(PAGE) && src.len().is_multiple_of(PAGE));
        // SAFETY: plain data.
        let mut c: uapi::uffdio_copy = unsafe { std::mem::zeroed() };
        c.dst = dst as u64;
        c.src = src.as_ptr() as u64;
        c.len = src.len() as u64;
        c.mode = if write_protect {
            uapi::UFFDIO_COPY_MODE_WP as u64
        } else {
            0
        } | if wake {
            0
        } else {
            uapi::UFFDIO_COPY_MODE_DONTWAKE as u64
        };
        loop {
            // SAFETY: UFFDIO_COPY reads `len` bytes at `src`, which `src` is valid for, and
            // writes only pages of our own registered range; it reads and writes one
            // uffdio_copy.
            let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), ioc::UFFDIO_COPY as _, &mut c) };
            if rc == 0 {
                return Ok(c.copy as usize);
            }
            let e = last_err();
            if e.raw_os_error() == Some(libc::EAGAIN) && c.copy > 0 {
                // Partial progress (the mapping changed under us): the caller retries the rest.
                return Ok(c.copy as usize);
            }
            if e.raw_os_error() == Some(libc::EAGAIN) {
                continue;
            }
            return Err(e);
        }
    }

    /// Moves the pages at `src` to `dst` (UFFDIO_MOVE: the page-table entries change hands,
    /// nothing is copied or allocated), then wakes whoever waits at `dst` if `wake`. `dst` must
    /// lie in a range registered with this object and hold no pages; `src` must be private
    /// anonymous memory of this process. Returns the bytes moved and, if it stopped short of
    /// `len`, why: ENOENT (no page at the next `src` page), EEXIST (a page already at the next
    /// `dst` page) or EBUSY (the next page is shared, with a forked child say), among others.
    pub fn move_pages(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        wake: bool,
    ) -> (usize, Option<io::Error>) {
        debug_assert!(self.can_move);
        let mut done = 0;
        while done < len {
            // SAFETY: plain data.
            let mut m: uapi::uffdio_move = unsafe { std::mem::zeroed() };
            m.dst = (dst + done) as u64;
            m.src = (src + done) as u64;
            m.len = (len - done) as u64;
            m.mode = if wake { 0 } else { UFFDIO_MOVE_MODE_DONTWAKE };
            // SAFETY: UFFDIO_MOVE changes only page tables of this process, moving pages
            // between two ranges the caller owns; it reads and writes one uffdio_move.
            let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_MOVE as _, &mut m) };
            if rc == 0 {
                return (len, None);
            }
            let e = last_err();
            if m.move_ > 0 {
                done += m.move_ as usize;
                if e.raw_os_error() == Some(libc::EAGAIN) {
                    continue;
                }
            } else if e.raw_os_error() == Some(libc::EAGAIN) {
                continue;
            } else if e.raw_os_error() == Some(libc::EINVAL) && len - done > PAGE {
                // A range must lie within one mapping at each end: the program split the
                // region (mprotect, madvise) somewhere inside this one. Page by page, the
                // first page that cannot move says why.
                while done < len {
                    let (n, err) = self.move_pages(dst + done, src + done, PAGE, wake);
                    done += n;
                    if err.is_some() {
                        return (done, err);
                    }
                }
                return (done, None);
            }
            return (done, Some(e));
        }
        (done, None)
    }

    /// Maps the shared zero page at `dst` (one page) and wakes waiters.
    pub fn zeropage(&self, dst: usize) -> io::Result<()> {
        // SAFETY: plain data.
        let mut z: uapi::uffdio_zeropage = unsafe { std::mem::zeroed() };
        z.range.start = dst as u64;
        z.range.len = PAGE as u64;
        retry_eagain(|| {
            // SAFETY: UFFDIO_ZEROPAGE maps into our own registered range; reads and writes one
            // uffdio_zeropage.
            unsafe { libc::ioctl(self.fd.as_raw_fd(), ioc::UFFDIO_ZEROPAGE as _, &mut z) }
        })
    }

    /// Write-protects `[addr, addr + len)` (`on`), or lifts the protection and wakes writers.
    pub fn write_protect(&self, addr: usize, len: usize, on: bool) -> io::Result<()> {
        // SAFETY: plain data.
        let mut w: uapi::uffdio_writeprotect = unsafe { std::mem::zeroed() };
        w.range.start = addr as u64;
        w.range.len = len as u64;
        w.mode = if on { 1 } else { 0 }; // UFFDIO_WRITEPROTECT_MODE_WP
        retry_eagain(|| {
            // SAFETY: UFFDIO_WRITEPROTECT changes protections of our own registered range only.
            unsafe { libc::ioctl(self.fd.as_raw_fd(), ioc::UFFDIO_WRITEPROTECT as _, &mut w) }
        })
    }

    /// Wakes threads waiting on faults in `[addr, addr + len)`, so they retry their access.
    pub fn wake(&self, addr: usize, len: usize) {
        let mut range = uapi::uffdio_range {
            start: addr as u64,
            len: len as u64,
        };
        // SAFETY: UFFDIO_WAKE reads one uffdio_range. It can fail only for a bad range, which
        // leaves nothing to wake.
        unsafe { libc::ioctl(self.fd.as_raw_fd(), ioc::UFFDIO_WAKE as _, &mut range) };
    }

    /// Reads page-fault events into `out`, waiting for at least one (`out` may still come back
    /// empty, after a signal). Other events (none are asked for) are skipped.
    pub fn read_faults(&self, out: &mut Vec<Fault>) -> io::Result<()> {
        out.clear();
        // SAFETY: uffd_msg is plain data; all-zero is valid.
        let mut msgs: [uapi::uffd_msg; 32] = unsafe { std::mem::zeroed() };
        // SAFETY: `msgs` is writable for its whole size; read writes whole messages.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr().cast(),
                std::mem::size_of_val(&msgs),
            )
        };
        if n < 0 {
            let e = last_err();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(()),
                _ => Err(e),
            };
        }
        let count = n as usize / std::mem::size_of::<uapi::uffd_msg>();
        for m in &msgs[..count] {
            if m.event as u32 != uapi::UFFD_EVENT_PAGEFAULT {
                continue;
            }
            // SAFETY: for UFFD_EVENT_PAGEFAULT the kernel fills the `pagefault` member.
            let pf = unsafe { m.arg.pagefault };
            out.push(Fault {
                page_addr: pf.address as usize & !(PAGE - 1),
                write: pf.flags & uapi::UFFD_PAGEFAULT_FLAG_WRITE as u64 != 0,
                wp: pf.flags & uapi::UFFD_PAGEFAULT_FLAG_WP as u64 != 0,
            });
        }
        Ok(())
    }
}

/// A reservation of address space (or a pager-private table), unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    /// Reserves `len` bytes, readable and writable, backed by nothing until touched and not
    /// charged against overcommit.
    pub fn reserve(len: usize) -> io::Result<Mapping> {
        let addr = tidepool_sys::map_noreserve(len)?;
        Ok(Mapping { addr, len })
    }

    pub fn addr(&self) -> usize {
        self.addr
    }

    /// A pager-private table of `T` viewed as a slice (zero-initialised, populated on touch).
    pub fn as_table<T: ZeroIsValid>(&self) -> &[T] {
        // SAFETY: the mapping is readable and writable for `len` bytes, page aligned (so
        // aligned for any T up to 4 KiB), zero-filled by the kernel, and T is valid when all
        // zero (the ZeroIsValid contract). It lives as long as `self`.
        unsafe {
            std::slice::from_raw_parts(self.addr as *const T, self.len / std::mem::size_of::<T>())
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the range is a mapping this value owns; nothing references it past drop.
        // A raw system call: a preloaded library may interpose munmap (tidepool run does).
        unsafe { libc::syscall(libc::SYS_munmap, self.addr, self.len) };
    }
}

/// Types for which the all-zero bit pattern is a valid value (atomics of integers).
///
/// # Safety
/// Implement only for types whose every field is valid when zero.
pub unsafe trait ZeroIsValid: Sync {}
// SAFETY: an atomic integer is valid when zero.
unsafe impl ZeroIsValid for std::sync::atomic::AtomicU64 {}
// SAFETY: an atomic integer is valid when zero.
unsafe impl ZeroIsValid for std::sync::atomic::AtomicU32 {}

/// Drops the pages of `[addr, addr + len)`: the next touch faults as missing.
pub fn discard(addr: usize, len: usize) {
    // SAFETY: MADV_DONTNEED on a range is defined for any range; callers pass ranges of
    // regions the pager owns, whose contents they have saved or no longer need. A raw system
    // call: the preload library interposes madvise and sends discards in its regions here.
    unsafe { libc::syscall(libc::SYS_madvise, addr, len, libc::MADV_DONTNEED) };
}

/// Changes the protection of `[addr, addr + len)` (a raw system call: the preload library
/// interposes mprotect and passes calls on paged memory here).
pub fn protect(addr: usize, len: usize, prot: i32) -> io::Result<()> {
    // SAFETY: mprotect changes only protections; callers pass ranges of regions the pager owns
    // on the program's behalf (mprotect's contract is the program's).
    if unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) } != 0 {
        return Err(last_err());
    }
    Ok(())
}

/// madvise with any advice, as a raw system call (see [`protect`]).
pub fn advise(addr: usize, len: usize, advice: i32) -> io::Result<()> {
    // SAFETY: the advice callers pass (fork inheritance) changes no contents.
    if unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) } != 0 {
        return Err(last_err());
    }
    Ok(())
}

/// Maps fresh private anonymous memory over `[addr, addr + len)` (MAP_FIXED: whatever was
/// there goes), with protection `prot`, reserved rather than committed.
pub fn map_fixed(addr: usize, len: usize, prot: i32) -> io::Result<()> {
    // SAFETY: callers pass ranges of their own regions whose old contents nobody needs (a
    // mapping the program unmapped, or a hole a forked child lacks).
    let p = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            addr,
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p < 0 {
        return Err(last_err());
    }
    Ok(())
}

/// Whether a page table entry maps the page at `addr` (mincore: present, or in the swap
/// cache).
pub fn is_mapped(addr: usize) -> bool {
    let mut v = 0u8;
    // SAFETY: mincore reads page tables only and writes one byte for the one page asked.
    let rc = unsafe { libc::mincore(addr as *mut libc::c_void, PAGE, &mut v) };
    rc == 0 && v & 1 != 0
}

/// This process's /proc/self/pagemap and the pid it was opened for (a forked child must open
/// its own: the inherited descriptor reads the parent's).
static PAGEMAP: parking_lot::Mutex<(i32, i32)> = parking_lot::Mutex::new((-1, -1));

/// For each page of `[addr, addr + pages * PAGE)`: whether the program still has it (present,
/// or swapped out by the kernel). False for a page the program dropped behind the pager's back
/// (a madvise system call the pager did not see). All true if pagemap cannot be read.
pub fn pages_exist(addr: usize, pages: usize, out: &mut Vec<bool>) {
    out.clear();
    out.resize(pages, true);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let fd = {
        let mut cached = PAGEMAP.lock();
        if cached.0 != pid {
            // SAFETY: open of a NUL-terminated path; the descriptor is kept for the process.
            let fd = unsafe {
                libc::open(
                    c"/proc/self/pagemap".as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC,
                )
            };
            if fd < 0 {
                return;
            }
            *cached = (pid, fd);
        }
        cached.1
    };
    let mut entries = vec![0u64; pages];
    // SAFETY: reads 8 bytes per page into `entries`, which is that long.
    let n = unsafe {
        libc::pread(
            fd,
            entries.as_mut_ptr().cast(),
            pages * 8,
            (addr / PAGE * 8) as libc::off_t,
        )
    };
    if n != (pages * 8) as isize {
        return;
    }
    for (e, o) in entries.iter().zip(out.iter_mut()) {
        // Bit 63: present; bit 62: swapped.
        *o = e >> 62 != 0;
    }
}

/// Whether process_madvise takes MADV_DONTNEED for this process (0 unknown, 1 yes, 2 no).
static VECTORED_DISCARD: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
/// A pidfd of this process and the pid it was opened for (a forked child inherits the fd but
/// must never advise its parent's memory).
static SELF_PIDFD: parking_lot::Mutex<(i32, i32)> = parking_lot::Mutex::new((-1, -1));

fn self_pidfd() -> Option<i32> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut cached = SELF_PIDFD.lock();
    if cached.0 != pid {
        // SAFETY: pidfd_open of our own pid; the fd is kept for the life of the process.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        if fd < 0 {
            return None;
        }
        *cached = (pid, fd);
    }
    Some(cached.1)
}

/// Drops the pages of several ranges, as [`discard`] does for one. On Linux 6.16 and later
/// one process_madvise call flushes the TLBs once for all of them: on a VM each flush is an
/// interrupt to every other CPU the program runs on, and evicting scattered pages otherwise
/// pays one per page. Older kernels get one madvise per range.
pub fn discard_many(ranges: &[(usize, usize)]) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut done = 0;
    let pidfd = (ranges.len() > 1 && VECTORED_DISCARD.load(Relaxed) != 2)
        .then(self_pidfd)
        .flatten();
    if let Some(pidfd) = pidfd {
        let iov: Vec<libc::iovec> = ranges
            .iter()
            .take(1024)
            .map(|&(addr, len)| libc::iovec {
                iov_base: addr as *mut libc::c_void,
                iov_len: len,
            })
            .collect();
        // SAFETY: `iov` describes ranges of regions the pager owns whose contents are saved or
        // no longer needed (as for `discard`); the kernel only reads the vector.
        let n = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                pidfd,
                iov.as_ptr(),
                iov.len(),
                libc::MADV_DONTNEED,
                0,
            )
        };
        if n < 0 {
            VECTORED_DISCARD.store(2, Relaxed);
        } else {
            VECTORED_DISCARD.store(1, Relaxed);
            // Whole ranges covered; a partial one is redone below (discarding twice is harmless).
            let mut left = n as usize;
            for &(_, len) in &ranges[..iov.len()] {
                if left < len {
                    break;
                }
                left -= len;
                done += 1;
            }
        }
    }
    for &(addr, len) in &ranges[done..] {
        discard(addr, len);
    }
}

/// The contents of a resident page of a registered region.
///
/// # Safety
/// The page at `addr` must be present (installed by the pager and not discarded since) and
/// write-protected or otherwise not written concurrently, for as long as the slice is used.
/// Pager threads must never read a page that could be missing: the fault would wait for a
/// pager thread.
pub unsafe fn page_bytes<'a>(addr: usize) -> &'a [u8] {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(addr as *const u8, PAGE) }
}

/// Waits until `word` is no longer `expected`, a wake-up, or `timeout` (Linux futex, private
/// to this process: no queue of waiters is kept in user memory, so a forked child inherits no
/// trace of the parent's waiting threads).
pub fn futex_wait(
    word: &std::sync::atomic::AtomicU32,
    expected: u32,
    timeout: std::time::Duration,
) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 behind `word`, which outlives the call, and the
    // timespec; it returns at once if the word is not `expected`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

/// Wakes one thread waiting in [`futex_wait`] on `word`.
pub fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        )
    };
}

/// A new shared anonymous page, zero-filled, never unmapped: inherited by every forked child
/// (`MAP_SHARED`), so an atomic in it is one counter for a whole family of processes.
pub fn shared_counter_page() -> io::Result<&'static std::sync::atomic::AtomicU32> {
    // SAFETY: a fresh mapping of our own; nothing else refers to it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(last_err());
    }
    // SAFETY: page aligned, zero-filled (a valid AtomicU32), mapped for the life of the process
    // and of its forked children, and used only through atomics.
    Ok(unsafe { &*(p as *const std::sync::atomic::AtomicU32) })
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(last_err());
    }
    // SAFETY: two new descriptors that nothing else owns.
    Ok(unsafe {
        (
            std::os::fd::FromRawFd::from_raw_fd(fds[0]),
            std::os::fd::FromRawFd::from_raw_fd(fds[1]),
        )
    })
}

/// Whether every write end of the pipe `read_end` reads from is closed.
pub fn pipe_closed(read_end: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: read_end.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; a zero timeout never blocks.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

/// Closes a descriptor this process inherited and will never use (a forked child's copy of
/// its parent's listening socket).
pub fn close_inherited(fd: i32) {
    // SAFETY: callers pass a descriptor nothing in this process uses any more.
    unsafe { libc::close(fd) };
}

/// Prints `msg` to standard error and exits with `code` at once, running none of the program's
/// handlers (its memory cannot be trusted).
pub fn die(msg: &str, code: i32) -> ! {
    // SAFETY: write(2) of a buffer, then _exit.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(code)
    }
}
