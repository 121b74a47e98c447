//! [`Staging`]: a pager thread's own buffer for pages on their way in from the far store, a
//! batch of [`PREFETCH_BATCH`] at most.

use crate::sys::PAGE;

/// Pages prefetched in one store round trip.
pub(crate) const PREFETCH_BATCH: usize = 64;

/// A fault handler's own buffer for pages read from the store on their way into the region:
/// the store copies into it ([`tidepool_store::FarStore::read_many_into`]) and one UFFDIO_COPY
/// installs a run of consecutive pages from it.
pub(crate) struct Staging {
    pub(crate) buf: Vec<u8>,
    /// What the store said of each page of the batch (its length, or none).
    pub(crate) lens: Vec<Option<usize>>,
    /// This handler's sampling of misses' delivery and wake-up.
    pub(crate) probe: crate::cpu::MissProbe,
}

impl Staging {
    pub(crate) fn new() -> Staging {
        Staging {
            buf: vec![0; PREFETCH_BATCH * PAGE],
            lens: vec![None; PREFETCH_BATCH],
            probe: Default::default(),
        }
    }

    /// Page `i` of the batch.
    pub(crate) fn page(&self, i: usize) -> &[u8] {
        &self.buf[i * PAGE..(i + 1) * PAGE]
    }
}
