//! The prefetch policies behind one trait, [`Prefetcher`]: each learns from the faults of its
//! pages and guesses what the program wants next. Each policy is a file of its own: the
//! stride vote (`prefetch.rs`, the pager's default), the sweep (`sweep_detector.rs`) and the
//! successor table (`successor.rs`); none at all is [`NoPrefetch`]. A section's
//! [`Prefetch`] setting picks one ([`for_section`]); the fault path calls whichever it got.

use crate::prefetch::{Detector, Plan};
use crate::sections::Prefetch;
use crate::successor::{Chain, SuccessorDetector};
use crate::sweep_detector::SweepDetector;
use crate::table::{PageTable, FAR, RESIDENT};

/// What a prefetcher wants fetched after a fault. Returned once per fault and never stored: a
/// chain is held inline, not boxed, whatever its size against a window.
#[derive(Debug, Clone, Copy)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Guess {
    /// A window of a stream, `stride` pages apart, with the pages the stream walked past.
    Window(Plan),
    /// A chain of far pages in the order the program is expected to want them.
    Chain(Chain),
}

/// A prefetch policy for the pages of one region (or one section of it).
pub(crate) trait Prefetcher: Send {
    /// Learns a fault on `page` (the page table tells what is mapped and what is far) and
    /// says what to fetch, if anything.
    fn on_fault(&mut self, page: i64, table: &PageTable) -> Option<Guess>;
    /// Pages it fetched that the program was then seen to use, so far.
    fn credited(&self) -> u64;
}

/// A section's prefetcher in one region, made at its first fault there.
pub(crate) type SectionPrefetcher = parking_lot::Mutex<Option<Box<dyn Prefetcher>>>;

/// A fault on `page` for `prefetcher`: its guess, and how many pages the fault credited.
pub(crate) fn guess(
    prefetcher: &mut dyn Prefetcher,
    page: i64,
    table: &PageTable,
) -> (Option<Guess>, u64) {
    let before = prefetcher.credited();
    let guess = prefetcher.on_fault(page, table);
    (guess, prefetcher.credited() - before)
}

/// The prefetcher a section's own `policy` asks for (made at the section's first fault in a
/// region): windows up to `window_max` pages, a successor table sized for `budget_pages`.
/// [`Prefetch::Shared`] is the region's one detector, not a section's: asked here, it gets a
/// stride detector of its own like [`Prefetch::Own`].
pub(crate) fn for_section(
    policy: Prefetch,
    window_max: u32,
    budget_pages: usize,
) -> Box<dyn Prefetcher> {
    match policy {
        Prefetch::Off => Box::new(NoPrefetch),
        Prefetch::Shared | Prefetch::Own => Box::new(Detector::new(window_max)),
        Prefetch::Sweep => Box::new(SweepDetector::new(window_max)),
        Prefetch::Successor => Box::new(SuccessorDetector::new(2 * budget_pages)),
    }
}

/// No prefetching: only the pages faulted on come in.
#[derive(Debug)]
pub(crate) struct NoPrefetch;

impl Prefetcher for NoPrefetch {
    fn on_fault(&mut self, _page: i64, _table: &PageTable) -> Option<Guess> {
        None
    }

    fn credited(&self) -> u64 {
        0
    }
}

/// The stride vote: follows streams whose faults are a stride apart.
impl Prefetcher for Detector {
    fn on_fault(&mut self, page: i64, table: &PageTable) -> Option<Guess> {
        Detector::on_fault(self, page, |p| table.is(p, RESIDENT)).map(Guess::Window)
    }

    fn credited(&self) -> u64 {
        self.credited
    }
}

/// The sweep: walks that drift forward without a stride.
impl Prefetcher for SweepDetector {
    fn on_fault(&mut self, page: i64, _table: &PageTable) -> Option<Guess> {
        SweepDetector::on_fault(self, page).map(Guess::Window)
    }

    fn credited(&self) -> u64 {
        self.credited
    }
}

/// The successor table: an order learned page by page, followed as a chain of far pages.
impl Prefetcher for SuccessorDetector {
    fn on_fault(&mut self, page: i64, table: &PageTable) -> Option<Guess> {
        SuccessorDetector::on_fault(self, page, |p| table.is(p, FAR)).map(Guess::Chain)
    }

    fn credited(&self) -> u64 {
        self.credited
    }
}
