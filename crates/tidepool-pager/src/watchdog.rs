//! The watchdog: a page fault that waits past a deadline stops the program, with a message
//! saying why and where every pager thread is, instead of hanging it.
//!
//! A pager may be slow; it may never hang the program it serves. Every known way to hang one is
//! closed by construction elsewhere (pager threads never touch paged memory, a fork serves its
//! own thread's faults, a forked child serves its pager threads' start), and this thread is
//! what holds if one was missed, or if the far store stops answering without failing.
//!
//! Two kinds of evidence, looked at every tick:
//!
//! - **Threads waiting in `handle_userfault`** (their kernel wait channel, from
//!   /proc/self/task): a thread seen there on consecutive ticks without completing a fault in
//!   between (its fault counts unchanged) and without a handler reading a fault of it (a thread
//!   inside madvise(MADV_POPULATE_WRITE) or mlock faults page after page, each served, and
//!   completes none the kernel counts) has waited since it was first seen. This finds every
//!   kind of hang (an unread fault, a fault held at a fork, a lost wake-up, a pager thread
//!   waiting for itself) without knowing its cause.
//! - **What the pager's threads say they do** (`activity.rs`): a handler holding faults at a
//!   closed gate, or serving one fault, for longer than the deadline.
//!
//! While a handler waits for the far store, the store's own patience
//! ([`tidepool_store::FarStore::patience`]) is added to the deadline: the store's deadline
//! comes first and says more (which node, which timeout). A tick much later than planned (the
//! whole process was stopped, by SIGSTOP or a debugger) starts every wait afresh.
//!
//! The watchdog reads only /proc files that describe threads, never the program's memory
//! (/proc/PID/cmdline would read paged memory), formats with Rust's own code (glibc's
//! `strerror` reads locale data the program allocated, which may be far), and exits with
//! `_exit`.

use crate::activity::{Doing, Seen};
use crate::pager::{Inner, FATAL_EXIT_CODE};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A thread of this process as /proc shows it.
#[derive(Debug, Clone)]
struct Task {
    tid: u32,
    name: String,
    /// R, S, D, T...
    state: char,
    /// Minor plus major faults completed so far, plus the fault events the handlers read for
    /// it (see `activity.rs`, `FaultsRead`): a change says it was served meanwhile.
    faults: u64,
    /// Where it sleeps in the kernel ("handle_userfault", "futex_wait_queue"...), if asleep.
    wchan: String,
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// `/proc/self/task/TID/stat`: (name, state, minflt + majflt).
fn parse_stat(stat: &str) -> Option<(String, char, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // After the name: state (field 3 of the whole line), ... minflt (10), cminflt, majflt (12).
    let state = rest.first()?.chars().next()?;
    let minflt: u64 = rest.get(7)?.parse().ok()?;
    let majflt: u64 = rest.get(9)?.parse().ok()?;
    Some((name, state, minflt + majflt))
}

/// Thread `tid`'s state (R, S, D...), from /proc/self/task/TID/stat.
fn state_of(tid: u32) -> Option<char> {
    read(&format!("/proc/self/task/{tid}/stat"))
        .and_then(|s| parse_stat(&s))
        .map(|(_, state, _)| state)
}

/// Whether thread `tid` of this process sleeps on a lock (a futex): not running, and not
/// waiting for a page fault either (a fault of the forking thread is served, and then it runs).
pub(crate) fn waits_on_a_lock(tid: u32) -> bool {
    state_of(tid) == Some('S')
        && read(&format!("/proc/self/task/{tid}/wchan")).is_some_and(|w| w.contains("futex"))
}

fn tasks() -> Vec<Task> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let tid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let (name, state, faults) = parse_stat(&read(&format!("/proc/self/task/{tid}/stat"))?)?;
        let wchan = if matches!(state, 'S' | 'D') {
            read(&format!("/proc/self/task/{tid}/wchan")).unwrap_or_default()
        } else {
            String::new()
        };
        Some(Task {
            tid,
            name,
            state,
            faults,
            wchan,
        })
    })
    .collect()
}

/// How long each thread has waited on one fault, by tid: (first seen, fault count then).
#[derive(Debug, Default)]
struct Waits(HashMap<u32, (Instant, u64)>);

impl Waits {
    /// Updates from this tick's view; returns the threads that have waited on one fault.
    fn update(&mut self, tasks: &[Task], now: Instant) -> Vec<(u32, Duration)> {
        let mut waiting = Vec::new();
        let mut seen = HashMap::with_capacity(self.0.len());
        for t in tasks.iter().filter(|t| t.wchan == "handle_userfault") {
            let since = match self.0.get(&t.tid) {
                Some(&(since, faults)) if faults == t.faults => since,
                _ => now,
            };
            seen.insert(t.tid, (since, t.faults));
            waiting.push((t.tid, now - since));
        }
        self.0 = seen;
        waiting
    }
}

/// Why the program stops: the longest wait and what the pager's threads were doing.
struct Verdict {
    /// The thread that waited, and how long (none if the evidence is a pager thread's state).
    waiter: Option<(u32, Duration)>,
    cause: String,
}

impl Inner {
    /// This process's threads, each fault count with the fault events read for the thread.
    fn program_tasks(&self) -> Vec<Task> {
        let mut tasks = tasks();
        for t in &mut tasks {
            t.faults += u64::from(self.activity.faults_read(t.tid));
        }
        tasks
    }

    /// The watchdog thread's loop; returns when the pager shuts down.
    pub(crate) fn watchdog_loop(self: Arc<Self>) {
        let tick =
            (self.fault_deadline / 10).clamp(Duration::from_millis(20), Duration::from_millis(500));
        let mut waits = Waits::default();
        let mut last = Instant::now();
        let mut reader = ReaderWatch::default();
        loop {
            if !self.watch_reader_until(last + tick, &mut reader) {
                return;
            }
            let now = Instant::now();
            if now - last > tick * 3 + Duration::from_secs(1) {
                // The process (this thread with it) was stopped: nobody served anything meanwhile.
                waits = Waits::default();
            }
            last = now;
            self.look_at_waits(&mut waits, now);
        }
    }

    /// Sleeps until `until`; while one handler reads at idle priority, looks every few
    /// milliseconds that it is not kept off its CPU (see `follow.rs`). Returns false once the
    /// pager shuts down.
    fn watch_reader_until(&self, until: Instant, watch: &mut ReaderWatch) -> bool {
        loop {
            let now = Instant::now();
            if now >= until {
                return !self.shutdown.load(Acquire);
            }
            let wait = if self.follow.one_reads() {
                crate::follow::STARVING_LOOK.min(until - now)
            } else {
                until - now
            };
            crate::sys::futex_wait(&self.watchdog_stop, 0, wait);
            if self.shutdown.load(Acquire) {
                return false;
            }
            self.look_at_reader(watch);
        }
    }

    /// One look at the one reader: rescued if it is kept off its CPU while a program thread
    /// still waits in the same fault as at the last suspect look.
    fn look_at_reader(&self, watch: &mut ReaderWatch) {
        let Some(reader) = self.follow.reader() else {
            return;
        };
        if watch.looked_at != Some(reader) {
            // Another thread's accounting: nothing to compare with yet.
            watch.starving = crate::follow::Starving::default();
            watch.looked_at = Some(reader);
        }
        let served =
            self.counters.missing_faults.load(Relaxed) + self.counters.wp_faults.load(Relaxed);
        if !watch.starving.needs_a_look(served) {
            return;
        }
        let tid = self.handler_tids.get(reader);
        // How long it waited for a CPU so far (runnable, not on one).
        let Some(sched) = crate::cpu::SchedStat::of(tid) else {
            return;
        };
        let runnable = || state_of(tid) == Some('R');
        if watch
            .starving
            .suspect(&self.follow, sched, runnable, served)
        {
            let waiting: Vec<(u32, u64)> = self
                .program_tasks()
                .iter()
                .filter(|t| t.wchan == "handle_userfault")
                .map(|t| (t.tid, t.faults))
                .collect();
            if watch.starving.still_waiting(waiting) {
                self.follow.starved(&self.shutdown);
            }
        }
    }

    /// The full look every tick: stops the program if one of its threads waited in a fault
    /// past the deadline (longer while a handler waits for the store), or a pager thread is
    /// stuck.
    fn look_at_waits(&self, waits: &mut Waits, now: Instant) {
        let (deadline, patience) = (self.fault_deadline, self.store.patience());
        let seen = self.activity.seen();
        self.handler_tids.rescue(&seen);
        let in_store = seen.iter().any(|s| s.doing == Doing::Store);
        let limit = if in_store {
            deadline + patience
        } else {
            deadline
        };
        let tasks = self.program_tasks();
        let waiting = waits.update(&tasks, now);
        let longest = waiting.iter().copied().max_by_key(|&(_, d)| d);
        let waited_too_long = longest.is_some_and(|(_, d)| d > limit);
        if waited_too_long || seen.iter().any(|s| self.stuck(s, deadline, patience)) {
            let cause = self.cause(&seen, &tasks, longest.map(|(tid, _)| tid));
            self.stop_program(
                Verdict {
                    waiter: longest,
                    cause,
                },
                &seen,
                &tasks,
            );
        }
    }

    /// Whether a pager thread's own account shows it stuck.
    fn stuck(&self, s: &Seen, deadline: Duration, patience: Duration) -> bool {
        match s.doing {
            Doing::Holding | Doing::Serving | Doing::Starting | Doing::Stalled => s.for_ > deadline,
            Doing::Store => s.for_ > deadline + patience,
            Doing::Idle | Doing::Evicting => false,
        }
    }

    /// The likeliest reason, from the evidence.
    fn cause(&self, seen: &[Seen], tasks: &[Task], waiter: Option<u32>) -> String {
        let name_of = |tid: u32| {
            tasks
                .iter()
                .find(|t| t.tid == tid)
                .map_or_else(|| "?".to_string(), |t| t.name.clone())
        };
        let pager_faulting = tasks
            .iter()
            .find(|t| t.wchan == "handle_userfault" && self.activity.is_pager_thread(t.tid));
        if let Some(t) = pager_faulting {
            return format!(
                "pager thread {} ({}) is itself waiting for a page fault: it touched memory that \
                 only a pager thread can bring back",
                t.name, t.tid
            );
        }
        let longest = |d: Doing| {
            seen.iter()
                .filter(|s| s.doing == d)
                .max_by_key(|s| s.for_)
                .copied()
        };
        if let Some(s) = longest(Doing::Stalled) {
            return format!(
                "pager thread {} ({}) was stopped on purpose (TIDEPOOL_RUN_STALL_AFTER)",
                name_of(s.tid),
                s.tid
            );
        }
        if let Some(s) = longest(Doing::Store) {
            return format!(
                "the far store {} has not answered {} ({}) for {:.1} s",
                self.store.describe(),
                name_of(s.tid),
                s.tid,
                s.for_.as_secs_f64()
            );
        }
        if let Some(s) = longest(Doing::Holding) {
            return format!(
                "a fork by thread {} ({}) has held the pager's gate closed for {:.1} s",
                name_of(s.of),
                s.of,
                s.for_.as_secs_f64()
            );
        }
        if let Some(s) = longest(Doing::Starting) {
            return format!(
                "the pager's threads have not all started after {:.1} s",
                s.for_.as_secs_f64()
            );
        }
        if let Some(s) = longest(Doing::Serving) {
            return format!(
                "pager thread {} ({}) has been serving the fault at {:#x} of thread {} for {:.1} s",
                name_of(s.tid),
                s.tid,
                s.page,
                s.of,
                s.for_.as_secs_f64()
            );
        }
        let handlers_idle = seen
            .iter()
            .filter(|s| name_of(s.tid).starts_with("tp-fault"))
            .all(|s| s.doing == Doing::Idle);
        match waiter {
            Some(tid) if handlers_idle => format!(
                "every fault handler is idle, so the fault of thread {} ({tid}) was read and its \
                 thread never woken (a lost wake-up)",
                name_of(tid)
            ),
            _ => "no pager thread has read the fault".to_string(),
        }
    }

    fn stop_program(&self, verdict: Verdict, seen: &[Seen], tasks: &[Task]) -> ! {
        let pid = std::process::id();
        let mut msg = String::new();
        match verdict.waiter {
            Some((tid, waited)) => {
                let name = tasks
                    .iter()
                    .find(|t| t.tid == tid)
                    .map_or("?", |t| t.name.as_str());
                let _ = writeln!(
                    msg,
                    "tidepool pager (process {pid}): thread {name} ({tid}) has waited {:.1} s for \
                     a page fault (deadline {:.1} s)",
                    waited.as_secs_f64(),
                    self.fault_deadline.as_secs_f64()
                );
            }
            None => {
                let _ = writeln!(
                    msg,
                    "tidepool pager (process {pid}): a page fault cannot be served (deadline \
                     {:.1} s)",
                    self.fault_deadline.as_secs_f64()
                );
            }
        }
        let _ = writeln!(
            msg,
            "tidepool pager (process {pid}): cause: {}",
            verdict.cause
        );
        let _ = writeln!(msg, "tidepool pager (process {pid}): pager threads:");
        for s in seen {
            let _ = writeln!(msg, "  {}", thread_line(s, tasks));
        }
        let waiting: Vec<String> = tasks
            .iter()
            .filter(|t| t.wchan == "handle_userfault" && !self.activity.is_pager_thread(t.tid))
            .map(|t| format!("{} ({})", t.name, t.tid))
            .collect();
        if !waiting.is_empty() {
            let _ = writeln!(
                msg,
                "tidepool pager (process {pid}): program threads waiting for faults: {}",
                waiting.join(", ")
            );
        }
        let _ = writeln!(
            msg,
            "tidepool pager (process {pid}): stopping the program (exit status {FATAL_EXIT_CODE}) \
             rather than let it hang; TIDEPOOL_RUN_FAULT_DEADLINE sets the deadline"
        );
        crate::sys::die(&msg, FATAL_EXIT_CODE)
    }
}

/// A pager thread's line in the watchdog's message: what it was doing, for how long, and where
/// the kernel has it.
fn thread_line(s: &Seen, tasks: &[Task]) -> String {
    let task = tasks.iter().find(|t| t.tid == s.tid);
    let (name, state, wchan) = task.map_or(("?", '?', ""), |t| {
        (t.name.as_str(), t.state, t.wchan.as_str())
    });
    let doing = match s.doing {
        Doing::Idle => "idle".to_string(),
        Doing::Serving => format!("serving {:#x} for thread {}", s.page, s.of),
        Doing::Store => format!("waiting for the far store (page {:#x})", s.page),
        Doing::Holding => {
            format!("holding {} faults for a fork by thread {}", s.page, s.of)
        }
        Doing::Evicting => "evicting".to_string(),
        Doing::Starting => format!("starting the pager's threads ({} up)", s.of),
        Doing::Stalled => "stopped by fault injection".to_string(),
    };
    let stack = read(&format!("/proc/self/task/{}/stack", s.tid))
        .map(|k| {
            k.lines()
                .take(4)
                .filter_map(|l| l.split_whitespace().nth(1))
                .collect::<Vec<_>>()
                .join(" < ")
        })
        .unwrap_or_default();
    format!(
        "{name} ({}): {doing}, for {:.1} s; state {state}{}{}",
        s.tid,
        s.for_.as_secs_f64(),
        if wchan.is_empty() || wchan == "0" {
            String::new()
        } else {
            format!(", in {wchan}")
        },
        if stack.is_empty() {
            String::new()
        } else {
            format!(" [{stack}]")
        },
    )
}

/// What the watchdog remembers of the one reader between looks.
#[derive(Default)]
struct ReaderWatch {
    starving: crate::follow::Starving,
    /// The handler the accounting is of.
    looked_at: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_name_state_and_faults_even_with_odd_names() {
        let line = "1234 (tp (fault) 0) S 1 2 3 4 5 6 100 7 23 8 9 10 11";
        assert_eq!(
            parse_stat(line),
            Some(("tp (fault) 0".to_string(), 'S', 123))
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_wait_counts_from_the_first_sight_and_restarts_when_a_fault_completes() {
        let task = |faults| Task {
            tid: 7,
            name: "t".into(),
            state: 'S',
            faults,
            wchan: "handle_userfault".into(),
        };
        let t0 = Instant::now();
        let mut w = Waits::default();
        assert_eq!(w.update(&[task(5)], t0), vec![(7, Duration::ZERO)]);
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(w.update(&[task(5)], t1), vec![(7, Duration::from_secs(2))]);
        // A fault completed meanwhile: a new wait.
        let t2 = t1 + Duration::from_secs(2);
        assert_eq!(w.update(&[task(6)], t2), vec![(7, Duration::ZERO)]);
        // Gone from handle_userfault: forgotten.
        let mut idle = task(6);
        idle.wchan = "futex_wait_queue".into();
        assert!(w.update(&[idle], t2).is_empty());
        assert!(w.0.is_empty());
    }

    #[test]
    fn this_process_threads_are_listed_with_their_states() {
        let tasks = tasks();
        let me = tidepool_sys::gettid();
        let mine = tasks.iter().find(|t| t.tid == me).expect("this thread");
        assert_eq!(mine.state, 'R');
        assert!(mine.faults > 0);
    }
}
