//! The coord suite's processes: the synthetic application (`tidepool bench-worker`'s `coord-app`
//! job), the antagonist that takes memory (`tidepool bench-worker`'s `antagonist` job), and the
//! guard that kills either when a run ends.

use crate::job::{AntagonistJob, AppJob};
use anyhow::{bail, Context, Result};
use rand::SeedableRng;
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The CPU a bench application pins itself to.
pub(super) const PIN_ENV: &str = "TIDEPOOL_BENCH_CPU";
/// Spin iterations per microsecond, calibrated once by the harness.
pub(super) const SPIN_ENV: &str = "TIDEPOOL_BENCH_SPIN";
/// The speed of the CPU a program runs as if alone on, as a share of a real one (see
/// [`Pacer`]); full speed when unset.
pub(super) const SPEED_ENV: &str = "TIDEPOOL_BENCH_CPU_SPEED";

/// Pins the calling thread (and the threads it starts later) to the CPU in PIN_ENV, if any.
pub(super) fn pin_from_env() -> Result<()> {
    if let Some(cpu) = std::env::var(PIN_ENV).ok().and_then(|c| c.parse().ok()) {
        tidepool_sys::set_affinity(0, &[cpu]).context("cannot pin the program")?;
    }
    Ok(())
}

/// Kills a child process when dropped (a failed run leaves nothing behind).
pub(super) struct Guard(pub(super) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `tidepool coord` from `c` and waits for its first line ("tidepool coord listening
/// ..."), which it returns; the rest of its output is read and dropped.
pub(super) fn start_coordinator(mut c: std::process::Command) -> Result<(Guard, String)> {
    use std::io::BufRead;
    c.stdout(std::process::Stdio::piped());
    let mut g = Guard(c.spawn().context("cannot start tidepool coord")?);
    let mut out = std::io::BufReader::new(g.0.stdout.take().expect("piped"));
    let mut first = String::new();
    out.read_line(&mut first)?;
    if !first.starts_with("tidepool coord listening") {
        bail!("tidepool coord did not start: {first:?}");
    }
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    Ok((g, first))
}

/// A thread reading a program's JSON lines until it closes its output: the numbers under
/// `keys` from each line (0 where missing), in order.
pub(super) fn read_json_lines<const N: usize>(
    out: std::process::ChildStdout,
    keys: [&'static str; N],
) -> std::thread::JoinHandle<Vec<[f64; N]>> {
    use std::io::BufRead;
    std::thread::spawn(move || {
        std::io::BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
            .map(|v| keys.map(|k| v[k].as_f64().unwrap_or(0.0)))
            .collect()
    })
}

/// Waits, takes the job's bytes of memory at its rate, holds them, and exits.
pub fn antagonist_worker(job: &AntagonistJob) -> Result<()> {
    let AntagonistJob {
        bytes,
        mib_per_s: rate,
        delay_s,
        hold_s,
    } = *job;
    std::thread::sleep(Duration::from_secs_f64(delay_s));
    let t = Instant::now();
    let chunk = 16u64 << 20;
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut taken = 0u64;
    while taken < bytes {
        // Zeroed pages from mmap: memory arrives as each page is touched.
        let mut c = vec![0u8; chunk.min(bytes - taken) as usize];
        for p in c.chunks_mut(4096) {
            p[0] = 1;
        }
        taken += c.len() as u64;
        held.push(c);
        if rate > 0.0 {
            let due = Duration::from_secs_f64((taken >> 20) as f64 / rate);
            if let Some(wait) = due.checked_sub(t.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    eprintln!(
        "antagonist: {} MiB in {:.0} ms",
        taken >> 20,
        t.elapsed().as_secs_f64() * 1e3
    );
    std::thread::sleep(Duration::from_secs_f64(hold_s));
    std::hint::black_box(&held);
    Ok(())
}

/// Spins for CPU time, not wall-clock time: iterations calibrated against this thread's CPU
/// clock.
pub(super) struct Spinner {
    pub(super) iters_per_us: f64,
}

impl Spinner {
    pub(super) fn calibrate() -> Spinner {
        let cpu = || {
            let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
            t.tv_sec as f64 * 1e6 + t.tv_nsec as f64 / 1e3
        };
        let mut best = f64::MAX;
        for _ in 0..5 {
            let n = 2_000_000u64;
            let t0 = cpu();
            spin_iters(n);
            let us = cpu() - t0;
            best = best.min(us / n as f64);
        }
        Spinner {
            iters_per_us: 1.0 / best,
        }
    }

    /// The harness's calibration (SPIN_ENV), else a calibration of its own.
    pub(super) fn from_env() -> Spinner {
        match std::env::var(SPIN_ENV).ok().and_then(|s| s.parse().ok()) {
            Some(iters_per_us) if iters_per_us > 0.0 => Spinner { iters_per_us },
            _ => Spinner::calibrate(),
        }
    }

    pub(super) fn spin(&self, us: f64) {
        spin_iters((us * self.iters_per_us) as u64);
    }
}

/// A CPU of its own, slower than a real one: after each batch of operations the thread
/// sleeps for the CPU time it used times (1 / SPEED - 1), slept once at least a millisecond
/// is owed and the over- or under-sleep carried forward, so the mean is exact. Work and
/// rebuilds then take 1 / SPEED times longer while a stall on a fault takes its own time, as
/// on a machine of the program's own; no program runs faster by taking the CPU of a stalled
/// neighbour, and none hides stalls in slack as under a CFS quota (which lets a program
/// stalled half the time still use its whole share in the other half). Work whose time the
/// program measures itself (a rebuild, which a soft application reports to the coordinator)
/// is slowed inline instead ([`Inline`]), so the time measured is the slow CPU's.
///
/// Time spent runnable but waiting for the CPU (the kernel's schedstat) is taken off what is
/// owed: on a CPU of its own the program would not have waited for the neighbour pinned beside
/// it. Without that, two programs to a CPU slowed each other by up to a third, and a program
/// ran faster beside a neighbour stalled on faults than in the all-local run it is measured
/// against (1.30 of it in one run).
pub(super) struct Pacer {
    idle_per_busy: f64,
    cpu_us: f64,
    /// Nanoseconds this thread has waited on a run queue, at the last sleep.
    waited_ns: u64,
    debt_us: f64,
    inline: Inline,
    inline_seen_ns: u64,
}

/// Slows work inline, by sleeping its share at once; shared with a reconstructor.
#[derive(Clone)]
pub(super) struct Inline {
    idle_per_busy: f64,
    on: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// CPU nanoseconds already slowed inline (the batch pacing leaves them out).
    paced_ns: std::sync::Arc<AtomicU64>,
}

impl Inline {
    /// Slows `cpu_us` of work just done (nothing until the pacer starts). A sleep shorter
    /// than 50 us would cost more than it is (a system call and a wake-up): such work is left
    /// to the batch pacing, its measured time the fast CPU's.
    pub(super) fn after(&self, cpu_us: f64) {
        if self.idle_per_busy == 0.0 || cpu_us * self.idle_per_busy < 50.0 || !self.on.load(Relaxed)
        {
            return;
        }
        self.paced_ns.fetch_add((cpu_us * 1e3) as u64, Relaxed);
        std::thread::sleep(Duration::from_secs_f64(cpu_us * self.idle_per_busy / 1e6));
    }
}

/// Nanoseconds the calling thread has spent runnable and waiting for a CPU (0 where the
/// kernel does not say).
fn thread_waited_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// What the pacer may run ahead by after waiting for the CPU longer than it owed (a burst
/// after a long wait is capped at this).
const MAX_CREDIT_US: f64 = 10_000.0;

fn thread_cpu_us() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 * 1e6 + t.tv_nsec as f64 / 1e3
}

impl Pacer {
    /// A pacer at the speed in the environment, stopped until [`Pacer::start`].
    pub(super) fn from_env() -> Pacer {
        let speed = std::env::var(SPEED_ENV)
            .ok()
            .and_then(|t| t.parse().ok())
            .filter(|s: &f64| *s > 0.0 && *s < 1.0)
            .unwrap_or(1.0);
        if speed < 1.0 {
            // Sleeps of a few hundred microseconds, not the default 50 us late.
            let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1000));
        }
        Pacer {
            idle_per_busy: 1.0 / speed - 1.0,
            cpu_us: 0.0,
            waited_ns: 0,
            debt_us: 0.0,
            inline: Inline {
                idle_per_busy: 1.0 / speed - 1.0,
                on: Default::default(),
                paced_ns: Default::default(),
            },
            inline_seen_ns: 0,
        }
    }

    pub(super) fn inline(&self) -> Inline {
        self.inline.clone()
    }

    /// Starts pacing (after a warm-up, which runs at full speed).
    pub(super) fn start(&mut self) {
        self.cpu_us = thread_cpu_us();
        self.waited_ns = thread_waited_ns();
        self.inline_seen_ns = self.inline.paced_ns.load(Relaxed);
        self.inline.on.store(true, Relaxed);
    }

    /// Called after each batch of operations.
    pub(super) fn batch(&mut self) {
        if self.idle_per_busy == 0.0 {
            return;
        }
        let now = thread_cpu_us();
        let inline_ns = self.inline.paced_ns.load(Relaxed);
        let inline_us = inline_ns.wrapping_sub(self.inline_seen_ns) as f64 / 1e3;
        self.inline_seen_ns = inline_ns;
        self.debt_us += (now - self.cpu_us - inline_us).max(0.0) * self.idle_per_busy;
        self.cpu_us = now;
        if self.debt_us >= 1000.0 {
            // Read only when a sleep is due (about once a millisecond): a read costs a few
            // microseconds.
            let waited = thread_waited_ns();
            let waited_us = waited.saturating_sub(self.waited_ns) as f64 / 1e3;
            self.waited_ns = waited;
            self.debt_us = (self.debt_us - waited_us).max(-MAX_CREDIT_US);
            if self.debt_us <= 0.0 {
                return;
            }
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_secs_f64(self.debt_us / 1e6));
            self.debt_us -= t0.elapsed().as_secs_f64() * 1e6;
            // A wait for the CPU on waking is in the time slept already.
            self.waited_ns = thread_waited_ns();
        }
    }
}

pub(super) fn spin_iters(n: u64) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x);
}

/// With TIDEPOOL_BENCH_JOIN_LATE, the coordinator to join after the warm-up (taken out of the
/// environment, so that the arena does not join it when it is made); else `None`.
fn late_coordinator() -> Option<tidepool_soft::coord::CoordConfig> {
    if std::env::var_os("TIDEPOOL_BENCH_JOIN_LATE").is_some() {
        let c = tidepool_soft::coord::CoordConfig::from_env();
        std::env::remove_var(tidepool_soft::coord::ENV_SOCKET);
        c
    } else {
        None
    }
}

/// Runs one synthetic application. With TIDEPOOL_COORD set the coordinator sets the budget
/// (with TIDEPOOL_BENCH_JOIN_LATE too, only after a warm-up on the job's budget). Prints a JSON
/// line every quarter second: seconds, operations, hits, misses, budget, bytes held.
pub fn worker(job: &AppJob) -> Result<()> {
    let AppJob {
        objects,
        skew,
        rebuild_us,
        work_us,
        seconds,
        budget,
        seed,
        ..
    } = *job;
    // Before any thread starts: the evacuator and the coordinator link inherit it.
    pin_from_env()?;
    // The clock starts before the warm-up: applications started together end together, and
    // measurements of their tails overlap.
    let start = Instant::now();
    let spinner = std::sync::Arc::new(Spinner::from_env());
    // With TIDEPOOL_BENCH_JOIN_LATE, the application warms up on BUDGET alone and joins the
    // coordinator afterwards (as in Midas §7.1, where every application starts with the same
    // soft memory): a warm-up scan has no ghost hits, and would look worth nothing to the
    // coordinator. Otherwise the arena joins as any program does, when it is made.
    let coordinator = late_coordinator();
    // A budget of 0: 8 MiB to start with.
    let first_budget = Some(budget as usize).filter(|&b| b != 0).unwrap_or(8 << 20);
    let arena = tidepool_soft::SoftRuntime::from_env(
        tidepool_soft::ArenaConfig::default()
            .budget(first_budget)
            .max_bytes(4 << 30),
    )?;
    // Free-segment watermarks of 1 and 2% (at least one and two segments): small budgets
    // keep more of themselves for objects.
    arena.start_evacuator(0.01, 0.02)?;
    let s = spinner.clone();
    let mut pacer = Pacer::from_env();
    let slow = pacer.inline();
    let values: tidepool_soft::SoftVec<[u8; 4096]> =
        tidepool_soft::SoftVec::new(&arena, objects as usize, move |i| {
            s.spin(rebuild_us);
            slow.after(rebuild_us);
            let mut v = [0u8; 4096];
            v[..8].copy_from_slice(&(i as u64).to_le_bytes());
            v
        });
    // Warm-up: every object built once, as a service's cache is warm before it is measured
    // (with a budget too small for all, the last ones built stay).
    for i in 0..objects as usize {
        std::hint::black_box(values.get(i));
    }
    if let Some(c) = coordinator {
        arena.join_coordinator(c)?;
    }
    let zipf = rand_distr::Zipf::new(objects, skew).context("Zipf parameters")?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    pacer.start();
    let mut next_print = Duration::ZERO;
    let mut ops = 0u64;
    let mut sum = 0u64;
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    loop {
        let el = start.elapsed();
        if el >= next_print {
            let st = values.stats();
            writeln!(
                out,
                "{{\"t\":{:.3},\"ops\":{ops},\"hits\":{},\"misses\":{},\"budget\":{},\"usage\":{}}}",
                el.as_secs_f64(),
                st.hits,
                st.misses,
                arena.budget(),
                arena.usage()
            )?;
            out.flush()?;
            next_print += Duration::from_millis(250);
            if el.as_secs_f64() >= seconds {
                break;
            }
        }
        for _ in 0..16 {
            use rand_distr::Distribution;
            let rank = zipf.sample(&mut rng) as u64 - 1;
            let key = crate::data::scatter(rank, objects);
            let v = values.get(key as usize);
            sum = sum.wrapping_add(v[0] as u64);
            spinner.spin(work_us);
            ops += 1;
        }
        pacer.batch();
    }
    std::hint::black_box(sum);
    Ok(())
}
