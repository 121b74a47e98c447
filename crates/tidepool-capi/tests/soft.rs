//! The C interface to soft memory, called as a C program would (raw pointers, C callbacks).

use std::ffi::{c_int, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tidepool::soft::*;
use tidepool::{tp_last_error, tp_status};

fn last_error() -> String {
    // SAFETY: tp_last_error returns a valid C string for this thread.
    unsafe { CStr::from_ptr(tp_last_error()) }
        .to_string_lossy()
        .into_owned()
}

static CALLS: AtomicU64 = AtomicU64::new(0);

/// Rebuilds an 8-byte object: the square of the u64 at `args`; fails for 13.
unsafe extern "C" fn square(
    _user: *mut c_void,
    args: *const c_void,
    out: *mut c_void,
    size: usize,
) -> c_int {
    CALLS.fetch_add(1, Relaxed);
    assert_eq!(size, 8);
    // SAFETY: the tests pass a u64 as args and the pool's objects are 8 bytes.
    unsafe {
        let n = *(args as *const u64);
        if n == 13 {
            return 7;
        }
        *(out as *mut u64) = n * n;
    }
    0
}

#[test]
fn pools_rebuild_objects_from_the_readers_arguments() {
    let arena = tp_arena_new(16 << 20, 0);
    assert!(!arena.is_null(), "{}", last_error());
    // SAFETY: handles from this library, used while alive, buffers of the stated sizes.
    unsafe {
        let pool = tp_soft_pool_new(arena, 8, Some(square), null_mut());
        assert!(!pool.is_null(), "{}", last_error());
        let b = tp_soft_box_new(pool);
        let mut out = 0u64;
        let args = 12u64;
        let before = CALLS.load(Relaxed);
        assert_eq!(
            tp_soft_box_read(
                b,
                &args as *const u64 as *const c_void,
                &mut out as *mut u64 as *mut c_void
            ),
            tp_status::TP_OK
        );
        assert_eq!(out, 144);
        // Cached now: a read with other arguments still gives the cached object.
        let other = 3u64;
        assert_eq!(
            tp_soft_box_read(
                b,
                &other as *const u64 as *const c_void,
                &mut out as *mut u64 as *mut c_void
            ),
            tp_status::TP_OK
        );
        assert_eq!(out, 144);
        assert_eq!(CALLS.load(Relaxed) - before, 1);
        let v = 5u64;
        assert_eq!(
            tp_soft_box_write(b, &v as *const u64 as *const c_void),
            tp_status::TP_OK
        );
        tp_soft_box_read(
            b,
            &args as *const u64 as *const c_void,
            &mut out as *mut u64 as *mut c_void,
        );
        assert_eq!(out, 5);
        // A failing reconstruction is an error with the callback's code, and caches nothing.
        let b2 = tp_soft_box_new(pool);
        let bad = 13u64;
        assert_eq!(
            tp_soft_box_read(
                b2,
                &bad as *const u64 as *const c_void,
                &mut out as *mut u64 as *mut c_void
            ),
            tp_status::TP_ERECONSTRUCT
        );
        assert!(last_error().contains("returned 7"), "{}", last_error());
        let mut s = tp_stats::default();
        assert_eq!(tp_soft_pool_stats(pool, &mut s), tp_status::TP_OK);
        assert_eq!((s.reconstructions, s.reconstruct_failures), (1, 1));
        assert!(s.hits >= 2);
        // Null handles are errors, not crashes.
        assert_eq!(
            tp_soft_box_read(
                std::ptr::null(),
                std::ptr::null(),
                &mut out as *mut u64 as *mut c_void
            ),
            tp_status::TP_EINVAL
        );
        assert!(tp_soft_pool_new(arena, 8, None, null_mut()).is_null());
        assert!(
            last_error().contains("reconstruct callback"),
            "{}",
            last_error()
        );
        tp_soft_box_free(b);
        tp_soft_box_free(b2);
        tp_soft_pool_free(pool);
        tp_arena_free(arena);
    }
}

/// Rebuilds a map value: "value-" followed by the key; fails for the key "bad".
unsafe extern "C" fn value_of(
    user: *mut c_void,
    key: *const u8,
    len: usize,
    out: *mut tp_buf,
) -> c_int {
    // SAFETY: user is the counter the test registered; key has len bytes; out is live.
    unsafe {
        (*(user as *const AtomicU64)).fetch_add(1, Relaxed);
        let k = std::slice::from_raw_parts(key, len);
        if k == b"bad" {
            return -9;
        }
        tp_buf_append(out, b"value-".as_ptr() as *const c_void, 6);
        tp_buf_append(out, key as *const c_void, len);
    }
    0
}

#[test]
fn maps_of_bytes_with_and_without_a_reconstructor() {
    let arena = tp_arena_new(16 << 20, 0);
    let calls = AtomicU64::new(0);
    // SAFETY: handles from this library, used while alive, buffers of the stated sizes; the
    // counter outlives the map.
    unsafe {
        let m = tp_soft_map_new(
            arena,
            Some(value_of),
            &calls as *const AtomicU64 as *mut c_void,
        );
        let mut buf = [0u8; 64];
        let mut len = 0usize;
        let key = b"k1";
        let get = |k: &[u8], buf: &mut [u8], len: &mut usize| {
            tp_soft_map_get(
                m,
                k.as_ptr() as *const c_void,
                k.len(),
                buf.as_mut_ptr() as *mut c_void,
                buf.len(),
                len,
            )
        };
        assert_eq!(get(key, &mut buf, &mut len), tp_status::TP_OK);
        assert_eq!(&buf[..len], b"value-k1");
        assert_eq!(get(key, &mut buf, &mut len), tp_status::TP_OK);
        assert_eq!(calls.load(Relaxed), 1, "the second read hits");
        // Too small a buffer says how much is needed.
        let mut small = [0u8; 3];
        assert_eq!(get(key, &mut small, &mut len), tp_status::TP_ETOOSMALL);
        assert_eq!(len, 8);
        assert_eq!(get(b"bad", &mut buf, &mut len), tp_status::TP_ERECONSTRUCT);
        let v = b"direct";
        assert_eq!(
            tp_soft_map_insert(
                m,
                b"k2".as_ptr() as *const c_void,
                2,
                v.as_ptr() as *const c_void,
                v.len()
            ),
            tp_status::TP_OK
        );
        assert_eq!(get(b"k2", &mut buf, &mut len), tp_status::TP_OK);
        assert_eq!(&buf[..len], b"direct");
        assert_eq!(tp_soft_map_len(m), 2);
        assert_eq!(
            tp_soft_map_remove(m, b"k2".as_ptr() as *const c_void, 2),
            tp_status::TP_OK
        );
        assert_eq!(
            tp_soft_map_remove(m, b"k2".as_ptr() as *const c_void, 2),
            tp_status::TP_NOT_FOUND
        );
        let mut s = tp_stats::default();
        tp_soft_map_stats(m, &mut s);
        assert_eq!(s.reconstructions, 1);
        tp_soft_map_free(m);
        // Without a reconstructor, a missing key is just absent.
        let plain = tp_soft_map_new(arena, None, null_mut());
        assert_eq!(
            tp_soft_map_get(
                plain,
                b"x".as_ptr() as *const c_void,
                1,
                buf.as_mut_ptr() as *mut c_void,
                64,
                &mut len
            ),
            tp_status::TP_NOT_FOUND
        );
        tp_soft_map_free(plain);
        tp_arena_free(arena);
    }
}

/// Rebuilds array element i: i as a decimal string.
unsafe extern "C" fn decimal(_user: *mut c_void, index: usize, out: *mut tp_buf) -> c_int {
    let s = index.to_string();
    // SAFETY: out is the live buffer passed in.
    unsafe { tp_buf_append(out, s.as_ptr() as *const c_void, s.len()) };
    0
}

#[test]
fn arrays_rebuild_elements_by_index_even_after_their_memory_is_taken() {
    let arena = tp_arena_new(16 << 20, 0);
    // SAFETY: handles from this library, used while alive, buffers of the stated sizes.
    unsafe {
        let a = tp_soft_array_new(arena, 10_000, Some(decimal), null_mut());
        let mut buf = [0u8; 32];
        let mut len = 0;
        for i in [0usize, 7, 9999] {
            assert_eq!(
                tp_soft_array_get(a, i, buf.as_mut_ptr() as *mut c_void, 32, &mut len),
                tp_status::TP_OK
            );
            assert_eq!(&buf[..len], i.to_string().as_bytes());
        }
        assert_eq!(
            tp_soft_array_set(a, 7, b"seven".as_ptr() as *const c_void, 5),
            tp_status::TP_OK
        );
        // Take all soft memory back: every element is rebuilt, never read as garbage.
        assert_eq!(tp_arena_set_budget(arena, 0), tp_status::TP_OK);
        tp_arena_set_budget(arena, 16 << 20);
        for i in [0usize, 9999] {
            assert_eq!(
                tp_soft_array_get(a, i, buf.as_mut_ptr() as *mut c_void, 32, &mut len),
                tp_status::TP_OK
            );
            assert_eq!(&buf[..len], i.to_string().as_bytes());
        }
        assert_eq!(
            tp_soft_array_get(a, 10_000, buf.as_mut_ptr() as *mut c_void, 32, &mut len),
            tp_status::TP_EINVAL
        );
        assert_eq!(tp_soft_array_len(a), 10_000);
        tp_soft_array_free(a);
        tp_arena_free(arena);
    }
}

#[test]
fn compare_and_exchange_is_atomic_across_threads() {
    let arena = tp_arena_new(16 << 20, 0);
    // SAFETY: handles from this library, used while alive (the threads end before the frees),
    // buffers of the stated sizes.
    unsafe {
        // An array element and a box, each incremented by 4 threads with cmpxchg loops: no
        // increment may be lost.
        let a = tp_soft_array_new(arena, 4, Some(decimal), null_mut());
        let pool = tp_soft_pool_new(arena, 8, Some(square), null_mut());
        let b = tp_soft_box_new(pool);
        let zero = 0u64;
        assert_eq!(
            tp_soft_box_cmpxchg(b, &zero as *const u64 as _, &zero as *const u64 as _),
            tp_status::TP_NOT_FOUND,
            "a box never written has nothing to compare"
        );
        tp_soft_box_write(b, &zero as *const u64 as _);
        let (aa, bb) = (a as usize, b as usize);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    let (a, b) = (aa as *const tp_soft_array, bb as *const tp_soft_box);
                    for _ in 0..500 {
                        loop {
                            let mut buf = [0u8; 32];
                            let mut len = 0;
                            let s = tp_soft_array_get(a, 1, buf.as_mut_ptr() as _, 32, &mut len);
                            assert_eq!(s, tp_status::TP_OK);
                            let n: u64 = std::str::from_utf8(&buf[..len]).unwrap().parse().unwrap();
                            let next = (n + 1).to_string();
                            let s = tp_soft_array_cmpxchg(
                                a,
                                1,
                                buf.as_ptr() as _,
                                len,
                                next.as_ptr() as _,
                                next.len(),
                            );
                            if s == tp_status::TP_OK {
                                break;
                            }
                            assert_eq!(s, tp_status::TP_MISMATCH);
                        }
                        loop {
                            let mut cur = 0u64;
                            let arg = 0u64;
                            let s = tp_soft_box_read(
                                b,
                                &arg as *const u64 as _,
                                &mut cur as *mut u64 as _,
                            );
                            assert_eq!(s, tp_status::TP_OK);
                            let next = cur + 1;
                            let s = tp_soft_box_cmpxchg(
                                b,
                                &cur as *const u64 as _,
                                &next as *const u64 as _,
                            );
                            if s == tp_status::TP_OK {
                                break;
                            }
                            assert_eq!(s, tp_status::TP_MISMATCH);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut buf = [0u8; 32];
        let mut len = 0;
        tp_soft_array_get(a, 1, buf.as_mut_ptr() as _, 32, &mut len);
        assert_eq!(&buf[..len], b"2001");
        let mut cur = 0u64;
        tp_soft_box_read(b, &zero as *const u64 as _, &mut cur as *mut u64 as _);
        assert_eq!(cur, 2000);
        let other = 5u64;
        assert_eq!(
            tp_soft_box_cmpxchg(b, &other as *const u64 as _, &zero as *const u64 as _),
            tp_status::TP_MISMATCH
        );
        tp_soft_box_free(b);
        tp_soft_pool_free(pool);
        tp_soft_array_free(a);
        tp_arena_free(arena);
    }
}

/// Rebuilds element i as 1 + element i - 64 (0 below 64), reading the array itself: `user`
/// points to a cell holding the array's handle.
unsafe extern "C" fn chained(user: *mut c_void, index: usize, out: *mut tp_buf) -> c_int {
    let mut v = 0u64;
    if index >= 64 {
        // SAFETY: `user` holds the live array's handle; the buffer is 8 bytes.
        unsafe {
            let a = (*(user as *const std::cell::Cell<*const tp_soft_array>)).get();
            let mut len = 0;
            let s = tp_soft_array_get(a, index - 64, &mut v as *mut u64 as _, 8, &mut len);
            if s != tp_status::TP_OK {
                return 1;
            }
        }
        v += 1;
    }
    // SAFETY: out is the live buffer passed in.
    unsafe { tp_buf_append(out, &v as *const u64 as _, 8) };
    0
}

#[test]
fn a_reconstructor_may_read_its_own_array() {
    let arena = tp_arena_new(16 << 20, 0);
    // SAFETY: handles from this library, used while alive; the cell outlives the array.
    unsafe {
        let cell = Box::new(std::cell::Cell::new(std::ptr::null::<tp_soft_array>()));
        let a = tp_soft_array_new(arena, 1000, Some(chained), &*cell as *const _ as _);
        cell.set(a);
        // Element 960 is rebuilt from 896, ... from 0: all in one lock stripe.
        let mut v = 0u64;
        let mut len = 0;
        let s = tp_soft_array_get(a, 960, &mut v as *mut u64 as _, 8, &mut len);
        assert_eq!(s, tp_status::TP_OK);
        assert_eq!(v, 15);
        let (old, new) = (15u64, 16u64);
        tp_arena_set_budget(arena, 0);
        tp_arena_set_budget(arena, 16 << 20);
        let s = tp_soft_array_cmpxchg(
            a,
            960,
            &old as *const u64 as _,
            8,
            &new as *const u64 as _,
            8,
        );
        assert_eq!(s, tp_status::TP_OK);
        tp_soft_array_get(a, 960, &mut v as *mut u64 as _, 8, &mut len);
        assert_eq!(v, 16);
        tp_soft_array_free(a);
        tp_arena_free(arena);
    }
}
