//! userfaultfd: opening the object with its features negotiated, and the ioctls on it. The
//! pager serves missing pages through [`Uffd`]; soft memory registers its arenas in SIGBUS
//! mode ([`crate::memfd::SigbusMap`]) and never reads the object.

use crate::PAGE;
use linux_raw_sys::general as uapi;
use linux_raw_sys::ioctl as ioc;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

/// `USERFAULTFD_IOC_NEW`: `_IO(0xAA, 0x00)` on /dev/userfaultfd.
const USERFAULTFD_IOC_NEW: libc::c_ulong = 0xAA00;

/// Who may raise faults on a userfaultfd object's ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultsFrom {
    /// User code and the kernel alike (a `read(2)` into a registered buffer waits for the
    /// handler instead of failing with EFAULT). Needs /dev/userfaultfd access or the system
    /// call's privileges; tried in that order.
    UserAndKernel,
    /// User code only (`UFFD_USER_MODE_ONLY`): allowed to any user, enough where registered
    /// memory is touched only by the process's own instructions.
    UserOnly,
}

/// Opens a close-on-exec userfaultfd object and negotiates `features` (UFFDIO_API).
pub fn userfaultfd(features: u64, from: FaultsFrom) -> io::Result<OwnedFd> {
    let syscall = |flags: libc::c_int| {
        // SAFETY: the userfaultfd system call takes only flags.
        let fd = unsafe { crate::syscall!(libc::SYS_userfaultfd, flags as libc::c_long) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
    };
    let fd = match from {
        FaultsFrom::UserAndKernel => open_uffd_device().or_else(|dev_err| {
            syscall(libc::O_CLOEXEC).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "neither /dev/userfaultfd ({dev_err}) nor the userfaultfd system call \
                         ({e}) is usable; run as root, or give this user read-write access to \
                         /dev/userfaultfd"
                    ),
                )
            })
        })?,
        FaultsFrom::UserOnly => syscall(libc::O_CLOEXEC | uapi::UFFD_USER_MODE_ONLY as libc::c_int)
            .or_else(|e| {
                open_uffd_device().map_err(|dev_err| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "the userfaultfd system call ({e}) and /dev/userfaultfd ({dev_err}) \
                             both refused; check the vm.unprivileged_userfaultfd sysctl, or run \
                             as root"
                        ),
                    )
                })
            })?,
    };
    // SAFETY: uffdio_api is plain data; all-zero is a valid starting value.
    let mut api: uapi::uffdio_api = unsafe { std::mem::zeroed() };
    api.api = uapi::UFFD_API as u64;
    api.features = features;
    // SAFETY: UFFDIO_API reads and writes one uffdio_api, which `api` is.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), ioc::UFFDIO_API as _, &mut api) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

fn open_uffd_device() -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated path.
    let dev = unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if dev < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dev` is a descriptor we just opened.
    let dev = unsafe { OwnedFd::from_raw_fd(dev) };
    // SAFETY: USERFAULTFD_IOC_NEW takes the new object's flags by value.
    let fd = unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            USERFAULTFD_IOC_NEW as _,
            libc::O_CLOEXEC as libc::c_long,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Registers `[addr, addr + len)` with the userfaultfd object `uffd` in `mode`
/// (`UFFDIO_REGISTER_MODE_*` bits).
pub fn register(uffd: BorrowedFd<'_>, addr: usize, len: usize, mode: u64) -> io::Result<()> {
    // SAFETY: plain data; all-zero is a valid starting value.
    let mut reg: uapi::uffdio_register = unsafe { std::mem::zeroed() };
    reg.range.start = addr as u64;
    reg.range.len = len as u64;
    reg.mode = mode;
    // SAFETY: UFFDIO_REGISTER reads and writes one uffdio_register.
    if unsafe { libc::ioctl(uffd.as_raw_fd(), ioc::UFFDIO_REGISTER as _, &mut reg) } != 0 {
        return Err(last_err());
    }
    Ok(())
}

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
/// UFFDIO_WRITEPROTECT's modes (linux/userfaultfd.h; not in linux-raw-sys).
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1;
const UFFDIO_WRITEPROTECT_MODE_DONTWAKE: u64 = 2;

/// A userfaultfd object, close-on-exec; reading it blocks until there are events.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    can_move: bool,
    /// Whether the object can be read without blocking (see [`Uffd::read_faults_now`]).
    nowait: bool,
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
    /// The thread that faulted (its kernel thread id, as `gettid` gives it).
    pub tid: u32,
}

/// Wakes held back on this thread (see [`Uffd::deferring_wakes`]).
mod deferred {
    use std::cell::Cell;

    thread_local! {
        /// Whether installs on this thread hold their wake-ups back.
        pub(super) static ACTIVE: Cell<bool> = const { Cell::new(false) };
        /// The span of addresses whose waiters are owed a wake-up, `(start, end)`: one range,
        /// widened as needed (waking a thread whose page is still missing only makes it fault
        /// again), so no allocation and no destructor on any thread.
        pub(super) static SPAN: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
    }

    /// Whether wake-ups are held back on this thread; if so, owes one for `[addr, addr + len)`.
    pub(super) fn hold(addr: usize, len: usize) -> bool {
        if !ACTIVE.with(Cell::get) {
            return false;
        }
        SPAN.with(|s| {
            let end = addr + len;
            s.set(Some(match s.get() {
                Some((a, b)) => (a.min(addr), b.max(end)),
                None => (addr, end),
            }))
        });
        true
    }
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
        let mut uffd = match Self::open_with(FEATURES | uapi::UFFD_FEATURE_MOVE as u64) {
            Ok(fd) => Uffd {
                fd,
                can_move: true,
                nowait: true,
            },
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Uffd {
                fd: Self::open_with(FEATURES)?,
                can_move: false,
                nowait: true,
            },
            Err(e) => return Err(e),
        };
        // Nothing is registered yet, so a read that may not wait finds nothing, or the kernel
        // refuses the flag.
        let mut none = Vec::new();
        uffd.nowait = uffd.read_faults_with(&mut none, libc::RWF_NOWAIT).is_ok();
        Ok(uffd)
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
        userfaultfd(features, FaultsFrom::UserAndKernel)
    }

    /// Registers `[addr, addr + len)` for missing-page and write-protect faults.
    pub fn register(&self, addr: usize, len: usize) -> io::Result<()> {
        use std::os::fd::AsFd;
        register(
            self.fd.as_fd(),
            addr,
            len,
            (uapi::UFFDIO_REGISTER_MODE_MISSING | uapi::UFFDIO_REGISTER_MODE_WP) as u64,
        )
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
        let wake = wake && !deferred::hold(dst, src.len());
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
        let wake = wake && !deferred::hold(dst, len);
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
        if deferred::hold(dst, PAGE) {
            z.mode = uapi::UFFDIO_ZEROPAGE_MODE_DONTWAKE as u64;
        }
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
        w.mode = if on {
            UFFDIO_WRITEPROTECT_MODE_WP
        } else if deferred::hold(addr, len) {
            UFFDIO_WRITEPROTECT_MODE_DONTWAKE
        } else {
            0
        };
        retry_eagain(|| {
            // SAFETY: UFFDIO_WRITEPROTECT changes protections of our own registered range only.
            unsafe { libc::ioctl(self.fd.as_raw_fd(), ioc::UFFDIO_WRITEPROTECT as _, &mut w) }
        })
    }

    /// Wakes threads waiting on faults in `[addr, addr + len)`, so they retry their access.
    pub fn wake(&self, addr: usize, len: usize) {
        if deferred::hold(addr, len) {
            return;
        }
        self.wake_now(addr, len);
    }

    fn wake_now(&self, addr: usize, len: usize) {
        let mut range = uapi::uffdio_range {
            start: addr as u64,
            len: len as u64,
        };
        // SAFETY: UFFDIO_WAKE reads one uffdio_range. It can fail only for a bad range, which
        // leaves nothing to wake.
        unsafe { libc::ioctl(self.fd.as_raw_fd(), ioc::UFFDIO_WAKE as _, &mut range) };
    }

    /// Runs `work` with every wake-up it causes on this thread (installs, lifted protections,
    /// explicit wakes) held back, then gives them all at once. For work that must be complete
    /// before the threads it serves run on: a thread woken by the first install would otherwise
    /// race the rest.
    pub fn deferring_wakes<T>(&self, work: impl FnOnce() -> T) -> T {
        let outer = deferred::ACTIVE.with(|a| a.replace(true));
        let result = work();
        if !outer {
            deferred::ACTIVE.with(|a| a.set(false));
            if let Some((start, end)) = deferred::SPAN.with(|s| s.take()) {
                self.wake_now(start, end - start);
            }
        }
        result
    }

    /// Reads page-fault events into `out`, waiting for at least one (`out` may still come back
    /// empty, after a signal). Other events (none are asked for) are skipped.
    pub fn read_faults(&self, out: &mut Vec<Fault>) -> io::Result<()> {
        self.read_faults_with(out, 0)
    }

    /// [`Uffd::read_faults`] without waiting: `out` comes back empty if none are pending. With
    /// RWF_NOWAIT where the kernel takes it for userfaultfd (it came with the object's
    /// `read_iter`), else by making the object non-blocking for the call.
    pub fn read_faults_now(&self, out: &mut Vec<Fault>) -> io::Result<()> {
        if self.nowait {
            return self.read_faults_with(out, libc::RWF_NOWAIT);
        }
        // Older kernels: the object non-blocking for the length of one read. A reader that
        // comes meanwhile comes back empty too, which readers take as "nothing yet".
        let fd = self.fd.as_raw_fd();
        // SAFETY: F_GETFL and F_SETFL on a descriptor this value owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(last_err());
        }
        // SAFETY: as above.
        unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
        let r = self.read_faults_with(out, 0);
        // SAFETY: as above.
        unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
        r
    }

    fn read_faults_with(&self, out: &mut Vec<Fault>, flags: libc::c_int) -> io::Result<()> {
        out.clear();
        // SAFETY: uffd_msg is plain data; all-zero is valid.
        let mut msgs: [uapi::uffd_msg; 32] = unsafe { std::mem::zeroed() };
        let iov = libc::iovec {
            iov_base: msgs.as_mut_ptr().cast(),
            iov_len: std::mem::size_of_val(&msgs),
        };
        // SAFETY: `iov` describes `msgs`, writable for its whole size; the kernel writes whole
        // messages into it.
        let n = unsafe { libc::preadv2(self.fd.as_raw_fd(), &iov, 1, -1, flags) };
        if n < 0 {
            let e = last_err();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(()),
                Some(libc::EOPNOTSUPP) => Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "this kernel cannot read a userfaultfd object without blocking",
                )),
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
                // SAFETY: UFFD_FEATURE_THREAD_ID, which every object here asks for, makes
                // the kernel fill `ptid`.
                tid: unsafe { pf.feat.ptid },
            });
        }
        Ok(())
    }
}
