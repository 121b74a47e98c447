//! Loom models of the slot protocol: the atomic operations of `pool.rs` (hint lock, slot
//! swap and compare-and-swap, hinted and slot reads) and `arena.rs`/`evacuator.rs`
//! (incarnation bumps, fences around copies), with object bytes as relaxed atomic cells.
//! Keep them in step with the code: they check the design's orderings, which the real code
//! (assembly copies into a memfd) cannot run under loom.

use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering::*};
use loom::sync::Arc;
use loom::thread;

const TAG: u64 = 0x50f7;
const GARBAGE: u64 = 0xdead;
const LIVE: u64 = 1 << 16;
const BUSY: u64 = 1 << 17;

/// Three object locations (each in its own segment), a slot and a handle's hint.
struct World {
    cells: [[AtomicU64; 2]; 3],
    inc: [AtomicU32; 3],
    slot: AtomicU64,
    hint: AtomicU64,
}

fn word(loc: usize, inc: u32) -> u64 {
    LIVE | ((inc as u64) << 8) | loc as u64
}
fn loc(w: u64) -> usize {
    (w & 0xff) as usize
}
fn inc(w: u64) -> u32 {
    ((w >> 8) & 0xff) as u32
}

impl World {
    /// Value 1 at location 0.
    fn new() -> Arc<World> {
        let w = World {
            cells: Default::default(),
            inc: Default::default(),
            slot: AtomicU64::new(word(0, 0)),
            hint: AtomicU64::new(word(0, 0)),
        };
        w.cells[0][0].store(TAG, Relaxed);
        w.cells[0][1].store(1, Relaxed);
        Arc::new(w)
    }

    /// `append`: bytes into a location (the fence, then the copy).
    fn put(&self, at: usize, value: u64) -> u64 {
        fence(Release);
        self.cells[at][0].store(TAG, Relaxed);
        self.cells[at][1].store(value, Relaxed);
        word(at, self.inc[at].load(Acquire))
    }

    /// `read_at`: the object `w` names, if its segment still holds it.
    fn read_at(&self, w: u64) -> Option<u64> {
        let at = loc(w);
        if self.inc[at].load(Acquire) != inc(w) {
            return None;
        }
        let tag = self.cells[at][0].load(Relaxed);
        let value = self.cells[at][1].load(Relaxed);
        fence(Acquire);
        (self.inc[at].load(Relaxed) == inc(w) && tag == TAG).then_some(value)
    }

    /// `Objects::read`: through the hint, else through the slot (twice at most here).
    fn read(&self) -> Option<u64> {
        let h = self.hint.load(Acquire);
        if h & LIVE != 0 && h & BUSY == 0 {
            if let Some(v) = self.read_at(h) {
                return Some(v);
            }
        }
        for _ in 0..2 {
            let w = self.slot.load(Acquire);
            if let Some(v) = self.read_at(w) {
                return Some(v);
            }
            if self.slot.load(Acquire) == w {
                return None; // lost
            }
        }
        None
    }

    /// `Objects::write`: lock the hint, append, swap the slot, publish the hint.
    fn write(&self, at: usize, value: u64) {
        let before = loop {
            let h = self.hint.load(Acquire);
            if h & BUSY == 0
                && self
                    .hint
                    .compare_exchange(h, h | BUSY, Acquire, Relaxed)
                    .is_ok()
            {
                break h;
            }
            thread::yield_now();
        };
        let _ = before;
        let new = self.put(at, value);
        self.slot.swap(new, AcqRel);
        self.hint.store(new, Release);
    }

    /// `SoftArena::evict` then reuse by someone else: bump, then new bytes.
    fn reuse(&self, at: usize) {
        self.inc[at].fetch_add(1, Release);
        fence(Release);
        self.cells[at][1].store(GARBAGE, Relaxed);
        self.cells[at][0].store(GARBAGE, Relaxed);
    }

    /// The evacuator's move: copy, then compare-and-swap the slot.
    fn evacuate(&self, to: usize) -> bool {
        let w = self.slot.load(Acquire);
        let Some(v) = self.read_at(w) else {
            return false;
        };
        let moved = self.put(to, v);
        self.slot
            .compare_exchange(w, moved, AcqRel, Relaxed)
            .is_ok()
    }
}

/// A reader racing a writer and the reuse of the old object's segment never sees garbage.
#[test]
fn a_read_racing_a_write_and_a_reuse_sees_a_written_value() {
    loom::model(|| {
        let w = World::new();
        let writer = {
            let w = w.clone();
            thread::spawn(move || w.write(1, 2))
        };
        let reuser = {
            let w = w.clone();
            thread::spawn(move || {
                // Location 0 is reused once nothing names it any more.
                while loc(w.slot.load(Acquire)) == 0 {
                    thread::yield_now();
                }
                w.reuse(0);
            })
        };
        let got = w.read();
        assert!(matches!(got, None | Some(1) | Some(2)), "read {got:?}");
        writer.join().unwrap();
        reuser.join().unwrap();
        assert_eq!(w.read(), Some(2));
    });
}

/// An evacuation racing a write never brings the old value back.
#[test]
fn an_evacuation_racing_a_write_loses_to_it() {
    loom::model(|| {
        let w = World::new();
        let evacuator = {
            let w = w.clone();
            thread::spawn(move || {
                w.evacuate(1);
            })
        };
        w.write(2, 2);
        evacuator.join().unwrap();
        assert_eq!(w.read(), Some(2));
        // Through the slot too (the evacuator may have moved the new version).
        assert_eq!(w.read_at(w.slot.load(Acquire)), Some(2));
    });
}

/// A read racing an evacuation and the reuse of the source sees the value, or a miss.
#[test]
fn a_read_racing_an_evacuation_and_a_reuse_sees_the_value() {
    loom::model(|| {
        let w = World::new();
        let mover = {
            let w = w.clone();
            thread::spawn(move || {
                if w.evacuate(1) {
                    w.reuse(0);
                }
            })
        };
        let got = w.read();
        assert!(matches!(got, None | Some(1)), "read {got:?}");
        mover.join().unwrap();
        assert_eq!(w.read(), Some(1));
    });
}
