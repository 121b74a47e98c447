//! Page ranges of the large-object region: first fit over a free list, coalesced on release.
//!
//! The region serves both the allocator's large objects and the program's own anonymous
//! mappings, and programs are allowed to unmap a part of a mapping, or a range that is already
//! unmapped: [`Ranges::release`] frees only the parts that are in use, so neither corrupts the
//! list.

use std::collections::BTreeMap;

/// Offsets and lengths are in bytes, multiples of the page size, relative to the region base.
#[derive(Debug)]
pub struct Ranges {
    /// Free ranges below `top`, by offset; never adjacent to one another or to `top`.
    free: BTreeMap<usize, usize>,
    /// Everything at or above `top` is free.
    top: usize,
    span: usize,
}

impl Ranges {
    pub fn new(span: usize) -> Ranges {
        Ranges {
            free: BTreeMap::new(),
            top: 0,
            span,
        }
    }

    /// Takes `len` bytes; the offset of the range, or `None` if the region is full.
    pub fn take(&mut self, len: usize) -> Option<usize> {
        let fit = self
            .free
            .iter()
            .find(|(_, &l)| l >= len)
            .map(|(&a, &l)| (a, l));
        if let Some((a, l)) = fit {
            self.free.remove(&a);
            if l > len {
                self.free.insert(a + len, l - len);
            }
            return Some(a);
        }
        if len > self.span - self.top {
            return None;
        }
        self.top += len;
        Some(self.top - len)
    }

    /// Grows the range in use at `start` from `old` to `new` bytes where it lies, if the bytes
    /// after it are free.
    pub fn grow_in_place(&mut self, start: usize, old: usize, new: usize) -> bool {
        let end = start + old;
        let want = new - old;
        if end == self.top {
            if want > self.span - self.top {
                return false;
            }
            self.top += want;
            return true;
        }
        match self.free.get(&end).copied() {
            Some(l) if l >= want => {
                self.free.remove(&end);
                if l > want {
                    self.free.insert(end + want, l - want);
                }
                true
            }
            _ => false,
        }
    }

    /// Whether all of `[start, start + len)` is free.
    pub fn is_free(&self, start: usize, len: usize) -> bool {
        let end = start + len;
        if start >= self.top {
            return end <= self.span;
        }
        // One free range below the top must cover it, up to the top, and the top the rest.
        match self.free.range(..=start).next_back() {
            Some((&a, &l)) if a + l >= end.min(self.top) && a <= start => end <= self.span,
            _ => false,
        }
    }

    /// Marks `[start, start + len)` in use, whatever part of it was free (MAP_FIXED: the
    /// program places a mapping at an address of its choosing). False if it reaches past the
    /// span.
    pub fn claim(&mut self, start: usize, len: usize) -> bool {
        let end = start + len;
        if end > self.span {
            return false;
        }
        if end > self.top {
            // The bytes from the top up to `start` become a free range.
            if start > self.top {
                let gap = (self.top, start - self.top);
                self.top = end;
                self.insert_free(gap.0, gap.1);
            } else {
                self.top = end;
            }
        }
        // Cut `[start, end)` out of every free range it overlaps.
        let overlapping: Vec<(usize, usize)> = self
            .free
            .range(..end)
            .filter(|(&a, &l)| a + l > start)
            .map(|(&a, &l)| (a, l))
            .collect();
        for (a, l) in overlapping {
            self.free.remove(&a);
            if a < start {
                self.free.insert(a, start - a);
            }
            if a + l > end {
                self.free.insert(end, a + l - end);
            }
        }
        true
    }

    /// Frees whatever part of `[start, start + len)` is in use; parts already free are skipped.
    /// Returns the parts freed, for the caller to discard.
    pub fn release(&mut self, start: usize, len: usize) -> Vec<(usize, usize)> {
        let end = (start + len).min(self.top);
        let mut freed = Vec::new();
        let mut at = start;
        while at < end {
            // The free range containing `at`, or the next one after it.
            let covering = self
                .free
                .range(..=at)
                .next_back()
                .filter(|(&a, &l)| a + l > at)
                .map(|(&a, &l)| a + l);
            if let Some(free_end) = covering {
                at = free_end;
                continue;
            }
            let next_free = self
                .free
                .range(at..)
                .next()
                .map_or(end, |(&a, _)| a.min(end));
            freed.push((at, next_free - at));
            at = next_free;
        }
        for &(a, l) in &freed {
            self.insert_free(a, l);
        }
        freed
    }

    fn insert_free(&mut self, mut start: usize, mut len: usize) {
        if let Some((&a, &l)) = self.free.range(..start).next_back() {
            if a + l == start {
                self.free.remove(&a);
                start = a;
                len += l;
            }
        }
        if let Some(l) = self.free.remove(&(start + len)) {
            len += l;
        }
        if start + len == self.top {
            self.top = start;
            // The range below may now end at the top.
            if let Some((&a, &l)) = self.free.range(..start).next_back() {
                if a + l == start {
                    self.free.remove(&a);
                    self.top = a;
                }
            }
        } else {
            self.free.insert(start, len);
        }
    }

    /// Bytes in use (for tests).
    #[cfg(test)]
    fn in_use(&self) -> usize {
        self.top - self.free.values().sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = 4096;

    #[test]
    fn partial_and_repeated_releases_free_each_page_once() {
        let mut r = Ranges::new(1 << 30);
        let a = r.take(10 * P).unwrap();
        let b = r.take(4 * P).unwrap();
        assert_eq!((a, b), (0, 10 * P));
        // Unmap the middle of `a`, then all of `a` (twice), as munmap allows.
        assert_eq!(r.release(2 * P, 3 * P), vec![(2 * P, 3 * P)]);
        assert_eq!(r.release(0, 10 * P), vec![(0, 2 * P), (5 * P, 5 * P)]);
        assert!(r.release(0, 10 * P).is_empty());
        assert_eq!(r.in_use(), 4 * P);
        // The hole is reused first fit; releasing `b` shrinks everything back to nothing.
        assert_eq!(r.take(3 * P), Some(0));
        r.release(0, 3 * P);
        r.release(b, 4 * P);
        assert_eq!((r.top, r.free.len()), (0, 0));
    }

    #[test]
    fn grows_in_place_only_into_free_space() {
        let mut r = Ranges::new(100 * P);
        let a = r.take(2 * P).unwrap();
        assert!(r.grow_in_place(a, 2 * P, 5 * P));
        let b = r.take(P).unwrap();
        assert!(!r.grow_in_place(a, 5 * P, 6 * P));
        r.release(b, P);
        assert!(r.grow_in_place(a, 5 * P, 100 * P));
        assert!(r.take(P).is_none());
    }

    #[test]
    fn claimed_ranges_are_in_use_wherever_they_fall() {
        let mut r = Ranges::new(100 * P);
        let a = r.take(10 * P).unwrap();
        assert!(r.is_free(20 * P, 5 * P) && !r.is_free(5 * P, 10 * P));
        // Past the top, leaving a free gap below it.
        assert!(r.claim(20 * P, 5 * P));
        assert!(!r.is_free(20 * P, P) && r.is_free(10 * P, 10 * P));
        assert_eq!(r.in_use(), 15 * P);
        // Over a free hole and part of a range in use.
        r.release(a, 4 * P);
        assert!(r.claim(2 * P, 14 * P));
        assert_eq!(r.in_use(), 19 * P);
        assert_eq!(r.take(2 * P), Some(0));
        assert_eq!(r.take(4 * P), Some(16 * P));
        assert!(!r.claim(99 * P, 2 * P));
    }

    #[test]
    fn random_operations_keep_the_accounting() {
        // A small deterministic generator: no dependency for one test.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut r = Ranges::new(4096 * P);
        let mut live: Vec<(usize, usize)> = Vec::new();
        let mut owned = 0;
        for _ in 0..5000 {
            if live.is_empty() || next() % 3 != 0 {
                let len = (next() % 16 + 1) as usize * P;
                if let Some(a) = r.take(len) {
                    assert!(live.iter().all(|&(b, l)| a + len <= b || b + l <= a));
                    live.push((a, len));
                    owned += len;
                }
            } else {
                let (a, l) = live.swap_remove((next() as usize) % live.len());
                // Sometimes only a part, the rest later.
                let cut = (next() % (l / P) as u64) as usize * P;
                let freed: usize = r.release(a, cut).iter().map(|f| f.1).sum();
                let rest: usize = r.release(a, l).iter().map(|f| f.1).sum();
                assert_eq!(freed + rest, l);
                owned -= l;
            }
            assert_eq!(r.in_use(), owned);
        }
    }
}
