//! Loom tests of the real slot protocol: the hint lock, slot swaps and compare-and-swaps and
//! hinted reads of `pool.rs`, the incarnation bumps and fences of `arena/`, the evacuator's
//! moves (`arena/compact.rs`) and revocation, run on loom's atomics and locks (`src/sync.rs`).
//! Only the bytes differ from a normal build: under loom an arena's memory is plain memory in
//! loom's cells (`src/memory.rs`) instead of a memfd copied with assembly.
//!
//! Run with their own target directory (the whole crate is built for loom):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p tidepool-soft --release --test loom_slots
//! ```
#![cfg(loom)]

use loom::thread;
use std::sync::Arc;
use tidepool_soft::{ArenaConfig, SoftArena, SoftBox, SoftPool, SEGMENT};

/// Objects of these tests: a 16-byte header and a u64, 32 bytes: two to a segment.
type Pool = SoftPool<u64>;

/// A model run with at most `preemptions` forced switches: enough for the races here, and
/// what keeps an evacuation pass (hundreds of atomic operations) explorable.
fn model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    b.check(f);
}

fn arena() -> Arc<SoftArena> {
    SoftArena::new(
        ArenaConfig::default()
            .budget(4 * SEGMENT)
            .max_bytes(8 * SEGMENT),
    )
    .unwrap()
}

/// An arena, a pool whose lost objects come back as 1, and a box holding 1 in a closed
/// segment (with a neighbour that fills it, and one more object that closes it).
struct ClosedBox {
    arena: Arc<SoftArena>,
    pool: Pool,
    b: Arc<SoftBox<u64>>,
    _others: Vec<SoftBox<u64>>,
}

fn closed_box() -> ClosedBox {
    let arena = arena();
    let pool = SoftPool::new(&arena, |_: ()| 1u64);
    let b = Arc::new(pool.new_box_with(1).unwrap());
    let others = vec![
        pool.new_box_with(10).unwrap(),
        pool.new_box_with(11).unwrap(),
    ];
    ClosedBox {
        arena,
        pool,
        b,
        _others: others,
    }
}

#[test]
fn a_read_racing_a_write_sees_the_old_value_or_the_new() {
    model(3, || {
        let arena = arena();
        let pool = SoftPool::new(&arena, |_: ()| 0u64);
        let b = Arc::new(pool.new_box_with(1).unwrap());
        let writer = {
            let b = b.clone();
            thread::spawn(move || b.write(2).unwrap())
        };
        let got = b.get();
        assert!(matches!(got, Some(1) | Some(2)), "read {got:?}");
        writer.join().unwrap();
        assert_eq!(b.get(), Some(2));
    });
}

#[test]
fn a_rebuild_racing_a_write_never_overwrites_it() {
    model(3, || {
        let arena = arena();
        let pool = SoftPool::new(&arena, |_: ()| 1u64);
        let b = Arc::new(pool.new_box());
        let writer = {
            let b = b.clone();
            thread::spawn(move || b.write(7).unwrap())
        };
        // A miss (if the write has not come yet) rebuilds 1; it may be returned, but it must
        // not be stored over the 7.
        let got = b.read(());
        assert!(got == 1 || got == 7, "read {got}");
        writer.join().unwrap();
        assert_eq!(b.get(), Some(7));
    });
}

#[test]
fn two_compare_exchanges_one_wins() {
    model(3, || {
        let arena = arena();
        let pool = SoftPool::new(&arena, |_: ()| 0u64);
        let b = Arc::new(pool.new_box_with(1).unwrap());
        let other = {
            let b = b.clone();
            thread::spawn(move || b.compare_exchange(&1, 2).is_ok())
        };
        let mine = b.compare_exchange(&1, 3).is_ok();
        let theirs = other.join().unwrap();
        assert!(
            mine != theirs,
            "exactly one wins (mine {mine}, theirs {theirs})"
        );
        assert_eq!(b.get(), Some(if mine { 3 } else { 2 }));
    });
}

#[test]
fn an_evacuation_racing_a_write_never_brings_the_old_value_back() {
    model(2, || {
        let ClosedBox {
            arena,
            pool: _pool,
            b,
            _others: _kept,
        } = closed_box();
        let evacuator = {
            let arena = arena.clone();
            thread::spawn(move || {
                arena.evacuate(usize::MAX, 1.0);
            })
        };
        b.write(2).unwrap();
        evacuator.join().unwrap();
        assert_eq!(b.get(), Some(2));
    });
}

#[test]
fn a_read_racing_an_evacuation_and_the_reuse_of_its_segment_sees_the_value() {
    model(2, || {
        let ClosedBox {
            arena,
            pool,
            b,
            _others: _kept,
        } = closed_box();
        let mover = {
            let arena = arena.clone();
            thread::spawn(move || {
                let report = arena.evacuate(usize::MAX, 1.0);
                assert_eq!(report.segments_freed, 1, "{report:?}");
                // The head's segment fills, and the next object goes where the box was
                // (the freed segment, its incarnation bumped).
                let reuse: Vec<_> = (0..2).map(|i| pool.new_box_with(20 + i).unwrap()).collect();
                assert_eq!(reuse[1].get(), Some(21));
            })
        };
        let got = b.get();
        assert_eq!(
            got,
            Some(1),
            "a hint to the old place must not read the new object"
        );
        mover.join().unwrap();
        assert_eq!(b.get(), Some(1));
    });
}

#[test]
fn a_read_racing_a_revocation_sees_the_value_or_a_miss() {
    model(3, || {
        let ClosedBox {
            arena,
            pool: _pool,
            b,
            _others: _kept,
        } = closed_box();
        let revoker = {
            let arena = arena.clone();
            thread::spawn(move || assert_eq!(arena.punch_oldest(), SEGMENT))
        };
        let got = b.get();
        assert!(matches!(got, Some(1) | None), "read {got:?}");
        revoker.join().unwrap();
        assert_eq!(b.get(), None, "revoked");
        assert_eq!(b.read(()), 1, "rebuilt");
        assert_eq!(b.get(), Some(1));
    });
}
