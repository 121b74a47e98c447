//! Which of the faults held at a fork may be served before it ends (see `fork.rs`).
//!
//! After the pager's prepare handler has closed the gate, glibc's `fork` takes its own locks
//! (the NSS lock, the stream list's, every malloc arena's) before it clones. A thread that
//! faulted while holding one of them is held at the gate, and the forking thread waits for its
//! lock: neither moves unless its fault is served anyway. Such a *late* service must not be
//! under way when the clone happens (the child would find the pager's state half changed, and
//! stops rather than risk a wrong byte).
//!
//! So, once a fault has been held [`HELD_TOO_LONG`] while the forking thread sleeps on a futex
//! (a lock; not in a fault of its own, not running), a handler takes the process's one turn
//! and *parks* the forking thread (`park.rs`: a signal whose handler waits): while it is parked
//! it cannot clone, so every held fault may be served, and the thread is let go only after the
//! last service ended and woke its thread. A thread that does not park within `PARK_WAIT`
//! (`handler.rs`) got its lock meanwhile and may be cloning, with every signal blocked: then
//! nothing is served, and the handler looks again.
//!
//! Where the forking thread cannot be parked (it blocks the signal, or the program handles
//! it), a held fault is served late, alone, only when all of these hold, so that the service
//! cannot be under way at the clone as long as the thread served is the one whose lock the
//! forking thread waits for (that thread runs only once its fault is served, and the service
//! ends before the wake-up):
//!
//! - it has been held [`HELD_TOO_LONG`] and the forking thread sleeps on a futex, as above;
//! - its thread faulted inside the C library, where those locks are taken (its program
//!   counter, from `/proc/self/task/TID/syscall`): a thread faulting in the program's own code
//!   holds none of them, and serving it would be a service the clone could cut in half when
//!   the real holder lets go. (Past [`HELD_LONGEST`] any held fault qualifies, in case a lock
//!   is taken somewhere this does not foresee: a late service then risks a stopped child, never
//!   a hang;)
//! - no other late service is under way in the process, and the last one ended at least
//!   [`HELD_TOO_LONG`] ago: the thread it woke has had time to let go of its lock and the
//!   forking thread to take it and fork.
//!
//! Before these rules, any fault held 10 ms while the forking thread waited on a lock was
//! served, and `tests/c/forks.c storm` (four threads faulting in the program's code, a fifth in
//! glibc's stream and NSS code, twenty forks) stopped a torn child in about one run in eight
//! on this project's 2-vCPU machines: a storm thread's service was under way when the stream
//! thread, served just before it, let go of its lock and the fork went ahead. The second rule
//! made that rarer, not impossible: on a loaded CI machine a storm thread held past
//! [`HELD_LONGEST`] was served while the stream thread let go, and a child stopped (exit 70).
//! Parking makes it impossible.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a held fault waits before it may be served late, and the least time between two
/// late services.
const HELD_TOO_LONG: Duration = Duration::from_millis(10);

/// How long a held fault waits before it may be served late wherever its thread faulted.
const HELD_LONGEST: Duration = Duration::from_secs(1);

static BUSY: AtomicBool = AtomicBool::new(false);
/// When the last late service ended, in milliseconds of the coarse monotonic clock.
static LAST_ENDED_MS: AtomicU64 = AtomicU64::new(0);

/// The process's one turn to serve a fault late; see the module documentation. Released (and
/// its end recorded) on drop, which must come after the served thread's wake-up.
#[must_use]
pub(crate) struct Turn(());

impl Drop for Turn {
    fn drop(&mut self) {
        LAST_ENDED_MS.store(crate::sys::coarse_now_ms(), SeqCst);
        BUSY.store(false, SeqCst);
    }
}

/// How often a handler looks again (in /proc) when no held fault may be served yet.
const LOOK_EVERY: Duration = Duration::from_millis(1);

/// A handler's choice among the faults it holds; see the module documentation.
pub(crate) struct Picker {
    next_look: Instant,
}

impl Picker {
    pub(crate) fn new() -> Picker {
        Picker {
            next_look: Instant::now(),
        }
    }

    /// What may be served now, late, of the faults held (their threads and when they were read)
    /// while thread `forking` forks; `None` if nothing may yet.
    pub(crate) fn pick(
        &mut self,
        forking: u32,
        held: impl Iterator<Item = (u32, Instant)>,
    ) -> Option<Late> {
        let now = Instant::now();
        if now < self.next_look {
            return None;
        }
        self.next_look = now + LOOK_EVERY;
        let mut aged = held
            .enumerate()
            .filter(|(_, (_, since))| now.duration_since(*since) >= HELD_TOO_LONG)
            .peekable();
        aged.peek()?;
        if BUSY.swap(true, SeqCst) {
            return None;
        }
        let turn = Turn(());
        if !crate::watchdog::waits_on_a_lock(forking) {
            turn.cancel();
            return None;
        }
        if crate::park::usable(forking) {
            return Some(Late::Parked(turn));
        }
        let ended = LAST_ENDED_MS.load(SeqCst);
        if crate::sys::coarse_now_ms().saturating_sub(ended) < HELD_TOO_LONG.as_millis() as u64 {
            turn.cancel();
            return None;
        }
        match aged.find(|(_, (tid, since))| {
            now.duration_since(*since) >= HELD_LONGEST || faulted_in_libc(*tid)
        }) {
            Some((i, _)) => Some(Late::One(i, turn)),
            None => {
                turn.cancel();
                None
            }
        }
    }
}

/// What [`Picker::pick`] allows.
pub(crate) enum Late {
    /// Park the forking thread (`park.rs`), then serve every held fault: no clone can overlap.
    Parked(Turn),
    /// The forking thread cannot be parked: serve the held fault at this index alone, by the
    /// rules of the module documentation.
    One(usize, Turn),
}

impl Turn {
    /// Gives the turn back unused: no service ended, so the next needs no pause.
    pub(crate) fn cancel(self) {
        std::mem::forget(self);
        BUSY.store(false, SeqCst);
    }
}

/// Whether thread `tid` of this process, asleep, last entered the kernel from the C library's
/// code: its program counter (the last field of `/proc/self/task/TID/syscall`, for a page fault
/// and for a system call alike) lies in an executable mapping of `libc.so`.
fn faulted_in_libc(tid: u32) -> bool {
    let Ok(line) = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")) else {
        return false;
    };
    program_counter(&line).is_some_and(|pc| libc_text().iter().any(|r| r.contains(&pc)))
}

/// The program counter in a line of `/proc/PID/task/TID/syscall`: "NR ARG0..ARG5 SP PC", or
/// "-1 SP PC" outside a system call; `None` for "running".
fn program_counter(line: &str) -> Option<u64> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 3 {
        return None;
    }
    u64::from_str_radix(fields.last()?.strip_prefix("0x")?, 16).ok()
}

/// The C library's executable mappings in this process (read once).
fn libc_text() -> &'static [Range<u64>] {
    static TEXT: OnceLock<Vec<Range<u64>>> = OnceLock::new();
    TEXT.get_or_init(|| {
        std::fs::read_to_string("/proc/self/maps")
            .map(|maps| executable_ranges_of(&maps, is_libc))
            .unwrap_or_default()
    })
}

fn is_libc(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("libc.so") || (name.starts_with("libc-") && name.ends_with(".so"))
}

/// The executable ranges of `/proc/PID/maps` whose file `wanted` picks.
fn executable_ranges_of(maps: &str, wanted: impl Fn(&str) -> bool) -> Vec<Range<u64>> {
    maps.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            let path = f.nth(3)?;
            if !perms.contains('x') || !wanted(path) {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            Some(u64::from_str_radix(start, 16).ok()?..u64::from_str_radix(end, 16).ok()?)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_counter_is_the_last_field_in_and_out_of_system_calls() {
        assert_eq!(
            program_counter("-1 0x7ffd2c0e1a40 0x7f3a1b2c3d4e\n"),
            Some(0x7f3a1b2c3d4e)
        );
        assert_eq!(
            program_counter("202 0x55d0 0x80 0x2 0x0 0x0 0x0 0x7ffd2c0e1a40 0x7f3a1b2c3d4f\n"),
            Some(0x7f3a1b2c3d4f)
        );
        assert_eq!(program_counter("running\n"), None);
    }

    #[test]
    fn only_the_c_librarys_executable_mappings_count() {
        let maps = "\
7f00000000-7f00028000 r--p 00000000 fe:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6
7f00028000-7f0017d000 r-xp 00028000 fe:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6
7f10000000-7f10010000 r-xp 00000000 fe:01 2 /usr/lib/x86_64-linux-gnu/libcrypt.so.1
7f20000000-7f20010000 r-xp 00000000 fe:01 3 /opt/old/lib/libc-2.17.so
7f30000000-7f30001000 rw-p 00000000 00:00 0
";
        assert_eq!(
            executable_ranges_of(maps, is_libc),
            vec![0x7f00028000..0x7f0017d000, 0x7f20000000..0x7f20010000]
        );
    }

    #[test]
    fn this_process_finds_its_c_library_and_a_sleeping_thread_in_it() {
        let text = libc_text();
        assert!(!text.is_empty(), "no libc text in /proc/self/maps");
        // A thread asleep in a system call made through the C library.
        let (tx, rx) = std::sync::mpsc::channel();
        let sleeper = std::thread::spawn(move || {
            tx.send(crate::sys::gettid()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
        });
        let tid = rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(faulted_in_libc(tid));
        sleeper.join().unwrap();
    }
}
