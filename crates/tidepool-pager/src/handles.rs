//! The program's handles on paged memory: [`Region`] (memory the pager keeps, for any Rust
//! program) and [`AdoptedRegion`] (a range the program already had, adopted with
//! [`Pager::adopt`]).

use crate::pager::{Pager, RegionInner};
use crate::sys::PAGE;
use crate::ForkAdvice;
use crate::PagerError;
use crate::SectionId;
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

    #[cfg(test)]
    pub(crate) fn inner(&self) -> &Arc<RegionInner> {
        &self.inner
    }

    /// Puts the pages of `[offset, offset + len)` (whole pages, cut at the region's end) in
    /// section `id` ([`Pager::section`]).
    pub fn set_section(&self, offset: usize, len: usize, id: SectionId) {
        let end = offset
            .saturating_add(len)
            .min(self.inner.len)
            .div_ceil(PAGE);
        self.inner.sections.set(offset / PAGE..end, id);
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

impl AdoptedRegion {
    /// The pages of `[addr, addr + len)` (len rounded up to whole pages, cut at the region's
    /// end); `None` unless `addr` is a page boundary inside the region.
    fn pages_of(&self, addr: usize, len: usize) -> Option<std::ops::Range<usize>> {
        let offset = addr.checked_sub(self.inner.base)?;
        if !offset.is_multiple_of(PAGE) || offset >= self.inner.len {
            return None;
        }
        let end = offset
            .saturating_add(len)
            .min(self.inner.len)
            .div_ceil(PAGE);
        Some(offset / PAGE..end)
    }

    /// Puts the pages of `[addr, addr + len)` in section `id` ([`Pager::section`]): their
    /// faults, far reads, prefetches and evictions are counted there from now on. `addr` must
    /// be a page boundary inside the region.
    pub fn set_section(&self, addr: usize, len: usize, id: SectionId) -> std::io::Result<()> {
        let pages = self.pages_of(addr, len).ok_or_else(einval)?;
        self.inner.sections.set(pages, id);
        Ok(())
    }

    /// The section of the page holding `addr` ([`SectionId::REST`] outside the region).
    pub fn section_at(&self, addr: usize) -> SectionId {
        match addr.checked_sub(self.inner.base) {
            Some(offset) if offset < self.inner.len => self.inner.sections.of(offset / PAGE),
            _ => SectionId::REST,
        }
    }

    /// Cuts the whole region into spans of `1 << shift` bytes from its base, span `i` in
    /// section `ids[i]` and every span past the last in the last (an allocator whose size
    /// classes each own a span names them so; at most 64 spans are told apart).
    pub fn set_section_spans(&self, shift: u32, ids: &[SectionId]) {
        self.inner.sections.set_spans(shift, ids);
    }

    /// mprotect on the pages of `[addr, addr + len)`, remembered by the pager: a page made
    /// inaccessible is not evicted until it is opened again (it could not be read to be
    /// saved). `addr` must be a page boundary inside the region.
    pub fn protect(&self, addr: usize, len: usize, prot: i32) -> std::io::Result<()> {
        let pages = self.pages_of(addr, len).ok_or_else(einval)?;
        self.pager.inner().protect(&self.inner, pages, prot)
    }

    /// Fork advice (MADV_DONTFORK and the like) on the pages of `[addr, addr + len)`, given to
    /// the kernel and remembered for the pager of a forked child.
    pub fn advise_fork(&self, addr: usize, len: usize, advice: ForkAdvice) -> std::io::Result<()> {
        let pages = self.pages_of(addr, len).ok_or_else(einval)?;
        self.pager.inner().advise_fork(&self.inner, pages, advice)
    }

    /// The program gave up `[addr, addr + len)`: zeros, readable and writable, inherited by
    /// forked children as usual.
    ///
    /// # Safety
    /// Nothing may reference the bytes of those pages (they change to zero).
    pub unsafe fn reset(&self, addr: usize, len: usize) {
        if let Some(pages) = self.pages_of(addr, len) {
            self.pager.inner().reset(&self.inner, pages);
        }
    }

    /// The program is about to map something else (a file, shared memory) over
    /// `[addr, addr + len)`: the pager forgets those pages and leaves them alone until
    /// [`AdoptedRegion::reclaim`].
    ///
    /// # Safety
    /// As for [`AdoptedRegion::reset`].
    pub unsafe fn cede(&self, addr: usize, len: usize) {
        if let Some(pages) = self.pages_of(addr, len) {
            self.pager.inner().cede(&self.inner, pages);
        }
    }

    /// The program unmapped what it had mapped over `[addr, addr + len)` (see
    /// [`AdoptedRegion::cede`]): the range becomes fresh paged memory, zeros.
    pub fn reclaim(&self, addr: usize, len: usize) -> std::io::Result<()> {
        let pages = self.pages_of(addr, len).ok_or_else(einval)?;
        self.pager.inner().reclaim(&self.inner, pages)
    }
}

fn einval() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EINVAL)
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
