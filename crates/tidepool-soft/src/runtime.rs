//! The soft-memory runtime: what runs beside an arena. The arena ([`SoftArena`]) is a core
//! that knows nothing of threads, the environment or coordinators; a [`SoftRuntime`] owns the
//! threads that keep it in shape: the evacuator ([`crate::evacuator`]), an `auto` budget
//! ([`crate::budget`]) and the link to a coordinator ([`crate::coord`]). Dropping the runtime
//! stops them all (each within one of its looks: 20 ms for the evacuator, a heartbeat for the
//! link); dropping the arena stops them too.
//!
//! Applications, and the C and Python wrappers, make one with [`SoftRuntime::from_env`]: an
//! arena, joined to the coordinator the environment names (`TIDEPOOL_COORD`, with
//! `TIDEPOOL_APP` and `TIDEPOOL_WEIGHT`), if any.

use crate::arena::{ArenaConfig, SoftArena};
use crate::budget::{AutoBudget, AutoStepper};
use crate::coord::{self, CoordConfig, CoordLink};
use crate::{evacuator, SoftError};
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering::Release};
use std::sync::Arc;

/// An arena and the threads that run beside it (see the module docs).
#[derive(Debug)]
#[must_use = "dropping the runtime stops its evacuator, budget and coordinator link"]
pub struct SoftRuntime {
    arena: Arc<SoftArena>,
    /// Set when the runtime is dropped: every thread it started stops.
    stop: Arc<AtomicBool>,
    /// Bumped by every start and stop of an `auto` budget: a budget thread steps, holding
    /// the lock, while the number is the one it started with.
    auto_epoch: Arc<Mutex<u64>>,
    link: Mutex<Option<Arc<CoordLink>>>,
}

impl SoftRuntime {
    /// A runtime for `arena`, running nothing yet.
    pub fn new(arena: Arc<SoftArena>) -> SoftRuntime {
        SoftRuntime {
            arena,
            stop: Default::default(),
            auto_epoch: Default::default(),
            link: Mutex::new(None),
        }
    }

    /// A new arena with a runtime that has joined the coordinator the environment names, if
    /// any ([`CoordConfig::from_env`]; a link that cannot start is a warning, not an error).
    pub fn from_env(config: ArenaConfig) -> Result<SoftRuntime, SoftError> {
        let runtime = SoftRuntime::new(SoftArena::new(config)?);
        if let Some(config) = CoordConfig::from_env() {
            if let Err(e) = runtime.join_coordinator(config) {
                tracing::warn!("soft memory: cannot start the coordinator link: {e}");
            }
        }
        Ok(runtime)
    }

    /// The arena.
    pub fn arena(&self) -> &Arc<SoftArena> {
        &self.arena
    }

    /// Starts the evacuator thread: whenever free segments fall under `low` of the budget
    /// (allocation rings it then) it reclaims up to `high`.
    pub fn start_evacuator(&self, low: f64, high: f64) -> io::Result<()> {
        self.start_evacuators(low, high, 1)
    }

    /// [`SoftRuntime::start_evacuator`] with a pool of `threads` compacting victims in
    /// parallel (one pass scans and plans; the copying is split). The pool also serves
    /// [`SoftArena::evacuate`] calls.
    pub fn start_evacuators(&self, low: f64, high: f64, threads: usize) -> io::Result<()> {
        evacuator::start(&self.arena, low, high, threads, self.stop.clone())
    }

    /// Makes the budget `auto`: a thread follows the headroom (see [`crate::budget`]) until
    /// the runtime or the arena is dropped, the budget is made fixed again
    /// ([`SoftRuntime::stop_auto_budget`]) or another `auto` budget replaces this one.
    pub fn start_auto_budget(&self, auto: AutoBudget) -> io::Result<()> {
        let weak = Arc::downgrade(&self.arena);
        let mut stepper = AutoStepper::new(auto);
        let epochs = self.auto_epoch.clone();
        let epoch = {
            let mut e = epochs.lock();
            *e += 1;
            *e
        };
        std::thread::Builder::new()
            .name("tp-soft-budget".into())
            .spawn(move || loop {
                let Some(arena) = weak.upgrade() else { return };
                {
                    let current = epochs.lock();
                    if *current != epoch {
                        return;
                    }
                    stepper.step(&arena);
                }
                drop(arena);
                std::thread::sleep(stepper.interval());
            })?;
        Ok(())
    }

    /// Stops the `auto` budget, if one runs: when this returns, no step of it is under way
    /// and none will be taken, so the budget stays where it is until set again.
    pub fn stop_auto_budget(&self) {
        *self.auto_epoch.lock() += 1;
    }

    /// Hands the arena's budget to the coordinator at `config.socket` (see [`crate::coord`]);
    /// a thread keeps the link while the runtime and the arena live.
    pub fn join_coordinator(&self, config: CoordConfig) -> io::Result<Arc<CoordLink>> {
        let link = coord::join(&self.arena, config, self.stop.clone())?;
        *self.link.lock() = Some(link.clone());
        Ok(link)
    }

    /// The link to the coordinator, if the runtime joined one.
    pub fn coordinator(&self) -> Option<Arc<CoordLink>> {
        self.link.lock().clone()
    }
}

/// A runtime stands for its arena: `&runtime` serves where `&Arc<SoftArena>` is wanted
/// (making pools and structures), and the arena's methods are the runtime's.
impl std::ops::Deref for SoftRuntime {
    type Target = Arc<SoftArena>;

    fn deref(&self) -> &Arc<SoftArena> {
        &self.arena
    }
}

impl Drop for SoftRuntime {
    fn drop(&mut self) {
        self.stop.store(true, Release);
        self.stop_auto_budget();
        self.arena.low_space().ring();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::SEGMENT;
    use std::time::Duration;

    #[test]
    fn a_stopped_auto_budget_leaves_the_budget_alone() {
        let runtime = SoftRuntime::new(
            SoftArena::new(
                ArenaConfig::default()
                    .budget(8 * SEGMENT)
                    .max_bytes(64 * SEGMENT),
            )
            .unwrap(),
        );
        let arena = runtime.arena().clone();
        // A reserve larger than any machine's headroom: the auto budget cuts at once.
        let auto = AutoBudget::default()
            .reserve(1 << 50)
            .interval(Duration::from_millis(1));
        let cut_to_one_segment = || {
            let t = std::time::Instant::now();
            while arena.budget() != SEGMENT {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "the auto budget never cut"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        runtime.start_auto_budget(auto.clone()).unwrap();
        cut_to_one_segment();
        runtime.stop_auto_budget();
        arena.set_budget(5 * SEGMENT);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            arena.budget(),
            5 * SEGMENT,
            "a stopped auto budget moved it"
        );
        // A new auto budget replaces a running one (and only one thread steps).
        runtime.start_auto_budget(auto.clone()).unwrap();
        runtime.start_auto_budget(auto).unwrap();
        cut_to_one_segment();
        runtime.stop_auto_budget();
        arena.set_budget(3 * SEGMENT);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(arena.budget(), 3 * SEGMENT);
        // Dropped, the runtime takes its budget thread with it.
        runtime
            .start_auto_budget(
                AutoBudget::default()
                    .reserve(1 << 50)
                    .interval(Duration::from_millis(1)),
            )
            .unwrap();
        drop(runtime);
        arena.set_budget(4 * SEGMENT);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            arena.budget(),
            4 * SEGMENT,
            "a dropped runtime's budget moved it"
        );
    }
}
