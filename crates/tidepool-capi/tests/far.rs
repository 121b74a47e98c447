//! The C interface to far vectors, far blocks and pager regions, called as a C program would.

use std::ffi::{c_void, CStr};
use tidepool::far::*;
use tidepool::pager::*;
use tidepool::{tp_last_error, tp_status};

fn last_error() -> String {
    // SAFETY: tp_last_error returns a valid C string for this thread.
    unsafe { CStr::from_ptr(tp_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn far_vectors_larger_than_their_section_read_back_what_was_written() {
    // SAFETY: every handle comes from its constructor, is used while live and freed once;
    // buffers have the lengths passed.
    unsafe {
        let far = tp_far_open(c"local:".as_ptr());
        assert!(!far.is_null(), "{}", last_error());
        // 8 lines of 256 bytes, for 100k 12-byte elements (1.2 MB): most live far, and
        // elements straddle lines.
        let sec = tp_section_new(tp_structure::TP_SET_ASSOCIATIVE, 4, 256, 8 * 256);
        assert!(!sec.is_null(), "{}", last_error());
        let v = tp_far_vec_new(far, sec, 12, 100_000);
        assert!(!v.is_null(), "{}", last_error());
        assert_eq!(tp_far_vec_len(v), 100_000);
        let elem = |i: u32| [i, i.wrapping_mul(3), !i];
        for i in 0..100_000u32 {
            let e = elem(i);
            let s = tp_far_vec_write(v, i as usize, 1, e.as_ptr() as *const c_void);
            assert_eq!(s, tp_status::TP_OK, "{}", last_error());
        }
        assert_eq!(tp_far_vec_flush(v), tp_status::TP_OK);
        let mut out = vec![[0u32; 3]; 1000];
        for first in (0..100_000).step_by(1000).rev() {
            let s = tp_far_vec_read(v, first, 1000, out.as_mut_ptr() as *mut c_void);
            assert_eq!(s, tp_status::TP_OK, "{}", last_error());
            for (j, e) in out.iter().enumerate() {
                assert_eq!(*e, elem((first + j) as u32));
            }
        }
        let mut st = tp_section_stats::default();
        assert_eq!(tp_section_stats_get(sec, &mut st), tp_status::TP_OK);
        assert!(st.fetched > 0 && st.writebacks > 0, "{st:?}");

        // Out of bounds: an error with a message, nothing written.
        let e = [0u32; 3];
        let s = tp_far_vec_write(v, 100_000, 1, e.as_ptr() as *const c_void);
        assert_eq!(s, tp_status::TP_EINVAL);
        assert!(last_error().contains("out of bounds"), "{}", last_error());
        let s = tp_far_vec_read(v, usize::MAX, 2, out.as_mut_ptr() as *mut c_void);
        assert_eq!(s, tp_status::TP_EINVAL);

        tp_far_vec_free(v);
        tp_section_free(sec);
        tp_far_free(far);
    }
}

#[test]
fn far_blocks_fetch_only_the_lines_a_read_needs() {
    // SAFETY: as above.
    unsafe {
        let far = tp_far_open(c"local:?compress=lz4".as_ptr());
        assert!(!far.is_null(), "{}", last_error());
        let sec = tp_section_new(tp_structure::TP_FULLY_ASSOCIATIVE, 0, 4096, 4 * 4096);
        let b = tp_far_block_new(far, sec, 1 << 20);
        assert!(!b.is_null(), "{}", last_error());
        assert_eq!(tp_far_block_size(b), 1 << 20);
        let data: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
        let s = tp_far_block_write(b, 0, data.as_ptr() as *const c_void, data.len());
        assert_eq!(s, tp_status::TP_OK, "{}", last_error());
        assert_eq!(tp_far_block_flush(b), tp_status::TP_OK);
        let mut before = tp_section_stats::default();
        tp_section_stats_get(sec, &mut before);
        let mut out = [0u8; 100];
        let s = tp_far_block_read(b, 500_000, out.as_mut_ptr() as *mut c_void, 100);
        assert_eq!(s, tp_status::TP_OK, "{}", last_error());
        assert_eq!(&out[..], &data[500_000..500_100]);
        let mut after = tp_section_stats::default();
        tp_section_stats_get(sec, &mut after);
        assert!(
            after.fetched - before.fetched <= 2,
            "{before:?} -> {after:?}"
        );
        let s = tp_far_block_read(b, (1 << 20) - 50, out.as_mut_ptr() as *mut c_void, 100);
        assert_eq!(s, tp_status::TP_EINVAL, "{}", last_error());
        tp_far_block_free(b);
        tp_section_free(sec);
        tp_far_free(far);
    }
}

#[test]
fn bad_arguments_get_messages_not_crashes() {
    // SAFETY: as above; nulls are what is being tested.
    unsafe {
        assert!(tp_far_open(c"nosuch://x".as_ptr()).is_null());
        assert!(last_error().contains("unknown scheme"), "{}", last_error());
        assert!(tp_far_open(std::ptr::null()).is_null());
        assert!(tp_section_new(tp_structure::TP_DIRECT, 0, 12, 4096).is_null());
        assert!(!last_error().is_empty());
        let far = tp_far_open(c"local:".as_ptr());
        assert!(tp_far_vec_new(far, std::ptr::null(), 8, 10).is_null());
        let sec = tp_section_new(tp_structure::TP_DIRECT, 0, 64, 4096);
        assert!(tp_far_vec_new(far, sec, 0, 10).is_null());
        assert!(tp_far_vec_new(far, sec, usize::MAX, 2).is_null());
        assert!(last_error().contains("overflow"), "{}", last_error());
        assert_eq!(tp_far_vec_flush(std::ptr::null()), tp_status::TP_EINVAL);
        assert!(tp_pager_start(std::ptr::null(), 1 << 20).is_null());
        tp_far_vec_free(std::ptr::null_mut());
        tp_far_block_free(std::ptr::null_mut());

        // A section is its thread's: another thread gets an error, not a data race.
        let v = tp_far_vec_new(far, sec, 8, 10);
        assert!(!v.is_null(), "{}", last_error());
        let addr = v as usize;
        let (status, msg) = std::thread::spawn(move || {
            let mut x = 0u64;
            let s = tp_far_vec_read(addr as *const tp_far_vec, 0, 1, &mut x as *mut u64 as _);
            (s, last_error())
        })
        .join()
        .unwrap();
        assert_eq!(status, tp_status::TP_EINVAL);
        assert!(msg.contains("thread"), "{msg}");
        tp_far_vec_free(v);
        tp_section_free(sec);
        tp_far_free(far);
    }
}

#[test]
fn a_pager_region_is_ordinary_memory_larger_than_its_budget() {
    // SAFETY: as above; the region's pointer is used within its length while it lives.
    unsafe {
        let pager = tp_pager_start(c"local:".as_ptr(), 1 << 20);
        assert!(!pager.is_null(), "{}", last_error());
        let r = tp_region_new(pager, 16 << 20);
        assert!(!r.is_null(), "{}", last_error());
        let len = tp_region_len(r);
        assert_eq!(len, 16 << 20);
        let p = tp_region_ptr(r) as *mut u64;
        let words = len / 8;
        for i in (0..words).step_by(64) {
            *p.add(i) = i as u64 * 31 + 1;
        }
        for i in (0..words).step_by(64) {
            assert_eq!(*p.add(i), i as u64 * 31 + 1, "word {i}");
        }
        let mut st = tp_pager_stats::default();
        assert_eq!(tp_pager_stats_get(pager, &mut st), tp_status::TP_OK);
        assert!(st.evicted > 0 && st.far_fetches > 0, "{st:?}");
        // Faults are served before eviction makes room, so the pager may run over its budget
        // by a margin (64 pages at this size) while the evictor catches up; it never holds
        // anything like the region (16 times the budget).
        assert!(st.resident_pages <= 2 * st.budget_pages, "{st:?}");

        // Discarded pages read as zeros.
        assert_eq!(tp_region_discard(r, 0, 1 << 20), tp_status::TP_OK);
        assert_eq!(*p, 0);
        assert_eq!(tp_region_discard(r, len, 1), tp_status::TP_EINVAL);
        assert!(last_error().contains("past the region"), "{}", last_error());
        assert_eq!(tp_pager_set_budget(pager, 4 << 20), tp_status::TP_OK);
        tp_region_free(r);
        tp_pager_free(pager);
    }
}
