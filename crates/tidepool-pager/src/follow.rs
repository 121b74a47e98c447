//! Following the program: while its faults come from one CPU, one fault handler, pinned there,
//! reads them, and the evictor runs there too, below the program.
//!
//! Why (measured on 2-vCPU VMs, uniform read-modify-write at 50% local, issue 55): a blocking
//! read of a userfaultfd wakes every handler waiting in it, so each fault woke the handler of
//! the idle CPU too (a rescheduling interrupt, then that CPU running the program's address
//! space); every page the evictor moved out while another CPU ran a thread of the process was
//! a TLB shootdown waiting for that CPU (2.6 function-call interrupts a fault); and the woken
//! program went to the idle CPU, so consecutive faults alternated CPUs. Everything on one CPU
//! (`taskset -c 0`) ran 1.2-1.4x faster, with no interrupts at all.
//!
//! So, while one handler reads (the *reader*), the others wait on a futex, and the reader and
//! the evictor run at `SCHED_IDLE` priority on the reader's CPU: the program, woken by the
//! install, stays on that CPU (an idle-priority thread leaves it "idle" for the scheduler) and
//! runs before them; they run while it waits for a page. The write-back thread runs on the
//! other CPUs, at normal priority: compressing pages there costs some shootdowns but gains more
//! (CPython's 1 GB dict at 50% local, compressing store: 5.5-7.0 s with it free, 7.4-9.0 s
//! with it on the reader's CPU, 6.3-8.3 s with every handler reading), and on the reader's CPU
//! it would keep the reader off it.
//!
//! Every [`CHECK_EVERY`] faults the reader looks at which CPU the faulting thread ran on; if it
//! is another, the reader's place moves there. For the process's first thread the pager reads
//! that CPU at every fault, from the thread's rseq area (one load, see
//! `tidepool_sys::rseq`), and follows at the first fault from elsewhere: the scheduler moves a
//! lone program between the CPUs of a 2-vCPU VM every 100 ms or so (the idle CPU's balancer
//! pulls it, since the reader beside it is pinned), and looking every 64 faults left ~128
//! faults each time read and woken across CPUs: CPython's 1 GB dict at 50% local took 12k
//! such faults a run, 24k function-call interrupts of its 31k. Faults of two threads on two
//! CPUs make every handler read again at normal priority, and the evictor run anywhere, as
//! before; after
//! [`SETTLED`] looks in a row at one thread on one CPU, one reader again.
//!
//! At idle priority the reader runs only when nothing else wants its CPU: another thread of the
//! program, or another process, busy there keeps it off (stress-ng's vm methods beside two CPU
//! hogs: 209 s against 77 s with every handler reading). So the watchdog looks every
//! [`STARVING_LOOK`]: the reader waiting for its CPU (its scheduler accounting, not its state:
//! a reader busy evicting is runnable too; or, since the kernel accounts a wait only when the
//! thread gets a CPU, not put on one since the last look and runnable now: beside two CPU hogs
//! uniform-rmw ran at 0.3-18.6k ops/s with no fallback before this, 88.9-95.7k after) for most
//! of the time between three looks in a row,
//! with fewer than [`CRAWLING`] faults served between each, and a thread waiting in the same
//! fault at the last two, move the reader to the next CPU, or, kept off there too, make every
//! handler read, at normal priority, for [`STARVED_FOR`], doubled each time it happens again
//! within a minute (up to a minute; see [`Follow::starved`]). Waiting alone is no
//! proof: the program preempts the reader at every wake-up, and runs on while it computes.
//! Judged by its state ('R') instead, a reader busy with a long eviction under the compressing
//! store counted as kept off: CPython's 1 GB dict at 25% local had one reader for 18% of its
//! faults, five fallbacks doubling to most of the run.
//!
//! Needs the right to leave `SCHED_IDLE` again (root, CAP_SYS_NICE, or RLIMIT_NICE of 20):
//! without it every handler reads, as before.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

/// The reader value under which every handler reads.
pub(crate) const ALL: u32 = u32::MAX;
/// Reads with faults in them a reader serves between looks at where the faulting thread runs
/// (a look reads /proc, a few microseconds); one fault a read while a single thread faults.
pub(crate) const CHECK_EVERY: u32 = 64;
/// Looks in a row at one thread's faults on one CPU before one handler reads again.
const SETTLED: u32 = 32;
/// How often the watchdog looks whether the one reader is kept off its CPU.
pub(crate) const STARVING_LOOK: Duration = Duration::from_millis(2);
/// How long every handler reads after the one reader was first found kept off its CPU.
const STARVED_FOR: Duration = Duration::from_secs(1);
/// A reader kept off its CPU again this soon after it moved off a busy one finds every CPU
/// busy: every handler reads.
const ELSEWHERE_WITHIN: Duration = Duration::from_millis(50);
/// Faults served between two looks below which a waiting reader counts as kept off its CPU
/// (unhindered, it serves one every few microseconds while a thread waits; beside a CPU hog
/// at idle priority, a few a second).
const CRAWLING: u64 = 16;

/// The pager's threads besides the handlers, placed by [`Follow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// On the reader's CPU, at SCHED_IDLE while one handler reads.
    Evictor,
    /// On the other CPUs.
    WriteBack,
    /// On the reader's CPU, at normal priority.
    Watchdog,
}

#[derive(Debug)]
pub(crate) struct Follow {
    enabled: bool,
    /// The index of the handler that reads faults, or [`ALL`]. A futex word: the others wait
    /// on it.
    reader: AtomicU32,
    /// The CPU each handler is pinned to, by index.
    cpus: Vec<usize>,
    /// The last look: the faulting thread and its CPU, and how many looks in a row found the
    /// same.
    last_tid: AtomicU32,
    last_cpu: AtomicU32,
    streak: AtomicU32,
    /// The process's first thread, whose CPU a fault of it tells at once.
    watched: tidepool_sys::rseq::WatchedThread,
    /// The evictor's, the write-back thread's and the watchdog's ids (0: not started).
    evictor: AtomicU32,
    writeback: AtomicU32,
    watchdog: AtomicU32,
    /// When the one reader was last found kept off its CPU (ms since `epoch`; 0: never), and
    /// for how long every handler reads since (ms).
    starved_at_ms: AtomicU64,
    starved_for_ms: AtomicU64,
    /// When the reader last moved off a CPU it was kept off (ms since `epoch`; 0: never), and
    /// the handler it moved from.
    moved_off_at_ms: AtomicU64,
    moved_off_from: AtomicU32,
    epoch: Instant,
    /// Faults served by a handler reading alone, and how many times every handler had to read
    /// again: the one reader kept off its CPU, or threads faulting on two CPUs.
    alone: AtomicU64,
    starvations: AtomicU64,
    two_cpus: AtomicU64,
    moves: AtomicU64,
    moved_off: AtomicU64,
}

/// How a run followed the program, for `--stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FollowReport {
    /// Faults served by a handler reading alone.
    pub alone: u64,
    /// Times the one reader was found kept off its CPU (every handler read for a while).
    pub starvations: u64,
    /// Times threads faulting on two CPUs made every handler read.
    pub two_cpus: u64,
    /// Times the one reader moved to the CPU the program moved to.
    pub moves: u64,
    /// Times the one reader moved off a CPU it was kept off.
    pub moved_off: u64,
}

/// The watchdog's looks at the one reader: its time waiting for a CPU (ns) and the faults
/// served at the last look, and when that was.
#[derive(Debug, Default)]
pub(crate) struct Starving {
    /// The last look: the reader's time waiting for a CPU and times put on one, faults served,
    /// and when.
    last: Option<(u64, u64, u64, Instant)>,
    /// Threads waiting in a fault at the last suspect look, with their fault counts.
    waiting: Vec<(u32, u64)>,
    /// Faults served at the last look, whether or not it read the accounting.
    served: u64,
}

impl Starving {
    /// Whether a look needs the reader's scheduler accounting: not while faults are served
    /// at a good pace ([`CRAWLING`] or more since the last look), when nothing can be kept off
    /// its CPU. Reading /proc every few milliseconds ran the watchdog on the other CPU, with the
    /// program's address space live there, long enough to take one TLB shootdown in every 70
    /// pages the reader moved out (CPython's 1 GB dict at 50% local: 1.4k of the 2.7k a run).
    /// A look that skips forgets the last, so the next that reads starts afresh.
    pub fn needs_a_look(&mut self, served: u64) -> bool {
        let pace = served.saturating_sub(std::mem::replace(&mut self.served, served));
        if pace >= CRAWLING {
            self.last = None;
            self.waiting.clear();
            return false;
        }
        true
    }

    /// A look: the reader's scheduler accounting (time so far runnable but off a CPU, times
    /// put on one), whether it is runnable now (asked only if needed), and how many faults were
    /// served so far. True if it may be kept off its CPU: the caller then looks for a thread
    /// waiting in a fault.
    pub fn suspect(
        &mut self,
        follow: &Follow,
        sched: crate::cpu::SchedStat,
        runnable: impl FnOnce() -> bool,
        served: u64,
    ) -> bool {
        let now = Instant::now();
        let suspect = self.suspect_at(follow, sched, runnable, served, now);
        if !suspect {
            self.waiting.clear();
        }
        suspect
    }

    /// After a suspect look, the threads waiting in a fault now (thread id, fault count):
    /// whether one of them waited already at the last suspect look, in the same fault.
    pub fn still_waiting(&mut self, now: Vec<(u32, u64)>) -> bool {
        let stuck = now.iter().any(|w| self.waiting.contains(w));
        self.waiting = now;
        stuck
    }

    fn suspect_at(
        &mut self,
        follow: &Follow,
        sched: crate::cpu::SchedStat,
        runnable: impl FnOnce() -> bool,
        served: u64,
        now: Instant,
    ) -> bool {
        match self.last {
            // Looks closer together than a full interval (the last before a tick) say little.
            Some((.., at)) if now - at < STARVING_LOOK => false,
            before => {
                self.last = Some((sched.waited_ns, sched.runs, served, now));
                let Some((w, runs, s, at)) = before else {
                    return false;
                };
                if served >= s + CRAWLING || !follow.one_reads() {
                    return false;
                }
                // Off its CPU for most of the time since the last look, serving next to
                // nothing. The kernel adds a wait to the accounting only when the thread gets a
                // CPU, so a reader kept off all along shows none: not put on a CPU since, and
                // runnable, says the same.
                sched.waited_ns.saturating_sub(w).saturating_mul(2) > (now - at).as_nanos() as u64
                    || (sched.runs == runs && runnable())
            }
        }
    }
}

/// A thread's CPU the last time it ran, from /proc/self/task/TID/stat (field 39).
fn cpu_of(tid: u32) -> Option<usize> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let after_name = stat.get(stat.rfind(')')? + 1..)?;
    after_name.split_whitespace().nth(36)?.parse().ok()
}

/// Whether this process may leave SCHED_IDLE once in it: CAP_SYS_NICE, or RLIMIT_NICE of at
/// least 20 (nice 0 within reach).
fn may_leave_idle() -> bool {
    let cap_sys_nice = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_string();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << 23) != 0);
    cap_sys_nice || tidepool_sys::nice_limit().is_some_and(|l| l >= 20)
}

impl Follow {
    /// For handlers pinned to `cpus` (by index); following only if asked, with two CPUs or more
    /// and the right to leave SCHED_IDLE.
    pub fn new(asked: bool, cpus: Vec<usize>) -> Follow {
        let enabled = asked && cpus.len() > 1 && may_leave_idle();
        let f = Follow::with(enabled, cpus);
        f.start_here();
        f
    }

    /// Every handler reading, nothing seen yet.
    fn with(enabled: bool, cpus: Vec<usize>) -> Follow {
        Follow {
            enabled,
            reader: AtomicU32::new(ALL),
            cpus,
            last_tid: AtomicU32::new(0),
            last_cpu: AtomicU32::new(u32::MAX),
            streak: AtomicU32::new(0),
            watched: Default::default(),
            evictor: AtomicU32::new(0),
            writeback: AtomicU32::new(0),
            watchdog: AtomicU32::new(0),
            starved_at_ms: AtomicU64::new(0),
            starved_for_ms: AtomicU64::new(0),
            moved_off_at_ms: AtomicU64::new(0),
            moved_off_from: AtomicU32::new(ALL),
            epoch: Instant::now(),
            alone: AtomicU64::new(0),
            starvations: AtomicU64::new(0),
            two_cpus: AtomicU64::new(0),
            moves: AtomicU64::new(0),
            moved_off: AtomicU64::new(0),
        }
    }

    /// The handler on the calling thread's CPU reads (the program's thread starting the pager,
    /// or a forked child's first thread).
    pub fn start_here(&self) {
        self.streak.store(0, Relaxed);
        self.evictor.store(0, Relaxed);
        self.writeback.store(0, Relaxed);
        self.watchdog.store(0, Relaxed);
        self.watched.watch_this_thread();
        let here = tidepool_sys::current_cpu();
        let reader = match self.cpus.iter().position(|&c| Some(c) == here) {
            Some(i) if self.enabled => i as u32,
            _ => ALL,
        };
        self.reader.store(reader, SeqCst);
    }

    /// Whether handler `n` reads faults now.
    #[cfg(test)]
    pub fn reads(&self, n: usize) -> bool {
        let r = self.reader.load(SeqCst);
        r == ALL || r == n as u32
    }

    /// `n` faults served by a handler reading alone.
    pub fn served_alone(&self, n: u64) {
        self.alone.fetch_add(n, Relaxed);
    }

    /// What following did so far; `None` when the pager does not follow the program.
    pub fn report(&self) -> Option<FollowReport> {
        self.enabled.then(|| FollowReport {
            alone: self.alone.load(Relaxed),
            starvations: self.starvations.load(Relaxed),
            two_cpus: self.two_cpus.load(Relaxed),
            moves: self.moves.load(Relaxed),
            moved_off: self.moved_off.load(Relaxed),
        })
    }

    /// Whether one handler reads (it and the evictor then run at SCHED_IDLE).
    pub fn one_reads(&self) -> bool {
        self.reader.load(SeqCst) != ALL
    }

    /// The index of the one handler that reads, if one does.
    pub fn reader(&self) -> Option<usize> {
        let r = self.reader.load(SeqCst);
        (r != ALL).then_some(r as usize)
    }

    /// Waits while handler `n` is not to read (or until `stop`).
    pub fn wait_to_read(&self, n: usize, stop: &AtomicBool) {
        loop {
            let r = self.reader.load(SeqCst);
            if r == ALL || r == n as u32 || stop.load(Acquire) {
                return;
            }
            crate::sys::futex_wait(&self.reader, r, Duration::from_millis(200));
        }
    }

    /// The one reader was kept off its CPU. The first time in [`ELSEWHERE_WITHIN`], its place
    /// moves to the next CPU: kept off by another process's burst (the bench's own sampler
    /// reading smaps on the program's CPU for a few ms, say), it reads where there is room, and
    /// the program, woken from there, follows, since an idle-priority reader leaves that CPU
    /// "idle". Kept off there too, every handler reads for [`STARVED_FOR`], doubled each time
    /// within a minute (beside two CPU hogs, shorter periods cost more returns to a lone reader
    /// kept off: 82-84k ops/s of uniform-rmw starting at 100 ms, 89-105k at 1 s). CPython's
    /// 1 GB dict at 50% local beside such a sampler fell back three times a run before (56-77%
    /// of faults served by a lone reader, 54-99k function-call interrupts); now never (100%,
    /// 1.3-2.3k).
    pub fn starved(&self, stop: &AtomicBool) {
        let now = (self.epoch.elapsed().as_millis() as u64).max(1);
        let reader = self.reader.load(SeqCst);
        let moved_at = self.moved_off_at_ms.load(Relaxed);
        // Kept off again soon after moving off, on the CPU it moved to: every CPU is busy. Back
        // on the one it left (the program went back there, and the reader followed it), the
        // burst there is not over: off again.
        let room_elsewhere = moved_at == 0
            || now > moved_at + ELSEWHERE_WITHIN.as_millis() as u64
            || reader == self.moved_off_from.load(Relaxed);
        if reader != ALL && self.cpus.len() > 1 && room_elsewhere {
            self.moved_off_at_ms.store(now, Relaxed);
            self.moved_off_from.store(reader, Relaxed);
            self.moved_off.fetch_add(1, Relaxed);
            self.hand_to(reader, (reader as usize + 1) % self.cpus.len(), stop);
            return;
        }
        let (at, was) = (
            self.starved_at_ms.load(Relaxed),
            self.starved_for_ms.load(Relaxed),
        );
        let again = at != 0 && now < at + was + 60_000;
        let first = STARVED_FOR.as_millis() as u64;
        let period = if again { (was * 2).min(60_000) } else { first };
        self.starved_for_ms.store(period, Relaxed);
        self.starved_at_ms.store(now, Relaxed);
        self.starvations.fetch_add(1, Relaxed);
        self.all_read();
    }

    fn starved_lately(&self) -> bool {
        let at = self.starved_at_ms.load(Relaxed);
        at != 0 && self.epoch.elapsed().as_millis() as u64 <= at + self.starved_for_ms.load(Relaxed)
    }

    /// Every handler reads, and the evictor runs anywhere at normal priority.
    pub fn all_read(&self) {
        if self.reader.swap(ALL, SeqCst) != ALL {
            crate::sys::futex_wake_all(&self.reader);
            self.place_threads();
        }
    }

    /// Handler `n` reads alone, if the reader is still `was` (and the pager is not stopping:
    /// stopping needs every handler to read).
    fn hand_to(&self, was: u32, n: usize, stop: &AtomicBool) {
        if self
            .reader
            .compare_exchange(was, n as u32, SeqCst, SeqCst)
            .is_err()
        {
            return;
        }
        if stop.load(SeqCst) {
            self.reader.store(ALL, SeqCst);
        }
        crate::sys::futex_wake_all(&self.reader);
        self.place_threads();
    }

    /// Thread `tid` faulted and waits for its page: if it is the watched thread and ran on
    /// another CPU than the one reader's, the reader's place moves there now.
    pub fn fault_from(&self, tid: u32, stop: &AtomicBool) {
        if !self.enabled {
            return;
        }
        let Some(cpu) = self.watched.cpu_of(tid) else {
            return;
        };
        let reader = self.reader.load(SeqCst);
        if reader == ALL || self.cpus.get(reader as usize) == Some(&cpu) || stop.load(Acquire) {
            return;
        }
        let Some(at) = self.cpus.iter().position(|&c| c == cpu) else {
            return;
        };
        // What a look would have seen; the next looks go on from it.
        self.last_tid.store(tid, Relaxed);
        self.last_cpu.store(cpu as u32, Relaxed);
        self.streak.store(0, Relaxed);
        self.moves.fetch_add(1, Relaxed);
        self.hand_to(reader, at, stop);
    }

    /// A handler served [`CHECK_EVERY`] faults since its last look, the last one thread `tid`'s:
    /// where does that thread run?
    pub fn look(&self, tid: u32, stop: &AtomicBool) {
        if !self.enabled || stop.load(Acquire) {
            return;
        }
        let Some(cpu) = self.watched.cpu_of(tid).or_else(|| cpu_of(tid)) else {
            return;
        };
        let Some(at) = self.cpus.iter().position(|&c| c == cpu) else {
            return;
        };
        let (last_tid, last_cpu) = (
            self.last_tid.swap(tid, Relaxed),
            self.last_cpu.swap(cpu as u32, Relaxed),
        );
        let same = last_tid == tid && last_cpu == cpu as u32;
        let streak = if same {
            self.streak.fetch_add(1, Relaxed) + 1
        } else {
            self.streak.store(0, Relaxed);
            0
        };
        let reader = self.reader.load(SeqCst);
        if reader == ALL {
            if streak >= SETTLED && !self.starved_lately() {
                self.hand_to(ALL, at, stop);
            }
        } else if last_tid != tid && last_cpu != cpu as u32 && last_cpu != u32::MAX {
            // Two threads faulting on two CPUs.
            self.two_cpus.fetch_add(1, Relaxed);
            self.all_read();
        } else if at != reader as usize && same {
            // The program runs elsewhere now: follow it.
            self.moves.fetch_add(1, Relaxed);
            self.hand_to(reader, at, stop);
        }
    }

    /// Records the calling thread as the pager's thread `role`, and places it.
    pub fn register(&self, role: Role) {
        let slot = match role {
            Role::Evictor => &self.evictor,
            Role::WriteBack => &self.writeback,
            Role::Watchdog => &self.watchdog,
        };
        slot.store(crate::sys::gettid(), Relaxed);
        self.place_threads();
    }

    /// Puts the evictor and the handlers `handlers` back at normal priority, for good: the
    /// process is leaving. A thread that exits at SCHED_IDLE clears its /proc entries at that
    /// priority while its parent, reaping the process, spins in the kernel over the same
    /// entries at normal priority: on a busy machine the parent then spun for seconds to
    /// minutes (stress-ng's vm workers, reaping their paged children; `scripts/stress-ng-pairs`).
    /// No allocation and no lock: called from `_exit`.
    pub fn leave_idle(&self, handlers: impl Iterator<Item = u32>) {
        if !self.enabled {
            return;
        }
        for tid in handlers.chain([self.evictor.load(Relaxed)]) {
            if tid != 0 {
                let _ = tidepool_sys::set_idle_priority(tid as i32, false);
            }
        }
    }

    /// With one reader, the evictor at SCHED_IDLE on its CPU and the write-back thread on the
    /// others; else both anywhere the handlers run, at normal priority.
    fn place_threads(&self) {
        if !self.enabled {
            return;
        }
        let r = self.reader.load(SeqCst);
        let (evictor, others, idle) = match self.cpus.get(r as usize) {
            Some(&c) if r != ALL => (
                vec![c],
                self.cpus.iter().copied().filter(|&o| o != c).collect(),
                true,
            ),
            _ => (self.cpus.clone(), self.cpus.clone(), false),
        };
        let tid = self.evictor.load(Relaxed);
        if tid != 0 {
            let _ = tidepool_sys::set_affinity(tid as i32, &evictor);
            let _ = tidepool_sys::set_idle_priority(tid as i32, idle);
        }
        let tid = self.writeback.load(Relaxed);
        if tid != 0 {
            let _ = tidepool_sys::set_affinity(tid as i32, &others);
        }
        let tid = self.watchdog.load(Relaxed);
        if tid != 0 {
            let _ = tidepool_sys::set_affinity(tid as i32, &evictor);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_never_put_on_a_cpu_while_runnable_is_suspect_though_it_shows_no_wait() {
        let stop = AtomicBool::new(false);
        let f = Follow::with(true, vec![1000, 1001]);
        f.hand_to(ALL, 0, &stop);
        let sched = |waited_ns, runs| crate::cpu::SchedStat {
            ran_ns: 0,
            waited_ns,
            runs,
        };
        let t0 = Instant::now();
        let later = |ms| t0 + Duration::from_millis(ms);
        let mut s = Starving::default();
        assert!(
            !s.suspect_at(&f, sched(0, 5), || true, 0, t0),
            "a first look says nothing"
        );
        // Kept off all along: no wait accounted yet (the kernel adds it when the thread runs),
        // not put on a CPU, runnable.
        assert!(s.suspect_at(&f, sched(0, 5), || true, 1, later(3)));
        // Not put on a CPU, but asleep (in read, say): not kept off.
        assert!(!s.suspect_at(&f, sched(0, 5), || false, 2, later(6)));
        // Put on a CPU, little waiting: not kept off; much waiting: kept off.
        assert!(!s.suspect_at(&f, sched(100_000, 9), || true, 3, later(9)));
        assert!(s.suspect_at(&f, sched(3_000_000, 12), || false, 4, later(12)));
        // Serving plenty meanwhile: not kept off.
        assert!(!s.suspect_at(&f, sched(3_000_000, 12), || true, 400, later(15)));
        // Every handler reads: nothing to suspect.
        f.all_read();
        assert!(!s.suspect_at(&f, sched(3_000_000, 12), || true, 401, later(18)));
    }

    #[test]
    fn a_reader_serving_at_pace_is_not_looked_at_and_the_next_look_starts_afresh() {
        let stop = AtomicBool::new(false);
        let f = Follow::with(true, vec![1000, 1001]);
        f.hand_to(ALL, 0, &stop);
        let kept_off = crate::cpu::SchedStat {
            ran_ns: 0,
            waited_ns: 0,
            runs: 5,
        };
        let t0 = Instant::now();
        let later = |ms| t0 + Duration::from_millis(ms);
        let mut s = Starving::default();
        assert!(s.needs_a_look(0));
        assert!(!s.suspect_at(&f, kept_off, || true, 0, t0));
        assert!(s.needs_a_look(1));
        assert!(s.suspect_at(&f, kept_off, || true, 1, later(3)));
        // Plenty served since: no look, and the one before is forgotten.
        assert!(!s.needs_a_look(1 + CRAWLING));
        assert!(s.needs_a_look(2 + CRAWLING));
        assert!(
            !s.suspect_at(&f, kept_off, || true, 2 + CRAWLING, later(9)),
            "a first look after a skip only sets the baseline"
        );
        assert!(s.needs_a_look(3 + CRAWLING));
        assert!(s.suspect_at(&f, kept_off, || true, 3 + CRAWLING, later(12)));
    }

    #[test]
    fn a_reader_kept_off_moves_to_the_next_cpu_first_and_all_read_if_kept_off_there_too() {
        let stop = AtomicBool::new(false);
        let mut f = Follow::with(true, vec![1000, 1001]);
        f.epoch -= Duration::from_secs(10);
        f.hand_to(ALL, 1, &stop);
        f.starved(&stop);
        assert_eq!(
            f.reader(),
            Some(0),
            "moved to the next CPU, wrapping around"
        );
        assert_eq!(f.report().unwrap().moved_off, 1);
        // The program went back to the CPU left, the reader with it: kept off there again, it
        // moves off again.
        f.hand_to(0, 1, &stop);
        f.starved(&stop);
        assert_eq!(f.reader(), Some(0));
        assert_eq!(f.report().unwrap().moved_off, 2);
        // Kept off there too, at once: every handler reads, for a while.
        f.starved(&stop);
        assert!(!f.one_reads());
        assert!(f.starved_lately());
        let r = f.report().unwrap();
        assert_eq!((r.moved_off, r.starvations, r.moves), (2, 1, 0));
        // Long after, a reader kept off moves again.
        f.moved_off_at_ms.store(1, Relaxed);
        f.hand_to(ALL, 0, &stop);
        f.starved(&stop);
        assert_eq!(f.reader(), Some(1));
    }

    #[test]
    fn a_threads_cpu_is_read_from_proc() {
        let cpu = cpu_of(crate::sys::gettid()).expect("this thread's CPU");
        assert!(cpu < tidepool_sys::online_cpus().max(1) * 64);
    }

    #[test]
    fn one_thread_seen_elsewhere_moves_the_reader_and_two_threads_make_all_read() {
        let stop = AtomicBool::new(false);
        let f = Follow::with(true, vec![1000, 1001]);
        // This thread runs on no CPU the handlers have: looks change nothing.
        f.look(crate::sys::gettid(), &stop);
        assert!(!f.one_reads());
        // A reader is handed over only while the pager is not stopping.
        f.hand_to(ALL, 1, &stop);
        assert!(f.reads(1) && !f.reads(0));
        stop.store(true, SeqCst);
        f.hand_to(1, 0, &stop);
        assert!(f.reads(0) && f.reads(1), "stopping: every handler reads");
        stop.store(false, SeqCst);
        f.hand_to(ALL, 0, &stop);
        f.all_read();
        assert!(f.reads(0) && f.reads(1));
        // A waiter returns once it may read.
        f.hand_to(ALL, 1, &stop);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| f.wait_to_read(0, &stop));
            std::thread::sleep(Duration::from_millis(20));
            f.all_read();
            waiter.join().unwrap();
        });
    }
}
