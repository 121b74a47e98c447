//! Far data structures with cache sections (Mira's runtime, without its compiler).
//!
//! A far structure keeps its elements in a [`FarStore`] (in-process, a memory node, Redis,
//! memcached) in *lines* of several elements, and caches lines in a [`Section`]: a local area
//! with its own structure (direct-mapped, set-associative or fully associative with CLOCK),
//! line size and capacity. Structures with different access patterns get different sections,
//! so a scan cannot evict what a random walk keeps hot (Mira §4.1).
//!
//! Access goes through *line guards* and iterators: a guard borrows a resident line, and the
//! elements in it are plain loads from a slice, with no per-element metadata or lookup (what
//! made AIFM slow even with all data local). The metadata is per line: a tag, a few flag bits
//! and a borrow count.
//!
//! ```
//! use std::sync::Arc;
//! use tidepool_far::{Far, FarVec, Section, SectionConfig, Structure};
//!
//! let far = Far::new(Arc::new(tidepool_store::LocalStore::new()));
//! // 16 lines of 4 KiB, 4-way set-associative.
//! let section = Section::new(SectionConfig::new(Structure::SetAssociative(4), 4096, 16 * 4096))?;
//! let v: FarVec<u64> = FarVec::from_slice(&far, &section, &(0..100_000).collect::<Vec<u64>>())?;
//! let mut sum = 0;
//! for x in v.iter() {
//!     sum += x?;
//! }
//! assert_eq!(sum, (0..100_000u64).sum::<u64>());
//! # Ok::<(), tidepool_far::FarError>(())
//! ```

mod boxed;
mod heap;
mod lines;
mod map;
pub mod profile;
mod query;
mod section;
mod shared;
pub mod tune;
mod vec;

pub use boxed::FarBox;
pub use heap::{FarHeap, FarPtr};
pub use lines::{LineMut, LineRef};
pub use map::FarMap;
pub use query::{Answer, Buckets, Cmp, Col, Decode, Elem, Estimate, Offload, Out, Query, Ran};
pub use section::{Section, SectionConfig, SectionStats, Structure};
pub use shared::{FarReader, FarShare, SharedFarVec};
pub use tune::{Config, SiteConfig};
pub use vec::{FarIter, FarLines, FarVec};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tidepool_store::{FarStore, StoreError};

/// Bits of a far key that number lines within one structure; the rest name the structure.
pub(crate) const LINE_BITS: u32 = 40;

/// What can go wrong with far data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FarError {
    #[error("far store: {0}")]
    Store(#[from] StoreError),
    #[error("bad section configuration: {0}")]
    Config(String),
    #[error(
        "every line that index {index} could go to in this section is borrowed by a guard \
         (hold fewer guards at once, or give the section more lines or ways)"
    )]
    AllBorrowed { index: usize },
    #[error("line {line} is borrowed {how}; it cannot also be borrowed {want}")]
    Borrowed {
        line: usize,
        how: &'static str,
        want: &'static str,
    },
    #[error("index {index} is out of bounds for a far vector of {len} elements")]
    OutOfBounds { index: usize, len: usize },
    #[error("far store returned a line of {got} bytes where {want} were expected")]
    BadLine { got: usize, want: usize },
    #[error(
        "the far vector this reader shares was dropped by its owner (keep the owner alive \
         while readers use it)"
    )]
    Gone,
    #[error("query: {0}")]
    Query(String),
    #[error(
        "the far store {0} cannot run queries (use a memory node, node://..., or \
         Offload::Auto to compute here)"
    )]
    NoOffload(String),
}

/// The far memory far structures live in: a store, and the names of structures in it.
#[derive(Debug, Clone)]
pub struct Far {
    pub(crate) store: Arc<dyn FarStore>,
    next: Arc<AtomicU64>,
    /// What queries and fetches have measured, for deciding where queries run.
    pub(crate) costs: Arc<Mutex<query::Costs>>,
    /// Whether vectors made now are profiled, and the profiles of those dropped.
    profiling: Arc<std::sync::atomic::AtomicBool>,
    profile: Arc<Mutex<profile::Profile>>,
    /// The thread that fetches lines ahead of streams, started on first use.
    ahead: Arc<std::sync::OnceLock<Mutex<std::sync::mpsc::Sender<AheadJob>>>>,
}

/// Lines fetched ahead: their bytes (a line's worth each) and lengths, as `read_many_into`
/// gives them.
pub(crate) type Fetched = Result<(Vec<u8>, Vec<Option<usize>>), StoreError>;
type AheadJob = (
    Vec<tidepool_store::Key>,
    usize,
    std::sync::mpsc::Sender<Fetched>,
);

impl Far {
    pub fn new(store: Arc<dyn FarStore>) -> Far {
        Far {
            store,
            // Structure 0 is never used: key 0 stays free for whoever shares the store.
            next: Arc::new(AtomicU64::new(1)),
            costs: Arc::default(),
            profiling: Arc::default(),
            profile: Arc::default(),
            ahead: Arc::default(),
        }
    }

    /// Reads `keys` (lines of `line_bytes`) on the fetch-ahead thread; the reply comes on the
    /// returned channel. The thread ends when the last clone of this `Far` is dropped.
    pub(crate) fn fetch_ahead(
        &self,
        keys: Vec<tidepool_store::Key>,
        line_bytes: usize,
    ) -> std::sync::mpsc::Receiver<Fetched> {
        let (tx, rx) = std::sync::mpsc::channel();
        let jobs = self.ahead.get_or_init(|| {
            let (jobs, queue) = std::sync::mpsc::channel::<AheadJob>();
            let store = self.store.clone();
            std::thread::Builder::new()
                .name("tp-far-ahead".into())
                .spawn(move || {
                    for (keys, lb, reply) in queue {
                        let mut data = vec![0u8; keys.len() * lb];
                        let mut lens = vec![None; keys.len()];
                        let r = store
                            .read_many_into(&keys, lb, &mut data, &mut lens)
                            .map(|()| (data, lens));
                        // The stream may have moved on and dropped its receiver.
                        let _ = reply.send(r);
                    }
                })
                .expect("cannot start the fetch-ahead thread");
            Mutex::new(jobs)
        });
        if jobs
            .lock()
            .expect("fetch-ahead queue")
            .send((keys, line_bytes, tx.clone()))
            .is_err()
        {
            // The thread is gone (it cannot end while this Far lives, but never hang on it).
            let _ = tx.send(Err(StoreError::Io {
                backend: "far",
                op: "fetch ahead",
                cause: std::io::Error::other("the fetch-ahead thread has stopped"),
            }));
        }
        rx
    }

    /// Profiles every far vector made from now on (a profiling run: it costs time on every
    /// access). See [`profile`].
    pub fn enable_profiling(&self) {
        self.profiling.store(true, Ordering::Relaxed);
    }

    pub(crate) fn profiling(&self) -> bool {
        self.profiling.load(Ordering::Relaxed)
    }

    pub(crate) fn add_profile(&self, p: profile::SiteProfile) {
        self.profile.lock().expect("profile lock").add(p);
    }

    /// The profiles of the profiled vectors dropped so far, by site.
    pub fn profile(&self) -> profile::Profile {
        self.profile.lock().expect("profile lock").clone()
    }

    /// The store's description.
    pub fn describe(&self) -> String {
        self.store.describe()
    }

    /// The first key of a new structure.
    pub(crate) fn new_base(&self) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        assert!(id < 1 << (64 - LINE_BITS), "too many far structures");
        id << LINE_BITS
    }
}

#[cfg(test)]
mod tests;
