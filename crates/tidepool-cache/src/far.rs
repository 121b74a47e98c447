//! The far tier (`--far URL`): every value stored is also written, behind the client's back
//! and in batches, to a far store (a memory node, Redis, memcached), keyed by its CAS unique
//! (unique to each version of each item). A value soft memory drops as cold, or the kernel
//! takes back under pressure, then comes back from there on its next hit instead of being a
//! miss. Writing behind rather than at eviction is what makes revocation safe: a punched
//! segment's bytes are gone before anyone could copy them.

use crossbeam_channel::{Receiver, Sender, TrySendError};
use parking_lot::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidepool_store::{FarStore, Key};

/// Writes queued beyond this many wait for none: they are skipped (the value then lives only
/// in soft memory), so a slow far store never slows a client.
const QUEUE: usize = 65_536;
/// Most values written in one batch.
const BATCH: usize = 256;

enum Op {
    Put(Key, Box<[u8]>),
    Remove(Key),
}

/// What the far tier did (for `stats` and the metrics).
#[derive(Debug, Default)]
pub struct FarCounters {
    pub writes: AtomicU64,
    pub removes: AtomicU64,
    /// Writes not queued because the queue was full.
    pub skipped: AtomicU64,
    pub errors: AtomicU64,
    pub fetches: AtomicU64,
    pub fetch_misses: AtomicU64,
    /// Reads not tried because the far store had just failed (see [`Spill::fetch`]).
    pub unavailable: AtomicU64,
    /// Removals not queued because the queue was full: far copies left behind.
    pub orphaned: AtomicU64,
}

/// After a far read fails, reads are not tried for this long, doubled at each failure in a
/// row up to [`BACKOFF_MAX`]: a far store that is down costs the clients misses, not a
/// deadline each (one read a pause still waits for the store's deadline, which a node URL
/// sets with `?timeout_ms=`).
const BACKOFF: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(64);
/// At most one warning about the far store in this long.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// A warning said at most every [`WARN_EVERY`], with how many were held back.
#[derive(Debug, Default)]
struct Quiet {
    last: Mutex<Option<Instant>>,
    held: AtomicU64,
}

impl Quiet {
    fn warn(&self, what: std::fmt::Arguments<'_>) {
        let mut last = self.last.lock();
        if last.is_some_and(|t| t.elapsed() < WARN_EVERY) {
            self.held.fetch_add(1, Relaxed);
            return;
        }
        *last = Some(Instant::now());
        let held = self.held.swap(0, Relaxed);
        tracing::warn!(
            "tidepool cache: {what} ({held} more such failures not logged since the last)"
        );
    }
}

/// The far tier of one server.
pub struct Spill {
    store: Arc<dyn FarStore>,
    tx: Sender<Op>,
    /// High bits that keep this server's keys apart from another's in a shared store.
    prefix: u64,
    pub counters: Arc<FarCounters>,
    /// Reads wait until this, after a failure, and the pause the next failure doubles.
    down_until: Mutex<(Option<Instant>, Duration)>,
    quiet: Arc<Quiet>,
}

impl std::fmt::Debug for Spill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spill")
            .field("store", &self.store.describe())
            .finish()
    }
}

impl Spill {
    /// A far tier on `store`, with its writer thread.
    pub fn start(store: Arc<dyn FarStore>) -> std::io::Result<Arc<Spill>> {
        let (tx, rx) = crossbeam_channel::bounded(QUEUE);
        let counters = Arc::new(FarCounters::default());
        let prefix = {
            use std::hash::BuildHasher;
            std::hash::RandomState::new().hash_one(std::process::id()) << 48
        };
        let quiet = Arc::new(Quiet::default());
        let writer = Writer {
            store: store.clone(),
            rx,
            counters: counters.clone(),
            quiet: quiet.clone(),
        };
        std::thread::Builder::new()
            .name("tp-cache-far".into())
            .spawn(move || writer.run())?;
        Ok(Arc::new(Spill {
            store,
            tx,
            prefix,
            counters,
            down_until: Mutex::new((None, BACKOFF)),
            quiet,
        }))
    }

    pub(crate) fn key(&self, cas: u64) -> Key {
        self.prefix | (cas & ((1 << 48) - 1))
    }

    /// Queues a copy of version `cas`'s value.
    pub fn put(&self, cas: u64, value: &[u8]) {
        let op = Op::Put(self.key(cas), value.into());
        if let Err(TrySendError::Full(_)) = self.tx.try_send(op) {
            self.counters.skipped.fetch_add(1, Relaxed);
        }
    }

    /// Queues the removal of version `cas`'s copy. Never waits: the caller holds a shard
    /// of the index, and a far store that hangs must not stop the cache. A removal the full
    /// queue cannot take leaves an orphan in the far store (counted): space, not a wrong
    /// value, since no entry names that version again (CAS uniques are never reused).
    pub fn remove(&self, cas: u64) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(Op::Remove(self.key(cas))) {
            self.counters.orphaned.fetch_add(1, Relaxed);
        }
    }

    /// Version `cas`'s value: `Ok(Some)` if the far store has it (and it is `len` bytes
    /// long), `Ok(None)` if it does not, `Err(Unavailable)` if the store could not say (it
    /// failed just now, or within [`BACKOFF`] of an earlier failure): the value may still be
    /// there once it is back.
    pub fn fetch(&self, cas: u64, len: usize) -> Result<Option<Vec<u8>>, Unavailable> {
        if self.down_until.lock().0.is_some_and(|t| Instant::now() < t) {
            self.counters.unavailable.fetch_add(1, Relaxed);
            return Err(Unavailable);
        }
        self.counters.fetches.fetch_add(1, Relaxed);
        let read = self.store.read_many(&[self.key(cas)]);
        if read.is_ok() {
            *self.down_until.lock() = (None, BACKOFF);
        }
        match read {
            Ok(mut v) => match v.pop().flatten() {
                Some(b) if b.len() == len => Ok(Some(b.to_vec())),
                _ => {
                    self.counters.fetch_misses.fetch_add(1, Relaxed);
                    Ok(None)
                }
            },
            Err(e) => {
                self.counters.errors.fetch_add(1, Relaxed);
                let pause = {
                    let mut d = self.down_until.lock();
                    let pause = d.1;
                    *d = (Some(Instant::now() + pause), (pause * 2).min(BACKOFF_MAX));
                    pause
                };
                self.quiet.warn(format_args!(
                    "far read failed, far reads paused for {pause:?}: {e}"
                ));
                Err(Unavailable)
            }
        }
    }

    /// The far store, as its URL describes it (without secrets).
    pub fn describe(&self) -> String {
        self.store.describe()
    }
}

/// The far store could not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable;

struct Writer {
    store: Arc<dyn FarStore>,
    rx: Receiver<Op>,
    counters: Arc<FarCounters>,
    quiet: Arc<Quiet>,
}

impl Writer {
    fn run(self) {
        let mut puts: Vec<(Key, Box<[u8]>)> = Vec::new();
        let mut removes: Vec<Key> = Vec::new();
        while let Ok(op) = self.rx.recv() {
            let mut next = Some(op);
            while let Some(op) = next.take() {
                match op {
                    Op::Put(k, v) => {
                        // A removal queued before this write is for an older version; one
                        // after it must follow it: flush removals first.
                        puts.push((k, v))
                    }
                    Op::Remove(k) => {
                        if puts.iter().any(|(p, _)| *p == k) {
                            self.flush(&mut puts, &mut removes);
                        }
                        removes.push(k)
                    }
                }
                if puts.len() + removes.len() < BATCH {
                    next = self.rx.try_recv().ok();
                }
            }
            self.flush(&mut puts, &mut removes);
        }
    }

    fn flush(&self, puts: &mut Vec<(Key, Box<[u8]>)>, removes: &mut Vec<Key>) {
        if !puts.is_empty() {
            let items: Vec<(Key, &[u8])> = puts.iter().map(|(k, v)| (*k, &v[..])).collect();
            match self.store.write_many(&items) {
                Ok(()) => {
                    self.counters.writes.fetch_add(puts.len() as u64, Relaxed);
                }
                Err(e) => {
                    self.counters.errors.fetch_add(1, Relaxed);
                    tracing::warn!(
                        "tidepool cache: far write of {} values failed: {e}",
                        puts.len()
                    );
                }
            }
            puts.clear();
        }
        if !removes.is_empty() {
            match self.store.remove_many(removes) {
                Ok(()) => {
                    self.counters
                        .removes
                        .fetch_add(removes.len() as u64, Relaxed);
                }
                Err(e) => {
                    self.counters.errors.fetch_add(1, Relaxed);
                    self.quiet.warn(format_args!("far removal failed: {e}"));
                }
            }
            removes.clear();
        }
    }
}
