//! Iterating over a far vector: by element and by line.

use super::FarVec;
use crate::lines::LineRef;
use crate::FarError;
use zerocopy::FromBytes;
use zerocopy::Immutable;
use zerocopy::IntoBytes;
use zerocopy::KnownLayout;

/// Iterates over a far vector a line at a time: within a line, the next element is a load
/// from the borrowed slice.
pub struct FarIter<'a, T> {
    pub(super) v: &'a FarVec<T>,
    pub(super) next: usize,
    pub(super) end: usize,
    pub(super) cur: Option<LineRef<'a, T>>,
}

impl<T> std::fmt::Debug for FarIter<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FarIter")
            .field("next", &self.next)
            .field("end", &self.end)
            .finish()
    }
}

impl<T> Iterator for FarIter<'_, T>
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy,
{
    type Item = Result<T, FarError>;

    #[inline]
    fn next(&mut self) -> Option<Result<T, FarError>> {
        if self.next >= self.end {
            self.cur = None;
            return None;
        }
        let i = self.next;
        if self.v.prof.is_some() {
            self.v.note(i, 1, false);
        }
        if let Some(l) = &self.cur {
            if let Some(&x) = l.get(i.wrapping_sub(l.first)) {
                self.next += 1;
                return Some(Ok(x));
            }
        }
        self.cur = None;
        let line = i / self.v.per_line;
        let r = self
            .v
            .ensure(line, self.v.distance(), i)
            .and_then(|slot| self.v.readable(line, slot));
        match r {
            Ok(l) => {
                let x = l[i - l.first];
                self.cur = Some(l);
                self.next += 1;
                Some(Ok(x))
            }
            Err(e) => {
                self.next = self.end;
                Some(Err(e))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end.saturating_sub(self.next);
        (n, Some(n))
    }
}

/// Iterates over a far vector's lines; see [`FarVec::line_iter`].
pub struct FarLines<'a, T> {
    pub(super) v: &'a FarVec<T>,
    pub(super) next: usize,
}

impl<T> std::fmt::Debug for FarLines<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FarLines")
            .field("next", &self.next)
            .finish()
    }
}

impl<'a, T> Iterator for FarLines<'a, T>
where
    T: FromBytes + IntoBytes + Immutable + KnownLayout + Copy,
{
    type Item = Result<LineRef<'a, T>, FarError>;

    fn next(&mut self) -> Option<Self::Item> {
        let line = self.next;
        if line >= self.v.lines() {
            return None;
        }
        self.next += 1;
        let r = self.v.line_ahead(line);
        if r.is_err() {
            self.next = self.v.lines();
        }
        Some(r)
    }
}
