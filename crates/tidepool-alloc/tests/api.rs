//! The malloc family's contract, through `tidepool_alloc::api` (the functions the preload
//! library exports). This test binary keeps glibc as its own allocator, so a bug here shows up
//! as a failed assertion rather than a crash of the test harness.

use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr;
use tidepool_alloc::api;
use tidepool_alloc::classes::{MAX_SMALL, PAGE};

fn fill(p: *mut c_void, n: usize, seed: u8) {
    // SAFETY: callers pass a live block of at least `n` bytes.
    unsafe { ptr::write_bytes(p as *mut u8, seed, n) };
}

fn check(p: *const c_void, n: usize, seed: u8) -> bool {
    // SAFETY: callers pass a live block of at least `n` bytes.
    let s = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
    s.iter().all(|&b| b == seed)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[test]
fn zero_sizes_give_unique_freeable_pointers() {
    let a = api::malloc(0);
    let b = api::malloc(0);
    assert!(!a.is_null() && !b.is_null());
    assert_ne!(a, b, "malloc(0) must return distinct pointers");
    let c = api::calloc(0, 8);
    let d = api::calloc(8, 0);
    assert!(!c.is_null() && !d.is_null());
    // SAFETY: all four are live allocations of ours.
    unsafe {
        assert!(api::usable_size(a) >= 1);
        for p in [a, b, c, d] {
            api::free(p);
        }
        api::free(ptr::null_mut());
        assert_eq!(api::usable_size(ptr::null()), 0);
    }
}

#[test]
fn every_alignment_up_to_a_page_and_beyond() {
    let mut live = Vec::new();
    for shift in 0..=16 {
        let align = 1usize << shift;
        for n in [
            0usize,
            1,
            7,
            16,
            100,
            align,
            align + 1,
            5000,
            MAX_SMALL,
            MAX_SMALL + 1,
            300_000,
        ] {
            let mut out: *mut c_void = ptr::null_mut();
            // SAFETY: `out` is a valid out-parameter.
            let rc = unsafe { api::posix_memalign(&mut out, align, n) };
            if align < std::mem::size_of::<usize>() {
                assert_eq!(
                    rc,
                    libc::EINVAL,
                    "posix_memalign must reject alignment {align}"
                );
                continue;
            }
            assert_eq!(rc, 0, "posix_memalign({align}, {n})");
            assert_eq!(
                out as usize % align,
                0,
                "posix_memalign({align}, {n}) misaligned"
            );
            let q = api::aligned_alloc(align, n);
            assert_eq!(
                q as usize % align,
                0,
                "aligned_alloc({align}, {n}) misaligned"
            );
            let m = api::memalign(align, n);
            assert_eq!(m as usize % align, 0, "memalign({align}, {n}) misaligned");
            for (i, p) in [out, q, m].into_iter().enumerate() {
                // SAFETY: live allocation.
                assert!(unsafe { api::usable_size(p) } >= n);
                fill(p, n, (shift * 3 + i) as u8);
                live.push((p, n, (shift * 3 + i) as u8));
            }
        }
    }
    for &(p, n, seed) in &live {
        assert!(check(p, n, seed), "an aligned block was overwritten");
        // SAFETY: live allocation, freed once.
        unsafe { api::free(p) };
    }
}

#[test]
fn bad_alignments_are_refused() {
    let mut out: *mut c_void = ptr::null_mut();
    // SAFETY: valid out-parameter.
    unsafe {
        assert_eq!(api::posix_memalign(&mut out, 24, 10), libc::EINVAL);
        assert_eq!(api::posix_memalign(&mut out, 0, 10), libc::EINVAL);
    }
    assert!(api::aligned_alloc(48, 10).is_null());
    assert_eq!(errno(), libc::EINVAL);
    // memalign rounds a non-power-of-two alignment up, like glibc.
    let p = api::memalign(48, 10);
    assert_eq!(p as usize % 64, 0);
    // SAFETY: live allocation.
    unsafe { api::free(p) };
}

#[test]
fn page_allocators() {
    let v = api::valloc(10);
    assert_eq!(v as usize % PAGE, 0);
    let pv = api::pvalloc(10);
    assert_eq!(pv as usize % PAGE, 0);
    // SAFETY: live allocations.
    unsafe {
        assert!(
            api::usable_size(pv) >= PAGE,
            "pvalloc rounds up to a whole page"
        );
        api::free(v);
        api::free(pv);
    }
    let z = api::pvalloc(0);
    assert!(!z.is_null());
    // SAFETY: live allocation.
    unsafe { api::free(z) };
}

#[test]
fn calloc_overflow_and_zeroing() {
    assert!(api::calloc(usize::MAX, 2).is_null());
    assert_eq!(errno(), libc::ENOMEM);
    assert!(api::calloc(1 << 33, 1 << 33).is_null());
    // Dirty a slot, free it, and calloc the same size: the reused slot must come back zeroed.
    for n in [8usize, 100, 1000, 20_000, 100_000] {
        let mut dirty = Vec::new();
        for _ in 0..64 {
            let p = api::malloc(n);
            fill(p, n, 0xAB);
            dirty.push(p);
        }
        for p in dirty {
            // SAFETY: live allocation.
            unsafe { api::free(p) };
        }
        for _ in 0..64 {
            let p = api::calloc(1, n);
            assert!(check(p, n, 0), "calloc({n}) returned non-zero bytes");
            fill(p, n, 0xCD);
            // SAFETY: live allocation.
            unsafe { api::free(p) };
        }
    }
}

#[test]
fn realloc_grows_shrinks_and_stays_in_place() {
    // SAFETY: every pointer passed is live and used once.
    unsafe {
        // NULL acts as malloc; size 0 frees and returns NULL (glibc).
        let p = api::realloc(ptr::null_mut(), 40);
        assert!(!p.is_null());
        fill(p, 40, 7);
        // Within the class: same pointer.
        let q = api::realloc(p, 45);
        assert_eq!(p, q, "realloc within the size class should not move");
        assert!(check(q, 40, 7));
        // Grow through small sizes into the large path and back, keeping the prefix.
        let mut p = q;
        let mut len = 40;
        for n in [
            100usize,
            1000,
            10_000,
            MAX_SMALL,
            MAX_SMALL + 1,
            200_000,
            5 << 20,
            70_000,
            500,
            3,
        ] {
            p = api::realloc(p, n);
            assert!(!p.is_null());
            let keep = len.min(n);
            assert!(
                check(p, keep, 7),
                "realloc to {n} lost the first {keep} bytes"
            );
            fill(p, n, 7);
            len = n;
        }
        assert!(api::realloc(p, 0).is_null());
        // Overflowing reallocarray fails and leaves the block alone.
        let r = api::malloc(16);
        fill(r, 16, 9);
        assert!(api::reallocarray(r, usize::MAX, 3).is_null());
        assert_eq!(errno(), libc::ENOMEM);
        assert!(check(r, 16, 9));
        let r2 = api::reallocarray(r, 4, 100);
        assert!(check(r2, 16, 9));
        api::free(r2);
    }
}

#[test]
fn usable_size_covers_the_request() {
    for n in (0..70_000).step_by(37) {
        let p = api::malloc(n);
        // SAFETY: live allocation.
        let u = unsafe { api::usable_size(p) };
        assert!(u >= n, "usable {u} < requested {n}");
        fill(p, u, 1);
        // SAFETY: live allocation.
        unsafe { api::free(p) };
    }
}

#[test]
fn fork_child_can_allocate_and_free() {
    // Another thread is allocating hard while we fork.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let churn = std::thread::spawn(move || {
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            let v: Vec<usize> = (0..100).map(|i| api::malloc(i * 8) as usize).collect();
            // SAFETY: live allocations.
            v.into_iter()
                .for_each(|p| unsafe { api::free(p as *mut c_void) });
        }
    });
    for _ in 0..20 {
        let parent_block = api::malloc(64);
        fill(parent_block, 64, 5);
        // SAFETY: the child only calls the allocator and _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let mut ok = check(parent_block, 64, 5);
            let mut blocks = Vec::with_capacity(0);
            for i in 0..10_000usize {
                let p = api::malloc(i % 3000);
                fill(p, i % 3000, 1);
                blocks.push(p);
                if blocks.len() > 64 {
                    // SAFETY: live allocation.
                    unsafe { api::free(blocks.swap_remove(i % 64)) };
                }
            }
            ok &= blocks.iter().all(|&p| !p.is_null());
            // SAFETY: the parent's block is ours in the child too.
            unsafe { api::free(parent_block) };
            // SAFETY: _exit skips atexit handlers that could touch the parent's state.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child failed: {status}"
        );
        // SAFETY: live allocation.
        unsafe { api::free(parent_block) };
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.join().unwrap();
}

#[test]
fn mixed_sizes_keep_their_contents() {
    let mut live: HashMap<usize, (usize, u8)> = HashMap::new();
    let mut seed = 1u64;
    for i in 0..200_000u64 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        if seed >> 62 == 0 && !live.is_empty() {
            let k = *live.keys().next().unwrap();
            let (n, v) = live.remove(&k).unwrap();
            assert!(check(k as *const c_void, n, v));
            // SAFETY: live allocation.
            unsafe { api::free(k as *mut c_void) };
        } else {
            let n = match seed % 100 {
                0..=79 => (seed >> 20) as usize % 512,
                80..=97 => (seed >> 20) as usize % 8192,
                _ => (seed >> 20) as usize % 300_000,
            };
            let p = api::malloc(n);
            let v = i as u8;
            fill(p, n, v);
            assert!(
                live.insert(p as usize, (n, v)).is_none(),
                "pointer handed out twice"
            );
        }
    }
    for (p, (n, v)) in live {
        assert!(check(p as *const c_void, n, v));
        // SAFETY: live allocation.
        unsafe { api::free(p as *mut c_void) };
    }
}

/// Runs `f` in a forked child and returns how the child ended.
fn in_child(f: impl FnOnce()) -> i32 {
    // SAFETY: the child runs only allocator calls and then _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // Keep the expected abort message out of the test output.
        // SAFETY: closing our own stderr in the child.
        unsafe { libc::close(2) };
        f();
        // SAFETY: _exit ends the child without running the parent's handlers.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    status
}

/// Debug mode is read when the allocator initialises, so the checks run in a fresh process of
/// this test binary with `TIDEPOOL_ALLOC_DEBUG=1`.
#[test]
fn double_frees_and_foreign_pointers_abort_in_debug_mode() {
    if std::env::var_os("TIDEPOOL_ALLOC_DEBUG").is_some() {
        return double_frees_and_foreign_pointers_abort();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "double_frees_and_foreign_pointers_abort_in_debug_mode",
            "--test-threads=1",
        ])
        .env("TIDEPOOL_ALLOC_DEBUG", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "debug-mode run failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn double_frees_and_foreign_pointers_abort() {
    let aborted =
        |status: i32| libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGABRT;
    // Freed twice in a row (its arena still current).
    assert!(aborted(in_child(|| {
        let p = api::malloc(40);
        // SAFETY: deliberately wrong, in a throwaway child.
        unsafe {
            api::free(p);
            api::free(p);
        }
    })));
    // Freed twice with other frees between, after its arena filled up: the bitmap bit is
    // already clear.
    assert!(aborted(in_child(|| {
        let first = api::malloc(40);
        let rest: Vec<usize> = (0..20_000).map(|_| api::malloc(40) as usize).collect();
        // SAFETY: deliberately wrong, in a throwaway child.
        unsafe {
            api::free(first);
            rest.iter().for_each(|&p| api::free(p as *mut c_void));
            api::free(first);
        }
    })));
    // A pointer into the middle of an object.
    assert!(aborted(in_child(|| {
        let keep: Vec<usize> = (0..20_000).map(|_| api::malloc(48) as usize).collect();
        // SAFETY: deliberately wrong, in a throwaway child.
        unsafe { api::free((keep[0] + 8) as *mut c_void) };
    })));
    // The medium heap: freed twice in a row, freed again after a neighbour absorbed it, and a
    // pointer into the middle of a medium object.
    assert!(aborted(in_child(|| {
        let p = api::malloc(10_000);
        // SAFETY: deliberately wrong, in a throwaway child.
        unsafe {
            api::free(p);
            api::free(p);
        }
    })));
    assert!(aborted(in_child(|| {
        let a = api::malloc(10_000);
        let b = api::malloc(11_000);
        let guard = api::malloc(12_000);
        // SAFETY: deliberately wrong, in a throwaway child: `b` merges into `a` when `a` is freed.
        unsafe {
            api::free(b);
            api::free(a);
            api::free(b);
            api::free(guard);
        }
    })));
    assert!(aborted(in_child(|| {
        let p = api::malloc(13_000) as usize;
        // SAFETY: deliberately wrong, in a throwaway child.
        unsafe { api::free((p + 4096) as *mut c_void) };
    })));
    // And a correct program in the same harness exits cleanly.
    assert_eq!(
        in_child(|| {
            let p = api::malloc(40);
            // SAFETY: a live allocation, freed once.
            unsafe { api::free(p) };
        }),
        0
    );
}
