//! Parking the forking thread while faults held at a fork are served late (see `late.rs`).
//!
//! A fault served while the gate is closed must not be under way when the clone happens: the
//! child would find the pager's state half changed. The forking thread cannot clone while it
//! runs a signal handler, so before such a service the pager sends it [`signal`] and waits until
//! its handler says it is *parked*; the handler returns only once the service ended and the
//! pager lets it go ([`Request`]'s drop). Any held fault may then be served, not only the one
//! whose thread holds the lock the forking thread waits for, and no child can be torn.
//!
//! The signal is a real-time one near the top of the range, which programs rarely use. Its
//! handler is installed the first time it is needed, and only if the program has none for it;
//! a forking thread that blocks it, or a program that handles it, is never sent it (`late.rs`
//! then falls back to serving one fault whose thread may hold a lock, as before).
//!
//! The handler does nothing but atomics, futex calls and short sleeps (async-signal-safe, no
//! allocation, no lock), keeps `errno`, and blocks every other signal while it runs. Before it
//! returns it also waits for any other service entered regardless to end: the signal may have
//! taken the thread out of a fault of its own that another handler is serving.

use crate::sys::{futex_wait, futex_wake_all, gettid};
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// The signal that parks the forking thread.
pub(crate) fn signal() -> i32 {
    libc::SIGRTMAX() - 5
}

/// The thread asked to park (0: none).
static TARGET: AtomicU32 = AtomicU32::new(0);
/// The number of the latest request; a request is over once [`RELEASED`] holds its number.
static SEQ: AtomicU32 = AtomicU32::new(0);
/// The number of the request the target last parked for.
static PARKED: AtomicU32 = AtomicU32::new(0);
/// The number of the latest request that ended. A futex word: a parked thread waits on it.
static RELEASED: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_park_signal(_signal: libc::c_int) {
    // SAFETY: the calling thread's errno, which the futex calls below may change and the
    // interrupted code must find as it left it.
    let errno = unsafe { *libc::__errno_location() };
    let seq = SEQ.load(SeqCst);
    if TARGET.load(SeqCst) == gettid() {
        PARKED.store(seq, SeqCst);
        futex_wake_all(&PARKED);
        loop {
            let released = RELEASED.load(SeqCst);
            if released == seq {
                break;
            }
            futex_wait(&RELEASED, released, Duration::from_millis(10));
        }
        // Another handler may be serving this thread's own fault, which the signal took it
        // out of: back from here it could find the page mapped and clone before that service
        // ends. It waits for every service entered regardless (none waits for this thread).
        let mut spins = 0u32;
        while crate::gate::regardless_in_flight() {
            spins += 1;
            if spins < 100 {
                std::thread::yield_now();
            } else {
                // nanosleep, async-signal-safe.
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Whether thread `tid` of this process can be parked: the handler is installed (now, if the
/// program has no handler of its own for the signal) and the thread does not block the signal.
pub(crate) fn usable(tid: u32) -> bool {
    handler_installed() && !blocks_signal(tid, signal())
}

fn handler_installed() -> bool {
    let sig = signal();
    let ours = on_park_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: an all-zero sigaction is a valid value to be overwritten.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: reads the signal's action into `old`; a null new action changes nothing.
    if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
        return false;
    }
    if old.sa_sigaction == ours {
        return true;
    }
    if old.sa_sigaction != libc::SIG_DFL {
        // The program's: never take it.
        return false;
    }
    // SAFETY: as above.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction = ours;
    new.sa_flags = libc::SA_RESTART;
    // SAFETY: `new.sa_mask` is a sigset_t to fill; then installs a handler that is
    // async-signal-safe (see the module documentation) for a signal nothing else handles.
    unsafe {
        libc::sigfillset(&mut new.sa_mask);
        libc::sigaction(sig, &new, std::ptr::null_mut()) == 0
    }
}

/// Whether thread `tid` of this process blocks `sig` (its `SigBlk` in /proc).
fn blocks_signal(tid: u32, sig: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")) else {
        return true;
    };
    blocked_in_status(&status, sig).unwrap_or(true)
}

fn blocked_in_status(status: &str, sig: i32) -> Option<bool> {
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))?
        .trim();
    let mask = u64::from_str_radix(mask, 16).ok()?;
    Some(mask >> (sig - 1) & 1 != 0)
}

/// A request that a thread park; while [`Request::wait_parked`] says so, it runs nothing but the
/// handler. Dropping the request lets it go (or, if it never parked, makes its handler return
/// at once whenever it runs).
#[must_use]
pub(crate) struct Request {
    seq: u32,
}

impl Request {
    /// Asks thread `tid` of this process to park; see [`usable`] first.
    pub(crate) fn send(tid: u32) -> Request {
        let seq = SEQ.fetch_add(1, SeqCst).wrapping_add(1);
        TARGET.store(tid, SeqCst);
        // SAFETY: tgkill sends a signal whose handler is installed to a thread of this process.
        unsafe {
            tidepool_sys::syscall!(
                libc::SYS_tgkill,
                std::process::id() as libc::c_long,
                tid as libc::c_long,
                signal() as libc::c_long,
            )
        };
        Request { seq }
    }

    /// Waits up to `limit` for the thread to park; whether it did.
    pub(crate) fn wait_parked(&self, limit: Duration) -> bool {
        let t0 = Instant::now();
        loop {
            let parked = PARKED.load(SeqCst);
            if parked == self.seq {
                return true;
            }
            let waited = t0.elapsed();
            if waited >= limit {
                return false;
            }
            futex_wait(
                &PARKED,
                parked,
                (limit - waited).min(Duration::from_millis(1)),
            );
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        TARGET.store(0, SeqCst);
        RELEASED.store(self.seq, SeqCst);
        futex_wake_all(&RELEASED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;

    #[test]
    fn a_parked_thread_runs_nothing_until_it_is_let_go() {
        assert!(handler_installed(), "the park signal has another handler");
        let (tx, rx) = std::sync::mpsc::channel();
        let count = Arc::new(AtomicU32::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let worker = {
            let (count, stop) = (count.clone(), stop.clone());
            std::thread::spawn(move || {
                tx.send(gettid()).unwrap();
                while !stop.load(Relaxed) {
                    count.fetch_add(1, Relaxed);
                    std::hint::spin_loop();
                }
            })
        };
        let tid = rx.recv().unwrap();
        assert!(usable(tid));
        let request = Request::send(tid);
        assert!(request.wait_parked(Duration::from_secs(10)), "never parked");
        let frozen = count.load(Relaxed);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(count.load(Relaxed), frozen, "the parked thread went on");
        drop(request);
        while count.load(Relaxed) == frozen {
            std::thread::yield_now();
        }
        stop.store(true, Relaxed);
        worker.join().unwrap();
    }

    #[test]
    fn a_thread_that_blocks_the_signal_is_not_usable() {
        assert_eq!(
            blocked_in_status("Name:\tx\nSigBlk:\t0000000000000001\n", 1),
            Some(true)
        );
        let sig = signal();
        let bit = format!("{:016x}", 1u64 << (sig - 1));
        assert_eq!(
            blocked_in_status(&format!("SigBlk:\t{bit}\n"), sig),
            Some(true)
        );
        assert_eq!(
            blocked_in_status("SigBlk:\t0000000000000000\n", sig),
            Some(false)
        );
        assert_eq!(blocked_in_status("SigPnd:\t0\n", sig), None);
    }
}
