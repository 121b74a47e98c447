//! Tidepool for Python: the native half of the `tidepool` package (`tidepool._tidepool`). The
//! Python half (`python/tidepool/__init__.py`) builds `SoftDict` and `soft_cache` on top.
//!
//! - One soft-memory runtime per process ([`tidepool_soft::SoftRuntime`]), made on first use
//!   (joined to the coordinator the environment names, if any), its evacuator running and its
//!   budget `auto` (it grows into idle memory and is cut at once under pressure) unless
//!   [`configure`] fixes it.
//! - [`map::SoftBytesMap`]: a `SoftMap` of bytes to bytes, rebuilt by a Python callable.
//! - [`far::FarArray`]: an array in far memory (a userfaultfd pager's region), exported
//!   through the buffer protocol so that numpy views it without a copy.
//!
//! Errors reach Python as exceptions saying what to do; no panic crosses into Python (pyo3
//! turns one into `PanicException`, and nothing here panics on input).

mod buffer;
pub mod far;
pub mod map;

use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tidepool_soft::budget::MemoryView;
use tidepool_soft::{ArenaConfig, AutoBudget, SoftArena, SoftError, SoftRuntime};

pyo3::create_exception!(
    tidepool,
    SoftMemoryError,
    pyo3::exceptions::PyMemoryError,
    "Soft memory could not hold a value, or could not be set up; the message says what to do."
);
pyo3::create_exception!(
    tidepool,
    FarMemoryError,
    pyo3::exceptions::PyOSError,
    "Far memory could not be set up (userfaultfd, the far store); the message says what to do."
);

/// Address space the arena reserves (no memory until used): the most soft memory can hold.
const MAX_BYTES: usize = 64 << 30;
/// The budget an `auto` arena starts from; it grows on demand within a few milliseconds.
const INITIAL_AUTO_BUDGET: usize = 64 << 20;
/// Bounds of the default reserve (a quarter of the headroom when the arena is made).
const MIN_RESERVE: usize = 32 << 20;
const MAX_RESERVE: usize = 256 << 20;

/// How the arena's budget is set.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Budget {
    /// Follows the headroom, leaving `reserve` (the default if `None`) to everything else.
    Auto {
        reserve: Option<usize>,
        max: usize,
    },
    Fixed(usize),
}

#[derive(Debug)]
struct Soft {
    runtime: Option<SoftRuntime>,
    budget: Budget,
    /// The reserve of the `auto` budget in force (for stats).
    reserve: usize,
}

static SOFT: Mutex<Soft> = Mutex::new(Soft {
    runtime: None,
    budget: Budget::Auto {
        reserve: None,
        max: MAX_BYTES,
    },
    reserve: 0,
});

/// The reserve when Python chose none: a quarter of what the process could take now (its
/// memory cgroups' limits and MemAvailable), between 32 and 256 MiB. A small cgroup keeps
/// most of its room for the cache; a large machine keeps 256 MiB free.
fn default_reserve() -> usize {
    (MemoryView::of_this_process().headroom() / 4).clamp(MIN_RESERVE, MAX_RESERVE)
}

/// A soft-memory error as text, with its causes.
pub(crate) fn describe(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

pub(crate) fn soft_error(e: SoftError) -> PyErr {
    SoftMemoryError::new_err(describe(&e))
}

/// Applies the budget mode to the live runtime.
fn apply(soft: &mut Soft) -> PyResult<()> {
    let Some(runtime) = &soft.runtime else {
        return Ok(());
    };
    match soft.budget {
        Budget::Fixed(bytes) => {
            runtime.stop_auto_budget();
            runtime.arena().set_budget(bytes);
        }
        Budget::Auto { reserve, max } => {
            let reserve = reserve.unwrap_or_else(default_reserve);
            runtime
                .start_auto_budget(AutoBudget::default().reserve(reserve).max(max))
                .map_err(|e| {
                    SoftMemoryError::new_err(format!(
                        "cannot start soft memory's budget thread: {e}"
                    ))
                })?;
            soft.reserve = reserve;
        }
    }
    Ok(())
}

/// The process's soft-memory arena, made on first use.
pub(crate) fn arena() -> PyResult<Arc<SoftArena>> {
    let mut soft = SOFT.lock();
    if let Some(r) = &soft.runtime {
        return Ok(r.arena().clone());
    }
    let budget = match soft.budget {
        Budget::Fixed(bytes) => bytes,
        Budget::Auto { .. } => INITIAL_AUTO_BUDGET,
    };
    let runtime = SoftRuntime::from_env(ArenaConfig::default().budget(budget).max_bytes(MAX_BYTES))
        .map_err(|e| {
            SoftMemoryError::new_err(format!(
            "{} (soft memory needs Linux 5.7 or later, memfd and userfaultfd; as a user, allow \
             userfaultfd with `sysctl vm.unprivileged_userfaultfd=1` or run as root)",
            describe(&e)
        ))
        })?;
    runtime.start_evacuator(0.02, 0.05).map_err(|e| {
        SoftMemoryError::new_err(format!("cannot start soft memory's evacuator thread: {e}"))
    })?;
    let arena = runtime.arena().clone();
    soft.runtime = Some(runtime);
    if let Err(e) = apply(&mut soft) {
        soft.runtime = None;
        return Err(e);
    }
    Ok(arena)
}

fn nonnegative(what: &str, v: Option<i64>) -> PyResult<Option<usize>> {
    match v {
        Some(n) if n < 0 => Err(PyValueError::new_err(format!(
            "{what} must be a number of bytes, 0 or more; got {n}"
        ))),
        Some(n) => Ok(Some(n as usize)),
        None => Ok(None),
    }
}

/// Sets how much memory soft memory may use.
///
/// - `configure(budget=N)`: a fixed budget of N bytes (rounded up to 2 MiB segments, at least
///   one); values beyond it are dropped at once. `budget=0` drops all but the newest segment:
///   a way to see reconstructors at work.
/// - `configure(reserve=N, max=M)`: an automatic budget that grows into idle memory while
///   leaving N bytes to everything else (in the process's memory cgroups and the machine),
///   is cut at once when less is left, and never exceeds M bytes.
/// - `configure()`: back to the default, an automatic budget whose reserve is a quarter of
///   the memory the process could take when soft memory is first used (32 to 256 MiB).
#[pyfunction]
#[pyo3(signature = (*, reserve=None, max=None, budget=None))]
fn configure(reserve: Option<i64>, max: Option<i64>, budget: Option<i64>) -> PyResult<()> {
    let reserve = nonnegative("reserve", reserve)?;
    let max = nonnegative("max", max)?;
    let budget = nonnegative("budget", budget)?;
    if budget.is_some() && (reserve.is_some() || max.is_some()) {
        return Err(PyValueError::new_err(
            "give either budget= (a fixed budget) or reserve= and max= (an automatic one), not \
             both",
        ));
    }
    let mode = match budget {
        Some(b) => Budget::Fixed(b),
        None => Budget::Auto {
            reserve,
            max: max.unwrap_or(MAX_BYTES).min(MAX_BYTES),
        },
    };
    let mut soft = SOFT.lock();
    soft.budget = mode;
    apply(&mut soft)
}

/// Called in a child after fork (os.register_at_fork): the parent's arena is not mapped here,
/// so structures made from now on get a new one. Structures made before the fork keep the
/// parent's, in which nothing can be held (the Python layer replaces its maps).
#[pyfunction]
fn _after_fork_in_child() {
    // Nothing holds this lock across a fork: every taker holds the GIL, as does the forking
    // thread. `try_lock` all the same: if it were held, the old arena stays.
    if let Some(mut soft) = SOFT.try_lock() {
        // Forgotten, not dropped: its threads are the parent's (none runs here), and a lock
        // of theirs may have been held at the fork.
        std::mem::forget(soft.runtime.take());
    }
}

/// Bytes this process could still take: the least of MemAvailable and, for each of its memory
/// cgroups, the limit less the usage.
#[pyfunction]
fn headroom() -> usize {
    MemoryView::of_this_process().headroom()
}

/// Soft memory's state: the budget and what is used of it, how it is set, what the arena has
/// done, and each live structure's hits, misses and reconstructions.
#[pyfunction]
fn stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let arena = arena()?;
    let d = PyDict::new(py);
    let (mode, reserve, max) = {
        let soft = SOFT.lock();
        match soft.budget {
            Budget::Fixed(_) => ("fixed", None, None),
            Budget::Auto { max, .. } => ("auto", Some(soft.reserve), Some(max)),
        }
    };
    d.set_item("budget", arena.budget())?;
    d.set_item("used", arena.usage())?;
    d.set_item("capacity", arena.capacity())?;
    d.set_item("mode", mode)?;
    d.set_item("reserve", reserve)?;
    d.set_item("max", max)?;
    let c = arena.counters();
    d.set_item("segments_populated", c.segments_populated.load(Relaxed))?;
    d.set_item("segments_evicted", c.segments_evicted.load(Relaxed))?;
    d.set_item("direct_evictions", c.direct_evictions.load(Relaxed))?;
    d.set_item("segments_revoked", c.segments_revoked.load(Relaxed))?;
    d.set_item("bytes_allocated", c.bytes_allocated.load(Relaxed))?;
    let structures = map::live_stats(py)?;
    let (mut hits, mut misses, mut rebuilt) = (0u64, 0u64, 0u64);
    for s in &structures {
        hits += s.1.hits;
        misses += s.1.misses;
        rebuilt += s.1.reconstructions;
    }
    d.set_item("hits", hits)?;
    d.set_item("misses", misses)?;
    d.set_item("reconstructions", rebuilt)?;
    let list = structures
        .into_iter()
        .map(|(dict, _)| dict)
        .collect::<Vec<_>>();
    d.set_item("structures", list)?;
    Ok(d)
}

#[pymodule]
fn _tidepool(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // The wheel's version: maturin takes the distribution's from this crate's Cargo.toml (the
    // workspace's). Equal as long as it is a plain x.y.z (maturin would spell a pre-release
    // the PEP 440 way); scripts/test-python checks it against the installed distribution's.
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(headroom, m)?)?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    m.add_function(wrap_pyfunction!(_after_fork_in_child, m)?)?;
    m.add_class::<map::SoftBytesMap>()?;
    m.add_class::<far::FarArray>()?;
    m.add_class::<map::ValueView>()?;
    m.add("SoftMemoryError", py.get_type::<SoftMemoryError>())?;
    m.add("FarMemoryError", py.get_type::<FarMemoryError>())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_reserve_is_bounded() {
        let r = default_reserve();
        assert!((MIN_RESERVE..=MAX_RESERVE).contains(&r), "{r}");
    }

    #[test]
    fn errors_carry_their_causes() {
        let e = SoftError::Arena(std::io::Error::other("no memfd"));
        assert_eq!(
            describe(&e),
            "cannot create the soft-memory arena: no memfd"
        );
    }
}
