//! The slot table: per-object metadata, kept apart from object data, and the protocol that lets
//! connection threads copy object bytes without locks while allocator threads recycle blocks.
//!
//! Each slot has one 64-bit state word:
//!
//! ```text
//! bits 63..32  generation  bumped when the object dies; a handle names one generation
//! bits 31..16  readers     connection threads copying the object out right now
//! bit  2       RESERVED    allocated and sitting in a connection's magazine, not yet visible
//! bit  1       EXCL        one thread is writing, taking or freeing the object
//! bit  0       LIVE        the object exists
//! ```
//!
//! A read takes a reader count only while LIVE, not EXCL and the generation matches; a writer
//! or freer takes EXCL only when there are no readers. A freer then bumps the generation and
//! clears LIVE before the slot goes back to its section's allocator, so by the time a block is
//! reused no guard on its old object remains and every old handle is refused as stale.
//! The other fields are written before the state word is published with Release and read after
//! it is observed with Acquire.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

pub const SLOTS_PER_CHUNK: usize = 4096;

const LIVE: u64 = 1;
const EXCL: u64 = 2;
const RESERVED: u64 = 4;
const READER: u64 = 1 << 16;
const READER_MASK: u64 = 0xFFFF << 16;

fn generation(state: u64) -> u32 {
    (state >> 32) as u32
}

fn state_of(generation: u32, flags: u64) -> u64 {
    ((generation as u64) << 32) | flags
}

/// Why an access through a handle was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No such object of this tenant was ever issued under this handle.
    Invalid,
    /// The object was freed or taken since.
    Stale,
}

#[derive(Debug, Default)]
pub struct SlotMeta {
    state: AtomicU64,
    tenant: AtomicU32,
    len: AtomicU32,
    cap: AtomicU32,
    span: AtomicU32,
    offset: AtomicU64,
    owner: AtomicU32,
}

/// What the allocator recorded about a slot's block.
#[derive(Debug, Clone, Copy)]
pub struct Placement {
    pub offset: u64,
    pub cap: u32,
    pub span: u32,
}

impl SlotMeta {
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed) as usize
    }
    pub fn owner(&self) -> u32 {
        self.owner.load(Ordering::Relaxed)
    }
    pub fn placement(&self) -> Placement {
        Placement {
            offset: self.offset.load(Ordering::Relaxed),
            cap: self.cap.load(Ordering::Relaxed),
            span: self.span.load(Ordering::Relaxed),
        }
    }

    /// Allocator side: gives the slot a block and marks it reserved. Returns its generation.
    pub fn reserve(&self, p: Placement) -> u32 {
        let s = self.state.load(Ordering::Acquire);
        debug_assert_eq!(s & (LIVE | EXCL | RESERVED | READER_MASK), 0);
        let generation = generation(s).max(1);
        self.offset.store(p.offset, Ordering::Relaxed);
        self.cap.store(p.cap, Ordering::Relaxed);
        self.span.store(p.span, Ordering::Relaxed);
        self.state
            .store(state_of(generation, RESERVED), Ordering::Release);
        generation
    }

    /// Holder of a reserved slot: returns it unused (the slot and block then go back to the
    /// allocator).
    pub fn unreserve(&self) {
        let s = self.state.load(Ordering::Acquire);
        debug_assert_eq!(s & RESERVED, RESERVED);
        self.state.store(
            state_of(generation(s).wrapping_add(1), 0),
            Ordering::Release,
        );
    }

    /// The holder of a reserved slot (the connection whose magazine it came from) claims it to
    /// fill and publish it.
    pub fn claim_reserved(&self) -> Reserved<'_> {
        debug_assert_eq!(self.state.load(Ordering::Relaxed) & RESERVED, RESERVED);
        Reserved { meta: self }
    }

    fn check(s: u64, want: u32) -> Result<(), Refusal> {
        let current = generation(s);
        if current == want && s & LIVE != 0 {
            Ok(())
        } else if want < current {
            Err(Refusal::Stale)
        } else {
            Err(Refusal::Invalid)
        }
    }

    fn wait(spins: &mut u32) {
        *spins += 1;
        if *spins < 64 {
            std::hint::spin_loop();
        } else {
            // The holder is copying at most a few hundred KiB; let it run.
            std::thread::yield_now();
        }
    }

    /// Takes shared read access to generation `want` of a live object of `tenant`.
    pub fn read(&self, want: u32, tenant: u32) -> Result<ReadGuard<'_>, Refusal> {
        let mut spins = 0;
        loop {
            let s = self.state.load(Ordering::Acquire);
            Self::check(s, want)?;
            if s & EXCL == 0 && s & READER_MASK != READER_MASK {
                if self
                    .state
                    .compare_exchange_weak(s, s + READER, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    break;
                }
                continue;
            }
            Self::wait(&mut spins);
        }
        let guard = ReadGuard { meta: self };
        if self.tenant.load(Ordering::Relaxed) != tenant {
            return Err(Refusal::Invalid);
        }
        Ok(guard)
    }

    /// Takes exclusive access to generation `want` of a live object of `tenant`.
    pub fn exclusive(&self, want: u32, tenant: u32) -> Result<ExclGuard<'_>, Refusal> {
        let mut spins = 0;
        loop {
            let s = self.state.load(Ordering::Acquire);
            Self::check(s, want)?;
            if s & (EXCL | READER_MASK) == 0 {
                if self
                    .state
                    .compare_exchange_weak(s, s | EXCL, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    break;
                }
                continue;
            }
            Self::wait(&mut spins);
        }
        let guard = ExclGuard {
            meta: self,
            generation: want,
            retired: false,
        };
        if self.tenant.load(Ordering::Relaxed) != tenant {
            return Err(Refusal::Invalid);
        }
        Ok(guard)
    }

    /// A cheap, unsynchronised look: is generation `want` still live here?
    pub fn looks_live(&self, want: u32) -> bool {
        Self::check(self.state.load(Ordering::Relaxed), want).is_ok()
    }
}

/// A guard that allows reading an object's bytes: (offset in section, length).
pub trait ReadAccess {
    fn extent(&self) -> (u64, usize);
}

/// A guard that allows writing an object's block: the offset, if `len` bytes fit.
pub trait WriteAccess {
    fn writable(&self, len: usize) -> u64;
}

fn writable(meta: &SlotMeta, len: usize) -> u64 {
    let p = meta.placement();
    assert!(
        len <= p.cap as usize,
        "write of {len} bytes into a {}-byte block",
        p.cap
    );
    p.offset
}

/// Exclusive use of a reserved slot, before its object is visible to anyone.
#[derive(Debug)]
pub struct Reserved<'a> {
    meta: &'a SlotMeta,
}

impl Reserved<'_> {
    /// Makes the object visible, with the data already copied in. Returns its generation.
    pub fn publish(self, tenant: u32, len: u32, owner: u32) -> u32 {
        let m = self.meta;
        let s = m.state.load(Ordering::Relaxed);
        m.tenant.store(tenant, Ordering::Relaxed);
        m.len.store(len, Ordering::Relaxed);
        m.owner.store(owner, Ordering::Relaxed);
        let generation = generation(s);
        m.state.store(state_of(generation, LIVE), Ordering::Release);
        generation
    }
}

impl WriteAccess for Reserved<'_> {
    fn writable(&self, len: usize) -> u64 {
        writable(self.meta, len)
    }
}

#[derive(Debug)]
pub struct ReadGuard<'a> {
    meta: &'a SlotMeta,
}

impl ReadAccess for ReadGuard<'_> {
    fn extent(&self) -> (u64, usize) {
        (self.meta.placement().offset, self.meta.len())
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.meta.state.fetch_sub(READER, Ordering::Release);
    }
}

#[derive(Debug)]
pub struct ExclGuard<'a> {
    meta: &'a SlotMeta,
    generation: u32,
    retired: bool,
}

impl ReadAccess for ExclGuard<'_> {
    fn extent(&self) -> (u64, usize) {
        (self.meta.placement().offset, self.meta.len())
    }
}

impl WriteAccess for ExclGuard<'_> {
    fn writable(&self, len: usize) -> u64 {
        writable(self.meta, len)
    }
}

impl ExclGuard<'_> {
    pub fn set_len(&self, len: u32) {
        self.meta.len.store(len, Ordering::Relaxed);
    }
    /// Ends the object: every handle to it is stale from now on. The caller must hand the slot
    /// back to its section's allocator.
    pub fn retire(mut self) {
        self.retired = true;
        self.meta.state.store(
            state_of(self.generation.wrapping_add(1), 0),
            Ordering::Release,
        );
    }
}

impl Drop for ExclGuard<'_> {
    fn drop(&mut self) {
        if !self.retired {
            self.meta
                .state
                .store(state_of(self.generation, LIVE), Ordering::Release);
        }
    }
}

/// All slots of one section: chunks of metadata created on demand and never moved, so a
/// reference to a slot stays valid for the table's life.
#[derive(Debug)]
pub struct SlotTable {
    chunks: Box<[OnceLock<Box<[SlotMeta]>>]>,
}

impl SlotTable {
    pub fn new(max_slots: usize) -> SlotTable {
        let n = max_slots.div_ceil(SLOTS_PER_CHUNK).max(1);
        SlotTable {
            chunks: (0..n).map(|_| OnceLock::new()).collect(),
        }
    }

    pub fn max_slots(&self) -> usize {
        self.chunks.len() * SLOTS_PER_CHUNK
    }

    /// The slot, if its chunk exists (a handle naming a slot never issued gets `None`).
    pub fn get(&self, slot: u32) -> Option<&SlotMeta> {
        let slot = slot as usize;
        let chunk = self.chunks.get(slot / SLOTS_PER_CHUNK)?.get()?;
        Some(&chunk[slot % SLOTS_PER_CHUNK])
    }

    /// Allocator side: the slot, creating its chunk if needed.
    pub fn get_or_create(&self, slot: u32) -> &SlotMeta {
        let slot = slot as usize;
        let chunk = self.chunks[slot / SLOTS_PER_CHUNK]
            .get_or_init(|| (0..SLOTS_PER_CHUNK).map(|_| SlotMeta::default()).collect());
        &chunk[slot % SLOTS_PER_CHUNK]
    }

    /// Bytes of metadata in use.
    pub fn metadata_bytes(&self) -> usize {
        self.chunks.iter().filter(|c| c.get().is_some()).count()
            * SLOTS_PER_CHUNK
            * std::mem::size_of::<SlotMeta>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed() -> (SlotTable, u32) {
        let t = SlotTable::new(10);
        let g = t.get_or_create(3).reserve(Placement {
            offset: 0,
            cap: 64,
            span: 0,
        });
        (t, g)
    }

    #[test]
    fn handles_of_other_tenants_and_generations_are_refused() {
        let (t, g) = placed();
        let m = t.get(3).unwrap();
        assert_eq!(
            m.read(g, 7).unwrap_err(),
            Refusal::Invalid,
            "reserved is not visible"
        );
        let g = m.claim_reserved().publish(7, 10, 1);
        assert!(m.read(g, 7).is_ok());
        assert_eq!(m.read(g, 8).unwrap_err(), Refusal::Invalid);
        assert_eq!(m.exclusive(g, 8).unwrap_err(), Refusal::Invalid);
        assert_eq!(
            m.read(g + 1, 7).unwrap_err(),
            Refusal::Invalid,
            "future generation"
        );
        m.exclusive(g, 7).unwrap().retire();
        assert_eq!(m.read(g, 7).unwrap_err(), Refusal::Stale);
        assert!(t.get(5000).is_none(), "slot in a chunk never created");
    }

    #[test]
    fn exclusive_waits_for_readers_and_blocks_new_ones() {
        let (t, _) = placed();
        let m = t.get(3).unwrap();
        let g = m.claim_reserved().publish(1, 10, 1);
        let r = m.read(g, 1).unwrap();
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                let e = m.exclusive(g, 1).unwrap();
                e.retire();
            });
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!h.is_finished(), "exclusive must wait for the reader");
            drop(r);
            h.join().unwrap();
        });
        assert_eq!(m.read(g, 1).unwrap_err(), Refusal::Stale);
        // The retired slot is reusable with the next generation.
        let g2 = m.reserve(Placement {
            offset: 64,
            cap: 64,
            span: 0,
        });
        assert_eq!(g2, g + 1);
    }
}
