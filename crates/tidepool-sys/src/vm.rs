//! Address space: reservations, fixed mappings, protections and advice, and what the page
//! tables say. madvise, mprotect and mmap over a program's memory go through raw system calls,
//! so that a preloaded library interposing them (tidepool run's) is not called back.

use crate::PAGE;
use std::io;

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

/// Reserves `len` bytes of fresh anonymous memory, readable and writable, populated only as
/// it is touched and not charged against overcommit (`MAP_NORESERVE`). Returns its address.
pub fn map_noreserve(len: usize) -> io::Result<usize> {
    // SAFETY: a fresh anonymous mapping at an address the kernel picks; no existing memory is
    // affected. The result is checked before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p as usize)
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
        let addr = map_noreserve(len)?;
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
        unsafe { crate::syscall!(libc::SYS_munmap, self.addr, self.len) };
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
// SAFETY: an atomic integer is valid when zero.
unsafe impl ZeroIsValid for std::sync::atomic::AtomicU8 {}

/// Drops the pages of `[addr, addr + len)`: the next touch faults as missing.
pub fn discard(addr: usize, len: usize) {
    // SAFETY: MADV_DONTNEED on a range is defined for any range; callers pass ranges of
    // regions the pager owns, whose contents they have saved or no longer need. A raw system
    // call: the preload library interposes madvise and sends discards in its regions here.
    unsafe { crate::syscall!(libc::SYS_madvise, addr, len, libc::MADV_DONTNEED) };
}

/// Changes the protection of `[addr, addr + len)` (a raw system call: the preload library
/// interposes mprotect and passes calls on paged memory here).
pub fn protect(addr: usize, len: usize, prot: i32) -> io::Result<()> {
    // SAFETY: mprotect changes only protections; callers pass ranges of regions the pager owns
    // on the program's behalf (mprotect's contract is the program's).
    if unsafe { crate::syscall!(libc::SYS_mprotect, addr, len, prot) } != 0 {
        return Err(last_err());
    }
    Ok(())
}

/// madvise with any advice, as a raw system call (see [`protect`]).
pub fn advise(addr: usize, len: usize, advice: i32) -> io::Result<()> {
    // SAFETY: the advice callers pass (fork inheritance) changes no contents.
    if unsafe { crate::syscall!(libc::SYS_madvise, addr, len, advice) } != 0 {
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
        crate::syscall!(
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
        let fd = unsafe { crate::syscall!(libc::SYS_pidfd_open, pid, 0) } as i32;
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
            crate::syscall!(
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

/// Reserves `[addr, addr + len)` inaccessible, if nothing is mapped anywhere in it
/// (`MAP_FIXED_NOREPLACE` fails rather than replace a mapping); whether it did. Only mmap, so
/// async-signal-safe: callable in a forked child before it may allocate.
pub fn reserve_inaccessible_at(addr: usize, len: usize) -> bool {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping, so no memory anyone uses
    // is affected; the new mapping is inaccessible and owned by nobody.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    p != libc::MAP_FAILED
}

/// Lets the calling thread read and write memory of every protection key (x86-64 PKU: sets
/// its PKRU register to 0). A new thread inherits its creator's PKRU, which denies the keys the
/// program allocates later to every thread but the one that allocated them; a pager thread
/// reads and writes the program's pages wherever they are, as the kernel would, and would
/// otherwise die of SIGSEGV on a page the program tagged with `pkey_mprotect`. Does nothing on
/// a CPU or kernel without protection keys, and on other architectures. Returns whether the
/// register was written.
pub fn open_protection_keys() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID leaf 7, ECX bit 4: OSPKE, the kernel enabled protection keys (CR4.PKE), which
        // is what makes WRPKRU a valid instruction.
        // Leaf 0's maximum first: leaf 7 may not exist.
        let ospke = std::arch::x86_64::__cpuid(0).eax >= 7
            && std::arch::x86_64::__cpuid_count(7, 0).ecx & (1 << 4) != 0;
        if ospke {
            // SAFETY: WRPKRU with ECX = EDX = 0 is defined when OSPKE is set (checked above);
            // it changes only this thread's access rights to protection-keyed pages, widening
            // them, which no code of this thread relies on being narrow.
            unsafe {
                std::arch::asm!("wrpkru", in("eax") 0u32, in("ecx") 0u32, in("edx") 0u32,
                    options(nostack, preserves_flags));
            }
            return true;
        }
        false
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}
