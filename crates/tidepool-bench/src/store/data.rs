//! What the store suite's parts share: sizes, the values every system stores (tagged with their
//! key and version, the rest incompressible noise) and the check of a value read back.

use crate::harness::BenchOpts;
use anyhow::{anyhow, bail, Result};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use tidepool_store::Key;

pub const VALUE_BYTES: usize = 4096;
pub(super) const THREADS: usize = 4;
pub(super) const SHARE_CLIENTS: usize = 3;

/// Keys (objects per client, in the sharing experiment) of a run.
pub(super) fn keys(opts: &BenchOpts) -> u64 {
    if opts.quick {
        4096
    } else {
        16384
    }
}

/// Requests in flight per client thread for the batched workloads: the ratio between systems
/// depends on it (fixed per-round-trip costs weigh less as batches grow), so it is swept.
pub(super) fn batches(opts: &BenchOpts) -> Vec<usize> {
    if opts.quick {
        vec![8, 32, 128]
    } else {
        vec![1, 8, 32, 128]
    }
}

pub(super) fn share_ratios(opts: &BenchOpts) -> Vec<f64> {
    if opts.quick {
        vec![0.5]
    } else {
        vec![0.25, 0.5, 0.75]
    }
}

/// A value whose first 8 bytes name its key and next 4 its version; the rest is noise, so no
/// backend can compress its way ahead.
pub fn value(key: Key, version: u32, noise: &[u8]) -> Vec<u8> {
    let mut v = noise[..VALUE_BYTES].to_vec();
    v[..8].copy_from_slice(&key.to_le_bytes());
    v[8..12].copy_from_slice(&version.to_le_bytes());
    v
}

/// Fails unless `got` is key `key`'s value (at `version`, if given).
pub(super) fn check(key: Key, version: Option<u32>, got: Option<&Bytes>, who: &str) -> Result<()> {
    let got = got.ok_or_else(|| anyhow!("{who}: key {key} vanished"))?;
    if got.len() != VALUE_BYTES || got[..8] != key.to_le_bytes() {
        bail!("{who}: key {key} came back wrong ({} bytes)", got.len());
    }
    if let Some(v) = version {
        let have = u32::from_le_bytes([got[8], got[9], got[10], got[11]]);
        if have != v {
            bail!("{who}: key {key} came back at version {have}, expected {v}");
        }
    }
    Ok(())
}

/// The same incompressible bytes in every process of a run.
pub(super) fn noise() -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    (0..VALUE_BYTES).map(|_| rng.gen()).collect()
}
