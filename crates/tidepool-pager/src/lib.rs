//! Transparent far memory through userfaultfd.
//!
//! A [`Pager`] owns a local-memory budget and a far store ([`tidepool_store::FarStore`]).
//! Regions registered with it ([`Region`] for Rust programs, or the allocator's whole heap
//! under `tidepool run`) behave as ordinary memory: at most the budget of their pages is
//! mapped at a time, and the rest is fetched back from the store on the next touch.
//!
//! - **Faults** are served by one handler thread per CPU, pinned, so the fault and its
//!   handler share a CPU (a wake-up across vCPUs costs tens of microseconds on small VMs).
//!   The userfaultfd object is a full one (opened through /dev/userfaultfd), so faults taken
//!   by the kernel on the program's behalf (a `read(2)` into an evicted buffer) are served too.
//! - **Eviction** takes first the pages a sequential stream walked past (SEQ: a loop over
//!   more than fits keeps a fixed part resident), then CLOCK with second chances for pages
//!   written or re-faulted soon after being evicted, in batches of runs: write-protect the
//!   run, keep clean pages' far copies, copy dirty pages to a write-back buffer,
//!   `MADV_DONTNEED`, wake waiters.
//! - **Dirty tracking.** Pages fetched for reading are installed write-protected, and a first
//!   write costs one write-protect fault that marks them dirty. Pages installed writable are
//!   hashed (XXH3) at eviction and compared with the hash of their far copy, which is exact
//!   where write-protect-based tracking has a window between the check and the unmap. Clean
//!   pages are dropped, zero pages are never stored.
//! - **Write-back** is asynchronous and batched, applied in order by one thread; a fault on a
//!   page still waiting to be written is served from the buffer.
//! - **Prefetch**: a Leap-style majority vote over recent fault strides, with an adaptive
//!   window, mapping pages straight into the region from the fault handler, one wake-up per
//!   batch (see [`prefetch`]).
//! - **fork**: a forked child gets a pager of its own over a copy of the parent's memory at the
//!   fork, far pages included (see `fork.rs` and `tags.rs`).
//! - **Failure**: if the far store fails, the program is stopped with a message and exit status
//!   [`FATAL_EXIT_CODE`]; it never reads zeros in place of its data.

/// Logs a page event when the `trace` feature is on; nothing otherwise.
macro_rules! tr {
    ($page:expr, $ev:literal, $arg:expr) => {
        #[cfg(feature = "trace")]
        crate::trace::event($page as usize, $ev, $arg as u64);
    };
}
pub(crate) use tr;

mod activity;
mod advice;
mod budget;
mod buffer;
mod config;
pub mod control;
pub mod coord;
pub mod cpu;
mod error;
mod evict;
mod fault;
pub mod fault_trace;
mod fetch_ahead;
mod follow;
mod fork;
mod frames;
mod gate;
mod handler;
mod handles;
mod late;
mod marks;
mod pager;
mod park;
pub mod prefetch;
mod prefetch_misses;
mod prefetcher;
pub mod profile;
mod protect;
mod refill;
#[cfg(test)]
mod refill_tests;
mod region;
pub mod replay;
mod restart;
pub mod run_env;
mod sections;
mod spill;
mod staging;
mod stats;
mod successor;
mod sweep_detector;
mod sys;
mod table;
mod tags;
#[cfg(test)]
mod testkit;
mod tier;
#[cfg(feature = "trace")]
pub mod trace;
pub mod verify;
mod victims;
mod watchdog;
mod writeback;

pub use config::{Config, DEFAULT_FAULT_DEADLINE, DEFAULT_PREFETCH_WINDOW_MAX};
pub use error::PagerError;
pub use follow::FollowReport;
pub use fork::{in_forked_child, install as install_fork_handlers};
pub use handles::{AdoptedRegion, Region};
pub use marks::ForkAdvice;
pub use pager::{Pager, FATAL_EXIT_CODE};
pub use sections::{Keep, Policy, Prefetch, SectionId, SectionStats, LINE_MAX, SECTIONS_MAX};
pub use stats::{PagerStats, StoreMemory};
pub use sys::PAGE;
