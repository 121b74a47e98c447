//! System calls made without libc's `syscall()`.
//!
//! Under `tidepool run` the preload library interposes `syscall()` itself, so that a program
//! mapping memory with `syscall(SYS_mmap, ...)` gets the same paged memory as through `mmap`.
//! Every system call of the crates linked into that library (pager, stores, this one) is
//! therefore made here, with the instruction inline: a memory call of the pager's own must
//! reach the kernel as it is, not come back into the pager as the program's.
//!
//! [`syscall!`](crate::syscall) keeps libc's convention (-1 and `errno` on failure), so call
//! sites read as they did with `libc::syscall`.

use core::ffi::c_long;

/// The kernel's answer to system call `nr` with six arguments (unused ones are ignored by the
/// kernel): the result, or `-errno`.
///
/// # Safety
/// Whatever system call `nr` requires of its arguments.
#[cfg(target_arch = "x86_64")]
#[inline]
pub unsafe fn syscall6(nr: c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the `syscall` instruction clobbers rcx and r11 and returns in rax; the caller
    // vouches for the arguments.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// As on x86-64; see there.
///
/// # Safety
/// Whatever system call `nr` requires of its arguments.
#[cfg(target_arch = "aarch64")]
#[inline]
pub unsafe fn syscall6(nr: c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: `svc 0` takes the number in x8 and the arguments in x0-x5, returns in x0.
    unsafe {
        core::arch::asm!(
            "svc 0",
            in("x8") nr,
            inlateout("x0") a[0] as isize => ret,
            in("x1") a[1],
            in("x2") a[2],
            in("x3") a[3],
            in("x4") a[4],
            in("x5") a[5],
            options(nostack),
        );
    }
    ret
}

/// `syscall6` with libc's convention: the result, or -1 with `errno` set.
///
/// # Safety
/// As [`syscall6`].
#[inline]
pub unsafe fn libc_style(nr: c_long, a: [usize; 6]) -> c_long {
    // SAFETY: the caller's contract.
    let r = unsafe { syscall6(nr, a) };
    if (-4095..0).contains(&r) {
        // SAFETY: errno is thread-local and always writable.
        unsafe { *libc::__errno_location() = -r as i32 };
        -1
    } else {
        r as c_long
    }
}

/// A system call argument as the machine word the kernel reads: pointers as addresses, signed
/// integers sign-extended. A bare integer literal is an `i32`, as in a C variadic call.
pub trait Word {
    /// The word.
    fn word(self) -> usize;
}

macro_rules! words_of {
    ($($t:ty),*) => {$(
        impl Word for $t {
            #[inline]
            fn word(self) -> usize {
                self as usize
            }
        }
    )*};
}
words_of!(i8, i16, i32, i64, isize, u8, u16, u32, u64, usize);

impl<T> Word for *const T {
    #[inline]
    fn word(self) -> usize {
        self as usize
    }
}

impl<T> Word for *mut T {
    #[inline]
    fn word(self) -> usize {
        self as usize
    }
}

/// Up to six argument words, the rest zero.
#[doc(hidden)]
pub const fn words<const N: usize>(given: [usize; N]) -> [usize; 6] {
    let mut a = [0usize; 6];
    let mut i = 0;
    while i < N {
        a[i] = given[i];
        i += 1;
    }
    a
}

/// `crate::syscall!(nr, args...)` without libc's `syscall()`; see the module documentation.
/// Each argument is a [`Word`].
#[macro_export]
macro_rules! syscall {
    ($nr:expr $(, $arg:expr)* $(,)?) => {
        $crate::raw::libc_style($nr as ::core::ffi::c_long, $crate::raw::words([$($crate::raw::Word::word($arg)),*]))
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn results_and_errors_keep_libcs_convention() {
        // SAFETY: getpid takes nothing; close of a descriptor that is not open only fails.
        unsafe {
            assert_eq!(
                crate::syscall!(libc::SYS_getpid),
                libc::getpid() as libc::c_long
            );
            assert_eq!(crate::syscall!(libc::SYS_close, -1), -1);
        }
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EBADF)
        );
        // Six arguments reach the kernel: an anonymous mapping at no address, then its end.
        // SAFETY: a fresh private mapping, unmapped by the same length.
        unsafe {
            let p = crate::syscall!(
                libc::SYS_mmap,
                core::ptr::null_mut::<libc::c_void>(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0
            );
            assert!(p > 0 && p % 4096 == 0, "{p}");
            *(p as *mut u8).add(8191) = 7;
            assert_eq!(crate::syscall!(libc::SYS_munmap, p, 8192), 0);
        }
    }
}
