//! An unpaged thread (a pager's own) never gets memory from the region or the page source, and
//! what it allocates frees cleanly, from it or from any other thread.

use tidepool_alloc::api;

fn in_region(p: *mut core::ffi::c_void) -> bool {
    let (base, len) = tidepool_alloc::region().expect("region reserved");
    (p as usize).wrapping_sub(base) < len
}

#[test]
fn unpaged_threads_allocate_outside_the_region() {
    // Reserve the region from an ordinary thread first.
    let warm = api::malloc(24);
    assert!(in_region(warm));
    // SAFETY: our own allocation.
    unsafe { api::free(warm) };

    let handed_over = std::thread::spawn(|| {
        tidepool_alloc::set_thread_unpaged(true);
        let mut kept = Vec::new();
        for &n in &[1usize, 24, 200, 3000, 20_000, 100_000, 1 << 21] {
            let p = api::calloc(1, n);
            assert!(!p.is_null(), "calloc({n}) failed on an unpaged thread");
            assert!(!in_region(p), "calloc({n}) came from the region");
            // SAFETY: `n` bytes were just allocated.
            let bytes = unsafe { core::slice::from_raw_parts_mut(p as *mut u8, n) };
            assert!(bytes.iter().all(|&b| b == 0), "calloc({n}) not zeroed");
            bytes.fill(0xa5);
            // SAFETY: our allocation, grown; the old contents must survive.
            let q = unsafe { api::realloc(p, n * 2) };
            assert!(!in_region(q));
            // SAFETY: at least `n` bytes.
            let bytes = unsafe { core::slice::from_raw_parts(q as *const u8, n) };
            assert!(bytes.iter().all(|&b| b == 0xa5), "realloc lost data at {n}");
            kept.push(q as usize);
        }
        let aligned = api::aligned_alloc(4096, 100);
        assert_eq!(aligned as usize % 4096, 0);
        assert!(!in_region(aligned));
        kept.push(aligned as usize);
        // Half freed here, half by another thread.
        for p in kept.drain(..4) {
            // SAFETY: live allocations of ours.
            unsafe { api::free(p as *mut _) };
        }
        tidepool_alloc::set_thread_unpaged(false);
        let back = api::malloc(24);
        assert!(in_region(back), "the thread did not return to the region");
        // SAFETY: our own allocation.
        unsafe { api::free(back) };
        kept
    })
    .join()
    .unwrap();
    for p in handed_over {
        // SAFETY: live allocations handed over by the thread that made them.
        unsafe { api::free(p as *mut _) };
    }
}
