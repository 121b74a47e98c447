//! The evacuator thread (Midas §4.2.2): whenever free segments fall under the low watermark
//! (allocation rings [`SoftArena::low_space`] then, and it looks every 20 ms anyway) it runs
//! an evacuation pass ([`SoftArena::reclaim`]) that frees up to the high watermark.

use crate::arena::{SoftArena, SEGMENT};
use std::sync::atomic::{AtomicBool, Ordering::Acquire};
use std::sync::Arc;
use std::time::Duration;

/// Starts the thread for `arena` with watermarks `low` and `high` (shares of the budget) and
/// `threads` copying in each pass. It stops when the arena is dropped or `stop` is set.
pub(crate) fn start(
    arena: &Arc<SoftArena>,
    low: f64,
    high: f64,
    threads: usize,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    arena.set_evacuation_threads(threads);
    arena.set_watermarks(low, high);
    let weak = Arc::downgrade(arena);
    std::thread::Builder::new()
        .name("tp-evacuator".into())
        .spawn(move || loop {
            if stop.load(Acquire) {
                return;
            }
            let Some(arena) = weak.upgrade() else { return };
            let (low, high) = arena.watermarks();
            let free = arena.free_segments();
            if free < low {
                arena.reclaim((high - free) * SEGMENT);
            }
            let idle = arena.low_space().clone();
            drop(arena);
            idle.wait(Duration::from_millis(20));
        })?;
    Ok(())
}
