//! The plain in-process store (`local:?compress=none`): values kept whole in sharded hash maps
//! in this process's memory. It saves the process no memory; it is there to measure the pager
//! alone, and for tests. (`local:`, the embedded default, is [`crate::PackedStore`].) A value
//! replaced by one of the same size is overwritten in place, so a page evicted again and again
//! costs a copy, not an allocation.

use crate::{FarStore, Key, StoreError, StoreStats};
use bytes::Bytes;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARDS: usize = 64;

type Shard = FxHashMap<Key, Box<[u8]>>;

#[derive(Debug)]
pub struct LocalStore {
    shards: Box<[Mutex<Shard>]>,
    bytes: AtomicU64,
    objects: AtomicU64,
}

impl LocalStore {
    #[allow(clippy::new_without_default)]
    pub fn new() -> LocalStore {
        LocalStore {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(FxHashMap::default()))
                .collect(),
            bytes: AtomicU64::new(0),
            objects: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: Key) -> &Mutex<Shard> {
        // Fibonacci hashing spreads sequential page numbers over all shards.
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.shards[h as usize % SHARDS]
    }

    /// Overwrites a value of the same size in place; false if there is none.
    fn overwrite(&self, key: Key, value: &[u8]) -> bool {
        match self.shard(key).lock().get_mut(&key) {
            Some(old) if old.len() == value.len() => {
                old.copy_from_slice(value);
                true
            }
            _ => false,
        }
    }

    fn account_remove(&self, old: Option<Box<[u8]>>) {
        if let Some(old) = old {
            self.bytes.fetch_sub(old.len() as u64, Ordering::Relaxed);
            self.objects.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl FarStore for LocalStore {
    fn private_to_process(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        "local:?compress=none".into()
    }

    fn write_many(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        for (key, value) in items {
            if self.overwrite(*key, value) {
                continue;
            }
            let stored: Box<[u8]> = (*value).into();
            self.bytes.fetch_add(stored.len() as u64, Ordering::Relaxed);
            self.objects.fetch_add(1, Ordering::Relaxed);
            let old = self.shard(*key).lock().insert(*key, stored);
            self.account_remove(old);
        }
        Ok(())
    }

    fn read_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        keys.iter()
            .map(|k| {
                Ok(self
                    .shard(*k)
                    .lock()
                    .get(k)
                    .map(|b| Bytes::copy_from_slice(b)))
            })
            .collect()
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
            lens[i] = crate::copy_into_chunk(shard.get(k).map(|b| &b[..]), chunk, dst)?;
        }
        Ok(())
    }

    fn take_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        keys.iter()
            .map(|k| {
                let stored = self.shard(*k).lock().remove(k);
                let value = stored.as_deref().map(Bytes::copy_from_slice);
                self.account_remove(stored);
                Ok(value)
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
