//! What serving faults costs the machine's CPUs, beyond the handler's own time: the
//! interrupts this machine took while the pager ran (a fault that wakes a handler on another
//! CPU sends a rescheduling interrupt; a page moved out of a mapping that another CPU has live
//! sends a TLB shootdown, a function-call interrupt that waits for that CPU), how often the
//! handlers went to sleep (each sleep needs a wake-up), and, sampled, how long a faulting thread
//! waits for a handler to take its fault and, once woken, for a CPU.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

pub use tidepool_sys::interrupts::Interrupts;

/// The interrupt counts when this pager started (or, in a forked child, restarted): atomics,
/// so that a fork never finds them locked.
#[derive(Debug, Default)]
pub(crate) struct Baseline([AtomicU64; 3]);

impl Baseline {
    pub fn set_now(&self) {
        let i = Interrupts::now().unwrap_or_default();
        for (a, v) in self
            .0
            .iter()
            .zip([i.function_call, i.tlb_shootdown, i.reschedule])
        {
            a.store(v, Relaxed);
        }
    }

    /// Interrupts taken since the baseline.
    pub fn taken(&self) -> Option<Interrupts> {
        let [f, t, r] = &self.0;
        Some(Interrupts::now()?.since(Interrupts {
            function_call: f.load(Relaxed),
            tlb_shootdown: t.load(Relaxed),
            reschedule: r.load(Relaxed),
        }))
    }
}

/// The fault handlers' thread ids, so that their sleeps can be counted, and whether each runs
/// at idle priority (a lone reader does: see `follow.rs`).
#[derive(Debug, Default)]
pub(crate) struct HandlerTids([AtomicU32; 8], [AtomicBool; 8]);

/// A handler at idle priority that has served one fault this long is kept off its CPU (a
/// fault takes microseconds): the watchdog puts it back at normal priority.
pub(crate) const KEPT_OFF: Duration = Duration::from_millis(10);

impl HandlerTids {
    /// Records the calling thread as handler `i` (ignored past the eighth).
    pub fn register(&self, i: usize) {
        if let Some(slot) = self.0.get(i) {
            slot.store(crate::sys::gettid(), Relaxed);
        }
    }

    /// Puts the calling thread, handler `i`, at idle priority or back at normal priority, if
    /// it is not there already.
    pub fn set_idle(&self, i: usize, idle: bool) {
        let Some(flag) = self.1.get(i) else { return };
        if flag.load(Relaxed) != idle && tidepool_sys::set_idle_priority(0, idle).is_ok() {
            flag.store(idle, Relaxed);
        }
    }

    /// Whether handler `i` runs at idle priority.
    pub fn is_idle(&self, i: usize) -> bool {
        self.1.get(i).is_some_and(|f| f.load(Relaxed))
    }

    /// Puts back at normal priority a handler that serves a fault at idle priority and has
    /// for [`KEPT_OFF`] or longer (`doing`: the handlers' own accounts, as `activity.rs` keeps
    /// them). Beside busy threads of normal priority an idle one gets almost no CPU, and the
    /// program waits for the fault it holds: the pager's own threads spinning on a memory
    /// node's answer held one off its CPU past a one-second fault deadline. Returns how many.
    pub fn rescue(&self, doing: &[crate::activity::Seen]) -> usize {
        use crate::activity::Doing;
        let mut rescued = 0;
        for (tid, flag) in self.0.iter().zip(&self.1) {
            let tid = tid.load(Relaxed);
            let kept_off = doing.iter().any(|s| {
                s.tid == tid
                    && !matches!(s.doing, Doing::Idle | Doing::Evicting)
                    && s.for_ >= KEPT_OFF
            });
            if tid != 0
                && kept_off
                && flag.load(Relaxed)
                && tidepool_sys::set_idle_priority(tid as i32, false).is_ok()
            {
                // The handler sees the flag when it next reads, and goes back to idle
                // priority then if it still reads alone.
                flag.store(false, Relaxed);
                rescued += 1;
            }
        }
        rescued
    }

    /// Handler `i`'s thread id (0: not started).
    pub fn get(&self, i: usize) -> u32 {
        self.0.get(i).map_or(0, |t| t.load(Relaxed))
    }

    pub fn clear(&self) {
        for (t, idle) in self.0.iter().zip(&self.1) {
            t.store(0, Relaxed);
            idle.store(false, Relaxed);
        }
    }

    /// How many times the handlers went to sleep, from their voluntary context switches: each
    /// is a wake-up someone paid for.
    pub fn sleeps(&self) -> u64 {
        self.0
            .iter()
            .map(|t| t.load(Relaxed))
            .filter(|&t| t != 0)
            .filter_map(|t| {
                let status = std::fs::read_to_string(format!("/proc/self/task/{t}/status")).ok()?;
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }
}

/// A thread's scheduler accounting (/proc/self/task/TID/schedstat): time on a CPU, time
/// runnable but waiting for one, and how many times it was put on one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SchedStat {
    pub(crate) ran_ns: u64,
    pub(crate) waited_ns: u64,
    pub(crate) runs: u64,
}

impl SchedStat {
    pub(crate) fn of(tid: u32) -> Option<SchedStat> {
        let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
        let mut f = text.split_whitespace().map(|w| w.parse::<u64>().ok());
        Some(SchedStat {
            ran_ns: f.next()??,
            waited_ns: f.next()??,
            runs: f.next()??,
        })
    }
}

/// One handler's sampling of the two parts of a miss it cannot time itself. At a sampled
/// fault it reads the faulting thread's scheduler accounting (the thread is stopped) and times
/// its own serving, up to the install that wakes the thread, in CPU time (a wall clock would
/// also count the thread's run if the wake-up preempted the handler). At the thread's next
/// fault, if the thread was put on a CPU exactly once in between (no other sleep, no
/// preemption), the wall time between the two faults taken, less the serving, less what the
/// thread ran, less what it waited runnable (its wake-up, which the kernel counts), is the
/// delivery of the second fault: from the thread stopping to a handler taking the fault.
#[derive(Debug, Default)]
pub(crate) struct MissProbe {
    faults: u32,
    pending: Option<Pending>,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    tid: u32,
    at: Instant,
    serve_ns: u64,
    sched: SchedStat,
}

/// A sampled fault being served.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    tid: u32,
    at: Instant,
    cpu_ns: u64,
    sched: SchedStat,
}

/// Faults between samples: a sample reads /proc twice, a few microseconds each.
const SAMPLE_EVERY: u32 = 128;

impl MissProbe {
    /// At a missing fault of thread `tid`, before its page goes in: a sample if this fault is
    /// sampled (hand it to [`MissProbe::woken`] once the thread is woken), and the delivery and
    /// wake-up times (ns) if this fault completes an earlier sample.
    pub fn taken(&mut self, tid: u32) -> (Option<Sample>, Option<(u64, u64)>) {
        let mut measured = None;
        if let Some(p) = self.pending.filter(|p| p.tid == tid) {
            self.pending = None;
            let at = Instant::now();
            measured = SchedStat::of(tid).and_then(|now| {
                if now.runs != p.sched.runs + 1 {
                    return None;
                }
                let wall = at.checked_duration_since(p.at)?.as_nanos() as u64;
                let wake = now.waited_ns.saturating_sub(p.sched.waited_ns);
                let ran = now.ran_ns.saturating_sub(p.sched.ran_ns);
                let delivery = wall
                    .saturating_sub(p.serve_ns)
                    .saturating_sub(ran)
                    .saturating_sub(wake);
                Some((delivery, wake))
            });
        }
        self.faults = self.faults.wrapping_add(1);
        if !self.faults.is_multiple_of(SAMPLE_EVERY) {
            return (None, measured);
        }
        let sample = SchedStat::of(tid).map(|sched| Sample {
            tid,
            sched,
            at: Instant::now(),
            cpu_ns: tidepool_sys::thread_cpu_ns(),
        });
        (sample, measured)
    }

    /// The sampled fault's thread was woken just now.
    pub fn woken(&mut self, s: Sample) {
        self.pending = Some(Pending {
            tid: s.tid,
            at: s.at,
            serve_ns: tidepool_sys::thread_cpu_ns().saturating_sub(s.cpu_ns),
            sched: s.sched,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activity::{Doing, Seen};

    /// Thread `tid`'s scheduling policy (field 41 of its stat: 0 normal, 5 idle).
    fn policy(tid: u32) -> u32 {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        after_name.split(' ').nth(38).unwrap().parse().unwrap()
    }

    #[test]
    fn a_handler_kept_off_its_cpu_while_serving_is_put_back_at_normal_priority() {
        // On a thread of its own: the test's thread goes to idle priority and back.
        std::thread::spawn(|| {
            let tids = HandlerTids::default();
            tids.register(1);
            let me = crate::sys::gettid();
            tids.set_idle(1, true);
            assert_eq!(policy(me), libc::SCHED_IDLE as u32);
            let seen = |doing, ms| Seen {
                tid: me,
                doing,
                for_: Duration::from_millis(ms),
                page: 0,
                of: 0,
            };
            // Waiting for faults, or serving one for a moment: left where it is.
            assert_eq!(tids.rescue(&[seen(Doing::Idle, 5000)]), 0);
            assert_eq!(tids.rescue(&[seen(Doing::Serving, 1)]), 0);
            assert_eq!(policy(me), libc::SCHED_IDLE as u32);
            // Serving one for 10 ms: back at normal priority, and the handler knows it.
            assert_eq!(tids.rescue(&[seen(Doing::Serving, 10)]), 1);
            assert_eq!(policy(me), libc::SCHED_OTHER as u32);
            assert_eq!(
                tids.rescue(&[seen(Doing::Serving, 10)]),
                0,
                "once is enough"
            );
            tids.set_idle(1, true);
            assert_eq!(
                policy(me),
                libc::SCHED_IDLE as u32,
                "idle again when it reads alone"
            );
            tids.set_idle(1, false);
            assert_eq!(policy(me), libc::SCHED_OTHER as u32);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn this_threads_accounting_and_its_sleeps_can_be_read() {
        let me = crate::sys::gettid();
        let s = SchedStat::of(me).expect("schedstat of this thread");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let t = SchedStat::of(me).unwrap();
        assert!(t.runs > s.runs, "a sleep puts the thread on a CPU again");
        let tids = HandlerTids::default();
        tids.register(0);
        assert!(tids.sleeps() >= 1, "the sleep above counts");
    }
}
