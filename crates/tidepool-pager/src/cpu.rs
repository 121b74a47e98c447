//! What serving faults costs the machine's CPUs, beyond the handler's own time: the
//! interrupts this machine took while the pager ran (a fault that wakes a handler on another
//! CPU sends a rescheduling interrupt; a page moved out of a mapping that another CPU has live
//! sends a TLB shootdown, a function-call interrupt that waits for that CPU), how often the
//! handlers went to sleep (each sleep needs a wake-up), and, sampled, how long a faulting thread
//! waits for a handler to take its fault and, once woken, for a CPU.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

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

/// The fault handlers' thread ids, so that their sleeps can be counted.
#[derive(Debug, Default)]
pub(crate) struct HandlerTids([AtomicU32; 8]);

impl HandlerTids {
    /// Records the calling thread as handler `i` (ignored past the eighth).
    pub fn register(&self, i: usize) {
        if let Some(slot) = self.0.get(i) {
            slot.store(crate::sys::gettid(), Relaxed);
        }
    }

    /// Handler `i`'s thread id (0: not started).
    pub fn get(&self, i: usize) -> u32 {
        self.0.get(i).map_or(0, |t| t.load(Relaxed))
    }

    pub fn clear(&self) {
        for t in &self.0 {
            t.store(0, Relaxed);
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
