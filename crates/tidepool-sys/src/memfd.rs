//! A memfd mapped shared and registered with userfaultfd in SIGBUS mode, so that a page with no
//! backing raises SIGBUS instead of filling with zeros; ranges populated with fallocate and
//! revoked by punching holes. Soft memory's arenas are made of these.

use linux_raw_sys::general as uapi;
use rustix::fs::FallocateFlags;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use crate::uffd::{register, userfaultfd, FaultsFrom};

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

/// A memfd of `len` bytes mapped shared at an address aligned to `align`, every page of which
/// raises SIGBUS until populated.
#[derive(Debug)]
pub struct SigbusMap {
    memfd: OwnedFd,
    /// Kept open: closing it would unregister the range, and holes would read as zeros.
    _uffd: OwnedFd,
    base: usize,
    len: usize,
}

impl SigbusMap {
    /// Creates the memfd, maps it and registers the mapping for missing-page faults in SIGBUS
    /// mode. `len` and `align` are multiples of the page size; `align` a power of two.
    pub fn create(len: usize, align: usize) -> io::Result<SigbusMap> {
        let memfd = rustix::fs::memfd_create("tidepool-soft", rustix::fs::MemfdFlags::CLOEXEC)?;
        rustix::fs::ftruncate(&memfd, len as u64)?;
        // Reserve len + align of address space, then map the file at the aligned address
        // inside it (huge pages need 2 MiB-aligned virtual addresses) and give back the rest.
        // SAFETY: a fresh anonymous reservation; no existing mapping is touched.
        let reserve = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len + align,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if reserve == libc::MAP_FAILED {
            return Err(last_err());
        }
        let start = reserve as usize;
        let base = (start + align - 1) & !(align - 1);
        // SAFETY: [base, base + len) lies inside our own reservation, so MAP_FIXED replaces
        // nothing but it.
        let mapped = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                memfd.as_raw_fd(),
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            let e = last_err();
            // SAFETY: our reservation, unmapped whole.
            unsafe { libc::munmap(reserve, len + align) };
            return Err(e);
        }
        // SAFETY: the slack before and after the mapping is ours and unused.
        unsafe {
            if base > start {
                libc::munmap(start as *mut libc::c_void, base - start);
            }
            let end = base + len;
            if start + len + align > end {
                libc::munmap(end as *mut libc::c_void, start + len + align - end);
            }
        }
        let unmap = |e: io::Error| {
            // SAFETY: our mapping, unmapped whole; nothing refers to it yet.
            unsafe { libc::munmap(base as *mut libc::c_void, len) };
            e
        };
        // Huge pages where the machine's shmem policy allows them; a hint, so errors are moot.
        // SAFETY: advice on our own mapping.
        unsafe { libc::madvise(base as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
        // A forked child must not share the arena (MAP_SHARED would let it write into the
        // parent's objects): it gets no mapping at all.
        // SAFETY: advice on our own mapping.
        if unsafe { libc::madvise(base as *mut libc::c_void, len, libc::MADV_DONTFORK) } != 0 {
            return Err(unmap(last_err()));
        }
        let uffd =
            userfaultfd(uapi::UFFD_FEATURE_SIGBUS as u64, FaultsFrom::UserOnly).map_err(|e| {
                unmap(io::Error::new(
                    e.kind(),
                    format!(
                        "soft memory needs userfaultfd to make revoked pages raise SIGBUS: \
                         {e}; {}",
                        crate::probe::DOCTOR_HINT
                    ),
                ))
            })?;
        register(
            uffd.as_fd(),
            base,
            len,
            uapi::UFFDIO_REGISTER_MODE_MISSING as u64,
        )
        .map_err(unmap)?;
        Ok(SigbusMap {
            memfd,
            _uffd: uffd,
            base,
            len,
        })
    }

    /// Where the mapping starts.
    pub fn base(&self) -> usize {
        self.base
    }

    /// The mapping's length in bytes.
    pub fn bytes(&self) -> usize {
        self.len
    }

    /// The memfd (a coordinator holding it can punch holes without our cooperation).
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// Backs `[offset, offset + len)` of the file with memory.
    pub fn populate(&self, offset: usize, len: usize) -> io::Result<()> {
        fallocate(self.memfd.as_fd(), FallocateFlags::empty(), offset, len)
    }

    /// Gives `[offset, offset + len)` of the file back to the system; its pages raise SIGBUS
    /// until populated again.
    pub fn punch(&self, offset: usize, len: usize) -> io::Result<()> {
        punch_hole(self.memfd.as_fd(), offset, len)
    }
}

impl Drop for SigbusMap {
    fn drop(&mut self) {
        // SAFETY: our mapping; its owner is gone, so nothing reads it any more.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

fn fallocate(
    fd: BorrowedFd<'_>,
    mode: FallocateFlags,
    offset: usize,
    len: usize,
) -> io::Result<()> {
    loop {
        match rustix::fs::fallocate(fd, mode, offset as u64, len as u64) {
            Err(rustix::io::Errno::INTR) => continue,
            r => return Ok(r?),
        }
    }
}

/// Punches a hole in a memfd: its pages are given back, and read as holes (raising SIGBUS
/// where a [`SigbusMap`] maps them) until populated again.
pub fn punch_hole(fd: BorrowedFd<'_>, offset: usize, len: usize) -> io::Result<()> {
    fallocate(
        fd,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        offset,
        len,
    )
}

/// The machine's policy for transparent huge pages in shmem (and so in a memfd), from
/// `/sys/kernel/mm/transparent_hugepage/shmem_enabled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShmemHugePages {
    /// `always`, `within_size` or `force`: fallocate populates 2 MiB pages.
    Enabled,
    /// `never`, `deny` or `advise` (which fallocate does not heed): 4 KiB pages.
    Disabled,
    /// The file is missing or unreadable.
    Unknown,
}

impl ShmemHugePages {
    /// Reads the setting.
    pub fn detect() -> ShmemHugePages {
        let Ok(s) = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        else {
            return ShmemHugePages::Unknown;
        };
        match s.split_whitespace().find(|w| w.starts_with('[')) {
            Some("[always]" | "[within_size]" | "[force]") => ShmemHugePages::Enabled,
            Some(_) => ShmemHugePages::Disabled,
            None => ShmemHugePages::Unknown,
        }
    }
}
