//! Queries over far vectors: a filter, a group-by and aggregations fused into one pass over
//! the lines of several columns, run where it is cheaper: on the memory node that stores the
//! lines (Mira's offloading), or here, over lines brought into the cache.
//!
//! ```
//! use std::sync::Arc;
//! use tidepool_far::{Cmp, Far, FarVec, Offload, Query, Section, SectionConfig, Structure};
//!
//! let far = Far::new(Arc::new(tidepool_store::LocalStore::new()));
//! let section = Section::new(SectionConfig::new(Structure::Full, 4096, 64 * 4096))?;
//! let region: FarVec<u64> = FarVec::from_slice(&far, &section, &[0, 1, 0, 1, 1])?;
//! let price: FarVec<f64> = FarVec::from_slice(&far, &section, &[1.0, 2.0, 3.0, 4.0, 5.0])?;
//! let mut q = Query::new();
//! let (r, p) = (q.column(&region)?, q.column(&price)?);
//! q.filter(p, Cmp::Gt, 1.5).group_by(r, 2);
//! let (sum, max, rows) = (q.sum(p), q.max(p), q.count());
//! let a = q.run(Offload::Auto)?;
//! assert_eq!((a.get(0, &sum), a.get(0, &max), a.get(0, &rows)), (3.0, 3.0, 1));
//! assert_eq!((a.get(1, &sum), a.get(1, &max), a.get(1, &rows)), (11.0, 5.0, 3));
//! # Ok::<(), tidepool_far::FarError>(())
//! ```
//!
//! Whether a query is offloaded ([`Offload::Auto`]) is decided from measured costs: the time
//! this process has taken per line fetched (from its sections' statistics) and per line
//! computed, against the time the node has taken per line of earlier offloaded queries. The
//! first query on a store that can compute is offloaded if any line it reads is not resident,
//! which gives the node's cost its first measurement. A store that cannot compute (it answers
//! `None`) is never asked again.

use crate::vec::FarVec;
use crate::{Far, FarError};
use std::marker::PhantomData;
use std::time::Instant;
pub use tidepool_proto::scan::Cmp;
use tidepool_proto::scan::{Agg, AggKind, Column, ElemType, Filter, Group, Scan};
use tidepool_query::Evaluator;
use tidepool_store::Key;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// An element type a far vector can be queried over: the scan's typed columns.
pub trait Elem:
    FromBytes + IntoBytes + Immutable + KnownLayout + Copy + PartialOrd + 'static
{
    const TYPE: ElemType;
    /// What a sum comes out as: `u64` for unsigned, `i64` for signed (both wrapping), `f64`.
    type Sum: Elem;
    /// The raw bits the scan protocol takes for a constant of this type.
    fn bits(self) -> u64;
    /// A minimum or maximum as the scan returns it (floats come back as `f64`).
    fn from_result(bits: u64) -> Self;
}

macro_rules! int_elem {
    ($t:ty, $ty:ident, $sum:ty, $u:ty) => {
        impl Elem for $t {
            const TYPE: ElemType = ElemType::$ty;
            type Sum = $sum;
            fn bits(self) -> u64 {
                self as $u as u64
            }
            fn from_result(bits: u64) -> Self {
                bits as $t
            }
        }
    };
}
int_elem!(u32, U32, u64, u32);
int_elem!(u64, U64, u64, u64);
int_elem!(i32, I32, i64, u32);
int_elem!(i64, I64, i64, u64);

impl Elem for f32 {
    const TYPE: ElemType = ElemType::F32;
    type Sum = f64;
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
    fn from_result(bits: u64) -> Self {
        f64::from_bits(bits) as f32
    }
}

impl Elem for f64 {
    const TYPE: ElemType = ElemType::F64;
    type Sum = f64;
    fn bits(self) -> u64 {
        self.to_bits()
    }
    fn from_result(bits: u64) -> Self {
        f64::from_bits(bits)
    }
}

/// Where a query may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Offload {
    /// Where the measured costs say it is cheaper (see the module docs).
    #[default]
    Auto,
    /// On the node; fails with [`FarError::NoOffload`] if the store cannot compute.
    Always,
    /// Here, fetching every line that is not resident.
    Never,
}

/// Where a query ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ran {
    Node,
    Local,
}

/// What the cost model expected of each way, in nanoseconds (`None`: no measurement yet).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Estimate {
    pub local_ns: Option<f64>,
    pub offload_ns: Option<f64>,
    /// Lines that would have to be fetched to run here.
    pub missing_lines: usize,
    /// Dirty lines written back before offloading.
    pub dirty_lines: usize,
}

/// Measured costs, shared by everything on one [`Far`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Costs {
    /// `Some(false)` once the store has said it cannot compute.
    pub can_offload: Option<bool>,
    /// Node nanoseconds per column line scanned (round trip included).
    pub node_line_ns: Option<f64>,
    /// Local nanoseconds per column line computed (fetching excluded).
    pub local_line_ns: Option<f64>,
}

fn blend(old: Option<f64>, new: f64) -> Option<f64> {
    Some(old.map_or(new, |o| 0.5 * o + 0.5 * new))
}

/// A column of a query, typed by its elements.
#[derive(Debug)]
pub struct Col<T> {
    index: u8,
    _t: PhantomData<T>,
}

impl<T> Clone for Col<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Col<T> {}

/// An aggregation of a query, typed by what it comes out as (read it with [`Answer::get`]).
#[derive(Debug)]
pub struct Out<O> {
    index: usize,
    _o: PhantomData<O>,
}

/// What an aggregation's result values decode to.
pub trait Decode: Sized {
    fn decode(values: &[u64]) -> Self;
}

impl<T: Elem> Decode for T {
    fn decode(values: &[u64]) -> Self {
        T::from_result(values[0])
    }
}

/// A histogram's bucket counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buckets(pub Vec<u64>);

impl Decode for Buckets {
    fn decode(values: &[u64]) -> Self {
        Buckets(values.to_vec())
    }
}

/// A far vector as a query sees it, whatever its element type.
pub(crate) trait Source {
    fn far(&self) -> &Far;
    fn rows(&self) -> usize;
    fn per_line(&self) -> usize;
    fn column(&self) -> Column<Key>;
    /// Lines not resident, and resident lines that are dirty.
    fn residency(&self) -> (usize, usize);
    /// Measured nanoseconds per line fetched by this vector's section.
    fn fetch_line_ns(&self) -> Option<f64>;
    fn flush(&self) -> Result<(), FarError>;
    /// Copies line `line` (fetching it, and lines after it, if not resident) into `out`.
    fn copy_line(&self, line: usize, out: &mut Vec<u8>) -> Result<(), FarError>;
    /// Nanoseconds this vector's section has spent fetching, in all.
    fn fetch_nanos(&self) -> u64;
}

impl<T: Elem> Source for FarVec<T> {
    fn far(&self) -> &Far {
        &self.far
    }
    fn rows(&self) -> usize {
        self.len()
    }
    fn per_line(&self) -> usize {
        FarVec::per_line(self)
    }
    fn column(&self) -> Column<Key> {
        Column {
            ty: T::TYPE,
            line_elems: FarVec::per_line(self) as u32,
            lines: self.keys().collect(),
        }
    }
    fn residency(&self) -> (usize, usize) {
        self.residency()
    }
    fn fetch_line_ns(&self) -> Option<f64> {
        let s = self.section().stats();
        (s.fetched > 0).then(|| s.fetch_nanos as f64 / s.fetched as f64)
    }
    fn flush(&self) -> Result<(), FarError> {
        FarVec::flush(self)
    }
    fn copy_line(&self, line: usize, out: &mut Vec<u8>) -> Result<(), FarError> {
        let g = self.line_ahead(line)?;
        out.clear();
        out.extend_from_slice(g.as_bytes());
        Ok(())
    }
    fn fetch_nanos(&self) -> u64 {
        self.section().stats().fetch_nanos
    }
}

/// A query over far vectors of the same length and elements per line, on the same store:
/// an optional filter on one column, an optional group-by on an integer column, and
/// aggregations, all computed in one pass (Mira's fused offload; a DataFrame's
/// `df[df.qty > 10].groupby("region").price.agg(["sum", "min", "max"])`).
#[derive(Default)]
pub struct Query<'a> {
    cols: Vec<&'a dyn Source>,
    filter: Option<Filter>,
    group: Option<Group>,
    aggs: Vec<Agg>,
    widths: Vec<usize>,
}

impl std::fmt::Debug for Query<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Query")
            .field("columns", &self.cols.len())
            .field("filter", &self.filter)
            .field("group", &self.group)
            .field("aggs", &self.aggs)
            .finish()
    }
}

impl<'a> Query<'a> {
    pub fn new() -> Query<'a> {
        Query::default()
    }

    /// Adds a column. All columns need the same length and elements per line (the same line
    /// bytes and element size), and the same store.
    pub fn column<T: Elem>(&mut self, v: &'a FarVec<T>) -> Result<Col<T>, FarError> {
        if let Some(first) = self.cols.first() {
            if first.rows() != v.len() || first.per_line() != v.per_line() {
                return Err(FarError::Query(format!(
                    "columns of one query need the same length and elements per line: {} \
                     elements in lines of {}, against {} in lines of {}",
                    v.len(),
                    v.per_line(),
                    first.rows(),
                    first.per_line()
                )));
            }
            if !std::sync::Arc::ptr_eq(&first.far().store, &v.far.store) {
                return Err(FarError::Query(
                    "columns of one query must live in the same far store".into(),
                ));
            }
        }
        if self.cols.len() == tidepool_proto::scan::MAX_COLUMNS {
            return Err(FarError::Query(format!(
                "a query takes at most {} columns",
                tidepool_proto::scan::MAX_COLUMNS
            )));
        }
        self.cols.push(v);
        Ok(Col {
            index: (self.cols.len() - 1) as u8,
            _t: PhantomData,
        })
    }

    /// Keeps only the rows where `column CMP value` holds (one filter per query).
    pub fn filter<T: Elem>(&mut self, column: Col<T>, cmp: Cmp, value: T) -> &mut Self {
        self.filter = Some(Filter {
            column: column.index,
            cmp,
            value: value.bits(),
        });
        self
    }

    /// Computes the aggregations per group: row `r` goes to group `column[r]`, which must be
    /// below `groups` (the query fails otherwise).
    pub fn group_by<T: Elem>(&mut self, column: Col<T>, groups: u32) -> &mut Self {
        self.group = Some(Group {
            column: column.index,
            groups,
        });
        self
    }

    fn agg<O>(&mut self, column: u8, kind: AggKind) -> Out<O> {
        let a = Agg { column, kind };
        self.widths.push(a.width());
        self.aggs.push(a);
        Out {
            index: self.aggs.len() - 1,
            _o: PhantomData,
        }
    }

    pub fn sum<T: Elem>(&mut self, c: Col<T>) -> Out<T::Sum> {
        self.agg(c.index, AggKind::Sum)
    }

    /// The least value (the type's largest, or +inf, in a group with no rows).
    pub fn min<T: Elem>(&mut self, c: Col<T>) -> Out<T> {
        self.agg(c.index, AggKind::Min)
    }

    /// The greatest value (the type's smallest, or -inf, in a group with no rows).
    pub fn max<T: Elem>(&mut self, c: Col<T>) -> Out<T> {
        self.agg(c.index, AggKind::Max)
    }

    /// Rows that pass the filter.
    pub fn count(&mut self) -> Out<u64> {
        self.agg(0, AggKind::Count)
    }

    /// Counts of values in `buckets` equal parts of `[lo, hi)`.
    pub fn histogram<T: Elem>(&mut self, c: Col<T>, lo: T, hi: T, buckets: u32) -> Out<Buckets> {
        self.agg(
            c.index,
            AggKind::Histogram {
                lo: lo.bits(),
                hi: hi.bits(),
                buckets,
            },
        )
    }

    fn scan(&self) -> Result<Scan<Key>, FarError> {
        let Some(first) = self.cols.first() else {
            return Err(FarError::Query("a query needs a column".into()));
        };
        Ok(Scan {
            rows: first.rows() as u64,
            columns: self.cols.iter().map(|c| c.column()).collect(),
            filter: self.filter,
            group: self.group,
            aggs: self.aggs.clone(),
        })
    }

    /// Runs the query (see [`Offload`]).
    pub fn run(&self, how: Offload) -> Result<Answer, FarError> {
        let scan = self.scan()?;
        let ev = Evaluator::new(&scan).map_err(|e| FarError::Query(e.to_string()))?;
        let used: Vec<&dyn Source> = (0..self.cols.len())
            .filter(|&c| ev.reads(c))
            .map(|c| self.cols[c])
            .collect();
        let far = self.cols[0].far().clone();
        let mut est = Estimate::default();
        let mut fetch = Vec::new();
        for c in &used {
            let (missing, dirty) = c.residency();
            est.missing_lines += missing;
            est.dirty_lines += dirty;
            fetch.extend(c.fetch_line_ns());
        }
        let fetch_ns = (!fetch.is_empty()).then(|| fetch.iter().sum::<f64>() / fetch.len() as f64);
        let costs = *far.costs.lock().expect("cost lock");
        let lines = (ev.lines() * used.len().max(1)) as f64;
        let compute = costs.local_line_ns.or(costs.node_line_ns);
        est.local_ns = fetch_ns
            .map(|f| f * est.missing_lines as f64)
            .or((est.missing_lines == 0).then_some(0.0))
            .map(|t| t + compute.unwrap_or(0.0) * lines);
        est.offload_ns = costs
            .node_line_ns
            .or(costs.local_line_ns)
            .map(|n| n * lines + fetch_ns.unwrap_or(0.0) * (est.dirty_lines + 1) as f64);
        let offload = match how {
            Offload::Never => false,
            Offload::Always => true,
            Offload::Auto => {
                costs.can_offload != Some(false)
                    && match (est.local_ns, est.offload_ns) {
                        (Some(l), Some(o)) => o < l,
                        (Some(l), None) => l > 0.0,
                        (None, _) => true,
                    }
            }
        };
        if offload {
            for c in &used {
                c.flush()?;
            }
            let t0 = Instant::now();
            match far.store.offload().map(|o| o.scan(&scan)).transpose()? {
                Some(values) => {
                    let ns = t0.elapsed().as_nanos() as f64;
                    let mut k = far.costs.lock().expect("cost lock");
                    k.can_offload = Some(true);
                    k.node_line_ns = blend(k.node_line_ns, ns / lines);
                    return Ok(self.answer(values, Ran::Node, est));
                }
                None => {
                    far.costs.lock().expect("cost lock").can_offload = Some(false);
                    if how == Offload::Always {
                        return Err(FarError::NoOffload(far.describe()));
                    }
                }
            }
        }
        let values = self.run_here(ev, &far)?;
        Ok(self.answer(values, Ran::Local, est))
    }

    /// Computes the query here, a line of every column at a time.
    fn run_here(&self, mut ev: Evaluator, far: &Far) -> Result<Vec<u64>, FarError> {
        let t0 = Instant::now();
        let fetched0: u64 = self.cols.iter().map(|c| c.fetch_nanos()).sum();
        let mut bufs = vec![Vec::new(); self.cols.len()];
        let mut used = 0;
        for line in 0..ev.lines() {
            for (c, col) in self.cols.iter().enumerate() {
                if ev.reads(c) {
                    col.copy_line(line, &mut bufs[c])?;
                }
            }
            let slices: Vec<Option<&[u8]>> = bufs
                .iter()
                .enumerate()
                .map(|(c, b)| ev.reads(c).then_some(&b[..]))
                .collect();
            ev.feed(line, &slices)
                .map_err(|e| FarError::Query(e.to_string()))?;
            used = slices.iter().flatten().count();
        }
        let fetched: u64 = self.cols.iter().map(|c| c.fetch_nanos()).sum::<u64>() - fetched0;
        let lines = (ev.lines() * used) as f64;
        if lines > 0.0 {
            // Columns sharing a section count its fetch time once per column: an estimate.
            let ns = (t0.elapsed().as_nanos() as f64 - fetched as f64).max(0.0);
            let mut k = far.costs.lock().expect("cost lock");
            k.local_line_ns = blend(k.local_line_ns, ns / lines);
        }
        Ok(ev.finish())
    }

    fn answer(&self, values: Vec<u64>, ran: Ran, estimate: Estimate) -> Answer {
        let mut offsets = Vec::with_capacity(self.widths.len());
        let mut at = 0;
        for w in &self.widths {
            offsets.push(at);
            at += w;
        }
        Answer {
            groups: values.len() / at.max(1),
            values,
            offsets,
            widths: self.widths.clone(),
            stride: at,
            ran,
            estimate,
        }
    }
}

/// A query's results, by group and aggregation.
#[derive(Debug, Clone)]
pub struct Answer {
    values: Vec<u64>,
    offsets: Vec<usize>,
    widths: Vec<usize>,
    stride: usize,
    groups: usize,
    /// Where the query ran.
    pub ran: Ran,
    /// What the cost model expected.
    pub estimate: Estimate,
}

impl Answer {
    /// Groups (1 if the query was not grouped).
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// The result of aggregation `out` in group `group`.
    pub fn get<O: Decode>(&self, group: usize, out: &Out<O>) -> O {
        assert!(group < self.groups, "group {group} of {}", self.groups);
        let at = group * self.stride + self.offsets[out.index];
        O::decode(&self.values[at..at + self.widths[out.index]])
    }
}

/// Whole-vector queries and gathers, run where [`Offload::Auto`] decides.
impl<T: Elem> FarVec<T> {
    fn one<O: Decode>(
        &self,
        f: impl FnOnce(&mut Query<'_>, Col<T>) -> Out<O>,
    ) -> Result<O, FarError> {
        let mut q = Query::new();
        let c = q.column(self)?;
        let out = f(&mut q, c);
        Ok(q.run(Offload::Auto)?.get(0, &out))
    }

    /// The sum of the elements (integers wrap).
    pub fn sum(&self) -> Result<T::Sum, FarError> {
        self.one(|q, c| q.sum(c))
    }

    /// The least element (`None` if the vector is empty).
    pub fn min(&self) -> Result<Option<T>, FarError> {
        self.extreme(true)
    }

    /// The greatest element (`None` if the vector is empty).
    pub fn max(&self) -> Result<Option<T>, FarError> {
        self.extreme(false)
    }

    fn extreme(&self, least: bool) -> Result<Option<T>, FarError> {
        if self.is_empty() {
            return Ok(None);
        }
        self.one(|q, c| if least { q.min(c) } else { q.max(c) })
            .map(Some)
    }

    /// Elements `x` for which `x CMP value` holds.
    pub fn count_where(&self, cmp: Cmp, value: T) -> Result<u64, FarError> {
        if self.is_empty() {
            return Ok(0);
        }
        self.one(|q, c| {
            q.filter(c, cmp, value);
            q.count()
        })
    }

    /// Counts of elements in `buckets` equal parts of `[lo, hi)`; elements outside are not
    /// counted.
    pub fn histogram(&self, lo: T, hi: T, buckets: u32) -> Result<Vec<u64>, FarError> {
        if self.is_empty() {
            return Ok(vec![0; buckets as usize]);
        }
        self.one(|q, c| q.histogram(c, lo, hi, buckets))
            .map(|b| b.0)
    }

    /// The elements at `indices`, in order. Run on the node, only the elements travel; run
    /// here, their whole lines do (in as few round trips as the section allows).
    /// [`Offload::Auto`] sends it to the node when more than one line it needs is missing
    /// here (besides the dirty lines it would have to write back first).
    pub fn gather(&self, indices: &[usize], how: Offload) -> Result<Vec<T>, FarError> {
        if let Some(&i) = indices.iter().find(|&&i| i >= self.len()) {
            return Err(FarError::OutOfBounds {
                index: i,
                len: self.len(),
            });
        }
        let far = &self.far;
        let offload = match how {
            Offload::Never => false,
            Offload::Always => true,
            Offload::Auto => {
                let can = far.costs.lock().expect("cost lock").can_offload;
                can != Some(false) && {
                    let mut lines: Vec<usize> = indices
                        .iter()
                        .map(|&i| i / self.per_line())
                        .filter(|&l| !self.is_resident(l))
                        .collect();
                    lines.sort_unstable();
                    lines.dedup();
                    lines.len() > 1 + self.residency().1
                }
            }
        };
        if offload {
            self.flush()?;
            let rows: Vec<u64> = indices.iter().map(|&i| i as u64).collect();
            match far
                .store
                .offload()
                .map(|o| o.gather(&Source::column(self), &rows))
                .transpose()?
            {
                Some(bytes) => {
                    let size = std::mem::size_of::<T>();
                    if bytes.len() != indices.len() * size {
                        return Err(FarError::BadLine {
                            got: bytes.len(),
                            want: indices.len() * size,
                        });
                    }
                    return Ok(bytes
                        .chunks_exact(size)
                        .map(|c| T::read_from_bytes(c).expect("chunks are one element long"))
                        .collect());
                }
                None => {
                    far.costs.lock().expect("cost lock").can_offload = Some(false);
                    if how == Offload::Always {
                        return Err(FarError::NoOffload(far.describe()));
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(indices.len());
        // Requests in chunks the section can hold at once, then plain gets that hit.
        let chunk = (self.section().lines() / 2).max(1);
        for part in indices.chunks(chunk) {
            self.request(part)?;
            for &i in part {
                out.push(self.get(i)?);
            }
        }
        Ok(out)
    }
}
