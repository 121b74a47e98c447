//! A section's allocator: size classes carved out of spans of 64 KiB pages.
//!
//! Owned and run by exactly one thread (the section's allocator thread), so nothing here is
//! synchronised. All metadata lives in these structures, apart from the data in the arena
//! (Sharry's segregated layout): finding free space walks only this metadata, never object
//! memory, and the arena holds nothing but object bytes.
//!
//! Small objects (up to 256 KiB) are rounded to one of eight classes per power of two (at most
//! 12.5% waste; 4 KiB pages fit exactly) and packed into spans of one class. Larger objects get
//! a run of whole pages. Free page runs are coalesced, and a span whose last block is freed goes
//! back to the page pool, so memory moves between classes as the workload changes.

use std::collections::BTreeMap;

pub const PAGE: u64 = 64 << 10;
pub const MIN_CLASS: u32 = 64;
pub const MAX_SMALL: u32 = 256 << 10;
/// A small-class span holds at least this many blocks.
const BLOCKS_PER_SPAN_MIN: u64 = 8;
const NONE: u32 = u32::MAX;
pub const LARGE_CLASS: u16 = u16::MAX;

/// The block sizes of the small classes, ascending.
pub fn class_sizes() -> &'static [u32] {
    static SIZES: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    SIZES.get_or_init(|| {
        let mut v = vec![];
        let mut s = MIN_CLASS;
        while s <= MAX_SMALL {
            v.push(s);
            // Eight steps per doubling above 128 bytes, 16-byte steps below.
            let step = if s < 128 {
                16
            } else {
                1 << (31 - s.leading_zeros() - 3)
            };
            s += step;
        }
        v
    })
}

/// The class index for an object of `size` bytes, or `None` if it takes the large path.
pub fn class_of(size: usize) -> Option<u16> {
    if size > MAX_SMALL as usize {
        return None;
    }
    let sizes = class_sizes();
    Some(sizes.partition_point(|&c| (c as usize) < size) as u16)
}

/// Bytes an object of `size` occupies.
pub fn footprint(size: usize) -> u64 {
    match class_of(size) {
        Some(c) => class_sizes()[c as usize] as u64,
        None => (size as u64).div_ceil(PAGE) * PAGE,
    }
}

/// Where one allocated block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Byte offset within the section.
    pub offset: u64,
    /// Usable bytes.
    pub cap: u32,
    /// The span holding it, needed to free it.
    pub span: u32,
}

#[derive(Debug)]
struct Span {
    start: u32,
    pages: u32,
    class: u16,
    block: u32,
    used: u32,
    capacity: u32,
    /// Blocks never handed out yet start at `bump`.
    bump: u32,
    /// Indices of freed blocks, reused first.
    freed: Vec<u32>,
    /// Position in its class's partial list, or NONE.
    partial_pos: u32,
}

#[derive(Debug)]
pub struct SpanAllocator {
    pages: u32,
    free_runs: BTreeMap<u32, u32>,
    free_pages: u64,
    spans: Vec<Span>,
    unused_span_ids: Vec<u32>,
    /// Per class, spans that have a free block.
    partial: Vec<Vec<u32>>,
    used_bytes: u64,
}

impl SpanAllocator {
    pub fn new(bytes: u64) -> SpanAllocator {
        let pages = (bytes / PAGE) as u32;
        let mut free_runs = BTreeMap::new();
        if pages > 0 {
            free_runs.insert(0, pages);
        }
        SpanAllocator {
            pages,
            free_runs,
            free_pages: pages as u64,
            spans: vec![],
            unused_span_ids: vec![],
            partial: vec![vec![]; class_sizes().len()],
            used_bytes: 0,
        }
    }

    pub fn capacity(&self) -> u64 {
        self.pages as u64 * PAGE
    }

    /// Bytes in handed-out blocks.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Bytes in whole free pages: what a request of any size could still get.
    pub fn free_page_bytes(&self) -> u64 {
        self.free_pages * PAGE
    }

    pub fn alloc(&mut self, size: usize) -> Option<Block> {
        match class_of(size) {
            Some(class) => self.alloc_small(class),
            None => self.alloc_large(size),
        }
    }

    fn alloc_small(&mut self, class: u16) -> Option<Block> {
        let span_id = match self.partial[class as usize].last() {
            Some(&id) => id,
            None => {
                let block = class_sizes()[class as usize];
                let span_bytes = (block as u64 * BLOCKS_PER_SPAN_MIN).max(PAGE);
                let pages = span_bytes.div_ceil(PAGE) as u32;
                let start = self.take_pages(pages)?;
                let capacity = (pages as u64 * PAGE / block as u64) as u32;
                let id = self.new_span(Span {
                    start,
                    pages,
                    class,
                    block,
                    used: 0,
                    capacity,
                    bump: 0,
                    freed: vec![],
                    partial_pos: NONE,
                });
                self.partial_push(class, id);
                id
            }
        };
        let span = &mut self.spans[span_id as usize];
        let index = match span.freed.pop() {
            Some(i) => i,
            None => {
                span.bump += 1;
                span.bump - 1
            }
        };
        span.used += 1;
        let block = Block {
            offset: span.start as u64 * PAGE + index as u64 * span.block as u64,
            cap: span.block,
            span: span_id,
        };
        self.used_bytes += span.block as u64;
        if span.used == span.capacity {
            self.partial_remove(span_id);
        }
        Some(block)
    }

    fn alloc_large(&mut self, size: usize) -> Option<Block> {
        let pages = u32::try_from((size as u64).div_ceil(PAGE)).ok()?;
        let cap = u32::try_from(pages as u64 * PAGE).ok()?;
        let start = self.take_pages(pages)?;
        let id = self.new_span(Span {
            start,
            pages,
            class: LARGE_CLASS,
            block: cap,
            used: 1,
            capacity: 1,
            bump: 1,
            freed: vec![],
            partial_pos: NONE,
        });
        self.used_bytes += cap as u64;
        Some(Block {
            offset: start as u64 * PAGE,
            cap,
            span: id,
        })
    }

    /// Frees a block this allocator handed out.
    pub fn free(&mut self, block: Block) {
        let span = &mut self.spans[block.span as usize];
        debug_assert!(span.used > 0, "double free in span {}", block.span);
        span.used -= 1;
        self.used_bytes -= span.block as u64;
        if span.used == 0 {
            let (start, pages, class, pos) = (span.start, span.pages, span.class, span.partial_pos);
            if class != LARGE_CLASS && pos != NONE {
                self.partial_remove(block.span);
            }
            self.unused_span_ids.push(block.span);
            self.spans[block.span as usize].freed = vec![];
            self.give_pages(start, pages);
            return;
        }
        let index = ((block.offset - span.start as u64 * PAGE) / span.block as u64) as u32;
        span.freed.push(index);
        if span.partial_pos == NONE {
            let class = span.class;
            self.partial_push(class, block.span);
        }
    }

    fn new_span(&mut self, span: Span) -> u32 {
        match self.unused_span_ids.pop() {
            Some(id) => {
                self.spans[id as usize] = span;
                id
            }
            None => {
                self.spans.push(span);
                (self.spans.len() - 1) as u32
            }
        }
    }

    fn partial_push(&mut self, class: u16, id: u32) {
        let list = &mut self.partial[class as usize];
        self.spans[id as usize].partial_pos = list.len() as u32;
        list.push(id);
    }

    fn partial_remove(&mut self, id: u32) {
        let (class, pos) = {
            let s = &self.spans[id as usize];
            (s.class, s.partial_pos)
        };
        let list = &mut self.partial[class as usize];
        list.swap_remove(pos as usize);
        if let Some(&moved) = list.get(pos as usize) {
            self.spans[moved as usize].partial_pos = pos;
        }
        self.spans[id as usize].partial_pos = NONE;
    }

    /// First fit by address, which keeps the low end of the section dense.
    fn take_pages(&mut self, pages: u32) -> Option<u32> {
        let (&start, &len) = self.free_runs.iter().find(|(_, &len)| len >= pages)?;
        self.free_runs.remove(&start);
        if len > pages {
            self.free_runs.insert(start + pages, len - pages);
        }
        self.free_pages -= pages as u64;
        Some(start)
    }

    fn give_pages(&mut self, mut start: u32, mut pages: u32) {
        self.free_pages += pages as u64;
        if let Some((&prev, &plen)) = self.free_runs.range(..start).next_back() {
            if prev + plen == start {
                self.free_runs.remove(&prev);
                start = prev;
                pages += plen;
            }
        }
        if let Some(next_len) = self.free_runs.remove(&(start + pages)) {
            pages += next_len;
        }
        self.free_runs.insert(start, pages);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn classes_bound_waste_and_fit_pages_exactly() {
        let sizes = class_sizes();
        assert_eq!(sizes[0], MIN_CLASS);
        assert_eq!(*sizes.last().unwrap(), MAX_SMALL);
        assert_eq!(footprint(4096), 4096);
        for size in (65..MAX_SMALL as usize).step_by(97) {
            let f = footprint(size);
            assert!(f >= size as u64);
            assert!(f as f64 <= size as f64 * 1.125 + 16.0, "{size} -> {f}");
        }
        assert_eq!(footprint(MAX_SMALL as usize + 1), 5 * PAGE);
    }

    proptest! {
        /// Random allocs and frees against a model: blocks never overlap, always lie inside the
        /// section, and freeing everything returns every page.
        #[test]
        fn blocks_never_overlap(ops in prop::collection::vec((0usize..600_000, any::<bool>(), any::<prop::sample::Index>()), 1..300)) {
            let mut a = SpanAllocator::new(64 * PAGE);
            let mut live: Vec<(Block, usize)> = vec![];
            for (size, alloc, pick) in ops {
                if alloc || live.is_empty() {
                    if let Some(b) = a.alloc(size) {
                        prop_assert!(b.cap as usize >= size);
                        prop_assert!(b.offset + b.cap as u64 <= a.capacity());
                        for (o, _) in &live {
                            let disjoint = b.offset + b.cap as u64 <= o.offset || o.offset + o.cap as u64 <= b.offset;
                            prop_assert!(disjoint, "{b:?} overlaps {o:?}");
                        }
                        live.push((b, size));
                    }
                } else {
                    let (b, _) = live.swap_remove(pick.index(live.len()));
                    a.free(b);
                }
                let used: u64 = live.iter().map(|(b, _)| b.cap as u64).sum();
                prop_assert_eq!(a.used_bytes(), used);
            }
            for (b, _) in live.drain(..) {
                a.free(b);
            }
            prop_assert_eq!(a.free_page_bytes(), a.capacity());
            prop_assert_eq!(a.free_runs.len(), 1);
        }
    }

    #[test]
    fn exhaustion_is_reported_not_panicked() {
        let mut a = SpanAllocator::new(4 * PAGE);
        let mut n = 0;
        while a.alloc(4096).is_some() {
            n += 1;
        }
        assert_eq!(n, 64);
        assert!(a.alloc(MAX_SMALL as usize + 1).is_none());
    }
}
