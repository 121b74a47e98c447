//! The node's one large mapping: the unified address space every tenant's objects live in.
//!
//! This is the only module of the node with `unsafe`. It hands out copies in and out of the
//! mapping; who may touch which bytes when is decided by the slot protocol in `slots.rs`, whose
//! guards are the only callers.

use crate::slots::{ReadAccess, WriteAccess};
use std::io;
use std::ptr::NonNull;

/// An anonymous private mapping of `len` bytes, reserved without committing memory
/// (`MAP_NORESERVE`): pages become resident only when an object is first written there.
#[derive(Debug)]
pub struct Arena {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; the raw pointer is only a handle to
// it. Concurrent access to the bytes is governed by the slot protocol (see the `unsafe fn`s).
unsafe impl Send for Arena {}
// SAFETY: as above; `&Arena` only offers copies whose callers guarantee exclusive or
// shared-read access to the bytes they name.
unsafe impl Sync for Arena {}

impl Arena {
    pub fn new(len: usize) -> io::Result<Arena> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "capacity is zero",
            ));
        }
        let p = tidepool_sys::map_noreserve(len)?;
        // Objects are read at random: with 4 KiB pages nearly every get misses the TLB, and
        // under a hypervisor that miss walks two page tables. Huge pages where the kernel has
        // them (advice only: without THP the mapping works as before).
        let _ = tidepool_sys::vm::advise(p, len, libc::MADV_HUGEPAGE);
        let base = NonNull::new(p as *mut u8).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Arena { base, len })
    }

    fn check(&self, offset: u64, len: usize) {
        // Offsets come from the node's own allocator, never from the wire; a failure here is a
        // bug in the allocator, and copying out of bounds would be worse than stopping.
        assert!(
            (offset as usize)
                .checked_add(len)
                .is_some_and(|end| end <= self.len),
            "arena access {offset}+{len} outside {} bytes",
            self.len
        );
    }

    /// Appends the object a guard covers to `out`. `base` is its section's start.
    pub fn read(&self, guard: &impl ReadAccess, base: u64, out: &mut impl bytes::BufMut) {
        let (offset, len) = guard.extent();
        // SAFETY: the guard holds read (or exclusive) access to exactly these bytes.
        unsafe { self.copy_out(base + offset, len, out) }
    }

    /// The bytes of the object a guard covers, for as long as the guard is borrowed. Used to
    /// hand object bytes to the kernel without copying them first.
    pub fn slice<'g>(&'g self, guard: &'g impl ReadAccess, base: u64) -> &'g [u8] {
        let (offset, len) = guard.extent();
        self.check(base + offset, len);
        // SAFETY: in bounds (checked above); the guard holds read access to these bytes, so no
        // thread writes them while the returned slice (which borrows the guard) lives.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add((base + offset) as usize), len) }
    }

    /// Copies `data` into the object a guard covers. The guard checked that it fits.
    pub fn write(&self, guard: &impl WriteAccess, base: u64, data: &[u8]) {
        let offset = guard.writable(data.len());
        // SAFETY: the guard holds exclusive access to its block, which is at least as large as
        // `data` (checked by `writable`).
        unsafe { self.copy_in(base + offset, data) }
    }

    /// Appends `len` bytes at `offset` to `out`.
    ///
    /// # Safety
    /// The caller must hold read access to these bytes under the slot protocol: no thread writes
    /// them until the caller's guard is released.
    unsafe fn copy_out(&self, offset: u64, len: usize, out: &mut impl bytes::BufMut) {
        self.check(offset, len);
        // SAFETY: in bounds (checked above), and no concurrent writer by the caller's contract,
        // so a shared slice over these bytes is sound for its short life.
        let src =
            unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset as usize), len) };
        out.put_slice(src);
    }

    /// Copies `data` to `offset`.
    ///
    /// # Safety
    /// The caller must hold exclusive access to these bytes under the slot protocol: no other
    /// thread reads or writes them until the caller's guard is released.
    unsafe fn copy_in(&self, offset: u64, data: &[u8]) {
        self.check(offset, data.len());
        // SAFETY: in bounds (checked above); exclusive by the caller's contract; `data` cannot
        // overlap the arena because the arena is never handed out as a slice that outlives a
        // guard.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.base.as_ptr().add(offset as usize),
                data.len(),
            )
        };
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`; no reference into it outlives
        // `self` because every access copies.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}
