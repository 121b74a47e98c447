//! Counters and their report. The report is formatted into a stack buffer and written with
//! write(2): it runs at exit inside programs whose malloc we are, so it must not allocate.

use crate::classes::{class_size, ARENA_BYTES, CLASSES};
use crate::heap;
use crate::large;
use crate::medium;
use crate::os;
use crate::region::{STATS_AT_EXIT, STATS_PATH, STATS_PATH_MAX};
use core::ffi::CStr;
use core::sync::atomic::Ordering::Relaxed;

/// One size class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Object size.
    pub size: usize,
    /// Objects freed by a thread other than their arena's owner (counted when collected).
    pub remote_frees: u64,
    /// Arenas ever taken from the class's span.
    pub arenas: usize,
    /// Bytes of those arenas resident now (headers included).
    pub resident: usize,
}

/// A snapshot of the allocator's counters.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    /// Per size class.
    pub classes: [ClassStats; CLASSES],
    /// Large objects allocated and freed.
    pub large_allocs: u64,
    pub large_frees: u64,
    /// Bytes mapped for large objects, the cache included.
    pub large_mapped: usize,
    /// Bytes of freed large mappings kept for reuse.
    pub large_cached: usize,
    /// Address space handed to arenas (pages appear only when touched).
    pub arena_bytes: usize,
    /// Empty arenas kept resident for reuse.
    pub empty_resident: usize,
    /// Medium-heap allocations and frees.
    pub medium_allocs: u64,
    pub medium_frees: u64,
    /// Bytes in live medium chunks (tags included).
    pub medium_in_use: usize,
    /// Bytes of the medium span ever carved (its high-water mark).
    pub medium_carved: usize,
}

/// Current counters.
pub fn snapshot() -> Stats {
    let mut classes = [ClassStats::default(); CLASSES];
    let mut arena_bytes = 0;
    for (c, slot) in classes.iter_mut().enumerate() {
        let (remote_frees, arenas) = heap::class_counters(c);
        *slot = ClassStats {
            size: class_size(c),
            remote_frees,
            arenas,
            resident: heap::class_resident_bytes(c),
        };
        arena_bytes += arenas * ARENA_BYTES;
    }
    let (large_allocs, large_frees, large_mapped, large_cached) = large::counters();
    let (medium_allocs, medium_frees, medium_in_use, medium_carved) = medium::counters();
    Stats {
        medium_allocs,
        medium_frees,
        medium_in_use,
        medium_carved,
        classes,
        large_allocs,
        large_frees,
        large_mapped,
        large_cached,
        arena_bytes,
        empty_resident: heap::resident_empty_bytes(),
    }
}

/// A fixed-capacity line that formats without allocating.
struct Line {
    buf: [u8; 160],
    len: usize,
    fd: i32,
}

impl Line {
    fn new(fd: i32) -> Self {
        Line {
            buf: [0; 160],
            len: 0,
            fd,
        }
    }

    fn text(&mut self, s: &[u8]) -> &mut Self {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
        self
    }

    /// `v` right-aligned in `width` columns.
    fn num(&mut self, v: u64, width: usize) -> &mut Self {
        let mut digits = [0u8; 20];
        let d = os::decimal(v, &mut digits);
        for _ in d.len()..width {
            self.text(b" ");
        }
        self.text(d)
    }

    fn flush(&mut self) {
        self.text(b"\n");
        os::write_all(self.fd, &self.buf[..self.len]);
        self.len = 0;
    }
}

/// Writes the report where `TIDEPOOL_ALLOC_STATS` asked (standard error, or appended to the
/// file it names), or to standard error when called directly.
pub fn print() {
    let mut path = [0u8; STATS_PATH_MAX];
    let mut fd = 2;
    if STATS_AT_EXIT.load(Relaxed) == 2 {
        for (dst, src) in path.iter_mut().zip(STATS_PATH.iter()) {
            *dst = src.load(Relaxed);
        }
        if let Some(f) = CStr::from_bytes_until_nul(&path)
            .ok()
            .and_then(os::open_append)
        {
            fd = f;
        }
    }
    write_report(fd);
    if fd != 2 {
        os::close(fd);
    }
}

fn write_report(fd: i32) {
    let s = snapshot();
    let mut line = Line::new(fd);
    line.text(b"tidepool-alloc statistics").flush();
    line.text(b"   size   remote frees  arenas  resident KiB")
        .flush();
    line.text(b"(medium and large: allocs, frees)").flush();
    for c in s.classes.iter().filter(|c| c.arenas > 0) {
        line.num(c.size as u64, 7)
            .num(c.remote_frees, 15)
            .num(c.arenas as u64, 8)
            .num((c.resident >> 10) as u64, 14)
            .flush();
    }
    line.text(b" medium")
        .num(s.medium_allocs, 13)
        .num(s.medium_frees, 13)
        .flush();
    line.text(b"  large")
        .num(s.large_allocs, 13)
        .num(s.large_frees, 13)
        .flush();
    line.text(b"arena address space: ")
        .num((s.arena_bytes >> 20) as u64, 0)
        .text(b" MiB; empty arenas kept resident: ")
        .num((s.empty_resident >> 10) as u64, 0)
        .text(b" KiB")
        .flush();
    line.text(b"medium heap: ")
        .num((s.medium_in_use >> 10) as u64, 0)
        .text(b" KiB in use, ")
        .num((s.medium_carved >> 10) as u64, 0)
        .text(b" KiB carved at most")
        .flush();
    line.text(b"large objects mapped: ")
        .num((s.large_mapped >> 10) as u64, 0)
        .text(b" KiB (")
        .num((s.large_cached >> 10) as u64, 0)
        .text(b" KiB cached for reuse)")
        .flush();
}

#[cfg(test)]
mod tests {
    use super::Line;

    #[test]
    fn numbers_format_right_aligned() {
        let mut l = Line::new(2);
        l.num(0, 3)
            .text(b"|")
            .num(1234567, 0)
            .text(b"|")
            .num(u64::MAX, 0);
        assert_eq!(&l.buf[..l.len], b"  0|1234567|18446744073709551615");
    }
}
