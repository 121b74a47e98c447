//! The pager's system calls. The userfaultfd object and its ioctls, address-space
//! reservations, discards and protections live in `tidepool-sys` (soft memory uses the same
//! wrappers); what is left here is the pager's own: futexes, pipes, and dying at once.

pub use tidepool_sys::uffd::{Fault, Uffd};
pub use tidepool_sys::vm::{
    advise, discard, discard_many, is_mapped, map_fixed, page_bytes, pages_exist, protect,
    shared_counter_page, Mapping,
};
pub use tidepool_sys::{gettid, PAGE};

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

fn last_err() -> io::Error {
    io::Error::last_os_error()
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
        tidepool_sys::syscall!(
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
    wake_waiters(word, 1);
}

/// Wakes every thread waiting in [`futex_wait`] on `word`.
pub fn futex_wake_all(word: &std::sync::atomic::AtomicU32) {
    wake_waiters(word, i32::MAX);
}

fn wake_waiters(word: &std::sync::atomic::AtomicU32, count: i32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe {
        tidepool_sys::syscall!(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            count,
        )
    };
}

/// Milliseconds on the monotonic clock, to a few milliseconds (CLOCK_MONOTONIC_COARSE: a read
/// of the kernel's last tick, a few nanoseconds through the vDSO, where a precise reading costs
/// tens): for the watchdog's ages, which are seconds.
pub fn coarse_now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `ts` is.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
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

/// The calling thread's signal mask, as [`block_asynchronous_signals`] found it.
#[derive(Clone, Copy)]
pub struct SignalMask(libc::sigset_t);

/// Blocks every signal in the calling thread but `keep` and the ones the kernel raises on the
/// thread's own instruction (a fault, a trap: blocking those kills instead); returns the mask
/// it had. Signals sent meanwhile stay pending until [`restore_signals`].
pub fn block_asynchronous_signals(keep: i32) -> SignalMask {
    // SAFETY: sigset_t values filled by sigfillset/sigdelset before use; pthread_sigmask
    // changes only the calling thread's mask and writes the old one into `old`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for sig in [
            keep,
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGTRAP,
            libc::SIGSYS,
        ] {
            libc::sigdelset(&mut set, sig);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        SignalMask(old)
    }
}

/// Gives the calling thread back the mask [`block_asynchronous_signals`] returned.
pub fn restore_signals(mask: SignalMask) {
    // SAFETY: a mask pthread_sigmask itself wrote.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &mask.0, std::ptr::null_mut()) };
}
