//! Reed-Solomon erasure coding of batches of values, for [`super::node_set::NodeSet`].
//!
//! A value of `len` bytes is cut into `data` pieces of [`piece_len`] bytes (the last padded with
//! zeros) and `parity` more pieces are computed from them; any `data` of the `data + parity`
//! pieces give the value back (pieces are whole 64-byte blocks, so a 4 KiB page is six pieces of
//! 1 KiB with 4+2, but a 100-byte value is six of 64 bytes). The coder (reed-solomon-simd, GF(2^16) with SIMD) works on every
//! byte position independently, so a whole batch is coded in one call: piece `p` of every value
//! is laid end to end into one long shard. That matters most when decoding, whose fixed cost
//! (evaluating the erasure locator over the whole field, about 0.2 ms) does not depend on the
//! shard's length: a batch pays it once per pattern of missing pieces, not once per value.

use crate::{Key, StoreError};
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};
use std::collections::BTreeMap;

const BACKEND: &str = "memory nodes";

/// The length of each piece of a value of `len` bytes cut into `data` pieces: a whole number
/// of 64-byte blocks, never zero. The coder pairs bytes into 16-bit symbols within each 64-byte
/// block of a shard (and differently in a shorter tail), so only pieces of whole blocks code
/// the same alone as laid end to end with others.
pub(crate) fn piece_len(len: usize, data: usize) -> usize {
    len.div_ceil(data).max(1).next_multiple_of(64)
}

fn coding_error(e: reed_solomon_simd::Error) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        message: format!("erasure coding: {e}"),
        source: None,
    }
}

/// Encoders and decoders for one `data + parity` layout, kept for reuse (making one allocates
/// its work space).
pub(crate) struct Coder {
    data: usize,
    parity: usize,
    encoders: Mutex<Vec<ReedSolomonEncoder>>,
    decoders: Mutex<Vec<ReedSolomonDecoder>>,
}

impl std::fmt::Debug for Coder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Coder({}+{})", self.data, self.parity)
    }
}

/// The pieces of a batch of values: piece `p` of value `j` is
/// `pieces[p][at[j]..at[j] + len[j]]`.
#[derive(Debug)]
pub(crate) struct Coded {
    pieces: Vec<Vec<u8>>,
    at: Vec<usize>,
    len: Vec<usize>,
}

impl Coded {
    pub(crate) fn piece(&self, value: usize, piece: usize) -> &[u8] {
        let at = self.at[value];
        &self.pieces[piece][at..at + self.len[value]]
    }
}

impl Coder {
    /// A coder, with an encoder and a decoder made now: the first builds the coder's tables
    /// (several milliseconds), which would otherwise fall on the first write, or on the first
    /// read after a node is lost.
    pub(crate) fn new(data: usize, parity: usize) -> Coder {
        Coder {
            data,
            parity,
            encoders: Mutex::new(
                ReedSolomonEncoder::new(data, parity, 64)
                    .into_iter()
                    .collect(),
            ),
            decoders: Mutex::new(
                ReedSolomonDecoder::new(data, parity, 64)
                    .into_iter()
                    .collect(),
            ),
        }
    }

    /// Cuts every value into its pieces and computes the parity pieces, in one coding call.
    pub(crate) fn encode(&self, values: &[&[u8]]) -> Result<Coded, StoreError> {
        let (k, m) = (self.data, self.parity);
        let len: Vec<usize> = values.iter().map(|v| piece_len(v.len(), k)).collect();
        let mut at = Vec::with_capacity(values.len());
        let mut total = 0;
        for s in &len {
            at.push(total);
            total += s;
        }
        let mut pieces: Vec<Vec<u8>> = (0..k).map(|_| vec![0u8; total]).collect();
        for (j, v) in values.iter().enumerate() {
            let s = len[j];
            for (p, chunk) in v.chunks(s).enumerate() {
                pieces[p][at[j]..at[j] + chunk.len()].copy_from_slice(chunk);
            }
        }
        let pooled = self.encoders.lock().pop();
        let mut enc = match pooled {
            Some(mut e) => {
                e.reset(k, m, total).map_err(coding_error)?;
                e
            }
            None => ReedSolomonEncoder::new(k, m, total).map_err(coding_error)?,
        };
        for piece in &pieces {
            enc.add_original_shard(piece).map_err(coding_error)?;
        }
        {
            let out = enc.encode().map_err(coding_error)?;
            pieces.extend(out.recovery_iter().map(<[u8]>::to_vec));
        }
        self.encoders.lock().push(enc);
        Ok(Coded { pieces, at, len })
    }

    /// The values back: `got[j]` holds `data` distinct pieces (index, bytes) of value `j`,
    /// whose length is `lens[j]`. Values with all their data pieces are only put together;
    /// the others are decoded together, one call per pattern of missing pieces.
    pub(crate) fn decode(
        &self,
        keys: &[Key],
        lens: &[usize],
        got: &mut [Vec<(usize, Bytes)>],
    ) -> Result<Vec<Bytes>, StoreError> {
        let k = self.data;
        let mut out: Vec<Option<Bytes>> = vec![None; got.len()];
        let mut patterns: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (j, g) in got.iter_mut().enumerate() {
            let s = piece_len(lens[j], k);
            if let Some((p, b)) = g.iter().find(|(_, b)| b.len() != s) {
                return Err(StoreError::Protocol {
                    backend: BACKEND,
                    detail: format!(
                        "piece {p} of key {:#x} came back {} bytes long, expected {s}",
                        keys[j],
                        b.len()
                    ),
                });
            }
            g.sort_unstable_by_key(|(p, _)| *p);
            if g.iter().take(k).map(|(p, _)| *p).eq(0..k) {
                let mut v = BytesMut::with_capacity(k * s);
                for (_, b) in g.iter().take(k) {
                    v.extend_from_slice(b);
                }
                v.truncate(lens[j]);
                out[j] = Some(v.freeze());
            } else {
                let mask = g.iter().fold(0u32, |m, (p, _)| m | 1 << p);
                patterns.entry(mask).or_default().push(j);
            }
        }
        for (mask, js) in patterns {
            self.decode_pattern(mask, &js, lens, got, &mut out)?;
        }
        Ok(out
            .into_iter()
            .map(|v| v.expect("every value put together"))
            .collect())
    }

    /// Decodes the values `js`, which all have the pieces in `mask`, in one call.
    fn decode_pattern(
        &self,
        mask: u32,
        js: &[usize],
        lens: &[usize],
        got: &[Vec<(usize, Bytes)>],
        out: &mut [Option<Bytes>],
    ) -> Result<(), StoreError> {
        let (k, m) = (self.data, self.parity);
        let sizes: Vec<usize> = js.iter().map(|&j| piece_len(lens[j], k)).collect();
        let total: usize = sizes.iter().sum();
        let present: Vec<usize> = (0..k + m).filter(|p| mask & 1 << p != 0).collect();
        // Piece `present[i]` of every value, end to end.
        let mut long: Vec<Vec<u8>> = present.iter().map(|_| Vec::with_capacity(total)).collect();
        for &j in js {
            for (i, (_, b)) in got[j].iter().enumerate() {
                long[i].extend_from_slice(b);
            }
        }
        let pooled = self.decoders.lock().pop();
        let mut dec = match pooled {
            Some(mut d) => {
                d.reset(k, m, total).map_err(coding_error)?;
                d
            }
            None => ReedSolomonDecoder::new(k, m, total).map_err(coding_error)?,
        };
        for (&p, shard) in present.iter().zip(&long) {
            if p < k {
                dec.add_original_shard(p, shard).map_err(coding_error)?;
            } else {
                dec.add_recovery_shard(p - k, shard).map_err(coding_error)?;
            }
        }
        {
            let restored = dec.decode().map_err(coding_error)?;
            let mut at = 0;
            for (&j, &s) in js.iter().zip(&sizes) {
                let mut v = BytesMut::with_capacity(k * s);
                for p in 0..k {
                    match present.iter().position(|&q| q == p) {
                        Some(i) => v.extend_from_slice(&long[i][at..at + s]),
                        None => {
                            let r = restored.restored_original(p).ok_or_else(|| {
                                coding_error(reed_solomon_simd::Error::NotEnoughShards {
                                    original_count: k,
                                    original_received_count: 0,
                                    recovery_received_count: 0,
                                })
                            })?;
                            v.extend_from_slice(&r[at..at + s]);
                        }
                    }
                }
                v.truncate(lens[j]);
                out[j] = Some(v.freeze());
                at += s;
            }
        }
        self.decoders.lock().push(dec);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any `data` of the pieces give every value back, whatever the lengths in the batch.
    #[test]
    fn any_k_pieces_give_every_value_back() {
        let coder = Coder::new(4, 2);
        let values: Vec<Vec<u8>> = [0usize, 1, 7, 4096, 4097, 10_000]
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|b| (b * 31 + i * 7) as u8).collect())
            .collect();
        let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let coded = coder.encode(&refs).unwrap();
        let lens: Vec<usize> = values.iter().map(Vec::len).collect();
        let keys: Vec<Key> = (0..values.len() as u64).collect();
        // Every choice of 4 of the 6 pieces, a different one per value.
        let choices: Vec<Vec<usize>> = (0u32..64)
            .filter(|m| m.count_ones() == 4)
            .map(|m| (0..6).filter(|p| m & 1 << p != 0).collect())
            .collect();
        for shift in 0..choices.len() {
            let mut got: Vec<Vec<(usize, Bytes)>> = (0..values.len())
                .map(|j| {
                    choices[(j + shift) % choices.len()]
                        .iter()
                        .rev()
                        .map(|&p| (p, Bytes::copy_from_slice(coded.piece(j, p))))
                        .collect()
                })
                .collect();
            let back = coder.decode(&keys, &lens, &mut got).unwrap();
            for (j, v) in values.iter().enumerate() {
                assert_eq!(&back[j][..], &v[..], "value {j}, shift {shift}");
            }
        }
    }
}
