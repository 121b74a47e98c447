//! Where a thread runs, read by another thread of the process with one load: the `cpu_id` the
//! kernel keeps in the thread's restartable-sequences area (`struct rseq`), which glibc 2.35 and
//! later register for every thread and locate with `__rseq_offset` from the thread pointer.
//!
//! The pager reads it for the thread that faulted, while that thread waits in its fault: the
//! kernel rewrites `cpu_id` before the thread returns to user space on a new CPU, so the value
//! read then is the CPU the fault came from. /proc/self/task/TID/stat says the same for a few
//! microseconds; this costs a cache miss.

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

/// The process's first thread, whose CPU other threads read while it waits in a fault: set by
/// that thread itself ([`WatchedThread::watch_this_thread`]).
#[derive(Debug, Default)]
pub struct WatchedThread {
    tid: AtomicU32,
    /// The thread's `cpu_id` word (null: none).
    word: AtomicPtr<AtomicU32>,
}

impl WatchedThread {
    /// Watches the calling thread if it is the process's first (its id is the process's, so
    /// never reused while the process lives; its TLS is never freed) and its rseq area is
    /// there; else watches none. Returns whether it watches.
    pub fn watch_this_thread(&self) -> bool {
        self.word.store(std::ptr::null_mut(), Ordering::SeqCst);
        let tid = crate::gettid();
        let word = (tid == std::process::id())
            .then(CpuWord::of_this_thread)
            .flatten();
        self.tid.store(tid, Ordering::SeqCst);
        if let Some(w) = word {
            self.word.store(
                w.word as *const AtomicU32 as *mut AtomicU32,
                Ordering::SeqCst,
            );
        }
        word.is_some()
    }

    /// The CPU thread `tid` last ran on in user space, if it is the watched thread. Ask only
    /// while that thread waits in a fault (or is otherwise known alive).
    pub fn cpu_of(&self, tid: u32) -> Option<usize> {
        if self.tid.load(Ordering::Relaxed) != tid {
            return None;
        }
        let word = self.word.load(Ordering::Acquire);
        // SAFETY: a non-null `word` came from `CpuWord::of_this_thread` on the watched thread,
        // the process's first, whose TLS stays mapped for the life of the process.
        let word: &AtomicU32 = unsafe { word.as_ref()? };
        CpuWord { word }.get()
    }
}

/// The `cpu_id` word of one thread's rseq area.
#[derive(Debug, Clone, Copy)]
struct CpuWord {
    word: &'static AtomicU32,
}

/// `struct rseq`: `cpu_id_start` (u32), then `cpu_id` (u32).
const CPU_ID_OFFSET: isize = 4;

impl CpuWord {
    /// The calling thread's, if glibc registered an rseq area for it (none on other C
    /// libraries, on glibc before 2.35, with `glibc.pthread.rseq=0`, or on other
    /// architectures).
    ///
    /// The word lives in the thread's TLS: read it only while the thread is known to be alive
    /// (the pager reads it for a thread blocked in a fault it has not served yet), and only for
    /// a thread whose id cannot be reused meanwhile (the process's first thread).
    fn of_this_thread() -> Option<CpuWord> {
        let (offset, size) = glibc_rseq()?;
        if size < 8 {
            return None;
        }
        let tp = thread_pointer()?;
        let addr = tp.checked_add_signed(offset + CPU_ID_OFFSET)?;
        if addr % std::mem::align_of::<AtomicU32>() != 0 {
            return None;
        }
        // SAFETY: glibc placed this thread's registered `struct rseq` at the thread pointer
        // plus `__rseq_offset`, at least `__rseq_size` (>= 8) bytes, aligned; `cpu_id` is its
        // second u32, which the kernel writes and other threads may read (an AtomicU32 has the
        // layout of a u32). The memory is this thread's static TLS: it stays mapped while the
        // thread lives, and the caller promises to read it only then (see above); `'static`
        // stands for that promise.
        let word = unsafe { &*(addr as *const AtomicU32) };
        let w = CpuWord { word };
        w.get().map(|_| w)
    }

    /// The CPU the thread last ran on in user space; none if the kernel has not filled the
    /// area in (registration failed).
    fn get(&self) -> Option<usize> {
        let c = self.word.load(Ordering::Relaxed);
        // RSEQ_CPU_ID_UNINITIALIZED (-1) and RSEQ_CPU_ID_REGISTRATION_FAILED (-2).
        (c < u32::MAX - 1).then_some(c as usize)
    }
}

/// glibc's `__rseq_offset` and `__rseq_size`, looked up at run time (once) so that the library
/// still loads where they do not exist.
fn glibc_rseq() -> Option<(isize, u32)> {
    static FOUND: std::sync::OnceLock<Option<(isize, u32)>> = std::sync::OnceLock::new();
    *FOUND.get_or_init(look_up_glibc_rseq)
}

fn look_up_glibc_rseq() -> Option<(isize, u32)> {
    // SAFETY: dlsym with RTLD_DEFAULT and NUL-terminated names only looks symbols up.
    let (offset, size) = unsafe {
        (
            libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()),
            libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()),
        )
    };
    if offset.is_null() || size.is_null() {
        return None;
    }
    // SAFETY: glibc defines `__rseq_offset` as a `const ptrdiff_t` and `__rseq_size` as a
    // `const unsigned int`, set before any user code runs and never written after.
    unsafe { Some((*(offset as *const isize), *(size as *const u32))) }
}

/// The thread pointer that `__rseq_offset` is relative to.
#[cfg(target_arch = "x86_64")]
fn thread_pointer() -> Option<usize> {
    let tp: usize;
    // SAFETY: on x86-64 Linux the word at %fs:0 is the TCB's pointer to itself, the thread
    // pointer (the TLS ABI); the load has no other effect.
    unsafe {
        std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags));
    }
    Some(tp)
}

#[cfg(target_arch = "aarch64")]
fn thread_pointer() -> Option<usize> {
    let tp: usize;
    // SAFETY: reading TPIDR_EL0, the thread pointer on arm64 Linux, has no other effect.
    unsafe {
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags));
    }
    Some(tp)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn thread_pointer() -> Option<usize> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's word, which must be there wherever glibc registered an area.
    fn word() -> Option<CpuWord> {
        let w = CpuWord::of_this_thread();
        if glibc_rseq().is_some_and(|(_, size)| size >= 8) {
            assert!(w.is_some(), "glibc registered rseq, yet no word was found");
        }
        w
    }

    #[test]
    fn the_word_says_the_cpu_the_thread_runs_on() {
        // glibc 2.35+ on x86-64 or arm64 (this machine's); elsewhere there is nothing to read.
        let Some(w) = word() else {
            return;
        };
        for cpu in 0..crate::online_cpus() {
            if crate::set_affinity(0, &[cpu]).is_err() {
                continue;
            }
            // The kernel rewrites the word on the way back to user space after a move.
            std::thread::yield_now();
            assert_eq!(w.get(), Some(cpu));
            assert_eq!(crate::current_cpu(), Some(cpu));
        }
    }

    #[test]
    fn another_thread_reads_it() {
        let Some(w) = word() else {
            return;
        };
        crate::set_affinity(0, &[0]).unwrap();
        std::thread::yield_now();
        let seen = std::thread::spawn(move || w.get()).join().unwrap();
        assert_eq!(seen, Some(0));
    }

    #[test]
    fn only_the_first_thread_is_watched() {
        // Test threads are never the process's first.
        let w = WatchedThread::default();
        assert!(!w.watch_this_thread());
        assert_eq!(w.cpu_of(crate::gettid()), None);
    }

    #[test]
    fn a_forked_child_watches_its_one_thread() {
        let Some(_) = word() else {
            return;
        };
        // SAFETY: the child makes system calls only (the rseq symbols were looked up above)
        // and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let w = WatchedThread::default();
            let ok = w.watch_this_thread()
                && crate::set_affinity(0, &[0]).is_ok()
                && {
                    std::thread::yield_now();
                    w.cpu_of(crate::gettid()) == Some(0)
                }
                && w.cpu_of(crate::gettid() + 1).is_none();
            // SAFETY: _exit ends the child without running the parent's atexit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child, writing its status into `status`.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
