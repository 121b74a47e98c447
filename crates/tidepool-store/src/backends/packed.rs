//! The packed in-process store, the embedded default (`local:`): values kept compressed in
//! this process's memory, as zram keeps swapped pages in the kernel's.
//!
//! - A value of equal 8-byte words (a zero page, a page of one repeated pattern) is kept as
//!   that word in its map entry: no slot, no codec.
//! - Others of 128 bytes to 4 KiB are compressed ([`Compression`]: LZ4, or zstd at level -1)
//!   and kept if that saves at least an eighth; otherwise as they are.
//! - Slots come in 32-byte size classes ([`super::slots`]), so a page costs its compressed
//!   length rounded up to 32 bytes plus a 16-byte entry: [`FarStore::stats`] counts all of it.
//!   The holes values leave in chunks are compacted away as zsmalloc's are.
//!
//! Which codec is the default was measured on the pages of the programs the apps suite runs
//! (`examples/page_codecs.rs`); see ARCHITECTURE.md.

use super::slots::{Body, Meta, SlotMap, MAX};
use crate::{FarStore, Key, StoreError, StoreStats};
use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How the packed store compresses what it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Compression {
    /// Nothing compressed (the plain in-process store: [`crate::LocalStore`]).
    None,
    /// LZ4: the default.
    Lz4,
    /// zstd at level -1 (its first fast level): smaller, and slower.
    Zstd,
}

impl Compression {
    /// What `local:` compresses with.
    pub const DEFAULT: Compression = Compression::Lz4;

    /// The name in a store URL (`local:?compress=NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

/// zstd's level: -1 keeps CPython's and pandas' pages in 0.59x and 0.80x of LZ4's bytes at
/// 1.7x its compression time; level 1 packs only 5-9% tighter at 1.5x level -1's time.
const ZSTD_LEVEL: i32 = -1;

/// How one value is kept (`Meta::tag`).
mod tag {
    pub const RAW: u8 = 0;
    pub const SAME: u8 = 1;
    pub const LZ4: u8 = 2;
    pub const ZSTD: u8 = 3;
}

/// Values shorter than this are kept as they are: too short to compress.
const MIN_COMPRESS: usize = 128;

/// zstd's contexts, kept for reuse: making one allocates its work space.
#[derive(Default)]
struct ZstdContexts {
    compressors: Mutex<Vec<zstd::bulk::Compressor<'static>>>,
    decompressors: Mutex<Vec<zstd::bulk::Decompressor<'static>>>,
}

impl std::fmt::Debug for ZstdContexts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ZstdContexts")
    }
}

/// The packed in-process store.
#[derive(Debug)]
pub struct PackedStore {
    map: SlotMap,
    compression: Compression,
    zstd: ZstdContexts,
    /// Bytes of the values kept, before packing.
    original: AtomicU64,
    /// Values kept as a word, and as they are.
    same: AtomicU64,
    raw: AtomicU64,
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend {
        backend: "local",
        message: format!("a stored value failed to decompress: {e}"),
        source: None,
    }
}

/// The word every 8 bytes of `value` repeat, if they do.
fn same_filled(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.len().is_multiple_of(8) {
        return None;
    }
    let first = &value[..8];
    value
        .chunks_exact(8)
        .all(|w| w == first)
        .then(|| u64::from_ne_bytes(first.try_into().expect("8 bytes")))
}

impl PackedStore {
    pub fn new(compression: Compression) -> PackedStore {
        PackedStore {
            map: SlotMap::default(),
            compression,
            zstd: ZstdContexts::default(),
            original: AtomicU64::new(0),
            same: AtomicU64::new(0),
            raw: AtomicU64::new(0),
        }
    }

    /// Compresses `value` into `out` (twice its length: LZ4 wants room for its worst case);
    /// its length there.
    fn compress(&self, value: &[u8], out: &mut [u8]) -> Option<usize> {
        match self.compression {
            Compression::None => None,
            Compression::Lz4 => lz4_flex::block::compress_into(value, out).ok(),
            Compression::Zstd => {
                let mut c = match self.zstd.compressors.lock().pop() {
                    Some(c) => c,
                    None => zstd::bulk::Compressor::new(ZSTD_LEVEL).ok()?,
                };
                let n = c.compress_to_buffer(value, out).ok();
                self.zstd.compressors.lock().push(c);
                n
            }
        }
    }

    /// Keeps one value.
    fn put(&self, key: Key, value: &[u8]) -> Result<(), StoreError> {
        let len = u32::try_from(value.len()).map_err(|_| StoreError::ValueTooLarge {
            backend: "local",
            len: value.len(),
            max: u32::MAX as usize,
        })?;
        let mut buf = [0u8; 2 * MAX];
        let (tag, body) = if let Some(word) = same_filled(value) {
            (tag::SAME, Body::Word(word))
        } else if value.len() >= MIN_COMPRESS && value.len() <= MAX {
            // Worth keeping only if it saves an eighth.
            let room = value.len() - value.len() / 8;
            match self.compress(value, &mut buf[..2 * value.len()]) {
                Some(n) if n <= room => (
                    match self.compression {
                        Compression::Zstd => tag::ZSTD,
                        _ => tag::LZ4,
                    },
                    Body::Bytes(&buf[..n]),
                ),
                _ => (tag::RAW, Body::Bytes(value)),
            }
        } else {
            (tag::RAW, Body::Bytes(value))
        };
        self.count(tag, value.len() as u64, true);
        if let Some(old) = self.map.insert(key, Meta { tag, len }, body) {
            self.count(old.tag, old.len as u64, false);
        }
        Ok(())
    }

    fn count(&self, tag: u8, len: u64, added: bool) {
        let add = |c: &AtomicU64, n: u64| {
            if added {
                c.fetch_add(n, Relaxed);
            } else {
                c.fetch_sub(n, Relaxed);
            }
        };
        add(&self.original, len);
        match tag {
            tag::SAME => add(&self.same, 1),
            tag::RAW => add(&self.raw, 1),
            _ => {}
        }
    }

    /// Unpacks a value into `out`, exactly its length.
    fn unpack(&self, meta: Meta, body: Body<'_>, out: &mut [u8]) -> Result<(), StoreError> {
        match (meta.tag, body) {
            (tag::SAME, Body::Word(w)) => {
                for c in out.chunks_exact_mut(8) {
                    c.copy_from_slice(&w.to_ne_bytes());
                }
            }
            (tag::RAW, Body::Bytes(b)) => out.copy_from_slice(b),
            (tag::LZ4, Body::Bytes(b)) => {
                let n = lz4_flex::block::decompress_into(b, out).map_err(corrupt)?;
                if n != out.len() {
                    return Err(corrupt(format!("{n} bytes of {}", out.len())));
                }
            }
            (tag::ZSTD, Body::Bytes(b)) => {
                let mut d = match self.zstd.decompressors.lock().pop() {
                    Some(d) => d,
                    None => zstd::bulk::Decompressor::new().map_err(corrupt)?,
                };
                let n = d.decompress_to_buffer(b, &mut *out);
                self.zstd.decompressors.lock().push(d);
                let n = n.map_err(corrupt)?;
                if n != out.len() {
                    return Err(corrupt(format!("{n} bytes of {}", out.len())));
                }
            }
            (t, _) => return Err(corrupt(format!("unknown packing {t}"))),
        }
        Ok(())
    }

    fn unpack_new(&self, meta: Meta, body: Body<'_>) -> Result<Bytes, StoreError> {
        let mut v = vec![0u8; meta.len as usize];
        self.unpack(meta, body, &mut v)?;
        Ok(Bytes::from(v))
    }
}

impl FarStore for PackedStore {
    fn private_to_process(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!("local:?compress={}", self.compression.name())
    }

    fn write_many(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        for (key, value) in items {
            self.put(*key, value)?;
        }
        Ok(())
    }

    fn read_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        keys.iter()
            .map(|k| {
                self.map
                    .get(*k, |meta, body| self.unpack_new(meta, body))
                    .transpose()
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
            lens[i] = self
                .map
                .get(*k, |meta, body| {
                    let len = meta.len as usize;
                    if len > chunk {
                        return Err(StoreError::ValueTooLarge {
                            backend: "the reader's buffer",
                            len,
                            max: chunk,
                        });
                    }
                    self.unpack(meta, body, &mut dst[..len]).map(|()| len)
                })
                .transpose()?;
        }
        Ok(())
    }

    fn take_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        keys.iter()
            .map(|k| {
                let v = self
                    .map
                    .remove(*k, |meta, body| (meta, self.unpack_new(meta, body)));
                v.map(|(meta, v)| {
                    self.count(meta.tag, meta.len as u64, false);
                    v
                })
                .transpose()
            })
            .collect()
    }

    fn remove_many(&self, keys: &[Key]) -> Result<(), StoreError> {
        for k in keys {
            if let Some(meta) = self.map.remove(*k, |meta, _| meta) {
                self.count(meta.tag, meta.len as u64, false);
            }
        }
        Ok(())
    }

    fn stats(&self) -> Result<StoreStats, StoreError> {
        Ok(StoreStats {
            far_bytes: Some(self.map.held_bytes()),
            objects: Some(self.map.objects()),
            extra: vec![
                ("original_bytes".into(), self.original.load(Relaxed)),
                ("packed_bytes".into(), self.map.used_bytes()),
                ("same_filled".into(), self.same.load(Relaxed)),
                ("kept_raw".into(), self.raw.load(Relaxed)),
                ("compacted_bytes".into(), self.map.compactions().0),
                ("compacted_values".into(), self.map.compactions().1),
            ],
        })
    }
}
