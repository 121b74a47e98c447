//! The large-object path's cache of freed mappings. Alone in its process: the cache is global.

use std::ffi::c_void;
use tidepool_alloc::api;

const MIB: usize = 1 << 20;

fn touch(p: *mut c_void, n: usize) {
    // SAFETY: callers pass a live block of at least `n` bytes.
    unsafe { std::ptr::write_bytes(p as *mut u8, 0x5a, n) };
}

#[test]
fn a_cached_mapping_serves_a_smaller_object_whole_down_to_a_quarter_of_its_size() {
    // Before the allocator's first use: a trim period long enough that a slow machine cannot
    // purge the cached mapping between the steps below.
    std::env::set_var("TIDEPOOL_ALLOC_TRIM_MS", "3600000");
    // A 16 MiB buffer, its pages made resident, then freed: the cache keeps the mapping.
    let big = api::malloc(16 * MIB);
    assert!(!big.is_null());
    touch(big, 16 * MIB);
    // SAFETY: live, freed once.
    unsafe { api::free(big) };

    // A 5 MiB object takes the same mapping, and all of it: the 11 MiB past the object stay
    // mapped for the next larger object rather than being faulted in again.
    let mid = api::malloc(5 * MIB);
    assert_eq!(mid, big, "the cached mapping should be reused");
    // SAFETY: a live allocation.
    let usable = unsafe { api::usable_size(mid) };
    assert!(
        usable >= 16 * MIB - 4096,
        "the whole mapping should serve it: {usable} bytes usable"
    );
    touch(mid, usable);
    // SAFETY: live, freed once.
    unsafe { api::free(mid) };

    // A 3 MiB object is less than a quarter of the mapping: the tail goes back to the system.
    let small = api::malloc(3 * MIB);
    assert_eq!(small, big, "the cached mapping should be reused");
    // SAFETY: a live allocation.
    let usable = unsafe { api::usable_size(small) };
    assert!(
        (3 * MIB..4 * MIB).contains(&usable),
        "the tail past the object should have been given back: {usable} bytes usable"
    );
    touch(small, usable);
    // SAFETY: live, freed once.
    unsafe { api::free(small) };
}
