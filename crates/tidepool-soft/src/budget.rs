//! The budget without a coordinator: `auto` follows the memory the machine (and the memory
//! cgroups the process is in) can spare, shrinking at once when it runs short.
//!
//! Every few milliseconds a thread reads the headroom: MemAvailable, and for each memory
//! cgroup from the process's own up to the root, its limit less its usage; the smallest.
//! Under the reserve, the budget drops by the shortfall and more (a shrink punches holes, so
//! the memory is back before the next look); with headroom to spare, it grows by a share of
//! it. Memory stalls reported by PSI (/proc/pressure/memory) over the last interval count as
//! a shortfall too.

use crate::arena::{SoftArena, SEGMENT};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How an `auto` budget behaves: [`AutoBudget::default`], then the setters below for what
/// differs from the defaults each one names.
#[derive(Debug, Clone)]
pub struct AutoBudget {
    /// Headroom to leave to everything else (bytes).
    pub(crate) reserve: usize,
    /// The budget never exceeds this.
    pub(crate) max: usize,
    /// Of the headroom above the reserve, the share one step may take.
    pub(crate) grow_share: f64,
    /// How often to look.
    pub(crate) interval: Duration,
}

impl AutoBudget {
    /// Headroom, in bytes, to leave to everything else on the machine and in the process's
    /// memory cgroups (default 256 MiB).
    pub fn reserve(mut self, bytes: usize) -> AutoBudget {
        self.reserve = bytes;
        self
    }

    /// The most the budget may grow to, in bytes (default 64 GiB).
    pub fn max(mut self, bytes: usize) -> AutoBudget {
        self.max = bytes;
        self
    }

    /// Of the headroom above the reserve, the share one step may take, between 0 and 1
    /// (default 0.5).
    pub fn grow_share(mut self, share: f64) -> AutoBudget {
        self.grow_share = share;
        self
    }

    /// How often the headroom is read (default 5 ms).
    pub fn interval(mut self, every: Duration) -> AutoBudget {
        self.interval = every;
        self
    }
}

impl Default for AutoBudget {
    fn default() -> Self {
        AutoBudget {
            reserve: 256 << 20,
            max: 64 << 30,
            grow_share: 0.5,
            interval: Duration::from_millis(5),
        }
    }
}

/// Where the process's memory limits are.
#[derive(Debug, Clone)]
pub struct MemoryView {
    /// (limit file, usage file) of each memory cgroup from the process's up to the root, kept
    /// open: a look every few milliseconds is then one pread a file.
    cgroups: Vec<(Arc<File>, Arc<File>)>,
}

/// A small kernel file (procfs, cgroupfs) read from its start with one pread: its contents
/// are made afresh at offset 0, and a descriptor kept open saves the open, stat and close
/// that `read_to_string` costs each time (a coordinator idling at a look every 5 ms spent 3%
/// of a CPU on them).
fn read_kernel_file(file: &File, buf: &mut [u8]) -> Option<usize> {
    let n = file.read_at(buf, 0).ok()?;
    (n < buf.len()).then_some(n)
}

/// A number alone in a small kernel file.
fn read_number(file: &File) -> Option<usize> {
    let mut buf = [0u8; 64];
    let n = read_kernel_file(file, &mut buf)?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

/// A line of a kernel file kept open once per process.
fn read_line_of(
    cell: &'static OnceLock<Option<File>>,
    path: &str,
    prefix: &str,
    f: impl FnOnce(&str) -> Option<u64>,
) -> Option<u64> {
    let file = cell.get_or_init(|| File::open(path).ok()).as_ref()?;
    let mut buf = [0u8; 8192];
    let n = read_kernel_file(file, &mut buf)?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    f(text.lines().find(|l| l.starts_with(prefix))?)
}

impl MemoryView {
    /// Finds the process's memory cgroups (v1 or v2).
    pub fn of_this_process() -> MemoryView {
        let mut cgroups = Vec::new();
        let text = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = match (parts.next(), parts.next(), parts.next()) {
                (Some(a), Some(b), Some(c)) => (a, b, c),
                _ => continue,
            };
            let (root, limit, usage) = if controllers.split(',').any(|c| c == "memory") {
                (
                    "/sys/fs/cgroup/memory",
                    "memory.limit_in_bytes",
                    "memory.usage_in_bytes",
                )
            } else if controllers.is_empty()
                && std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
            {
                ("/sys/fs/cgroup", "memory.max", "memory.current")
            } else {
                continue;
            };
            let mut dir = PathBuf::from(root).join(path.trim_start_matches('/'));
            loop {
                if let (Ok(l), Ok(u)) = (File::open(dir.join(limit)), File::open(dir.join(usage))) {
                    cgroups.push((Arc::new(l), Arc::new(u)));
                }
                if dir == std::path::Path::new(root) || !dir.pop() {
                    break;
                }
            }
        }
        MemoryView { cgroups }
    }

    /// How many memory cgroups bound the process (its own and those above it that have a
    /// limit file).
    pub fn cgroups(&self) -> usize {
        self.cgroups.len()
    }

    /// Bytes the process could still take: the least of MemAvailable and every cgroup's
    /// limit less usage.
    pub fn headroom(&self) -> usize {
        self.headroom_under(mem_available())
    }

    /// The same, with MemAvailable already read (reading /proc/meminfo costs tens of
    /// microseconds; a loop that also wants MemAvailable itself reads it once).
    pub fn headroom_under(&self, mem_available: Option<usize>) -> usize {
        let mut room = mem_available.unwrap_or(usize::MAX);
        for (limit, usage) in &self.cgroups {
            if let (Some(l), Some(u)) = (read_number(limit), read_number(usage)) {
                room = room.min(l.saturating_sub(u));
            }
        }
        room
    }
}

/// MemAvailable from /proc/meminfo, in bytes.
pub fn mem_available() -> Option<usize> {
    static MEMINFO: OnceLock<Option<File>> = OnceLock::new();
    read_line_of(&MEMINFO, "/proc/meminfo", "MemAvailable:", |line| {
        line.split_whitespace().nth(1)?.parse::<u64>().ok()
    })
    .map(|kib| (kib as usize) << 10)
}

/// Microseconds some task has stalled on memory since boot (PSI's `some total`), if the
/// kernel reports it.
pub fn memory_stall_us() -> Option<u64> {
    static PRESSURE: OnceLock<Option<File>> = OnceLock::new();
    read_line_of(&PRESSURE, "/proc/pressure/memory", "some", |line| {
        let total = line.split_whitespace().find(|w| w.starts_with("total="))?;
        total["total=".len()..].parse().ok()
    })
}

/// The next budget, from the current one, the arena's usage, the headroom, the memory
/// pressure (percent of recent time some task stalled on memory) and whether the arena
/// evicted anything since the last look.
pub fn next_budget(
    auto: &AutoBudget,
    budget: usize,
    usage: usize,
    headroom: usize,
    pressure: f64,
    demand: bool,
) -> usize {
    let floor = SEGMENT;
    if headroom < auto.reserve || pressure > 10.0 {
        // Short: give back the shortfall and a quarter of the reserve more, at once.
        let short = auto.reserve.saturating_sub(headroom) + auto.reserve / 4;
        usage.min(budget).saturating_sub(short).max(floor)
    } else {
        let spare = headroom - auto.reserve;
        let grow = (spare as f64 * auto.grow_share) as usize;
        // Grow only on demand (the arena had to evict to make room): room nobody fills is
        // room held back from everyone else.
        if demand {
            (budget + grow.min(64 * SEGMENT)).min(auto.max)
        } else {
            budget.min(auto.max)
        }
    }
    .max(floor)
}

/// One `auto` budget's state between looks: the last PSI reading and eviction count.
#[derive(Debug)]
pub(crate) struct AutoStepper {
    auto: AutoBudget,
    view: MemoryView,
    stalled: Option<u64>,
    evicted: u64,
    at: std::time::Instant,
}

impl AutoStepper {
    pub(crate) fn new(auto: AutoBudget) -> AutoStepper {
        AutoStepper {
            auto,
            view: MemoryView::of_this_process(),
            stalled: memory_stall_us(),
            evicted: 0,
            at: std::time::Instant::now(),
        }
    }

    pub(crate) fn interval(&self) -> Duration {
        self.auto.interval
    }

    /// Looks once and sets the arena's next budget.
    pub(crate) fn step(&mut self, arena: &SoftArena) {
        // Pressure: the share of the time since the last look that some task spent stalled
        // on memory.
        let now = memory_stall_us();
        let pressure = match (self.stalled, now) {
            (Some(a), Some(b)) => {
                let span = self.at.elapsed().as_micros().max(1) as f64;
                100.0 * (b.saturating_sub(a)) as f64 / span
            }
            _ => 0.0,
        };
        (self.stalled, self.at) = (now, std::time::Instant::now());
        let budget = arena.budget();
        let now_evicted = arena.counters.segments_evicted.load(Relaxed);
        let demand = now_evicted != self.evicted;
        self.evicted = now_evicted;
        let next = next_budget(
            &self.auto,
            budget,
            arena.usage(),
            self.view.headroom(),
            pressure,
            demand,
        );
        if next != budget {
            arena.set_budget(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrinks_below_the_reserve_and_grows_on_demand() {
        let a = AutoBudget::default()
            .reserve(100 * SEGMENT)
            .max(1000 * SEGMENT);
        let s = SEGMENT;
        // Short by 40 segments: drop usage by 40 + 25.
        assert_eq!(
            next_budget(&a, 500 * s, 500 * s, 60 * s, 0.0, true),
            435 * s
        );
        // Pressure alone shrinks too.
        assert!(next_budget(&a, 500 * s, 500 * s, 900 * s, 50.0, false) < 500 * s);
        // Room to spare and evictions: grow by at most 64 segments.
        assert_eq!(
            next_budget(&a, 500 * s, 499 * s, 900 * s, 0.0, true),
            564 * s
        );
        // Room to spare but no demand: hold.
        assert_eq!(
            next_budget(&a, 500 * s, 100 * s, 900 * s, 0.0, false),
            500 * s
        );
        // Never past max, never under a segment.
        assert_eq!(
            next_budget(&a, 990 * s, 990 * s, 9000 * s, 0.0, true),
            1000 * s
        );
        assert_eq!(next_budget(&a, 2 * s, 2 * s, 0, 0.0, true), s);
    }

    #[test]
    fn sees_this_process_memory() {
        let v = MemoryView::of_this_process();
        assert!(v.headroom() > 0);
    }
}
