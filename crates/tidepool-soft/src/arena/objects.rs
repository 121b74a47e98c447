//! Objects in an arena: a header (whose slot and generation, how long), then the payload,
//! appended to a segment; read back by copying, checked against the header and the segment's
//! incarnation.

use super::{Placement, SoftArena, HEADER, INC_MASK, MAGIC, SEGMENT};
use crate::resilient::Lost;
use crate::slots;
use crate::sync::fence;
use crate::SoftError;
use std::sync::atomic::Ordering::*;

impl SoftArena {
    /// Writes an object for `slot` (header, then `len` bytes from `src`) into new space;
    /// where it went.
    ///
    /// # Safety
    ///
    /// `src` is valid for reads of `len` bytes.
    pub(crate) unsafe fn append(
        &self,
        slot: u32,
        generation: u16,
        src: *const u8,
        len: usize,
    ) -> Result<Placement, SoftError> {
        if self.memory.forked() {
            return Err(SoftError::Forked);
        }
        if len > u32::MAX as usize {
            return Err(SoftError::TooLarge {
                bytes: len,
                budget: self.budget(),
            });
        }
        let total = (HEADER + len).next_multiple_of(16);
        let header = [tag(slot, generation), len as u64];
        loop {
            let at = self.allocate(total)?;
            // The segment's incarnation bump (when it was last evicted) happens before this
            // write; the fence makes a reader that sees the bytes also see the bump (it
            // checks after an acquire fence). No instruction on x86.
            fence(Release);
            // SAFETY: [at, at + total) was just allocated to us inside the arena; `header`
            // is ours and `src` is the caller's; a revoked page is reported, not faulted on.
            let written = unsafe {
                self.memory
                    .write(at.offset, header.as_ptr().cast(), HEADER)
                    .and_then(|()| self.memory.write(at.offset + HEADER, src, len))
            };
            self.meta[at.offset / SEGMENT].writers.fetch_sub(1, Release);
            match written {
                Ok(()) => return Ok(at),
                // The segment was revoked under us: it is gone; take another.
                Err(Lost) => self.revoked(at),
            }
        }
    }

    /// Copies the payload of the object at `offset` into `sink` after checking that its
    /// header names `slot` and `generation` and that the sink takes its length; returns the
    /// payload length and the header. `Err(Lost)` if a page of it was revoked or
    /// something else is there now. The bytes may be torn by a concurrent reuse of the
    /// segment: the caller checks the incarnation again afterwards.
    pub(crate) fn read(
        &self,
        offset: usize,
        slot: u32,
        generation: u16,
        sink: &mut impl Sink,
    ) -> Result<(usize, [u64; 2]), Lost> {
        let header = self.header(offset, slot, generation)?;
        let len = header[1] as u32 as usize;
        let dst = sink.prepare(len).ok_or(Lost)?;
        // SAFETY: the header said `len` bytes follow, inside the arena (checked in `header`),
        // whose mapping lives as long as `self`; revoked pages are reported; the sink gave
        // room for `len` bytes at `dst`.
        unsafe { self.memory.read(dst, offset + HEADER, len)? };
        Ok((len, header))
    }

    /// The header at `offset`, if readable, naming `slot`, and describing an object inside
    /// the arena.
    pub(crate) fn header(
        &self,
        offset: usize,
        slot: u32,
        generation: u16,
    ) -> Result<[u64; 2], Lost> {
        let mut header = [0u64; 2];
        if offset + HEADER > self.memory.bytes() {
            return Err(Lost);
        }
        // SAFETY: the header lies inside the arena (checked just above), whose mapping lives
        // as long as `self`; revoked pages are reported; `header` is ours.
        unsafe {
            self.memory
                .read(header.as_mut_ptr().cast(), offset, HEADER)?
        };
        if header[0] != tag(slot, generation)
            || offset + HEADER + header[1] as u32 as usize > self.memory.bytes()
        {
            return Err(Lost);
        }
        Ok(header)
    }

    /// The payload length of the object at `offset`, if its segment is still in
    /// `incarnation` and the header is readable.
    pub(crate) fn object_bytes(&self, offset: usize, incarnation: u32) -> Option<usize> {
        if self.incarnation(offset) != incarnation || offset + HEADER > self.memory.bytes() {
            return None;
        }
        let mut h = [0u64; 2];
        // SAFETY: inside the arena (checked above); revoked pages are reported.
        unsafe {
            self.memory
                .read(h.as_mut_ptr().cast(), offset, HEADER)
                .ok()?
        };
        (h[0] >> 48 == MAGIC).then_some(h[1] as u32 as usize)
    }

    /// An object of `len` payload bytes at `offset` is no longer referenced.
    pub(crate) fn forget(&self, offset: usize, incarnation: u32, len: usize) {
        let m = &self.meta[offset / SEGMENT];
        if m.incarnation.load(Acquire) & INC_MASK == incarnation {
            m.live
                .fetch_sub((HEADER + len).next_multiple_of(16) as i64, Relaxed);
        }
    }
}

/// Where a read puts an object's bytes.
///
/// # Safety
///
/// `prepare` returns a pointer valid for writes of `len` bytes, or `None`.
pub(crate) unsafe trait Sink {
    /// Room for `len` bytes (or `None`: this is not the object the reader expects).
    fn prepare(&mut self, len: usize) -> Option<*mut u8>;
    /// The bytes are in and validated.
    fn done(&mut self, len: usize);
}

/// A sink of one fixed length.
pub(crate) struct Exact {
    dst: *mut u8,
    len: usize,
}

impl Exact {
    /// # Safety
    ///
    /// `dst` is valid for writes of `len` bytes for as long as the sink is used.
    pub unsafe fn new(dst: *mut u8, len: usize) -> Exact {
        Exact { dst, len }
    }
}

// SAFETY: `dst` is valid for `len` bytes (the contract of `Exact::new`).
unsafe impl Sink for Exact {
    fn prepare(&mut self, len: usize) -> Option<*mut u8> {
        (len == self.len).then_some(self.dst)
    }
    fn done(&mut self, _: usize) {}
}

// SAFETY: the pointer is to the vector's own reserved capacity.
unsafe impl Sink for Vec<u8> {
    fn prepare(&mut self, len: usize) -> Option<*mut u8> {
        self.clear();
        self.reserve(len);
        Some(self.as_mut_ptr())
    }
    fn done(&mut self, len: usize) {
        // SAFETY: `prepare` reserved `len` bytes and the copy filled them.
        unsafe { self.set_len(len) };
    }
}

/// A header's first word: who the object belongs to.
pub(crate) fn tag(slot: u32, generation: u16) -> u64 {
    (MAGIC << 48) | ((generation as u64) << 32) | slot as u64
}

/// The slot word for an object placed at `at`.
pub(crate) fn live_word(generation: u16, at: Placement) -> u64 {
    slots::word(slots::LIVE, generation, at.offset, at.incarnation)
}
