//! The miss path: fetching lines that are not resident (one round trip for a line and the
//! lines a stream will want next), installing them, and undoing a fetch that failed.

use super::{FarVec, Pending};
use crate::lines::LineRef;
use crate::section::DIRTY;
use crate::section::FILLING;
use crate::section::REFERENCED;
use crate::FarError;
use std::time::Instant;
use tidepool_store::{Key, StoreError};
use zerocopy::FromBytes;
use zerocopy::Immutable;
use zerocopy::IntoBytes;
use zerocopy::KnownLayout;

/// A slot taken for a fill: (slot, new key, old tag, old flags).
type Taken = (usize, Key, u64, u8);

impl<T> FarVec<T>
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy,
{
    /// Lines fetched past a miss: fixed by [`FarVec::set_prefetch`], or the section's.
    pub(super) fn distance(&self) -> usize {
        self.ahead.get().unwrap_or_else(|| self.section.distance())
    }

    #[inline(never)]
    pub(super) fn miss(&self, line: usize, ahead: usize, index: usize) -> Result<usize, FarError> {
        let (prev, delta) = self.stride.get();
        let d = line as isize - prev as isize;
        self.stride.set((line, d));
        let lines: Vec<usize> = if ahead == 0 && d != 0 && d == delta {
            // Element accesses missing at a constant stride: fetch along it, and expect the
            // next miss one stride past the last line fetched.
            let run: Vec<usize> = (0..=self.distance() as isize)
                .map(|k| line as isize + d * k)
                .take_while(|&l| l >= 0 && (l as usize) < self.lines())
                .map(|l| l as usize)
                .collect();
            self.stride.set((*run.last().unwrap_or(&line), d));
            run
        } else if ahead > 0 {
            return self.stream_miss(line, ahead, index);
        } else {
            vec![line]
        };
        self.fill(&lines, true, index)?;
        self.resident(line).ok_or(FarError::AllBorrowed { index })
    }

    /// A miss of a stream (an iterator): the lines come from the batch fetched ahead if it
    /// holds this one, else in a round trip of their own; either way the next `ahead + 1`
    /// lines are then asked for ahead, to arrive while these are used.
    pub(super) fn stream_miss(
        &self,
        line: usize,
        ahead: usize,
        index: usize,
    ) -> Result<usize, FarError> {
        let batch = ahead + 1;
        let mut next = line + batch;
        if let Some(p) = self.pending.take() {
            if p.lines.binary_search(&line).is_ok() {
                next = p.lines.last().map_or(next, |l| l + 1);
                self.install_ahead(p, index)?;
            }
        }
        if self.resident(line).is_none() {
            let lines: Vec<usize> = (line..(line + batch).min(self.lines())).collect();
            self.fill(&lines, true, index)?;
            next = line + batch;
        }
        self.fetch_ahead(next..(next + batch).min(self.lines()));
        self.resident(line).ok_or(FarError::AllBorrowed { index })
    }

    /// Asks the store, from another thread, for the lines of `range` not resident now.
    pub(super) fn fetch_ahead(&self, range: std::ops::Range<usize>) {
        let lines: Vec<usize> = range.filter(|&l| self.resident(l).is_none()).collect();
        if lines.is_empty() {
            return;
        }
        let keys: Vec<Key> = lines.iter().map(|&l| self.base + l as u64).collect();
        let rx = self.far.fetch_ahead(keys, self.section.line_bytes());
        *self.pending.borrow_mut() = Some(Pending {
            lines,
            rx,
            writebacks: self.section.stats().writebacks,
        });
    }

    /// Installs a batch fetched ahead (waiting for it if it is still on its way), unless a
    /// write-back in the section since it was asked for could have made it stale (then it is
    /// dropped, and the caller fetches).
    pub(super) fn install_ahead(&self, p: Pending, index: usize) -> Result<(), FarError> {
        let t0 = Instant::now();
        let Ok(reply) = p.rx.recv() else {
            return Ok(());
        };
        let waited = t0.elapsed().as_nanos() as u64;
        let (data, lens) = reply?;
        if self.section.stats().writebacks != p.writebacks {
            return Ok(());
        }
        // A reader installs only while its owner lives (`fill_from` checks): the owner marks
        // itself dead before its far copies go, so a batch read while it lived is whole.
        self.fill_from(&p.lines, false, index, Some((&data, &lens)))?;
        self.section.bump(|s| s.fetch_nanos += waited);
        Ok(())
    }

    /// Fetches the lines of `lines` that are not resident, writing back the dirty lines they
    /// replace, in one round trip. With `required`, the first line must find a slot; the
    /// others are prefetches, skipped when no slot is free.
    pub(super) fn fill(
        &self,
        lines: &[usize],
        required: bool,
        index: usize,
    ) -> Result<(), FarError> {
        self.fill_from(lines, required, index, None)
    }

    /// [`FarVec::fill`], or with `ready` (the lines' contents, fetched ahead, in the order of
    /// `lines`: bytes and lengths as `read_many_into` gives them) installing those instead of
    /// fetching; dirty victims are written back first either way.
    pub(super) fn fill_from(
        &self,
        lines: &[usize],
        required: bool,
        index: usize,
        ready: Option<(&[u8], &[Option<usize>])>,
    ) -> Result<(), FarError> {
        let sec = &self.section;
        let (taken, place) = self.take_slots(lines, required, index)?;
        if taken.is_empty() {
            return Ok(());
        }
        let lb = sec.line_bytes();
        // A reader fetches only while its owner lives (and keeps it alive meanwhile).
        let alive = self
            .reader_of
            .as_ref()
            .map(|a| a.read().unwrap_or_else(|e| e.into_inner()));
        if alive.as_ref().is_some_and(|a| !**a) {
            self.undo(&taken);
            return Err(FarError::Gone);
        }
        let mut data = if ready.is_some() {
            Vec::new()
        } else {
            vec![0u8; taken.len() * lb]
        };
        let mut lens = vec![None; if ready.is_some() { 0 } else { taken.len() }];
        let fetch: Vec<Key> = taken.iter().map(|t| t.1).collect();
        let t0 = Instant::now();
        let writebacks = match self.write_back_and_fetch(
            &taken,
            &fetch,
            ready.is_some(),
            &mut data,
            &mut lens,
        ) {
            Ok(writebacks) => writebacks,
            Err(e) => {
                // Nothing lost: the dirty lines are still here, under their own keys.
                self.undo(&taken);
                return Err(e.into());
            }
        };
        // Fetched ahead, the round trip was not waited for here: it is not one to learn from.
        let nanos = if ready.is_some() {
            0
        } else {
            t0.elapsed().as_nanos() as u64
        };
        if ready.is_none() {
            sec.observe_fetch(taken.len(), nanos);
        }
        if let Some(p) = &self.prof {
            p.borrow_mut().fetched(taken.len() as u64, nanos);
        }
        let bad = self.install_lines(&taken, &place, ready, &data, &lens);
        let n = taken.len() as u64;
        sec.bump(|s| {
            s.misses += n;
            s.fetched += n;
            s.prefetched += n - required as u64;
            s.writebacks += writebacks;
            s.fetches += 1;
            s.fetch_nanos += nanos;
        });
        bad.map_or(Ok(()), Err)
    }

    /// Takes a slot, marked filling, for each line of `lines` not resident: (slot, new key,
    /// old tag, old flags), and the line's place in `lines`. With `required`, the first line
    /// must find one (else the slots taken are given back).
    fn take_slots(
        &self,
        lines: &[usize],
        required: bool,
        index: usize,
    ) -> Result<(Vec<Taken>, Vec<usize>), FarError> {
        let sec = &self.section;
        let mut taken: Vec<Taken> = Vec::new();
        let mut place: Vec<usize> = Vec::new();
        for (n, &line) in lines.iter().enumerate() {
            if self.resident(line).is_some() {
                continue;
            }
            let key = self.base + line as u64;
            let Some(slot) = sec.victim(key) else {
                if required && n == 0 {
                    self.undo(&taken);
                    return Err(FarError::AllBorrowed { index });
                }
                continue;
            };
            taken.push((slot, key, sec.tag(slot), sec.flags(slot)));
            place.push(n);
            sec.install(slot, key, FILLING | REFERENCED);
        }
        Ok((taken, place))
    }

    /// Writes the dirty victims of `taken` back and, unless the lines were fetched ahead
    /// (`ready`), fetches `fetch` into `data` and `lens`, in one round trip; returns the
    /// lines written back.
    fn write_back_and_fetch(
        &self,
        taken: &[Taken],
        fetch: &[Key],
        ready: bool,
        data: &mut [u8],
        lens: &mut [Option<usize>],
    ) -> Result<u64, StoreError> {
        let sec = &self.section;
        // Victims are never borrowed, so their old contents can be read for write-back.
        let dirty: Vec<(Key, LineRef<'_, u8>)> = taken
            .iter()
            .filter(|t| t.2 != 0 && t.3 & DIRTY != 0)
            .map(|t| {
                (
                    t.2 - 1,
                    sec.buf.bytes(t.0).expect("a victim is not borrowed"),
                )
            })
            .collect();
        let evict: Vec<(Key, &[u8])> = dirty.iter().map(|(k, g)| (*k, &g[..])).collect();
        if !ready {
            let lb = sec.line_bytes();
            self.far
                .store
                .evict_fetch_into(&evict, fetch, lb, data, lens)?;
        } else if !evict.is_empty() {
            self.far.store.write_many(&evict)?;
        }
        Ok(evict.len() as u64)
    }

    /// Installs the lines fetched (or `ready`, fetched ahead) in the slots taken for them;
    /// a line of the wrong length leaves its slot empty and is the error returned.
    fn install_lines(
        &self,
        taken: &[Taken],
        place: &[usize],
        ready: Option<(&[u8], &[Option<usize>])>,
        data: &[u8],
        lens: &[Option<usize>],
    ) -> Option<FarError> {
        let sec = &self.section;
        let lb = sec.line_bytes();
        let mut bad = None;
        for (k, t) in taken.iter().enumerate() {
            let (len, bytes) = match ready {
                None => (lens[k], &data[k * lb..(k + 1) * lb]),
                Some((d, l)) => (l[place[k]], &d[place[k] * lb..(place[k] + 1) * lb]),
            };
            match len {
                Some(n) if n != lb => {
                    bad.get_or_insert(FarError::BadLine { got: n, want: lb });
                    sec.clear(t.0);
                    continue;
                }
                Some(_) => sec.buf.fill(t.0, bytes),
                None => sec.buf.fill(t.0, &[]),
            };
            sec.set_flags(t.0, REFERENCED);
        }
        bad
    }

    /// Gives slots taken for a fill that failed back to the lines they held.
    pub(super) fn undo(&self, taken: &[Taken]) {
        for &(slot, _, old, flags) in taken.iter().rev() {
            if old == 0 {
                self.section.clear(slot);
            } else {
                self.section.install(slot, old - 1, flags);
            }
        }
    }
}
