//! Random sequences of malloc-family calls against a shadow map of what every live block must
//! hold: contents survive, blocks never overlap, alignment and zeroing hold.

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ffi::c_void;
use tidepool_alloc::api;

#[derive(Debug, Clone)]
enum Op {
    Malloc(usize),
    Calloc(usize),
    Aligned(u32, usize),
    Realloc(usize, usize),
    Free(usize),
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        8 => 0usize..512,
        3 => 512usize..33_000,
        1 => 33_000usize..400_000,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => size().prop_map(Op::Malloc),
        1 => size().prop_map(Op::Calloc),
        1 => (4u32..14, size()).prop_map(|(s, n)| Op::Aligned(s, n)),
        2 => (any::<usize>(), size()).prop_map(|(i, n)| Op::Realloc(i, n)),
        4 => any::<usize>().prop_map(Op::Free),
    ]
}

struct Shadow {
    /// start -> (len, fill byte)
    live: BTreeMap<usize, (usize, u8)>,
    next_fill: u8,
}

impl Shadow {
    fn add(&mut self, p: *mut c_void, n: usize) -> Result<(), TestCaseError> {
        prop_assert!(!p.is_null());
        let start = p as usize;
        prop_assert_eq!(start % 16, 0);
        if let Some((&s, &(l, _))) = self.live.range(..=start).next_back() {
            prop_assert!(
                s + l.max(1) <= start,
                "block {start:#x} overlaps live {s:#x}+{l}"
            );
        }
        if let Some((&s, _)) = self.live.range(start..).next() {
            prop_assert!(
                start + n.max(1) <= s,
                "block {start:#x}+{n} overlaps live {s:#x}"
            );
        }
        self.next_fill = self.next_fill.wrapping_add(1).max(1);
        // SAFETY: a fresh block of at least n bytes.
        unsafe { std::ptr::write_bytes(p as *mut u8, self.next_fill, n) };
        self.live.insert(start, (n, self.next_fill));
        Ok(())
    }

    fn pick(&self, i: usize) -> Option<usize> {
        (!self.live.is_empty()).then(|| *self.live.keys().nth(i % self.live.len()).unwrap())
    }

    fn verify(&self, start: usize) -> Result<(), TestCaseError> {
        let (n, v) = self.live[&start];
        // SAFETY: a live block of n bytes.
        let s = unsafe { std::slice::from_raw_parts(start as *const u8, n) };
        prop_assert!(
            s.iter().all(|&b| b == v),
            "block {start:#x} lost its contents"
        );
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn malloc_family_matches_shadow(ops in proptest::collection::vec(op(), 1..400)) {
        let mut sh = Shadow { live: BTreeMap::new(), next_fill: 0 };
        for op in ops {
            match op {
                Op::Malloc(n) => sh.add(api::malloc(n), n)?,
                Op::Calloc(n) => {
                    let p = api::calloc(1, n);
                    // SAFETY: a fresh block of n bytes.
                    let s = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
                    prop_assert!(s.iter().all(|&b| b == 0), "calloc({n}) not zeroed");
                    sh.add(p, n)?;
                }
                Op::Aligned(shift, n) => {
                    let p = api::aligned_alloc(1 << shift, n);
                    prop_assert_eq!(p as usize % (1 << shift), 0);
                    sh.add(p, n)?;
                }
                Op::Realloc(i, n) => {
                    if let Some(start) = sh.pick(i) {
                        sh.verify(start)?;
                        let (old, v) = sh.live.remove(&start).unwrap();
                        // SAFETY: a live block.
                        let p = unsafe { api::realloc(start as *mut c_void, n) };
                        if n == 0 {
                            prop_assert!(p.is_null());
                            continue;
                        }
                        let keep = old.min(n);
                        // SAFETY: the moved block holds at least `keep` bytes.
                        let s = unsafe { std::slice::from_raw_parts(p as *const u8, keep) };
                        prop_assert!(s.iter().all(|&b| b == v), "realloc lost contents");
                        sh.add(p, n)?;
                    }
                }
                Op::Free(i) => {
                    if let Some(start) = sh.pick(i) {
                        sh.verify(start)?;
                        sh.live.remove(&start);
                        // SAFETY: a live block, freed once.
                        unsafe { api::free(start as *mut c_void) };
                    }
                }
            }
        }
        for (&start, _) in sh.live.iter() {
            sh.verify(start)?;
            // SAFETY: a live block, freed once.
            unsafe { api::free(start as *mut c_void) };
        }
    }
}
