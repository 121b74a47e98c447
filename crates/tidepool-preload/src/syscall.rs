//! `syscall()`, interposed: a program that maps memory with `syscall(SYS_mmap, ...)` (or
//! munmap, mremap, mprotect, pkey_mprotect, madvise, brk and the mlock family) gets what the same call
//! through its libc wrapper gets (`mmap.rs`), paged memory included; every other system call
//! goes to the kernel as it is. Calls made with the instruction inline (Go's runtime) never
//! come here; nor do the pager's own, which use [`tidepool_sys::syscall!`].
//!
//! `syscall` is variadic in C. On x86-64 and arm64 Linux a variadic call passes integer
//! arguments exactly as a call with fixed ones would, so it is declared with six; those the
//! caller did not pass are never read for the calls that do not take them.

use crate::mmap;
use core::ffi::{c_int, c_long, c_void};

/// # Safety
/// The syscall(2) contract for system call `nr`.
#[no_mangle]
pub unsafe extern "C" fn syscall(
    nr: c_long,
    a0: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
) -> c_long {
    let ptr = |a: c_long| a as usize as *mut c_void;
    // SAFETY: (every arm) the caller's arguments, with the contract of the call they name,
    // passed to the function that keeps that call's meaning.
    unsafe {
        match nr {
            libc::SYS_mmap => mmap::mmap(
                ptr(a0),
                a1 as usize,
                a2 as c_int,
                a3 as c_int,
                a4 as c_int,
                a5 as libc::off_t,
            ) as c_long,
            libc::SYS_munmap => mmap::munmap(ptr(a0), a1 as usize) as c_long,
            libc::SYS_mremap => {
                mmap::mremap(ptr(a0), a1 as usize, a2 as usize, a3 as c_int, ptr(a4)) as c_long
            }
            libc::SYS_mprotect => mmap::mprotect(ptr(a0), a1 as usize, a2 as c_int) as c_long,
            libc::SYS_pkey_mprotect => {
                mmap::pkey_mprotect(ptr(a0), a1 as usize, a2 as c_int, a3 as c_int) as c_long
            }
            libc::SYS_madvise => mmap::madvise(ptr(a0), a1 as usize, a2 as c_int) as c_long,
            libc::SYS_mlock => mmap::mlock(ptr(a0), a1 as usize) as c_long,
            libc::SYS_mlock2 => mmap::mlock2(ptr(a0), a1 as usize, a2 as libc::c_uint) as c_long,
            libc::SYS_munlock => mmap::munlock(ptr(a0), a1 as usize) as c_long,
            libc::SYS_mlockall => mmap::mlockall(a0 as c_int) as c_long,
            libc::SYS_munlockall => mmap::munlockall() as c_long,
            libc::SYS_brk => mmap::brk_syscall(a0 as usize),
            _ => tidepool_sys::syscall!(nr, a0, a1, a2, a3, a4, a5),
        }
    }
}
