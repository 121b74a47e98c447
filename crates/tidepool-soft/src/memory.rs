//! An arena's memory: the one place the soft-memory core reads and writes soft memory.
//!
//! In normal builds it is a memfd mapped shared whose holes raise SIGBUS
//! ([`tidepool_sys::memfd::SigbusMap`]), registered with the resilient copy's fault handler,
//! and bytes move through that copy ([`crate::resilient`]): a revoked page reads as
//! [`Lost`]. Under `--cfg loom` it is plain memory in loom's atomic cells (relaxed, word by
//! word), so that loom sees the bytes the protocol's fences order; punching marks pages lost.
//! Nothing else of the core differs between the two builds.

use crate::resilient::Lost;
use std::io;

#[cfg(not(loom))]
pub(crate) use mapped::ArenaMemory;
#[cfg(loom)]
pub(crate) use plain::ArenaMemory;

/// Why an arena's memory could not be made.
#[derive(Debug)]
pub(crate) enum CreateError {
    Map(io::Error),
    #[cfg_attr(loom, allow(dead_code))] // the loom stand-in registers nothing
    TooManyArenas,
}

#[cfg(not(loom))]
mod mapped {
    use super::{CreateError, Lost};
    use crate::resilient;
    use std::io;
    use std::os::fd::BorrowedFd;
    use tidepool_sys::memfd::SigbusMap;

    /// A mapped memfd, registered with the resilient copy's fault handler while it lives.
    #[derive(Debug)]
    pub(crate) struct ArenaMemory {
        map: SigbusMap,
        registration: usize,
        /// `resilient::forks()` when it was made: in a forked child it is not mapped.
        forks: usize,
    }

    impl ArenaMemory {
        /// `len` bytes of address space aligned to `align`; no memory yet.
        pub(crate) fn create(len: usize, align: usize) -> Result<ArenaMemory, CreateError> {
            let map = SigbusMap::create(len, align).map_err(CreateError::Map)?;
            let registration = resilient::register_arena(map.base(), map.base() + map.bytes())
                .ok_or(CreateError::TooManyArenas)?;
            Ok(ArenaMemory {
                map,
                registration,
                forks: resilient::forks(),
            })
        }

        pub(crate) fn bytes(&self) -> usize {
            self.map.bytes()
        }

        pub(crate) fn memfd(&self) -> BorrowedFd<'_> {
            self.map.memfd()
        }

        /// This process is a fork of the one that made the memory: it is not mapped here.
        pub(crate) fn forked(&self) -> bool {
            resilient::forks() != self.forks
        }

        pub(crate) fn populate(&self, offset: usize, len: usize) -> io::Result<()> {
            self.map.populate(offset, len)
        }

        pub(crate) fn punch(&self, offset: usize, len: usize) -> io::Result<()> {
            self.map.punch(offset, len)
        }

        /// Copies `len` bytes from `src` to `offset`.
        ///
        /// # Safety
        ///
        /// `[offset, offset + len)` lies inside the memory; `src` is valid for reads of `len`
        /// bytes and not inside it.
        #[inline]
        pub(crate) unsafe fn write(
            &self,
            offset: usize,
            src: *const u8,
            len: usize,
        ) -> Result<(), Lost> {
            // SAFETY: the destination is inside our mapping, which lives as long as `self`
            // (the caller's contract), and `src` is the caller's; revoked pages are reported.
            unsafe { resilient::copy((self.map.base() + offset) as *mut u8, src, len) }
        }

        /// Copies `len` bytes at `offset` to `dst`.
        ///
        /// # Safety
        ///
        /// `[offset, offset + len)` lies inside the memory; `dst` is valid for writes of `len`
        /// bytes and not inside it.
        #[inline]
        pub(crate) unsafe fn read(
            &self,
            dst: *mut u8,
            offset: usize,
            len: usize,
        ) -> Result<(), Lost> {
            // SAFETY: as in `write`, the other way.
            unsafe { resilient::copy(dst, (self.map.base() + offset) as *const u8, len) }
        }

        /// Copies `len` bytes from `from` to `to`, both inside the memory and not overlapping.
        pub(crate) fn copy_within(&self, to: usize, from: usize, len: usize) -> Result<(), Lost> {
            assert!(
                to.max(from) + len <= self.bytes(),
                "a copy inside the arena"
            );
            let base = self.map.base();
            // SAFETY: both ranges lie inside our mapping (checked above); revoked pages are
            // reported.
            unsafe { resilient::copy((base + to) as *mut u8, (base + from) as *const u8, len) }
        }
    }

    impl Drop for ArenaMemory {
        fn drop(&mut self) {
            // Before the mapping goes (the field drops after this).
            resilient::unregister_arena(self.registration);
        }
    }
}

#[cfg(loom)]
mod plain {
    use super::{CreateError, Lost};
    use crate::sync::{AtomicBool, AtomicU64};
    use std::io;
    use std::os::fd::BorrowedFd;
    use std::sync::atomic::Ordering::{Relaxed, SeqCst};

    /// Bytes a punch takes at a time in the stand-in.
    const PAGE: usize = 32;

    /// Plain memory in loom's cells; a memfd of no size stands in for the real one.
    #[derive(Debug)]
    pub(crate) struct ArenaMemory {
        words: Box<[AtomicU64]>,
        /// Per page: punched, and not populated since (reads and writes are lost).
        holes: Box<[AtomicBool]>,
        memfd: std::os::fd::OwnedFd,
    }

    impl ArenaMemory {
        pub(crate) fn create(len: usize, _align: usize) -> Result<ArenaMemory, CreateError> {
            let memfd =
                rustix::fs::memfd_create("tidepool-soft-loom", rustix::fs::MemfdFlags::CLOEXEC)
                    .map_err(|e| CreateError::Map(e.into()))?;
            Ok(ArenaMemory {
                words: (0..len / 8).map(|_| AtomicU64::new(0)).collect(),
                holes: (0..len / PAGE).map(|_| AtomicBool::new(true)).collect(),
                memfd,
            })
        }

        pub(crate) fn bytes(&self) -> usize {
            self.words.len() * 8
        }

        pub(crate) fn memfd(&self) -> BorrowedFd<'_> {
            use std::os::fd::AsFd;
            self.memfd.as_fd()
        }

        pub(crate) fn forked(&self) -> bool {
            false
        }

        pub(crate) fn populate(&self, offset: usize, len: usize) -> io::Result<()> {
            self.holes[offset / PAGE..(offset + len) / PAGE]
                .iter()
                .for_each(|h| h.store(false, SeqCst));
            Ok(())
        }

        pub(crate) fn punch(&self, offset: usize, len: usize) -> io::Result<()> {
            self.holes[offset / PAGE..(offset + len) / PAGE]
                .iter()
                .for_each(|h| h.store(true, SeqCst));
            Ok(())
        }

        fn word(&self, i: usize) -> Result<&AtomicU64, Lost> {
            if self.holes[i * 8 / PAGE].load(SeqCst) {
                return Err(Lost);
            }
            Ok(&self.words[i])
        }

        /// # Safety
        ///
        /// As the mapped memory's: `src` is valid for reads of `len` bytes.
        pub(crate) unsafe fn write(
            &self,
            offset: usize,
            src: *const u8,
            len: usize,
        ) -> Result<(), Lost> {
            // SAFETY: the caller's contract.
            let src = unsafe { std::slice::from_raw_parts(src, len) };
            self.put(offset, src)
        }

        /// # Safety
        ///
        /// As the mapped memory's: `dst` is valid for writes of `len` bytes.
        pub(crate) unsafe fn read(
            &self,
            dst: *mut u8,
            offset: usize,
            len: usize,
        ) -> Result<(), Lost> {
            // SAFETY: the caller's contract.
            let dst = unsafe { std::slice::from_raw_parts_mut(dst, len) };
            self.get(offset, dst)
        }

        pub(crate) fn copy_within(&self, to: usize, from: usize, len: usize) -> Result<(), Lost> {
            let mut bytes = vec![0u8; len];
            self.get(from, &mut bytes)?;
            self.put(to, &bytes)
        }

        fn put(&self, offset: usize, src: &[u8]) -> Result<(), Lost> {
            let end = offset + src.len();
            for i in offset / 8..end.div_ceil(8) {
                let cell = self.word(i)?;
                let mut bytes = cell.load(Relaxed).to_le_bytes();
                for (k, b) in bytes.iter_mut().enumerate() {
                    let at = i * 8 + k;
                    if (offset..end).contains(&at) {
                        *b = src[at - offset];
                    }
                }
                cell.store(u64::from_le_bytes(bytes), Relaxed);
            }
            Ok(())
        }

        fn get(&self, offset: usize, dst: &mut [u8]) -> Result<(), Lost> {
            let end = offset + dst.len();
            for i in offset / 8..end.div_ceil(8) {
                let bytes = self.word(i)?.load(Relaxed).to_le_bytes();
                for (k, b) in bytes.iter().enumerate() {
                    let at = i * 8 + k;
                    if (offset..end).contains(&at) {
                        dst[at - offset] = *b;
                    }
                }
            }
            Ok(())
        }
    }
}
