//! [`Region`]: memory whose pages the pager keeps, for any Rust program.

use crate::pager::{Inner, Pager, RegionInner};
use crate::stats::Counters;
use crate::sys;
use crate::sys::PAGE;
use crate::table::*;
use crate::writeback::StoreJob;
use crate::PagerError;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

/// A range of memory backed by far memory: at most the pager's local budget of it (shared with
/// the pager's other regions) is mapped at a time; the rest lives in the far store and comes
/// back on the next touch. Reads and writes are ordinary memory accesses.
///
/// ```no_run
/// use tidepool_pager::{Config, Pager, Region};
/// let store = tidepool_store::open("local:").unwrap();
/// let pager = Pager::start(Config::new(64 << 20), store).unwrap();
/// let mut region = Region::new(&pager, 1 << 30).unwrap(); // 1 GiB, 64 MiB of it local
/// region.as_mut_slice()[123_456_789] = 7;
/// assert_eq!(region.as_slice()[123_456_789], 7);
/// ```
#[derive(Debug)]
pub struct Region {
    pager: Pager,
    inner: Arc<RegionInner>,
}

impl Region {
    /// Reserves `len` bytes (rounded up to whole pages), reading as zeros until written.
    pub fn new(pager: &Pager, len: usize) -> Result<Region, PagerError> {
        let inner = pager.create_region(len)?;
        Ok(Region {
            pager: pager.clone(),
            inner,
        })
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.inner.base as *const u8
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.inner.base as *mut u8
    }

    /// Length in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        self.inner.len
    }

    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the range is a live, readable and writable reservation owned by this region
        // for its whole life; pages that are not mapped are faulted in by the pager, so every
        // byte is readable. Shared borrows of self exclude writes through the region.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and the exclusive borrow of self excludes other access.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len()) }
    }

    /// Forgets the contents of `[offset, offset + len)` (whole pages inside it): they read as
    /// zeros afterwards, and their far copies are freed.
    pub fn discard(&mut self, offset: usize, len: usize) {
        discard_pages_within(&self.pager, &self.inner, offset, len);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.pager.remove_region(&self.inner);
    }
}

/// A reservation made by someone else (an allocator's heap, say) whose pages the pager
/// serves from now on. Pages the owner touched before adoption stay mapped and are managed
/// from their first eviction on.
#[derive(Debug)]
pub struct AdoptedRegion {
    pager: Pager,
    inner: Arc<RegionInner>,
}

impl Pager {
    /// Registers `[base, base + len)` with this pager.
    ///
    /// # Safety
    /// The range must be page aligned, a private anonymous mapping (or several) made readable
    /// and writable, registered with no other userfaultfd object, and stay mapped for as long
    /// as the returned value lives.
    pub unsafe fn adopt(&self, base: usize, len: usize) -> Result<AdoptedRegion, PagerError> {
        let inner = self.adopt_range(base, len)?;
        Ok(AdoptedRegion {
            pager: self.clone(),
            inner,
        })
    }
}

impl AdoptedRegion {
    pub fn base(&self) -> usize {
        self.inner.base
    }

    pub fn len(&self) -> usize {
        self.inner.len
    }

    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    pub fn contains(&self, addr: usize) -> bool {
        addr.wrapping_sub(self.inner.base) < self.inner.len
    }

    /// Forgets the whole pages inside `[addr, addr + len)`: they read as zeros afterwards and
    /// their far copies are freed.
    ///
    /// # Safety
    /// Nothing may reference the bytes of those pages (they change to zero).
    pub unsafe fn discard(&self, addr: usize, len: usize) {
        if let Some(offset) = addr.checked_sub(self.inner.base) {
            discard_pages_within(&self.pager, &self.inner, offset, len);
        }
    }
}

impl Drop for AdoptedRegion {
    fn drop(&mut self) {
        self.pager.remove_region(&self.inner);
    }
}

/// Discards the whole pages inside `[offset, offset + len)` of a region.
fn discard_pages_within(pager: &Pager, region: &Arc<RegionInner>, offset: usize, len: usize) {
    let first = offset.div_ceil(PAGE);
    let end = (offset.saturating_add(len) / PAGE).min(region.len / PAGE);
    if first < end {
        pager.inner().discard(region, first, end);
    }
}

impl Inner {
    /// Forgets pages `[first, end)` of a region: their contents are no longer needed and the
    /// next touch reads zeros.
    pub(crate) fn discard(&self, region: &Arc<RegionInner>, first: usize, end: usize) {
        let end = end.min(region.table.pages());
        let _section = crate::fork::section();
        let mut removes = Vec::new();
        let mut page = first;
        while page < end {
            let chunk_end = (page + 512).min(end);
            let mut resident = 0;
            for p in page..chunk_end {
                let w = region.table.lock_any(p);
                match kind(w) {
                    RESIDENT => {
                        resident += 1;
                        if w & FAR_VALID != 0 {
                            self.tags.drop_copy(region.key(p), &mut removes);
                        }
                    }
                    FAR if w & FRAMED != 0 => {}
                    FAR => self.tags.drop_copy(region.key(p), &mut removes),
                    // Removed once the write in flight lands (the jobs run in order). No forked
                    // child reads it: a child gives its pages in write-back tags of its own.
                    WRITEBACK => removes.push(region.key(p)),
                    _ => {}
                }
            }
            sys::discard(region.addr(page), (chunk_end - page) * PAGE);
            if region.shadow.is_some() {
                sys::discard(region.shadow_addr(page), (chunk_end - page) * PAGE);
            }
            for p in page..chunk_end {
                region.table.unlock(p, UNTOUCHED);
            }
            self.resident.fetch_sub(resident, Relaxed);
            Counters::add(&self.counters.discarded, resident as u64);
            self.uffd.wake(region.addr(page), (chunk_end - page) * PAGE);
            page = chunk_end;
        }
        if !removes.is_empty() {
            let _ = self.store_tx.send(StoreJob::Remove(removes));
        }
    }
}
