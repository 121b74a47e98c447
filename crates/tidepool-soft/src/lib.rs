//! Soft memory, after Midas (NSDI'24): caches and memoized results kept in memory that can be
//! taken back at any moment, and rebuilt on their next access.
//!
//! - [`SoftArena`]: the core. One memfd, mapped and registered with userfaultfd in SIGBUS mode,
//!   cut into 2 MiB segments populated with fallocate. Taking memory back is punching a hole:
//!   by the runtime, or by a coordinator holding the memfd without asking. A revoked page
//!   raises SIGBUS, which the resilient copy ([`resilient`]) turns into "lost": never a crash,
//!   never zeros read as data. The arena starts no thread and reads no environment.
//! - [`SoftRuntime`]: what runs beside an arena, owned by the application: the evacuator, an
//!   `auto` budget, the link to a coordinator ([`SoftRuntime::from_env`] joins the one the
//!   environment names).
//! - Objects are appended to segments (log-structured) and found through a slot table in
//!   normal memory ([`slots`]); handles hold a slot index and generation, never an address.
//!   Reads copy optimistically and check the slot and the segment afterwards.
//! - [`SoftPool`] and [`SoftBox`]: typed objects with a reconstructor.
//! - [`SoftVec`], [`SoftMap`], [`SoftQueue`]: data structures with their index in normal memory
//!   and their values ([`SoftValue`]) in soft memory.
//!
//! ```
//! use tidepool_soft::{ArenaConfig, AutoBudget, SoftMap, SoftRuntime};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = SoftRuntime::from_env(ArenaConfig::default())?;
//! runtime.start_evacuator(0.02, 0.05)?;
//! runtime.start_auto_budget(AutoBudget::default())?;
//! let squares: SoftMap<u64, u64> = SoftMap::with_reconstructor(runtime.arena(), |n| n * n);
//! assert_eq!(squares.get_or_reconstruct(12), Some(144)); // built, then cached
//! assert_eq!(squares.get(&12), Some(144)); // a hit (while memory lasts)
//! # Ok(())
//! # }
//! ```

pub mod arena;
pub mod blobs;
pub mod budget;
pub mod coord;
pub mod counters;
pub mod demand;
pub mod doorbell;
mod evacuator;
mod memory;
pub mod pool;
pub mod resilient;
pub mod runtime;
mod slots;
pub mod structures;
mod sync;
pub mod value;

/// The system calls soft memory shares with the pager, for code that named them here.
pub mod sys {
    pub use tidepool_sys::memfd::punch_hole;
}

pub use arena::compact::EvacuationReport;
pub use arena::{ArenaConfig, SoftArena, SEGMENT};
pub use blobs::{Blob, SoftBlobs};
pub use budget::AutoBudget;
pub use counters::PoolStats;
pub use demand::DemandStats;
pub use pool::{SoftBox, SoftPool};
pub use runtime::SoftRuntime;
pub use structures::{SoftMap, SoftQueue, SoftVec};
pub use tidepool_sys::memfd::ShmemHugePages;
pub use value::SoftValue;

/// What can go wrong in soft memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SoftError {
    #[error("cannot create the soft-memory arena")]
    Arena(#[source] std::io::Error),
    #[error("too many soft-memory arenas in this process (64 at most)")]
    TooManyArenas,
    #[error("cannot back a soft-memory segment with memory (is the machine out of memory or tmpfs space?)")]
    Populate(#[source] std::io::Error),
    #[error("soft memory is full: its budget of {budget} bytes is held by allocation heads; raise the budget")]
    OutOfBudget { budget: usize },
    #[error(
        "a soft object of {bytes} bytes does not fit in the soft-memory budget of {budget} bytes"
    )]
    TooLarge { bytes: usize, budget: usize },
    #[error("no run of free address space for a soft object of {bytes} bytes; raise the arena's max_bytes")]
    AddressSpace { bytes: usize },
    #[error("soft memory is not shared with a forked child: values are rebuilt there, not cached (create a new arena in the child to cache)")]
    Forked,
}
