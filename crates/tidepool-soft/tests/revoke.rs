//! Soft memory taken back while threads read, write and verify: never a wrong value, never a
//! crash; and a SIGBUS that is not ours still kills.

use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use tidepool_soft::{ArenaConfig, SoftArena, SoftPool, SoftRuntime, SEGMENT};

type Value = [u64; 6];

fn value(index: u64, version: u64) -> Value {
    let mut v = [0; 6];
    for (i, w) in v.iter_mut().enumerate() {
        *w = index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version.rotate_left(17) ^ i as u64;
    }
    v
}

fn arena(budget: usize) -> Arc<SoftArena> {
    SoftArena::new(ArenaConfig::default().budget(budget).max_bytes(1 << 30)).expect("arena")
}

#[test]
fn reads_write_and_reconstruct() {
    let arena = arena(16 << 20);
    let pool = SoftPool::new(&arena, |(i, v): (u64, u64)| value(i, v));
    let b = pool.new_box();
    assert!(!b.is_present());
    assert_eq!(b.get(), None);
    assert_eq!(b.read((1, 0)), value(1, 0));
    assert!(b.is_present());
    assert_eq!(b.get(), Some(value(1, 0)));
    b.write(value(1, 1)).unwrap();
    assert_eq!(b.read((1, 99)), value(1, 1), "a hit must not reconstruct");
    assert_eq!(
        b.compare_exchange(&value(1, 0), value(1, 2)),
        Err(Some(value(1, 1)))
    );
    assert_eq!(b.compare_exchange(&value(1, 1), value(1, 2)), Ok(()));
    assert_eq!(b.get(), Some(value(1, 2)));
    b.evict();
    assert_eq!(b.compare_exchange(&value(1, 2), value(1, 3)), Err(None));
    assert_eq!(b.read((1, 4)), value(1, 4));
    let s = pool.stats();
    assert_eq!(s.reconstructions, 2);
    assert_eq!(s.hits, 3, "{s:?}");
}

#[test]
fn a_punched_segment_reads_as_lost_and_is_rebuilt() {
    let arena = arena(64 << 20);
    let pool = SoftPool::new(&arena, |i: u64| value(i, 7));
    // Enough objects to fill and close a few segments.
    let n = 3 * SEGMENT / 64;
    let boxes: Vec<_> = (0..n as u64)
        .map(|i| pool.new_box_with(value(i, 7)).unwrap())
        .collect();
    assert!(arena.punch_oldest() > 0);
    let mut lost = 0;
    for (i, b) in boxes.iter().enumerate() {
        if b.get().is_none() {
            lost += 1;
        }
        assert_eq!(b.read(i as u64), value(i as u64, 7));
    }
    assert!(lost > 0, "punching the oldest segment lost nothing");
    assert!(arena.usage() <= arena.budget());
}

#[test]
fn holes_punched_behind_its_back_never_give_wrong_values() {
    let arena = arena(32 << 20);
    let stop = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));
    let rebuilt = Arc::new(AtomicU64::new(0));
    let pool = SoftPool::new(&arena, |(i, v): (u64, u64)| value(i, v));
    let mut threads = Vec::new();
    for t in 0..3u64 {
        let (pool, stop, checked) = (pool.clone(), stop.clone(), checked.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(t);
            let n = 20_000u64;
            let base = t * n;
            let boxes: Vec<_> = (0..n).map(|_| pool.new_box()).collect();
            let mut versions = vec![0u64; n as usize];
            while !stop.load(Relaxed) {
                let k = rng.gen_range(0..n) as usize;
                let i = base + k as u64;
                if rng.gen_bool(0.3) {
                    versions[k] += 1;
                    boxes[k].write(value(i, versions[k])).unwrap();
                } else {
                    assert_eq!(
                        boxes[k].read((i, versions[k])),
                        value(i, versions[k]),
                        "box {i} at version {}",
                        versions[k]
                    );
                    checked.fetch_add(1, Relaxed);
                }
            }
        }));
    }
    {
        let (arena, stop, rebuilt) = (arena.clone(), stop.clone(), rebuilt.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(99);
            let mut punches = 0u64;
            while !stop.load(Relaxed) {
                // Pages anywhere in the first segments, in use or not.
                let pages = (64 << 20) / 4096;
                let page = rng.gen_range(0..pages);
                let len = 4096 * rng.gen_range(1..16);
                arena.punch_behind_back(page * 4096, len).unwrap();
                punches += 1;
                if punches.is_multiple_of(64) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            rebuilt.store(punches, Relaxed);
        }));
    }
    std::thread::sleep(std::time::Duration::from_secs(3));
    stop.store(true, Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let s = pool.stats();
    eprintln!(
        "checked {} reads, {} punches, {s:?}",
        checked.load(Relaxed),
        rebuilt.load(Relaxed)
    );
    assert!(checked.load(Relaxed) > 10_000);
    assert!(s.reconstructions > 0);
    assert!(s.hits > 0);
}

#[test]
fn a_small_budget_evicts_and_stays_correct() {
    let arena = arena(4 * SEGMENT);
    let pool = SoftPool::new(&arena, |i: u64| value(i, 1));
    let boxes: Vec<_> = (0..200_000u64).map(|_| pool.new_box()).collect();
    for round in 0..3 {
        for (i, b) in boxes.iter().enumerate() {
            assert_eq!(b.read(i as u64), value(i as u64, 1), "round {round}");
        }
    }
    assert!(arena.usage() <= arena.budget());
    let s = pool.stats();
    assert!(s.reconstructions > 200_000, "{s:?}");
}

#[test]
fn large_objects_span_segments() {
    // Multi-megabyte values by value need a big stack (unoptimised builds copy them at
    // every call level).
    std::thread::Builder::new()
        .stack_size(512 << 20)
        .spawn(large_objects)
        .unwrap()
        .join()
        .unwrap();
}

fn large_objects() {
    let arena = arena(16 * SEGMENT);
    let pool = SoftPool::new(&arena, |seed: u8| [seed; 3 << 20]);
    let b = pool.new_box();
    let v = b.read(3);
    assert!(v.iter().all(|&x| x == 3));
    let mut out = Box::new([0u8; 3 << 20]);
    assert!(b.get_into(&mut out));
    assert!(out.iter().all(|&x| x == 3));
    b.write([9; 3 << 20]).unwrap();
    assert!(b.get().unwrap().iter().all(|&x| x == 9));
    while arena.punch_oldest() > 0 {}
    assert!(b.get().is_none());
    assert!(b.read(4).iter().all(|&x| x == 4));
}

/// A SIGBUS outside the resilient copy (here: touching a memfd page past its end) must still
/// kill the process: the handler passes it on.
#[test]
fn a_foreign_sigbus_still_kills() {
    if std::env::var_os("TIDEPOOL_SOFT_FOREIGN_SIGBUS").is_some() {
        let _arena = arena(SEGMENT); // installs the handler
                                     // SAFETY: deliberately touching a page past a memfd's end, in a child process whose
                                     // only job is to die of it.
        unsafe {
            let fd = libc::memfd_create(c"t".as_ptr(), 0);
            let p = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            ) as *const u8;
            std::ptr::read_volatile(p);
        }
        unreachable!("the read above raises SIGBUS");
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_foreign_sigbus_still_kills",
            "--test-threads=1",
        ])
        .env("TIDEPOOL_SOFT_FOREIGN_SIGBUS", "1")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGBUS), "{:?}", out.status);
}

#[test]
fn evacuation_compacts_and_keeps_live_objects() {
    let arena = arena(64 * SEGMENT);
    let pool = SoftPool::new(&arena, |i: u64| value(i, 0));
    let n = 200_000u64;
    let mut boxes: Vec<Option<_>> = (0..n)
        .map(|i| Some(pool.new_box_with(value(i, 1)).unwrap()))
        .collect();
    // Nine in ten die.
    for (i, b) in boxes.iter_mut().enumerate() {
        if i % 10 != 0 {
            *b = None;
        }
    }
    let used = arena.usage();
    let r = arena.evacuate(usize::MAX, 0.5);
    assert!(r.segments_freed >= 3, "{r:?}");
    assert!(r.objects_moved > 0, "{r:?}");
    let before = pool.stats().reconstructions;
    for (i, b) in boxes.iter().enumerate() {
        if let Some(b) = b {
            assert_eq!(b.read(i as u64), value(i as u64, 1), "box {i}");
        }
    }
    assert_eq!(
        pool.stats().reconstructions,
        before,
        "a moved object was lost"
    );
    // Unread, the moved objects have cooled to zero: the next pass drops them.
    let r2 = arena.evacuate(usize::MAX, 1.0);
    eprintln!("{r:?} {r2:?}, usage {used} -> {}", arena.usage());
}

type VersionedPool = SoftPool<Value, (u64, u64)>;

/// Thread `t`'s own `n` boxes, half written (a new version each time), half read and checked
/// against the version it last wrote, until `stop`; how many reads it checked.
fn verify_until_stopped(pool: &VersionedPool, stop: &AtomicBool, t: u64, n: u64, seed: u64) -> u64 {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let boxes: Vec<_> = (0..n).map(|_| pool.new_box()).collect();
    let mut versions = vec![0u64; n as usize];
    let mut reads = 0u64;
    while !stop.load(Relaxed) {
        let k = rng.gen_range(0..n) as usize;
        let i = t * n + k as u64;
        if rng.gen_bool(0.5) {
            versions[k] += 1;
            boxes[k].write(value(i, versions[k])).unwrap();
        } else {
            assert_eq!(boxes[k].read((i, versions[k])), value(i, versions[k]));
            reads += 1;
        }
    }
    reads
}

#[test]
fn the_evacuator_runs_under_punches_and_writes() {
    let arena = arena(24 * SEGMENT);
    // A pool of two: compaction split between threads.
    let runtime = SoftRuntime::new(arena.clone());
    runtime.start_evacuators(0.3, 0.5, 2).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let pool = SoftPool::new(&arena, |(i, v): (u64, u64)| value(i, v));
    let mut threads = Vec::new();
    for t in 0..2u64 {
        let (pool, stop) = (pool.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            verify_until_stopped(&pool, &stop, t, 100_000, t)
        }));
    }
    let punch = {
        let (arena, stop) = (arena.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
            while !stop.load(Relaxed) {
                let page = rng.gen_range(0..(48 * SEGMENT / 4096));
                arena.punch_behind_back(page * 4096, 4096).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };
    std::thread::sleep(std::time::Duration::from_secs(3));
    stop.store(true, Relaxed);
    let reads: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    punch.join().unwrap();
    let s = pool.stats();
    eprintln!(
        "{reads} reads verified, {s:?}, usage {} of {}",
        arena.usage(),
        arena.budget()
    );
    assert!(reads > 10_000);
}

#[test]
fn children_are_evicted_with_their_parent() {
    let arena = arena(64 * SEGMENT);
    let posts = SoftPool::new(&arena, |i: u64| value(i, 0));
    let pictures = SoftPool::new(&arena, |i: u64| [i as u8; 1000]);
    let post = posts.new_box_with(value(1, 1)).unwrap();
    let picture = pictures.new_child_box(&post);
    picture.write([7; 1000]).unwrap();
    assert_eq!(picture.get(), Some([7; 1000]));
    post.evict();
    assert_eq!(picture.get(), None, "the picture outlived its post");
    assert_eq!(picture.read(2), [2; 1000]);
    // The parent back: the child stays until evicted again.
    post.write(value(1, 2)).unwrap();
    picture.write([8; 1000]).unwrap();
    assert_eq!(picture.get(), Some([8; 1000]));
    // Evacuation drops an orphan too.
    let others: Vec<_> = (0..40_000u64)
        .map(|i| posts.new_box_with(value(i, 3)).unwrap())
        .collect();
    post.evict();
    arena.evacuate(usize::MAX, 1.0);
    assert!(!picture.is_present(), "evacuation kept an orphan");
    drop(others);
}

#[test]
fn hotness_updates_never_touch_a_reused_or_revoked_segment() {
    // Readers raise hotness while segments are punched behind the arena's back and reused:
    // every raise is a compare-and-swap of the whole header, so values stay right.
    let arena = arena(8 * SEGMENT);
    let pool = SoftPool::new(&arena, |i: u64| value(i, 0));
    let boxes: Vec<_> = (0..60_000u64)
        .map(|i| pool.new_box_with(value(i, 0)).unwrap())
        .collect();
    for round in 0..4 {
        for (i, b) in boxes.iter().enumerate() {
            assert_eq!(b.read(i as u64), value(i as u64, 0), "round {round}");
        }
        arena
            .punch_behind_back((round % 4) * SEGMENT, SEGMENT)
            .unwrap();
        arena.evacuate(usize::MAX, 1.0);
    }
}

#[test]
fn threads_sharing_heads_under_revocation_and_direct_eviction() {
    // More threads than allocation heads, a budget small enough that allocation evicts
    // directly, the evacuator running, and whole segments punched behind the arena's back:
    // no segment is reused while a copy into it is in flight, so no value is ever wrong.
    // 8 heads and 2 evacuation heads hold 10 segments; 4 more for closed ones.
    let arena = arena(14 * SEGMENT);
    let runtime = SoftRuntime::new(arena.clone());
    runtime.start_evacuators(0.2, 0.3, 2).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let pool = SoftPool::new(&arena, |(i, v): (u64, u64)| value(i, v));
    let mut threads = Vec::new();
    for t in 0..12u64 {
        let (pool, stop) = (pool.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            verify_until_stopped(&pool, &stop, t, 20_000, 100 + t)
        }));
    }
    let punch = {
        let (arena, stop) = (arena.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
            while !stop.load(Relaxed) {
                let seg = rng.gen_range(0..24);
                arena.punch_behind_back(seg * SEGMENT, SEGMENT).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
        })
    };
    std::thread::sleep(std::time::Duration::from_secs(3));
    stop.store(true, Relaxed);
    let reads: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    punch.join().unwrap();
    let c = arena.counters();
    eprintln!(
        "{reads} reads verified; direct evictions {}, revoked {}",
        c.direct_evictions.load(Relaxed),
        c.segments_revoked.load(Relaxed)
    );
    assert!(reads > 10_000);
}

/// A forked child does not share the arena (it would write into the parent's objects): there
/// it reads as empty, values are rebuilt but not cached, and new arenas work. The parent's
/// objects are untouched.
#[test]
fn a_forked_child_neither_sees_nor_touches_the_parents_soft_memory() {
    if std::env::var_os("TIDEPOOL_SOFT_FORK_ROLE").is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_forked_child_neither_sees_nor_touches_the_parents_soft_memory",
                "--test-threads=1",
                "--nocapture",
            ])
            .env("TIDEPOOL_SOFT_FORK_ROLE", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let arena = arena(4 * SEGMENT);
    let pool = SoftPool::new(&arena, |i: u64| value(i, 9));
    let b = pool.new_box_with(value(1, 1)).unwrap();
    // SAFETY: fork in a process whose other threads hold no locks we use; the child only
    // runs the checks below and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = b.get().is_none()
            && b.read(1) == value(1, 9)
            && matches!(b.write(value(1, 2)), Err(tidepool_soft::SoftError::Forked))
            && {
                let fresh = self::arena(4 * SEGMENT);
                let p = SoftPool::new(&fresh, |i: u64| value(i, 0));
                let c = p.new_box_with(value(2, 3)).unwrap();
                c.get() == Some(value(2, 3))
            };
        // SAFETY: leaving the child at once, with its verdict.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed: {status}"
    );
    assert_eq!(
        b.get(),
        Some(value(1, 1)),
        "the child changed the parent's object"
    );
}
