//! The in-process store: the embedded default, needing no server. Values live in sharded hash
//! maps in this process's memory, optionally LZ4-compressed (worth it for pages of text or
//! sparse data; incompressible data is stored as is). A value replaced by one of the same size
//! is overwritten in place, so a page evicted again and again costs a copy, not an allocation.

use crate::{FarStore, Key, StoreError, StoreStats};
use bytes::Bytes;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARDS: usize = 64;

/// How a value is kept.
#[derive(Debug, Clone)]
enum Stored {
    Raw(Box<[u8]>),
    Lz4 { compressed: Box<[u8]> },
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
                    compressed: c.into_boxed_slice(),
                };
            }
        }
        Stored::Raw(value.into())
    }

    fn decode(stored: &Stored) -> Result<Bytes, StoreError> {
        match stored {
            Stored::Raw(b) => Ok(Bytes::copy_from_slice(b)),
            Stored::Lz4 { compressed } => lz4_flex::decompress_size_prepended(compressed)
                .map(Bytes::from)
                .map_err(Self::corrupt),
        }
    }

    fn corrupt(e: impl std::fmt::Display) -> StoreError {
        StoreError::Backend {
            backend: "local",
            message: format!("stored value failed to decompress: {e}"),
            source: None,
        }
    }

    /// Overwrites an uncompressed value of the same size in place; false if there is none.
    fn overwrite(&self, key: Key, value: &[u8]) -> bool {
        if self.compress {
            return false;
        }
        match self.shard(key).lock().get_mut(&key) {
            Some(Stored::Raw(old)) if old.len() == value.len() => {
                old.copy_from_slice(value);
                true
            }
            _ => false,
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
    fn private_to_process(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        if self.compress {
            "local:?compress=lz4".into()
        } else {
            "local:".into()
        }
    }

    fn write_many(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        for (key, value) in items {
            if self.overwrite(*key, value) {
                continue;
            }
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

    fn evict_fetch_into(
        &self,
        evict: &[(Key, &[u8])],
        fetch: &[Key],
        chunk: usize,
        out: &mut [u8],
        lens: &mut [Option<usize>],
    ) -> Result<(), StoreError> {
        // In process there is no round trip to save: write, then copy out without allocating.
        if !evict.is_empty() {
            self.write_many(evict)?;
        }
        self.read_many_into(fetch, chunk, out, lens)
    }

    fn read_many_into(
        &self,
        keys: &[Key],
        chunk: usize,
        out: &mut [u8],
        lens: &mut [Option<usize>],
    ) -> Result<(), StoreError> {
        assert!(out.len() >= keys.len() * chunk && lens.len() >= keys.len());
        for (i, k) in keys.iter().enumerate() {
            let dst = &mut out[i * chunk..(i + 1) * chunk];
            let shard = self.shard(*k).lock();
            lens[i] = match shard.get(k) {
                None => None,
                Some(Stored::Raw(b)) => crate::copy_into_chunk(Some(b), chunk, dst)?,
                Some(Stored::Lz4 { compressed }) => {
                    let (size, body) = compressed.split_at(4);
                    let len = u32::from_le_bytes(size.try_into().expect("4 bytes")) as usize;
                    if len > chunk {
                        return Err(StoreError::ValueTooLarge {
                            backend: "the reader's buffer",
                            len,
                            max: chunk,
                        });
                    }
                    Some(lz4_flex::decompress_into(body, dst).map_err(Self::corrupt)?)
                }
            };
        }
        Ok(())
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
