//! `FarBox<T>`: one value in far memory, kept as the bytes of one or more lines, so that a
//! large value can be read in part (only the lines under the part travel).

use crate::vec::FarVec;
use crate::{Far, FarError, Section};
use std::marker::PhantomData;
use std::ops::Range;
use std::rc::Rc;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// A value of `T` in far memory (see the module docs).
pub struct FarBox<T> {
    bytes: FarVec<u8>,
    _t: PhantomData<T>,
}

impl<T> std::fmt::Debug for FarBox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FarBox")
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

impl<T> FarBox<T>
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy,
{
    /// `value` in far memory, cached in `section`'s lines. Written straight to the store.
    #[track_caller]
    pub fn new(far: &Far, section: &Rc<Section>, value: T) -> Result<FarBox<T>, FarError> {
        Ok(FarBox {
            bytes: FarVec::from_slice(far, section, value.as_bytes())?,
            _t: PhantomData,
        })
    }

    /// The value (every line of it, in one round trip if any is missing).
    pub fn get(&self) -> Result<T, FarError> {
        let mut out = T::new_zeroed();
        let n = self.bytes.len();
        self.read_into(0..n, out.as_mut_bytes())?;
        Ok(out)
    }

    /// Bytes `range` of the value: only the lines under it are fetched.
    pub fn read(&self, range: Range<usize>) -> Result<Vec<u8>, FarError> {
        let mut out = vec![0; range.len()];
        self.read_into(range, &mut out)?;
        Ok(out)
    }

    /// A field of type `F` at byte `offset` of the value (fetching only its lines).
    pub fn field<F: FromBytes + IntoBytes + KnownLayout + Immutable>(
        &self,
        offset: usize,
    ) -> Result<F, FarError> {
        let mut out = F::new_zeroed();
        let size = std::mem::size_of::<F>();
        self.read_into(offset..offset + size, out.as_mut_bytes())?;
        Ok(out)
    }

    fn read_into(&self, range: Range<usize>, out: &mut [u8]) -> Result<(), FarError> {
        if range.start > range.end {
            return Err(FarError::OutOfBounds {
                index: range.start,
                len: self.bytes.len(),
            });
        }
        self.bytes.read_into(range.start, out)
    }

    /// Replaces the value (whole lines are written: nothing is fetched).
    pub fn set(&self, value: T) -> Result<(), FarError> {
        self.bytes.write_from(0, value.as_bytes())
    }

    /// Applies `f` to the value and stores the result.
    pub fn update<R>(&self, f: impl FnOnce(&mut T) -> R) -> Result<R, FarError> {
        let mut v = self.get()?;
        let r = f(&mut v);
        self.set(v)?;
        Ok(r)
    }

    /// Writes the value back if it changed here (it stays cached).
    pub fn flush(&self) -> Result<(), FarError> {
        self.bytes.flush()
    }
}
