//! Empty arenas kept resident for reuse are given back once they have sat empty for a whole
//! trim period, without anyone calling `malloc_trim` (mimalloc's delayed purge). Alone in its
//! process: it reads the allocator's global figures.

use std::ffi::c_void;
use std::time::{Duration, Instant};
use tidepool_alloc::api;
use tidepool_alloc::classes::class_of;

fn churn(n: usize, size: usize) {
    let blocks: Vec<usize> = (0..n).map(|_| api::malloc(size) as usize).collect();
    // SAFETY: live allocations, each freed once.
    blocks
        .into_iter()
        .for_each(|p| unsafe { api::free(p as *mut c_void) });
}

#[test]
fn empty_arenas_are_purged_after_a_delay() {
    let c = class_of(200);
    let resident = || tidepool_alloc::stats().classes[c].resident;
    // Fill a dozen arenas of one class, free everything and give the thread's arenas up: the
    // empty ones stay resident, within the retained budget, for reuse.
    churn(20_000, 200);
    tidepool_alloc::release_thread_arenas();
    let before = resident();
    assert!(
        before > 2 << 20,
        "the arenas should be resident ({before} bytes)"
    );
    // Keep working in another class, in the same few arenas: its slow paths run the periodic
    // trim, and nothing else would give those pages back.
    let start = Instant::now();
    while resident() > before / 4 && start.elapsed() < Duration::from_secs(5) {
        churn(20_000, 48);
        std::thread::sleep(Duration::from_millis(5));
    }
    let after = resident();
    assert!(
        after <= before / 4,
        "empty arenas still hold {after} of {before} bytes after {:?}",
        start.elapsed()
    );
}
