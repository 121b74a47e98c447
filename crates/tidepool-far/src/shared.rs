//! Far vectors across threads (Mira's per-thread and shared sections).
//!
//! Sections are single-threaded: their lines and tables are touched without atomics, which is
//! what makes a resident access a few plain loads. Threads share far data in two ways:
//!
//! - **Read sharing, per-thread private sections.** [`FarVec::share`] writes the vector's
//!   dirty lines back and gives a [`FarShare`], which can go to other threads; each opens it
//!   in a section of its own ([`FarShare::open`]) and reads through its own cache, with no
//!   synchronisation on hits. Readers see the lines as they were when they fetch them: what
//!   the owner writes later reaches a reader only for lines it fetches after the owner's next
//!   flush. Once the owner is dropped, a reader's misses fail with [`FarError::Gone`] (an
//!   owner never drops its lines under a fetch in progress).
//! - **Writes, one shared section.** [`SharedFarVec`] keeps a vector in a section behind a
//!   mutex: every thread reads and writes the same cached lines, one at a time.

use crate::query::Elem;
use crate::vec::FarVec;
use crate::{Far, FarError, LineRef, Section, SectionConfig};
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::{Arc, Mutex, RwLock};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// A far vector's lines, for readers in other threads (see the module docs).
#[derive(Debug, Clone)]
pub struct FarShare<T> {
    far: Far,
    base: u64,
    len: usize,
    /// The owner's line size: a reader's section must have the same.
    line_bytes: usize,
    alive: Arc<RwLock<bool>>,
    _t: PhantomData<fn() -> T>,
}

impl<T> FarVec<T>
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy,
{
    /// Writes dirty lines back and returns a handle other threads can open the vector's lines
    /// with, each in a section of its own, for reading.
    pub fn share(&self) -> Result<FarShare<T>, FarError> {
        let (base, len, alive) = self.share_parts()?;
        Ok(FarShare {
            far: self.far.clone(),
            base,
            len,
            line_bytes: self.section().line_bytes(),
            alive,
            _t: PhantomData,
        })
    }
}

impl<T> FarShare<T>
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy,
{
    /// A reader of the shared lines, cached in `section` (this thread's, with the owner's
    /// line size).
    pub fn open(&self, section: &Rc<Section>) -> Result<FarReader<T>, FarError> {
        if section.line_bytes() != self.line_bytes {
            return Err(FarError::Config(format!(
                "the shared vector's lines are {} bytes; a reader's section needs the same, not {}",
                self.line_bytes,
                section.line_bytes()
            )));
        }
        let site = format!("shared:{}", self.base);
        Ok(FarReader {
            v: FarVec::at(
                &self.far,
                section,
                self.base,
                self.len,
                &site,
                Some(self.alive.clone()),
            )?,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One thread's read-only view of a shared far vector (see the module docs).
#[derive(Debug)]
pub struct FarReader<T> {
    v: FarVec<T>,
}

impl<T> FarReader<T>
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy,
{
    pub fn len(&self) -> usize {
        self.v.len()
    }

    pub fn is_empty(&self) -> bool {
        self.v.is_empty()
    }

    pub fn get(&self, index: usize) -> Result<T, FarError> {
        self.v.get(index)
    }

    pub fn line(&self, index: usize) -> Result<LineRef<'_, T>, FarError> {
        self.v.line(index)
    }

    pub fn request(&self, indices: &[usize]) -> Result<(), FarError> {
        self.v.request(indices)
    }

    pub fn iter(&self) -> crate::FarIter<'_, T> {
        self.v.iter()
    }

    pub fn line_iter(&self) -> crate::FarLines<'_, T> {
        self.v.line_iter()
    }

    pub fn to_vec(&self) -> Result<Vec<T>, FarError> {
        self.v.to_vec()
    }

    /// [`FarVec::load_all`] into this reader's section.
    pub fn load_all(&self) -> Result<(), FarError> {
        self.v.load_all()
    }

    /// [`FarVec::local`]: the whole vector as one slice, if this reader's section holds it.
    pub fn local(&self) -> Option<LineRef<'_, T>> {
        self.v.local()
    }
}

impl<T: Elem> FarReader<T> {
    /// The sum of the elements, computed where it is cheaper ([`FarVec::sum`]).
    pub fn sum(&self) -> Result<T::Sum, FarError> {
        self.v.sum()
    }
}

/// The vector and section behind a [`SharedFarVec`]'s mutex.
struct Inner<T> {
    v: FarVec<T>,
}

// SAFETY: `Inner` holds `Rc`s and `Cell`s (the section, the vector's line table), which may
// not be touched by two threads at once. Every `Inner` lives in one `Arc<Mutex<_>>` made in
// `SharedFarVec::new` together with the section it uses, and `SharedFarVec` hands out neither
// the vector, nor the section, nor any guard or reference into them: each method locks, works
// and returns plain values (`T`, or the caller's closure's result, which must be `Send`).
// So every access to those `Rc`s and `Cell`s happens under the mutex, one thread at a time,
// which is all moving them between threads requires. Dropping the last `SharedFarVec` drops
// `Inner` on one thread with no lock held elsewhere.
unsafe impl<T: Send> Send for Inner<T> {}

/// A far vector that any thread can read and write, through one section behind a mutex (see
/// the module docs). Clones are handles on the same vector.
pub struct SharedFarVec<T> {
    inner: Arc<Mutex<Inner<T>>>,
    len: usize,
}

impl<T> Clone for SharedFarVec<T> {
    fn clone(&self) -> Self {
        SharedFarVec {
            inner: self.inner.clone(),
            len: self.len,
        }
    }
}

impl<T> std::fmt::Debug for SharedFarVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedFarVec")
            .field("len", &self.len)
            .finish()
    }
}

impl<T> SharedFarVec<T>
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy + Send,
{
    /// A far vector of `len` zeros in a section of its own made from `config`.
    #[track_caller]
    pub fn new(far: &Far, config: SectionConfig, len: usize) -> Result<SharedFarVec<T>, FarError> {
        let at = std::panic::Location::caller();
        let section = Section::new(config)?;
        let v = FarVec::named(far, &section, len, &format!("{}:{}", at.file(), at.line()))?;
        Ok(SharedFarVec {
            inner: Arc::new(Mutex::new(Inner { v })),
            len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn with<R>(&self, f: impl FnOnce(&FarVec<T>) -> R) -> R {
        // A panic in another thread's closure leaves the lines consistent (each method's
        // writes are whole elements), so the poison is not an error here.
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&g.v)
    }

    pub fn get(&self, index: usize) -> Result<T, FarError> {
        self.with(|v| v.get(index))
    }

    pub fn set(&self, index: usize, value: T) -> Result<(), FarError> {
        self.with(|v| v.set(index, value))
    }

    /// Applies `f` to element `index` under the lock (`f` must not use this vector: it would
    /// wait for itself).
    pub fn update<R: Send>(
        &self,
        index: usize,
        f: impl FnOnce(&mut T) -> R,
    ) -> Result<R, FarError> {
        self.with(|v| v.update(index, f))
    }

    /// Elements `range`, copied out under one lock.
    pub fn read(&self, range: std::ops::Range<usize>) -> Result<Vec<T>, FarError> {
        self.with(|v| v.iter_range(range).collect())
    }

    /// Writes dirty lines back.
    pub fn flush(&self) -> Result<(), FarError> {
        self.with(|v| v.flush())
    }
}
