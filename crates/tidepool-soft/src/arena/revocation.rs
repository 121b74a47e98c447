//! Taking memory back: following a budget someone else sets (shrinking cooperatively, by
//! evacuation first), telling which segments are coldest, and retiring segments punched
//! behind the runtime's back. What a coordinator link ([`crate::coord`]) drives.

use super::{Placement, SoftArena, ACTIVE, CLOSED, CONTINUATION, FREE, REVOKED, SEGMENT};
use std::sync::atomic::Ordering::*;
use tidepool_proto::coord::SegmentRun;

impl SoftArena {
    /// Keeps to a budget the coordinator set: shrinking evacuates first (the coldest objects
    /// go, the rest are compacted), then gives back segments.
    pub fn follow_budget(&self, bytes: usize) {
        let target = bytes.div_ceil(SEGMENT).max(1);
        self.set_budget_segments(target);
        let populated = self.segments.lock().populated;
        if populated > target {
            self.reclaim((populated - target) * SEGMENT);
        }
        self.set_budget(bytes);
    }

    /// Closed segments (runs) coldest first, as the last evacuation ordered them: what direct
    /// reclamation should take first.
    pub fn cold_runs(&self, max: usize) -> Vec<SegmentRun> {
        let s = self.segments.lock();
        s.closed
            .iter()
            .filter(|&&c| self.meta[c as usize].kind.load(Relaxed) == CLOSED)
            .take(max)
            .map(|&c| SegmentRun {
                first: c,
                len: self.meta[c as usize].run.load(Relaxed).max(1),
            })
            .collect()
    }

    /// The coordinator punched these segments: retire them (their objects read as lost
    /// anyway; this keeps the count of memory held exact and stops allocation there).
    pub fn punched(&self, runs: &[SegmentRun]) {
        let count = self.meta.len() as u32;
        for r in runs {
            let end = r.first.saturating_add(r.len.max(1)).min(count);
            for seg in r.first.min(count)..end {
                // A large object's continuation: its run starts further back.
                let mut first = seg;
                while first > 0 && self.meta[first as usize].kind.load(Relaxed) == CONTINUATION {
                    first -= 1;
                }
                let kind = self.meta[first as usize].kind.load(Relaxed);
                if matches!(kind, FREE | ACTIVE | CLOSED) {
                    let offset = first as usize * SEGMENT;
                    self.revoked(Placement {
                        offset,
                        incarnation: self.incarnation(offset),
                    });
                }
            }
        }
        self.release_revoked();
    }

    /// Gives back revoked segments no writer is still copying into.
    fn release_revoked(&self) {
        let mut s = self.segments.lock();
        let quiet: Vec<u32> = s
            .closed
            .iter()
            .copied()
            .filter(|&c| {
                let m = &self.meta[c as usize];
                m.kind.load(Relaxed) == REVOKED && m.writers.load(Acquire) == 0
            })
            .collect();
        s.closed.retain(|c| !quiet.contains(c));
        for seg in quiet {
            self.release(&mut s, seg);
        }
    }
}
