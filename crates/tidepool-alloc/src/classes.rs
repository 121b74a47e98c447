//! Size classes and the arena geometry each one implies. Pure arithmetic, all `const`.
//!
//! Memento found most serverless allocations under 512 bytes, so the small end is dense: every
//! 16 bytes up to 128, then four classes per doubling up to [`MAX_SMALL`] (at most 25% internal
//! waste, 12.5% on average). Plain requests above 8 KiB go to the medium heap
//! (`medium.rs`) instead, and above [`MAX_SMALL`] to the large-object path (`large.rs`); aligned
//! requests use the classes up to [`MAX_SMALL`].
//!
//! Every arena is [`ARENA_BYTES`] long and aligned to that size, whatever its class, so the
//! arena holding any small pointer is `ptr & !(ARENA_BYTES - 1)`: one mask. Its header sits
//! [`header_offset`] bytes in, one cache line further for each class: arenas aligned to 256 KiB
//! would otherwise put every class's header in the same set of every cache level (8 ways on this
//! machine's L1 and L2), and a program using twenty classes would miss on each. The header
//! (fixed fields, then one allocation bit per slot, used only in debug mode) occupies the first
//! slots, which are never handed out.

/// log2 of the arena size.
pub const ARENA_SHIFT: u32 = 18;
/// Bytes per arena (256 KiB): 16 384 slots of the smallest class, 7 of the largest.
pub const ARENA_BYTES: usize = 1 << ARENA_SHIFT;
/// Number of small size classes.
pub const CLASSES: usize = 40;
/// Largest request served from arenas.
pub const MAX_SMALL: usize = class_size(CLASSES - 1);
/// Requests up to this size find their class with one table lookup.
pub const LUT_MAX: usize = 1024;
/// Bytes of the fixed header fields, before the bitmap.
pub const HEADER_FIXED: usize = 128;
/// Page size assumed for lazy population and for discarding arena bodies.
pub const PAGE: usize = 4096;

/// Object size of class `c`.
pub const fn class_size(c: usize) -> usize {
    if c < 8 {
        (c + 1) * 16
    } else {
        let group = (c - 8) / 4;
        let step = (c - 8) % 4 + 1;
        let base = 128 << group;
        base + step * (base / 4)
    }
}

/// Smallest class whose objects hold `n` bytes; `n` must be at most [`MAX_SMALL`]. Zero-byte
/// requests get the smallest class (malloc(0) returns a unique pointer).
#[inline(always)]
pub const fn class_of(n: usize) -> usize {
    if n <= 128 {
        if n == 0 {
            0
        } else {
            n.div_ceil(16) - 1
        }
    } else {
        // 2^b < n <= 2^(b+1): four classes split that interval evenly.
        let b = (usize::BITS - 1 - (n - 1).leading_zeros()) as usize;
        8 + (b - 7) * 4 + ((n - 1 - (1 << b)) >> (b - 2))
    }
}

/// Class lookup for requests up to [`LUT_MAX`], indexed by `(n + 15) >> 4`.
pub static CLASS_LUT: [u8; LUT_MAX / 16 + 1] = {
    let mut lut = [0u8; LUT_MAX / 16 + 1];
    let mut i = 0;
    while i < lut.len() {
        lut[i] = class_of(i * 16) as u8;
        i += 1;
    }
    lut
};

/// Slots an arena of class `c` spans, header slots included.
pub const fn slots(c: usize) -> usize {
    ARENA_BYTES / class_size(c)
}

/// 64-bit words in the allocation bitmap of class `c`.
pub const fn bitmap_words(c: usize) -> usize {
    slots(c).div_ceil(64)
}

/// Where class `c`'s arena header starts, from the arena's start: its colour.
pub const fn header_offset(c: usize) -> usize {
    c * 64
}

/// Bytes from the arena's start to the end of its header (colour, fixed fields, bitmap).
pub const fn header_bytes(c: usize) -> usize {
    header_offset(c) + HEADER_FIXED + bitmap_words(c) * 8
}

/// First slot not overlapped by the header.
pub const fn first_slot(c: usize) -> usize {
    header_bytes(c).div_ceil(class_size(c))
}

/// Objects one arena of class `c` can hand out.
pub const fn capacity(c: usize) -> usize {
    slots(c) - first_slot(c)
}

/// `ceil(2^32 / size)`: `(offset * recip) >> 32` is the slot index of any slot-aligned offset in
/// an arena (offset < 2^18, so the rounding error stays below one).
pub const fn reciprocal(c: usize) -> u32 {
    ((1u64 << 32).div_ceil(class_size(c) as u64)) as u32
}

/// Smallest class at least `min_class` whose objects are all aligned to `align` (a power of two):
/// arenas are aligned to [`ARENA_BYTES`], so slot `i` sits at `i * size` and is aligned to the
/// largest power of two dividing `size`.
pub const fn aligned_class(min_class: usize, align: usize) -> Option<usize> {
    let mut c = min_class;
    while c < CLASSES {
        if class_size(c).is_multiple_of(align) {
            return Some(c);
        }
        c += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn classes_are_increasing_and_aligned() {
        assert_eq!(class_size(0), 16);
        assert_eq!(class_size(7), 128);
        assert_eq!(class_size(8), 160);
        assert_eq!(MAX_SMALL, 32 << 10);
        for c in 1..CLASSES {
            assert!(class_size(c) > class_size(c - 1));
            assert_eq!(class_size(c) % 16, 0, "class {c} breaks 16-byte alignment");
            assert!(
                capacity(c) >= 7,
                "class {c} holds only {} objects",
                capacity(c)
            );
            assert!(
                header_bytes(c) <= PAGE,
                "class {c} header spills past one page"
            );
        }
    }

    #[test]
    fn lut_agrees_with_class_of() {
        for n in 0..=LUT_MAX {
            assert_eq!(CLASS_LUT[(n + 15) >> 4] as usize, class_of(n), "n = {n}");
        }
    }

    #[test]
    fn reciprocal_gives_exact_slot_indices() {
        for c in 0..CLASSES {
            for i in 0..slots(c) {
                let offset = (i * class_size(c)) as u64;
                assert_eq!(((offset * reciprocal(c) as u64) >> 32) as usize, i);
            }
        }
    }

    proptest! {
        #[test]
        fn class_of_is_the_smallest_fit(n in 0usize..=MAX_SMALL) {
            let c = class_of(n);
            prop_assert!(c < CLASSES);
            prop_assert!(class_size(c) >= n);
            prop_assert!(c == 0 || class_size(c - 1) < n);
            // Internal waste is bounded by a quarter of the object (past the dense end).
            prop_assert!(n <= 128 || class_size(c) - n < class_size(c) / 4 + 1);
        }

        #[test]
        fn aligned_class_is_aligned(n in 1usize..=MAX_SMALL, shift in 4u32..=15) {
            let align = 1usize << shift;
            if let Some(c) = aligned_class(class_of(n), align) {
                prop_assert!(class_size(c) >= n);
                prop_assert_eq!(class_size(c) % align, 0);
            } else {
                prop_assert!(n > MAX_SMALL - align || align > MAX_SMALL);
            }
        }
    }
}
