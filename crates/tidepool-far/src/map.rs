//! `FarMap<K, V>`: a hash map in far memory. Open addressing over the lines of a far vector:
//! a key hashes to a line, and is looked for among that line's entries with plain loads,
//! then the next line's (linear probing by lines), so a lookup costs one line in the common
//! case, fetched whole when missing.
//!
//! An entry is an 8-byte tag (0 empty, 1 deleted, else the key's hash with bit 1 set), the
//! key's bytes and the value's bytes, rounded up to 8 bytes; entries do not straddle lines.
//! The map doubles (rehashing into a new far vector in the same section) when live and
//! deleted entries pass three quarters of the slots.

use crate::vec::FarVec;
use crate::{Far, FarError, Section};
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::rc::Rc;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

const EMPTY: u64 = 0;
const DELETED: u64 = 1;

/// A hash map in far memory (see the module docs).
pub struct FarMap<K, V> {
    far: Far,
    section: Rc<Section>,
    site: String,
    table: FarVec<u64>,
    /// Words per entry, entries per line.
    words: usize,
    per_line: usize,
    lines: usize,
    live: usize,
    deleted: usize,
    _kv: PhantomData<(K, V)>,
}

impl<K, V> std::fmt::Debug for FarMap<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FarMap")
            .field("len", &self.live)
            .field("lines", &self.lines)
            .field("per_line", &self.per_line)
            .finish()
    }
}

/// Where a probe ended: the entry holding the key, or the first free one on the way.
enum Probe {
    Found(usize),
    Free(usize),
}

impl<K, V> FarMap<K, V>
where
    K: FromBytes + IntoBytes + Immutable + KnownLayout + Copy + Hash + Eq,
    V: FromBytes + IntoBytes + Immutable + KnownLayout + Copy,
{
    /// An empty map with room for about `capacity` entries before it grows.
    #[track_caller]
    pub fn with_capacity(
        far: &Far,
        section: &Rc<Section>,
        capacity: usize,
    ) -> Result<FarMap<K, V>, FarError> {
        let at = std::panic::Location::caller();
        let site = format!("{}:{}", at.file(), at.line());
        let bytes = 8 + std::mem::size_of::<K>() + std::mem::size_of::<V>();
        let words = bytes.div_ceil(8);
        let per_line = section.line_bytes() / (words * 8);
        if per_line == 0 {
            return Err(FarError::Config(format!(
                "a map entry of {} bytes does not fit a line of {}",
                words * 8,
                section.line_bytes()
            )));
        }
        let lines = (capacity * 4 / 3 + 1).div_ceil(per_line).max(1);
        Ok(FarMap {
            far: far.clone(),
            section: section.clone(),
            table: FarVec::named(far, section, lines * section.line_bytes() / 8, &site)?,
            site,
            words,
            per_line,
            lines,
            live: 0,
            deleted: 0,
            _kv: PhantomData,
        })
    }

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    fn hash(k: &K) -> u64 {
        rustc_hash::FxBuildHasher.hash_one(k) | 2
    }

    /// The first word of entry `e` (of the whole table).
    fn word(&self, e: usize) -> usize {
        let line_words = self.section.line_bytes() / 8;
        (e / self.per_line) * line_words + (e % self.per_line) * self.words
    }

    fn probe(&self, key: &K, tag: u64) -> Result<Probe, FarError> {
        let start = (tag >> 2) as usize % self.lines;
        let mut free = None;
        for step in 0..self.lines {
            let line = (start + step) % self.lines;
            let first = line * self.per_line;
            let g = self.table.line(self.word(first))?;
            for k in 0..self.per_line {
                let at = k * self.words;
                match g[at] {
                    EMPTY => return Ok(Probe::Free(free.unwrap_or(first + k))),
                    DELETED => {
                        free.get_or_insert(first + k);
                    }
                    t if t == tag => {
                        let bytes = g[at + 1..at + self.words].as_bytes();
                        let stored = K::read_from_prefix(bytes).expect("an entry holds a key").0;
                        if stored == *key {
                            return Ok(Probe::Found(first + k));
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(Probe::Free(free.expect(
            "a map below three quarters full has a free entry",
        )))
    }

    fn value_of(&self, e: usize) -> Result<V, FarError> {
        let w = self.word(e);
        let g = self.table.line(w)?;
        let at = w - g.first;
        let bytes = &g[at + 1..at + self.words].as_bytes()[std::mem::size_of::<K>()..];
        Ok(V::read_from_prefix(bytes)
            .expect("an entry holds a value")
            .0)
    }

    fn write(&self, e: usize, tag: u64, key: &K, value: &V) -> Result<(), FarError> {
        let w = self.word(e);
        let mut g = self.table.line_mut(w)?;
        let at = w - g.first;
        g[at] = tag;
        let body = g[at + 1..at + self.words].as_mut_bytes();
        let ks = std::mem::size_of::<K>();
        body[..ks].copy_from_slice(key.as_bytes());
        body[ks..ks + std::mem::size_of::<V>()].copy_from_slice(value.as_bytes());
        Ok(())
    }

    pub fn get(&self, key: &K) -> Result<Option<V>, FarError> {
        match self.probe(key, Self::hash(key))? {
            Probe::Found(e) => self.value_of(e).map(Some),
            Probe::Free(_) => Ok(None),
        }
    }

    pub fn contains_key(&self, key: &K) -> Result<bool, FarError> {
        Ok(matches!(self.probe(key, Self::hash(key))?, Probe::Found(_)))
    }

    /// Inserts `value` under `key`, returning the value it replaces.
    pub fn insert(&mut self, key: K, value: V) -> Result<Option<V>, FarError> {
        if (self.live + self.deleted + 1) * 4 > self.lines * self.per_line * 3 {
            self.grow()?;
        }
        let tag = Self::hash(&key);
        match self.probe(&key, tag)? {
            Probe::Found(e) => {
                let old = self.value_of(e)?;
                self.write(e, tag, &key, &value)?;
                Ok(Some(old))
            }
            Probe::Free(e) => {
                let w = self.word(e);
                if self.table.get(w)? == DELETED {
                    self.deleted -= 1;
                }
                self.write(e, tag, &key, &value)?;
                self.live += 1;
                Ok(None)
            }
        }
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &K) -> Result<Option<V>, FarError> {
        match self.probe(key, Self::hash(key))? {
            Probe::Found(e) => {
                let v = self.value_of(e)?;
                self.table.set(self.word(e), DELETED)?;
                self.live -= 1;
                self.deleted += 1;
                Ok(Some(v))
            }
            Probe::Free(_) => Ok(None),
        }
    }

    /// The live entries of one line of `table`.
    fn line_entries(&self, line: &[u64], out: &mut Vec<(K, V)>) {
        for k in 0..self.per_line {
            let at = k * self.words;
            if line[at] > DELETED {
                let body = line[at + 1..at + self.words].as_bytes();
                let key = K::read_from_prefix(body).expect("an entry holds a key").0;
                let v = V::read_from_prefix(&body[std::mem::size_of::<K>()..])
                    .expect("an entry holds a value")
                    .0;
                out.push((key, v));
            }
        }
    }

    /// Every entry, a line at a time (order unspecified).
    pub fn entries(&self) -> Result<Vec<(K, V)>, FarError> {
        let mut out = Vec::with_capacity(self.live);
        for line in self.table.line_iter() {
            self.line_entries(&line?, &mut out);
        }
        Ok(out)
    }

    /// Doubles the table: the entries move a line at a time into a new far vector (no guard
    /// on the old one is held while the new one is written). On an error the old table stays
    /// the map's, untouched, and the new one is dropped: nothing is lost.
    fn grow(&mut self) -> Result<(), FarError> {
        let lines = self.lines * 2;
        let new = FarVec::named(
            &self.far,
            &self.section,
            lines * self.section.line_bytes() / 8,
            &self.site,
        )?;
        let old = std::mem::replace(&mut self.table, new);
        let before = (self.lines, self.live, self.deleted);
        (self.lines, self.live, self.deleted) = (lines, 0, 0);
        match self.move_from(&old) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.table = old;
                (self.lines, self.live, self.deleted) = before;
                Err(e)
            }
        }
    }

    fn move_from(&mut self, old: &FarVec<u64>) -> Result<(), FarError> {
        let mut moving = Vec::with_capacity(self.per_line);
        for line in 0..old.lines() {
            moving.clear();
            self.line_entries(&old.line(line * old.per_line())?, &mut moving);
            for &(k, v) in &moving {
                let tag = Self::hash(&k);
                match self.probe(&k, tag)? {
                    Probe::Free(e) => {
                        self.write(e, tag, &k, &v)?;
                        self.live += 1;
                    }
                    Probe::Found(_) => unreachable!("keys of a map are distinct"),
                }
            }
        }
        Ok(())
    }

    /// Writes dirty lines back (they stay cached).
    pub fn flush(&self) -> Result<(), FarError> {
        self.table.flush()
    }
}
