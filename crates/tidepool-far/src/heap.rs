//! Far pointers: `FarHeap<T>` allocates values of `T` in far memory and names each with a
//! `FarPtr<T>`, a plain 8-byte handle that can itself be stored in far memory (in a `T`, a
//! `FarVec`, a `FarMap`), so linked structures (lists, trees, graphs) can live far.
//! Dereferencing goes through the heap's section like any far access: a resident object is a
//! table load and a load.
//!
//! The heap keeps its objects in chunks of far vectors (it grows a chunk at a time, never
//! moves an object) and reuses freed slots. A pointer carries no type-safety beyond `T`:
//! using one after `free`, or with another heap, reads whatever the slot holds then (never
//! memory outside the heap: every pointer is bounds-checked).

use crate::vec::FarVec;
use crate::{Far, FarError, Section};
use std::marker::PhantomData;
use std::rc::Rc;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Objects per chunk of a heap.
const CHUNK: usize = 1 << 16;

/// A handle on an object in a [`FarHeap`]: plain data, storable in far memory. Zero is null.
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(transparent)]
pub struct FarPtr<T> {
    raw: u64,
    _t: PhantomData<T>,
}

impl<T> FarPtr<T> {
    /// The null pointer (what a zeroed far line holds).
    pub const NULL: FarPtr<T> = FarPtr {
        raw: 0,
        _t: PhantomData,
    };

    pub fn is_null(&self) -> bool {
        self.raw == 0
    }

    fn slot(&self) -> usize {
        self.raw as usize - 1
    }
}

impl<T> Clone for FarPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for FarPtr<T> {}
impl<T> PartialEq for FarPtr<T> {
    fn eq(&self, o: &Self) -> bool {
        self.raw == o.raw
    }
}
impl<T> Eq for FarPtr<T> {}
impl<T> std::fmt::Debug for FarPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_null() {
            f.write_str("FarPtr(null)")
        } else {
            write!(f, "FarPtr({})", self.slot())
        }
    }
}

/// Values of `T` in far memory, named by [`FarPtr`]s (see the module docs).
pub struct FarHeap<T> {
    far: Far,
    section: Rc<Section>,
    site: String,
    chunks: Vec<FarVec<T>>,
    /// Slots never handed out start here.
    next: usize,
    free: Vec<usize>,
    /// A bit per slot: freed and not yet reused.
    freed: Vec<u64>,
}

impl<T> std::fmt::Debug for FarHeap<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FarHeap")
            .field("live", &(self.next - self.free.len()))
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

impl<T> FarHeap<T>
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy,
{
    /// An empty heap cached in `section`.
    #[track_caller]
    pub fn new(far: &Far, section: &Rc<Section>) -> FarHeap<T> {
        let at = std::panic::Location::caller();
        FarHeap {
            far: far.clone(),
            section: section.clone(),
            site: format!("{}:{}", at.file(), at.line()),
            chunks: Vec::new(),
            next: 0,
            free: Vec::new(),
            freed: Vec::new(),
        }
    }

    /// Objects allocated and not freed.
    pub fn len(&self) -> usize {
        self.next - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stores `value` and returns its pointer.
    pub fn alloc(&mut self, value: T) -> Result<FarPtr<T>, FarError> {
        let slot = match self.free.pop() {
            Some(s) => {
                self.freed[s / 64] &= !(1 << (s % 64));
                s
            }
            None => {
                if self.next == self.chunks.len() * CHUNK {
                    self.chunks
                        .push(FarVec::named(&self.far, &self.section, CHUNK, &self.site)?);
                }
                self.next += 1;
                self.next - 1
            }
        };
        let p = FarPtr {
            raw: slot as u64 + 1,
            _t: PhantomData,
        };
        if let Err(e) = self.set(p, value) {
            self.free.push(slot);
            return Err(e);
        }
        Ok(p)
    }

    fn at(&self, p: FarPtr<T>) -> Result<(&FarVec<T>, usize), FarError> {
        if p.is_null() || p.slot() >= self.next {
            return Err(FarError::OutOfBounds {
                index: p.raw as usize,
                len: self.next,
            });
        }
        Ok((&self.chunks[p.slot() / CHUNK], p.slot() % CHUNK))
    }

    /// The object `p` points to.
    pub fn get(&self, p: FarPtr<T>) -> Result<T, FarError> {
        let (v, i) = self.at(p)?;
        v.get(i)
    }

    pub fn set(&self, p: FarPtr<T>, value: T) -> Result<(), FarError> {
        let (v, i) = self.at(p)?;
        v.set(i, value)
    }

    pub fn update<R>(&self, p: FarPtr<T>, f: impl FnOnce(&mut T) -> R) -> Result<R, FarError> {
        let (v, i) = self.at(p)?;
        v.update(i, f)
    }

    /// Brings the objects of `ptrs` in, in one round trip (the split phase of a traversal
    /// that knows where it goes next).
    pub fn request(&self, ptrs: &[FarPtr<T>]) -> Result<(), FarError> {
        for (c, v) in self.chunks.iter().enumerate() {
            let here: Vec<usize> = ptrs
                .iter()
                .filter(|p| !p.is_null() && p.slot() < self.next && p.slot() / CHUNK == c)
                .map(|p| p.slot() % CHUNK)
                .collect();
            if !here.is_empty() {
                v.request(&here)?;
            }
        }
        Ok(())
    }

    /// Frees the object `p` points to: its slot is reused by a later `alloc`.
    pub fn free(&mut self, p: FarPtr<T>) -> Result<(), FarError> {
        self.at(p)?;
        let s = p.slot();
        if self.freed.len() <= s / 64 {
            self.freed.resize(s / 64 + 1, 0);
        }
        if self.freed[s / 64] & (1 << (s % 64)) != 0 {
            return Err(FarError::Config(format!("{p:?} was already freed")));
        }
        self.freed[s / 64] |= 1 << (s % 64);
        self.free.push(s);
        Ok(())
    }
}
