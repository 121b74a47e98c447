//! Arena reuse, alone in its own process: it counts the arenas of a class, which concurrent
//! tests allocating the same sizes would disturb. The tests here take turns (`serial`).

use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};
use tidepool_alloc::api;

/// One test at a time: they measure arena counts and RSS of the whole process.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn check(p: *const c_void, n: usize, seed: u8) -> bool {
    // SAFETY: callers pass a live block of at least `n` bytes.
    let s = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
    s.iter().all(|&b| b == seed)
}

fn fill(p: *mut c_void, n: usize, seed: u8) {
    // SAFETY: callers pass a live block of at least `n` bytes.
    unsafe { std::ptr::write_bytes(p as *mut u8, seed, n) };
}

#[test]
fn freed_arenas_are_reused_before_new_ones() {
    let _serial = serial();
    // Rounds of: allocate a batch (some short-lived, most kept), then free the kept ones
    // together. After the first round, no round may need more arenas than the first.
    for n in [32768usize, 4000, 300, 24] {
        let c = tidepool_alloc::classes::class_of(n);
        let arenas = || tidepool_alloc::stats().classes[c].arenas;
        let mut after_first = 0;
        for round in 0..6 {
            let mut kept = Vec::new();
            for i in 0..3000 {
                let p = api::malloc(n);
                fill(p, n, 1);
                if i % 3 == 0 {
                    // SAFETY: live allocation.
                    unsafe { api::free(p) };
                } else {
                    kept.push(p);
                }
            }
            // SAFETY: live allocations.
            kept.into_iter().for_each(|p| unsafe { api::free(p) });
            if round == 0 {
                after_first = arenas();
            }
        }
        assert!(
            arenas() <= after_first + 1,
            "size {n}: {} arenas after 6 rounds, {after_first} after one",
            arenas()
        );
    }
}

#[test]
fn frees_from_other_threads_come_back() {
    let _serial = serial();
    // A producer allocates, consumers free: memory must be reused, not leaked.
    let before = tidepool_alloc::stats();
    for _round in 0..20 {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<usize>>();
        let consumer = std::thread::spawn(move || {
            for batch in rx {
                for p in batch {
                    assert!(check(p as *const c_void, 48, (p >> 4) as u8));
                    // SAFETY: the producer handed these over and never touches them again.
                    unsafe { api::free(p as *mut c_void) };
                }
            }
        });
        for _ in 0..50 {
            let batch: Vec<usize> = (0..1000)
                .map(|_| {
                    let p = api::malloc(48);
                    fill(p, 48, (p as usize >> 4) as u8);
                    p as usize
                })
                .collect();
            tx.send(batch).unwrap();
        }
        drop(tx);
        consumer.join().unwrap();
    }
    let after = tidepool_alloc::stats();
    let c = tidepool_alloc::classes::class_of(48);
    let new_arenas = after.classes[c].arenas - before.classes[c].arenas;
    // 1M allocations of 48 bytes, at most 50k live at once (2.4 MB, ~10 arenas).
    assert!(
        new_arenas < 40,
        "{new_arenas} new arenas for a small live set: remote frees leak"
    );
}

#[test]
fn thread_exit_hands_arenas_back() {
    let _serial = serial();
    let c = tidepool_alloc::classes::class_of(700);
    let before = tidepool_alloc::stats().classes[c].arenas;
    for _ in 0..200 {
        std::thread::spawn(|| {
            // Some survive the thread (freed by the main thread later), some do not.
            let keep: Vec<usize> = (0..10).map(|_| api::malloc(700) as usize).collect();
            for _ in 0..100 {
                let p = api::malloc(700);
                fill(p, 700, 3);
                // SAFETY: live allocation.
                unsafe { api::free(p) };
            }
            keep
        })
        .join()
        .unwrap()
        .into_iter()
        // SAFETY: allocations of the exited thread, freed once here.
        .for_each(|p| unsafe { api::free(p as *mut c_void) });
    }
    let after = tidepool_alloc::stats().classes[c].arenas;
    assert!(
        after - before < 10,
        "200 short-lived threads took {} arenas: exiting threads strand them",
        after - before
    );
}

#[test]
fn an_exited_threads_arenas_pass_to_the_thread_freeing_into_them() {
    let _serial = serial();
    // larson's pattern: a thread inherits an exited thread's objects and replaces them one by
    // one. Its first free into each of the exited thread's arenas queues that arena, so its
    // next allocation takes the arena over instead of a new one, and its frees there are local.
    let n = 3000;
    let c = tidepool_alloc::classes::class_of(n);
    let arenas = || tidepool_alloc::stats().classes[c].arenas;
    let inherited = std::thread::spawn(move || {
        (0..1000)
            .map(|i| {
                let p = api::malloc(n);
                fill(p, n, i as u8);
                p as usize
            })
            .collect::<Vec<usize>>()
    })
    .join()
    .unwrap();
    let before = arenas();
    std::thread::spawn(move || {
        let mut replaced = Vec::new();
        for (i, p) in inherited.into_iter().enumerate() {
            assert!(check(p as *const c_void, n, i as u8));
            // SAFETY: the exited thread's allocation, freed once here.
            unsafe { api::free(p as *mut c_void) };
            let q = api::malloc(n);
            fill(q, n, 7);
            replaced.push(q);
        }
        for q in replaced {
            assert!(check(q, n, 7));
            // SAFETY: live allocation.
            unsafe { api::free(q) };
        }
    })
    .join()
    .unwrap();
    assert_eq!(
        arenas(),
        before,
        "replacing an exited thread's objects took new arenas instead of its own"
    );
}
