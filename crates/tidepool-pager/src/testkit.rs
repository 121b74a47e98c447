//! Helpers for the modules' unit tests: a pager over a store that records what reached it, a
//! region, and a way to look at page states.

use crate::pager::{Inner, RegionInner};
use crate::{Config, Pager, Region};
use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::Arc;
use tidepool_store::{FarStore, Key, LocalStore, StoreError};

/// What reached the store, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Write(Key),
    Remove(Key),
}

/// The in-process store, with a log of writes and removes.
#[derive(Debug)]
pub struct Recorder {
    inner: LocalStore,
    pub log: Mutex<Vec<Op>>,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            inner: LocalStore::new(),
            log: Mutex::new(Vec::new()),
        })
    }
}

impl FarStore for Recorder {
    fn describe(&self) -> String {
        "recorder".into()
    }
    fn private_to_process(&self) -> bool {
        true
    }
    fn write_many(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        self.log
            .lock()
            .extend(items.iter().map(|(k, _)| Op::Write(*k)));
        self.inner.write_many(items)
    }
    fn read_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        self.inner.read_many(keys)
    }
    fn take_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        self.inner.take_many(keys)
    }
    fn remove_many(&self, keys: &[Key]) -> Result<(), StoreError> {
        self.log.lock().extend(keys.iter().map(|k| Op::Remove(*k)));
        self.inner.remove_many(keys)
    }
}

/// A pager with a budget of 64 pages (its least) that evicts only when asked here, over
/// `store`, and a region of `pages` pages. Frames as asked; no prefetch beyond one window.
pub fn pager(store: Arc<dyn FarStore>, frames: bool, pages: usize) -> (Pager, Region) {
    let mut config = Config::new(1 << 30);
    config.in_process_frames = frames;
    pager_with(config, store, pages)
}

/// [`pager`] with a probation tier in front of `store` (in this process, so a hundredth of the
/// budget: thousands of pages, so nothing leaves it unless a test spills it); None, with a
/// note, on a kernel without UFFDIO_MOVE.
pub fn probation_pager(store: Arc<dyn FarStore>, pages: usize) -> Option<(Pager, Region)> {
    let mut config = Config::new(1 << 30);
    config.probation = true;
    let (pager, region) = pager_with(config, store, pages);
    if pager.inner().frames.probation().is_none() {
        eprintln!("skipped: a probation tier needs UFFDIO_MOVE (Linux 6.8)");
        return None;
    }
    Some((pager, region))
}

/// A pager built from `config` (one fault handler, on CPU 0) and a region of `pages` pages.
pub fn pager_with(mut config: Config, store: Arc<dyn FarStore>, pages: usize) -> (Pager, Region) {
    config.handler_cpus = Some(vec![0]);
    let pager = Pager::start(config, store).unwrap();
    let region = Region::new(&pager, pages * crate::PAGE).unwrap();
    (pager, region)
}

pub fn inner(pager: &Pager) -> &Arc<Inner> {
    pager.inner()
}

pub fn region_inner(region: &Region) -> &Arc<RegionInner> {
    region.inner()
}

/// The state word of page `page`, once no thread is moving it (the faulting thread is woken
/// by the install, a moment before the handler publishes the page's new state).
pub fn word(region: &Region, page: usize) -> u64 {
    let s = region.inner().table.state(page);
    loop {
        let w = s.load(std::sync::atomic::Ordering::Acquire);
        if crate::table::kind(w) != crate::table::BUSY {
            return w;
        }
        std::thread::yield_now();
    }
}

/// Evicts every resident page the clock offers, in batches, until none of the region's pages
/// is resident (or only ones that cannot go: a few rounds without progress).
pub fn evict_all(pager: &Pager, region: &Region) {
    for _ in 0..20 {
        let pages = region.len() / crate::PAGE;
        let resident = (0..pages)
            .filter(|&p| crate::table::kind(word(region, p)) == crate::table::RESIDENT)
            .count();
        if resident == 0 {
            return;
        }
        // A page just installed reaches the clock a moment after its state.
        std::thread::sleep(std::time::Duration::from_millis(2));
        let _s = crate::gate::section();
        while pager.inner().evict_batch() > 0 {}
    }
}

/// Waits until the write-back thread has landed page `page` (it is FAR).
pub fn landed(region: &Region, page: usize) {
    let start = std::time::Instant::now();
    while crate::table::kind(word(region, page)) != crate::table::FAR {
        assert!(
            start.elapsed().as_secs() < 10,
            "page {page}: {:#x}",
            word(region, page)
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Fills page `page` of the region with `byte`.
pub fn fill(region: &mut Region, page: usize, byte: u8) {
    region.as_mut_slice()[page * crate::PAGE..(page + 1) * crate::PAGE].fill(byte);
}

/// Whether page `page` holds `byte` throughout.
pub fn holds(region: &Region, page: usize, byte: u8) -> bool {
    region.as_slice()[page * crate::PAGE..(page + 1) * crate::PAGE]
        .iter()
        .all(|&b| b == byte)
}
