//! The in-process store: the embedded default, needing no server. Values live in sharded hash
//! maps in this process's memory, optionally LZ4-compressed (worth it for pages of text or
//! sparse data; incompressible data is stored as is).

use crate::{FarStore, Key, StoreError, StoreStats};
use bytes::Bytes;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARDS: usize = 64;

/// How a value is kept.
#[derive(Debug, Clone)]
enum Stored {
    Raw(Bytes),
    Lz4 { compressed: Bytes },
}

impl Stored {
    fn footprint(&self) -> u64 {
        match self {
            Stored::Raw(b) => b.len() as u64,
            Stored::Lz4 { compressed } => compressed.len() as u64,
        }
    }
}

#[derive(Debug)]
pub struct LocalStore {
    shards: Box<[Mutex<FxHashMap<Key, Stored>>]>,
    compress: bool,
    bytes: AtomicU64,
    objects: AtomicU64,
}

impl LocalStore {
    pub fn new(compress: bool) -> LocalStore {
        LocalStore {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(FxHashMap::default()))
                .collect(),
            compress,
            bytes: AtomicU64::new(0),
            objects: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: Key) -> &Mutex<FxHashMap<Key, Stored>> {
        // Fibonacci hashing spreads sequential page numbers over all shards.
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.shards[h as usize % SHARDS]
    }

    fn encode(&self, value: &[u8]) -> Stored {
        if self.compress {
            let c = lz4_flex::compress_prepend_size(value);
            if c.len() < value.len() {
                return Stored::Lz4 {
                    compressed: Bytes::from(c),
                };
            }
        }
        Stored::Raw(Bytes::copy_from_slice(value))
    }

    fn decode(stored: &Stored) -> Result<Bytes, StoreError> {
        match stored {
            Stored::Raw(b) => Ok(b.clone()),
            Stored::Lz4 { compressed } => lz4_flex::decompress_size_prepended(compressed)
                .map(Bytes::from)
                .map_err(|e| StoreError::Backend {
                    backend: "local",
                    message: format!("stored value failed to decompress: {e}"),
                    source: None,
                }),
        }
    }

    fn account_remove(&self, old: Option<Stored>) {
        if let Some(old) = old {
            self.bytes.fetch_sub(old.footprint(), Ordering::Relaxed);
            self.objects.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl FarStore for LocalStore {
    fn describe(&self) -> String {
        if self.compress {
            "local:?compress=lz4".into()
        } else {
            "local:".into()
        }
    }

    fn write_many(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        for (key, value) in items {
            // Compress outside the lock.
            let stored = self.encode(value);
            self.bytes.fetch_add(stored.footprint(), Ordering::Relaxed);
            self.objects.fetch_add(1, Ordering::Relaxed);
            let old = self.shard(*key).lock().insert(*key, stored);
            self.account_remove(old);
        }
        Ok(())
    }

    fn read_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        keys.iter()
            .map(|k| {
                let stored = self.shard(*k).lock().get(k).cloned();
                stored.as_ref().map(Self::decode).transpose()
            })
            .collect()
    }

    fn take_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        keys.iter()
            .map(|k| {
                let stored = self.shard(*k).lock().remove(k);
                let value = stored.as_ref().map(Self::decode).transpose();
                self.account_remove(stored);
                value
            })
            .collect()
    }

    fn remove_many(&self, keys: &[Key]) -> Result<(), StoreError> {
        for k in keys {
            let old = self.shard(*k).lock().remove(k);
            self.account_remove(old);
        }
        Ok(())
    }

    fn stats(&self) -> Result<StoreStats, StoreError> {
        Ok(StoreStats {
            far_bytes: Some(self.bytes.load(Ordering::Relaxed)),
            objects: Some(self.objects.load(Ordering::Relaxed)),
            extra: vec![],
        })
    }
}
