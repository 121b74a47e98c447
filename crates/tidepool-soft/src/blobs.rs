//! Untyped soft objects for structures built outside this crate: a [`SoftBlobs`] pool hands
//! out [`Blob`]s, each one byte string in soft memory, read by appending to a caller's buffer
//! (no decoding, one copy). The index that finds a blob is the caller's, in normal memory,
//! as in [`crate::SoftMap`]; what is lost reads as missing and the caller decides what a
//! miss means (memcached's: a miss).

use crate::arena::objects::Sink;
use crate::arena::SoftArena;
use crate::counters::PoolStats;
use crate::pool::Handle;
use crate::structures::Core;
use crate::SoftError;
use std::sync::Arc;

/// A pool of byte strings in soft memory, sharing one arena's budget. Every [`Blob`] it made
/// must be given back with [`SoftBlobs::release`] (a blob dropped otherwise keeps its slot).
#[derive(Debug)]
pub struct SoftBlobs {
    core: Core,
}

/// One byte string in a [`SoftBlobs`] pool: a slot and generation, never an address.
#[derive(Debug)]
pub struct Blob {
    h: Handle,
}

/// Appends an object to a vector, after what it held (a reply being built).
struct Append<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

// SAFETY: the pointer is to the vector's own reserved capacity, past its first `start` bytes.
unsafe impl Sink for Append<'_> {
    fn prepare(&mut self, len: usize) -> Option<*mut u8> {
        self.out.truncate(self.start);
        self.out.reserve(len);
        // SAFETY: `start` is at most the length, within the allocation.
        Some(unsafe { self.out.as_mut_ptr().add(self.start) })
    }
    fn done(&mut self, len: usize) {
        // SAFETY: `prepare` reserved `len` bytes past `start` and the copy filled them.
        unsafe { self.out.set_len(self.start + len) };
    }
}

impl SoftBlobs {
    /// A pool on `arena`, named in the arena's statistics and the coordinator's view.
    pub fn new(arena: &Arc<SoftArena>, name: &str) -> SoftBlobs {
        SoftBlobs {
            core: Core::new(arena, name),
        }
    }

    /// A new, empty blob (it reads as missing until written).
    pub fn blob(&self) -> Blob {
        Blob {
            h: self.core.objects.handle(),
        }
    }

    /// Sets the blob's bytes.
    pub fn write(&self, b: &Blob, bytes: &[u8]) -> Result<(), SoftError> {
        // SAFETY: the slice's bytes, valid for its length.
        unsafe { self.core.objects.write(&b.h, bytes.as_ptr(), bytes.len()) }
    }

    /// Appends the blob's bytes to `out` and says `true`, or leaves `out` as it was and says
    /// `false` if they are gone (revoked, dropped as cold, never written). Counts a hit or a
    /// miss.
    pub fn read_into(&self, b: &Blob, out: &mut Vec<u8>) -> bool {
        let start = out.len();
        let hit = self.core.objects.read(&b.h, &mut Append { out, start });
        if !hit {
            out.truncate(start);
        }
        self.core.counters.hit(hit);
        hit
    }

    /// Like [`SoftBlobs::read_into`] without counting a hit or a miss (a read-modify-write
    /// that already counted its lookup).
    pub fn peek_into(&self, b: &Blob, out: &mut Vec<u8>) -> bool {
        let start = out.len();
        let hit = self.core.objects.read(&b.h, &mut Append { out, start });
        if !hit {
            out.truncate(start);
        }
        hit
    }

    /// Whether the blob's bytes are in soft memory now, as far as its slot tells (a read may
    /// still find them gone).
    pub fn present(&self, b: &Blob) -> bool {
        self.core.objects.present(&b.h)
    }

    /// Whether the blob's slot still remembers some hotness (of its bytes, or of bytes
    /// dropped as cold that has not aged away): worth keeping in an index.
    pub fn remembered(&self, b: &Blob) -> bool {
        self.core.objects.remembered(&b.h)
    }

    /// Drops the blob's bytes from soft memory (it reads as missing until written again).
    pub fn evict(&self, b: &Blob) {
        self.core.objects.evict(&b.h)
    }

    /// Tells the arena that bytes which were missing took `nanos` to rebuild (by whoever
    /// rebuilt them: for a cache, its client between the miss and the set that followed).
    /// A blob dropped as cold counts as a ghost hit at its distance: the miss curve the
    /// coordinator sizes the budget by.
    pub fn rebuilt(&self, b: &Blob, nanos: u64) {
        self.core.counters.rebuilt_elsewhere(nanos);
        self.core.objects.arena.rebuilt(Some(b.h.slot), nanos);
    }

    /// Gives the blob's slot back and forgets its bytes.
    pub fn release(&self, b: Blob) {
        self.core.objects.release(&b.h)
    }

    /// Hits, misses and rebuilds so far.
    pub fn stats(&self) -> PoolStats {
        self.core.counters.snapshot()
    }

    /// The arena the blobs live in.
    pub fn arena(&self) -> &Arc<SoftArena> {
        &self.core.objects.arena
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ArenaConfig;

    #[test]
    fn a_blob_reads_after_what_the_buffer_held_and_a_lost_one_leaves_it_untouched() {
        let arena = SoftArena::new(ArenaConfig::default()).unwrap();
        let blobs = SoftBlobs::new(&arena, "test");
        let b = blobs.blob();
        let mut out = b"VALUE k 0 5\r\n".to_vec();
        assert!(!blobs.read_into(&b, &mut out), "never written");
        assert_eq!(out, b"VALUE k 0 5\r\n");
        blobs.write(&b, b"hello").unwrap();
        assert!(blobs.read_into(&b, &mut out));
        assert_eq!(out, b"VALUE k 0 5\r\nhello");
        blobs.evict(&b);
        let mut again = b"head".to_vec();
        assert!(!blobs.read_into(&b, &mut again));
        assert_eq!(again, b"head");
        let s = blobs.stats();
        assert_eq!((s.hits, s.misses), (1, 2));
        blobs.release(b);
    }
}
