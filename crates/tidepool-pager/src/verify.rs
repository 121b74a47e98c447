//! The verification workload: known patterns written over memory many times larger than the
//! local budget, by several threads, every byte checked. Used by the tests of every backend,
//! by `tidepool run` tests (inside an unmodified program) and by the bench.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const WORDS_PER_PAGE: usize = 512;

/// The word expected at `word` of `page` after `round` (0: never written, reads zero).
pub fn pattern(page: usize, word: usize, round: u64) -> u64 {
    if round == 0 {
        return 0;
    }
    // Every fourth page is written with zeros, to exercise zero-page elision.
    if page % 4 == 3 {
        return 0;
    }
    let mut x = (page as u64) << 32 ^ (word as u64) ^ round.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 29)
}

/// What a run checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub bytes_checked: u64,
    pub wrong_words: u64,
    /// The first wrong word: (page, word, found, expected).
    pub first_wrong: Option<(usize, usize, u64, u64)>,
}

/// Runs `rounds` rounds over `mem` (a whole number of 4 KiB pages) with `threads` threads.
/// Each round every thread checks its share of pages against the previous round's pattern and
/// writes the next; between rounds every thread reads pages from all shares in a scattered
/// order and checks them too. Returns what was checked.
pub fn run(mem: &mut [u8], threads: usize, rounds: u64) -> Report {
    run_rounds(mem, threads, 0, rounds)
}

/// Runs rounds `done + 1 ..= done + rounds` over memory that has been through `done` rounds
/// already (zero: fresh memory), so a long run can report progress between calls.
pub fn run_rounds(mem: &mut [u8], threads: usize, done: u64, rounds: u64) -> Report {
    assert!(mem.len().is_multiple_of(4096) && (mem.as_ptr() as usize).is_multiple_of(4096));
    let pages = mem.len() / 4096;
    let threads = threads.max(1);
    let base = mem.as_mut_ptr() as usize;
    let checked = AtomicU64::new(0);
    let wrong = AtomicU64::new(0);
    let first = parking_lot::Mutex::new(None);
    let check = |page: usize, round: u64| {
        // SAFETY: `page` is inside `mem`, which is exclusively borrowed for this call; during
        // a check phase no thread writes.
        let words = unsafe {
            std::slice::from_raw_parts((base + page * 4096) as *const u64, WORDS_PER_PAGE)
        };
        let mut bad = 0;
        for (w, &found) in words.iter().enumerate() {
            let expected = pattern(page, w, round);
            if found != expected {
                bad += 1;
                crate::tr!(page, "wrong", found);
                first.lock().get_or_insert((page, w, found, expected));
            }
        }
        checked.fetch_add(4096, Relaxed);
        wrong.fetch_add(bad, Relaxed);
    };
    for round in done + 1..=done + rounds {
        std::thread::scope(|s| {
            for t in 0..threads {
                let check = &check;
                s.spawn(move || {
                    // Interleaved shares (page % threads), so threads fault in neighbouring
                    // pages at once.
                    for page in (t..pages).step_by(threads) {
                        check(page, round - 1);
                        // SAFETY: this thread alone writes pages ≡ t (mod threads) in this phase.
                        let words = unsafe {
                            std::slice::from_raw_parts_mut(
                                (base + page * 4096) as *mut u64,
                                WORDS_PER_PAGE,
                            )
                        };
                        for (w, slot) in words.iter_mut().enumerate() {
                            *slot = pattern(page, w, round);
                        }
                    }
                });
            }
        });
        std::thread::scope(|s| {
            for t in 0..threads {
                let check = &check;
                s.spawn(move || {
                    let mut x = (t as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D) ^ round;
                    for _ in 0..pages / threads / 4 + 1 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        check((x % pages as u64) as usize, round);
                    }
                });
            }
        });
    }
    let first_wrong = *first.lock();
    Report {
        bytes_checked: checked.load(Relaxed),
        wrong_words: wrong.load(Relaxed),
        first_wrong,
    }
}
