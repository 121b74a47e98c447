//! The medium heap (requests above 8 KiB up to 32 KiB) in a process of its own, so its global
//! counters see only this test: freed neighbours merge and the space is reused, frees from
//! other threads work, and malloc_trim gives the wilderness back.

use std::ffi::c_void;
use tidepool_alloc::api;

fn fill(p: *mut c_void, n: usize, seed: u8) {
    // SAFETY: `p` holds `n` writable bytes.
    unsafe { std::ptr::write_bytes(p as *mut u8, seed, n) };
}

fn intact(p: *const c_void, n: usize, seed: u8) -> bool {
    // SAFETY: `p` holds `n` readable bytes.
    unsafe { std::slice::from_raw_parts(p as *const u8, n) }
        .iter()
        .all(|&b| b == seed)
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn medium_heap_merges_reuses_and_gives_back() {
    // Rounds of mixed sizes freed in a scrambled order: every round fits in what the first one
    // carved, because freed neighbours merge back into chunks (and into the wilderness).
    let sizes: Vec<usize> = (0..2000).map(|i| 8193 + (i * 7919) % 24_000).collect();
    let mut carved_after_first = 0;
    for round in 0..5u8 {
        let blocks: Vec<(usize, usize)> = sizes
            .iter()
            .map(|&n| {
                let p = api::malloc(n);
                assert!(!p.is_null());
                // SAFETY: a live allocation.
                assert!(unsafe { api::usable_size(p) } >= n);
                fill(p, n, round);
                (p as usize, n)
            })
            .collect();
        let mut order: Vec<usize> = (0..blocks.len()).collect();
        order.sort_by_key(|&i| (i * 2654435761) % blocks.len());
        for i in order {
            let (p, n) = blocks[i];
            assert!(
                intact(p as *const c_void, n, round),
                "round {round}: block {i} changed"
            );
            // SAFETY: allocated above, freed once.
            unsafe { api::free(p as *mut c_void) };
        }
        let s = tidepool_alloc::stats();
        assert_eq!(s.medium_allocs - s.medium_frees, 0);
        assert_eq!(s.medium_in_use, 0);
        if round == 0 {
            carved_after_first = s.medium_carved;
            assert!(carved_after_first > 0);
        } else {
            assert_eq!(
                s.medium_carved, carved_after_first,
                "round {round} grew the heap"
            );
        }
    }

    // Freed by another thread than the one that allocated.
    let ptrs: Vec<usize> = (0..500)
        .map(|i| api::malloc(9000 + i * 40) as usize)
        .collect();
    std::thread::spawn(move || {
        for p in ptrs {
            // SAFETY: live allocations handed over to this thread.
            unsafe { api::free(p as *mut c_void) };
        }
    })
    .join()
    .unwrap();
    assert_eq!(tidepool_alloc::stats().medium_in_use, 0);

    // 64 MiB of medium objects, all freed, then malloc_trim: the pages go back.
    let big: Vec<usize> = (0..4096)
        .map(|_| {
            let p = api::malloc(16 << 10);
            fill(p, 16 << 10, 1);
            p as usize
        })
        .collect();
    let full = rss_kib();
    for p in big {
        // SAFETY: allocated above, freed once.
        unsafe { api::free(p as *mut c_void) };
    }
    api::trim();
    let trimmed = rss_kib();
    assert!(
        trimmed + 48 * 1024 < full,
        "RSS {full} KiB before, {trimmed} KiB after freeing 64 MiB and trimming"
    );
}
