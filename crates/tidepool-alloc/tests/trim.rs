//! RSS after freeing everything, alone in its own process: it measures the whole process's
//! resident memory, which any other test in the same process would disturb.

use std::ffi::c_void;
use tidepool_alloc::api;

fn fill(p: *mut c_void, n: usize, seed: u8) {
    // SAFETY: callers pass a live block of at least `n` bytes.
    unsafe { std::ptr::write_bytes(p as *mut u8, seed, n) };
}

#[test]
fn empty_arenas_go_back_to_the_os() {
    // Allocate ~64 MiB of small objects, free them all, trim: RSS must drop back.
    let rss = || -> usize {
        let s = std::fs::read_to_string("/proc/self/statm").unwrap();
        s.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<usize>()
            .unwrap()
            * 4096
    };
    // Start from a trimmed process: earlier tests leave memory this one would otherwise reuse.
    tidepool_alloc::release_thread_arenas();
    api::trim();
    let base = rss();
    let blocks: Vec<usize> = (0..400_000)
        .map(|i| {
            let n = 96 + (i % 5) * 16;
            let p = api::malloc(n);
            fill(p, n, 2);
            p as usize
        })
        .collect();
    let peak = rss();
    assert!(
        peak > base + (40 << 20),
        "the blocks should have cost RSS ({base} -> {peak})"
    );
    // SAFETY: live allocations, each freed once.
    blocks
        .into_iter()
        .for_each(|p| unsafe { api::free(p as *mut c_void) });
    tidepool_alloc::release_thread_arenas();
    api::trim();
    let after = rss();
    let retained = (peak - base) / 4;
    assert!(
        after < base + retained,
        "RSS stayed at {} MiB after freeing everything (baseline {} MiB, peak {} MiB)",
        after >> 20,
        base >> 20,
        peak >> 20
    );
}
