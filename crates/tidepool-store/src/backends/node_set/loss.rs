//! Losing nodes: marking one down, naming the lost ones in errors, and storing again the values
//! that lost a piece with them.

use super::chunks;
use super::node_lost;
use super::NodeSet;
use super::BACKEND;
use super::REPROTECT_BATCH;
use crate::Key;
use crate::StoreError;
use std::sync::atomic::Ordering::*;

impl NodeSet {
    /// Marks member `i` down after `e` and queues the values that had a piece on it.
    pub(super) fn mark_down(&self, i: usize, e: &StoreError) {
        if self.members[i].down.swap(true, AcqRel) {
            return;
        }
        eprintln!(
            "tidepool: memory node {} is down ({e}); reading from the other pieces and storing \
             its share again on the nodes still up",
            self.members[i].name
        );
        let mut lost = vec![];
        for shard in self.index.iter() {
            lost.extend(
                shard
                    .lock()
                    .iter()
                    .filter(|(_, p)| p.holds_on(i))
                    .map(|(k, _)| *k),
            );
        }
        if !lost.is_empty() {
            self.unprotected.lock().extend(lost);
            self.has_unprotected.store(true, Release);
        }
    }

    /// Marks the member down if `e` says it is gone; otherwise returns `e`.
    pub(super) fn failed(&self, i: usize, e: StoreError) -> Result<(), StoreError> {
        if node_lost(&e) {
            self.mark_down(i, &e);
            Ok(())
        } else {
            Err(e)
        }
    }

    pub(super) fn down_names(&self) -> String {
        let names: Vec<&str> = self
            .members
            .iter()
            .filter(|m| m.down.load(Acquire))
            .map(|m| m.name.as_str())
            .collect();
        names.join(", ")
    }

    pub(super) fn lost(&self, what: String) -> StoreError {
        StoreError::Backend {
            backend: BACKEND,
            message: format!("{what}; memory nodes down: {}", self.down_names()),
            source: None,
        }
    }

    /// Stores again, on nodes still up, up to `max` values that lost a piece with a node.
    /// Returns the bytes re-protected. Values that cannot be read any more (too many pieces
    /// lost) are left for their reader to fail on; values that cannot get more pieces (no
    /// other node up) stay as they are.
    pub fn reprotect(&self, max: usize) -> Result<u64, StoreError> {
        let batch: Vec<Key> = {
            let Some(mut q) = self.unprotected.try_lock() else {
                return Ok(0);
            };
            let n = q.len().min(max);
            let at = q.len() - n;
            let b = q.split_off(at);
            if q.is_empty() {
                self.has_unprotected.store(false, Release);
            }
            b
        };
        if batch.is_empty() {
            return Ok(0);
        }
        let guards: Vec<_> = self
            .stripes_of(batch.iter().copied())
            .into_iter()
            .map(|s| self.stripes[s].write())
            .collect();
        let live = self.live();
        let target = self.redundancy.pieces().min(live);
        let keys: Vec<Key> = batch
            .into_iter()
            .filter(|&k| {
                self.placed(k).is_some_and(|p| {
                    let up = p.pieces().filter(|&(_, m)| self.up(m)).count();
                    up < target && up >= self.redundancy.needed()
                })
            })
            .collect();
        let mut bytes = 0;
        for c in chunks(&keys, |_| 0) {
            let values = match self.read_locked(c) {
                Ok(v) => v,
                // Another node went down meanwhile: these wait for the next round.
                Err(e) => {
                    self.unprotected.lock().extend_from_slice(c);
                    self.has_unprotected.store(true, Release);
                    return Err(e);
                }
            };
            let items: Vec<(Key, &[u8])> = c
                .iter()
                .zip(&values)
                .filter_map(|(&k, v)| Some((k, v.as_deref()?)))
                .collect();
            self.write_locked(&items)?;
            bytes += items.iter().map(|(_, v)| v.len() as u64).sum::<u64>();
        }
        drop(guards);
        self.reprotected_bytes.fetch_add(bytes, Relaxed);
        Ok(bytes)
    }

    /// A few values re-protected after a call, while some wait.
    pub(super) fn reprotect_some(&self) {
        if self.has_unprotected.load(Acquire) {
            if let Err(e) = self.reprotect(REPROTECT_BATCH) {
                tracing::warn!("re-protecting values after a node loss: {e}");
            }
        }
    }

    /// Bytes of values with fewer pieces on live nodes than the URL asks for.
    pub(super) fn unprotected_bytes(&self) -> (u64, u64) {
        let want = self.redundancy.pieces();
        let (mut keys, mut bytes) = (0, 0);
        for shard in self.index.iter() {
            for p in shard.lock().values() {
                if p.pieces().filter(|&(_, m)| self.up(m)).count() < want {
                    keys += 1;
                    bytes += p.len as u64;
                }
            }
        }
        (keys, bytes)
    }
}
