//! The fault handler threads (one pinned per CPU; while one of them reads alone, the others wait
//! their turn, see `follow.rs`): they read fault events and serve them,
//! except while a fork holds the gate closed (`fork.rs`), when they serve the forking thread's
//! own faults and hold the others; and the service a thread starting the pager's threads gives
//! until they run.

use crate::fault::FollowUp;
use crate::pager::{Inner, FATAL_EXIT_CODE};
use crate::staging::Staging;
use crate::stats::Counters;
use crate::sys::{Fault, PAGE};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a handler waits for the forking thread to park (`park.rs`) before it gives up
/// and looks again: a signal reaches a thread asleep on a lock in microseconds, but a thread
/// that got its lock meanwhile and went on into the clone (every signal blocked) never parks.
const PARK_WAIT: Duration = Duration::from_millis(20);

impl Inner {
    /// The loop of fault handler number `n`.
    pub(crate) fn handler_loop(self: Arc<Self>, n: usize) {
        self.handler_tids.register(n);
        let mut faults = Vec::with_capacity(32);
        // Faults read while a fork holds the gate closed, with when they were read.
        let mut held: Vec<(Fault, Instant)> = Vec::new();
        let mut picker = crate::late::Picker::new();
        let mut staging = Staging::new();
        let bell = self.doorbell.addr();
        // Reads that brought faults since its last look at where the program runs.
        let mut served = 0u32;
        loop {
            if held.is_empty() {
                self.follow.wait_to_read(n, &self.shutdown);
                // At SCHED_IDLE while it reads alone.
                self.handler_tids.set_idle(n, self.follow.one_reads());
            }
            let read = if held.is_empty() {
                // One system call a fault: the read blocks until there are some (a poll first
                // would be a second).
                self.uffd.read_faults(&mut faults)
            } else {
                // Faults are held: look for the forking thread's own, and for the gate to open.
                let r = self.uffd.read_faults_now(&mut faults);
                if faults.is_empty() {
                    std::thread::sleep(Duration::from_micros(50));
                }
                r
            };
            if let Err(e) = read {
                self.fatal("reading fault events", &e);
            }
            self.stall_if_asked();
            let mut stop = false;
            let now = Instant::now();
            let mut last_tid = None;
            let mut read = 0;
            for f in faults.drain(..) {
                if f.page_addr != bell {
                    self.activity.fault_read(f.tid);
                    last_tid = Some(f.tid);
                    read += 1;
                    held.push((f, now));
                } else if self.shutdown.load(Acquire) && !stop {
                    // Mapping the page lets the ringer go on to the next handler.
                    stop = true;
                    let _ = self.uffd.zeropage(bell);
                } else {
                    self.uffd.wake(bell, PAGE);
                }
            }
            if let Some(tid) = last_tid {
                // Before the install wakes it: where it faulted, not where it runs next.
                self.follow.fault_from(tid, &self.shutdown);
            }
            self.serve_or_hold(&mut held, &mut picker, &mut staging);
            if self.handler_tids.is_idle(n) {
                self.follow.served_alone(read);
            }
            if stop {
                return;
            }
            if let Some(tid) = last_tid {
                served += 1;
                if served >= crate::follow::CHECK_EVERY {
                    served = 0;
                    self.follow.look(tid, &self.shutdown);
                }
            }
            if held.is_empty() {
                self.activity.set(crate::activity::Doing::Idle, 0, 0);
            }
        }
    }

    /// Fault injection for tests ([`Config::stall_handlers_after`]): past that many faults, this
    /// handler stops for good, as if stuck.
    fn stall_if_asked(&self) {
        let Some(after) = self.stall_handlers_after else {
            return;
        };
        if self.counters.missing_faults.load(Relaxed) < after {
            return;
        }
        self.activity.set(crate::activity::Doing::Stalled, 0, 0);
        while !self.shutdown.load(Acquire) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Serves the faults read so far, or, while a fork holds the gate closed, those of the
    /// forking thread (it cannot fork while it waits for them) and, one at a time, those whose
    /// threads the forking thread may be waiting for (`late.rs`); the rest stay in `held`.
    fn serve_or_hold(
        &self,
        held: &mut Vec<(Fault, Instant)>,
        picker: &mut crate::late::Picker,
        staging: &mut Staging,
    ) {
        use crate::activity::Doing;
        if held.is_empty() {
            return;
        }
        if let Some(_section) = crate::gate::try_section() {
            let mut faults: Vec<Fault> = held.drain(..).map(|(f, _)| f).collect();
            let first = faults[0];
            self.activity
                .set(Doing::Serving, first.page_addr as u64, first.tid);
            if faults.len() > 1 {
                self.serve_together(&mut faults, staging);
            }
            for f in faults {
                self.serve(f, staging, FollowUp::Full);
            }
            return;
        }
        let Some(forking) = crate::gate::forking_thread() else {
            // The gate opened since: next time round.
            return;
        };
        held.retain(|&(f, _)| {
            if f.tid != forking {
                return true;
            }
            Counters::add(&self.counters.fork_own_faults, 1);
            self.serve_during_fork(f, staging);
            false
        });
        match picker.pick(forking, held.iter().map(|(f, t)| (f.tid, *t))) {
            Some(crate::late::Late::Parked(turn)) => {
                let request = crate::park::Request::send(forking);
                if request.wait_parked(PARK_WAIT) {
                    Counters::add(&self.counters.fork_parks, 1);
                    for (f, _) in held.drain(..) {
                        Counters::add(&self.counters.fork_late_faults, 1);
                        self.serve_during_fork(f, staging);
                    }
                    // The forking thread goes on only after every service ended and woke its
                    // thread; the next turn after that.
                    drop(request);
                    drop(turn);
                } else {
                    // It runs on (into the clone, perhaps, with every signal blocked): serve
                    // nothing, look again.
                    drop(request);
                    turn.cancel();
                }
            }
            Some(crate::late::Late::One(i, turn)) => {
                let (f, _) = held.remove(i);
                Counters::add(&self.counters.fork_late_faults, 1);
                self.serve_during_fork(f, staging);
                // Only now, after the thread's wake-up.
                drop(turn);
            }
            None => {}
        }
        if !held.is_empty() {
            self.activity
                .set(Doing::Holding, held.len() as u64, forking);
        }
    }

    /// Serves one fault while a fork is under way: installed and accounted for entirely before
    /// its thread (perhaps the forking one) is woken, nothing evicted, no prefetch.
    fn serve_during_fork(&self, f: Fault, staging: &mut Staging) {
        self.activity
            .set(crate::activity::Doing::Serving, f.page_addr as u64, f.tid);
        self.uffd.deferring_wakes(|| {
            // The section ends before the wake-ups go out: the child of a fork that follows
            // must not find it counted.
            let _section = crate::gate::section_regardless();
            self.serve(f, staging, FollowUp::InstallOnly);
        });
    }

    /// Serves faults on this (not yet a pager) thread until `started` of the pager's new
    /// threads say they run: their start-up in glibc may touch memory of the program (the
    /// locale data `setlocale` allocated), which only a running pager can bring back. In a
    /// forked child nobody else would serve it.
    pub(crate) fn serve_while_starting(&self, started: &std::sync::atomic::AtomicU32, n: u32) {
        let t0 = Instant::now();
        let mut faults = Vec::new();
        let mut staging: Option<Staging> = None;
        let bell = self.doorbell.addr();
        while started.load(Acquire) < n {
            if let Err(e) = self.uffd.read_faults_now(&mut faults) {
                self.fatal("reading fault events while the pager's threads start", &e);
            }
            if faults.is_empty() {
                if t0.elapsed() > self.fault_deadline && !self.fault_deadline.is_zero() {
                    crate::sys::die(
                        &format!(
                            "tidepool pager (process {}): only {} of the pager's {n} threads \
                             started within {:.1} s; stopping the program (exit status {}) \
                             rather than let it hang\n",
                            std::process::id(),
                            started.load(Acquire),
                            self.fault_deadline.as_secs_f64(),
                            FATAL_EXIT_CODE
                        ),
                        FATAL_EXIT_CODE,
                    );
                }
                std::thread::sleep(Duration::from_micros(50));
                continue;
            }
            let staging = staging.get_or_insert_with(Staging::new);
            for f in faults.drain(..) {
                if f.page_addr == bell {
                    self.uffd.wake(bell, PAGE);
                    continue;
                }
                self.activity.fault_read(f.tid);
                let _section = crate::gate::section();
                self.serve(f, staging, FollowUp::InstallOnly);
            }
        }
    }
}
