//! Offloaded scans: what a `Scan` request asks a memory node to compute over typed far
//! vectors it stores, and the evaluator that computes it (the node runs it on its objects; an
//! in-process store can run the same code on its own).
//!
//! A far vector is stored as lines, one object per line, each holding `line_elems` elements
//! of one type, little-endian. A scan walks `rows` rows of up to 8 such columns in step (all
//! with the same elements per line), keeps the rows where an optional filter holds, sorts them
//! into optional groups by an integer column, and computes up to 16 aggregations, all in one
//! pass: a DataFrame query's filter, group-by and aggregations fused into one request.
//!
//! Results are `u64`s: for each group (one if not grouped), for each aggregation in order, one
//! value (a histogram: one per bucket). Sums of integers wrap (signed ones in two's
//! complement); sums, minima and maxima of floats are `f64` bits; minima and maxima of
//! integers are the value itself (signed: two's complement). An empty minimum is the type's
//! largest value, an empty maximum its smallest (floats: +inf and -inf). Float minima and
//! maxima skip NaN, and of values that compare equal (-0.0 and +0.0) keep the first seen.

use std::fmt;

/// The element type of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ElemType {
    U32 = 1,
    U64 = 2,
    I32 = 3,
    I64 = 4,
    F32 = 5,
    F64 = 6,
}

impl ElemType {
    pub fn from_u8(v: u8) -> Option<ElemType> {
        Some(match v {
            1 => ElemType::U32,
            2 => ElemType::U64,
            3 => ElemType::I32,
            4 => ElemType::I64,
            5 => ElemType::F32,
            6 => ElemType::F64,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            ElemType::U32 | ElemType::I32 | ElemType::F32 => 4,
            _ => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, ElemType::F32 | ElemType::F64)
    }

    /// A value given as raw bits of this type (as `Filter::value` and histogram bounds are).
    fn value(self, bits: u64) -> Val {
        match self {
            ElemType::U32 => Val::Int(bits as u32 as i128),
            ElemType::U64 => Val::Int(bits as i128),
            ElemType::I32 => Val::Int(bits as u32 as i32 as i128),
            ElemType::I64 => Val::Int(bits as i64 as i128),
            ElemType::F32 => Val::Float(f32::from_bits(bits as u32) as f64),
            ElemType::F64 => Val::Float(f64::from_bits(bits)),
        }
    }
}

/// A comparison of a column's value with a constant: `value CMP constant`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Cmp {
    Lt = 1,
    Le = 2,
    Gt = 3,
    Ge = 4,
    Eq = 5,
    Ne = 6,
}

impl Cmp {
    pub fn from_u8(v: u8) -> Option<Cmp> {
        Some(match v {
            1 => Cmp::Lt,
            2 => Cmp::Le,
            3 => Cmp::Gt,
            4 => Cmp::Ge,
            5 => Cmp::Eq,
            6 => Cmp::Ne,
            _ => return None,
        })
    }
}

/// What to compute over a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AggKind {
    Sum,
    Min,
    Max,
    /// Rows (that pass the filter); the column is not read.
    Count,
    /// Counts of values in `buckets` equal parts of `[lo, hi)` (bounds as raw bits of the
    /// column's type); values outside are not counted.
    Histogram {
        lo: u64,
        hi: u64,
        buckets: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Agg {
    pub column: u8,
    pub kind: AggKind,
}

impl Agg {
    /// Result values it takes per group.
    pub fn width(&self) -> usize {
        match self.kind {
            AggKind::Histogram { buckets, .. } => buckets as usize,
            _ => 1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Filter {
    pub column: u8,
    pub cmp: Cmp,
    /// Raw bits of a value of the column's type.
    pub value: u64,
}

/// Rows go to group `key` of an integer column; keys must be below `groups`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Group {
    pub column: u8,
    pub groups: u32,
}

/// One far vector: its lines, in order. `L` names a line: a handle on the wire (`None`: never
/// written, all zeros), a store key in a client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Column<L> {
    pub ty: ElemType,
    pub line_elems: u32,
    pub lines: Vec<L>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scan<L> {
    pub rows: u64,
    pub columns: Vec<Column<L>>,
    pub filter: Option<Filter>,
    pub group: Option<Group>,
    pub aggs: Vec<Agg>,
}

pub const MAX_COLUMNS: usize = 8;
pub const MAX_AGGS: usize = 16;
pub const MAX_GROUPS: u32 = 1 << 16;
/// The most result values one scan may ask for (8 MiB of answer).
pub const MAX_RESULTS: usize = 1 << 20;
/// The largest line a scan may name (a line of zeros is made in memory, so this bounds what a
/// forged request can make the node allocate).
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Why a scan cannot run (the whole request fails with this).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    #[error("a scan needs 1 to {MAX_COLUMNS} columns and 1 to {MAX_AGGS} aggregations")]
    Shape,
    #[error("column {0} is named but the scan has only {1}")]
    NoColumn(u8, usize),
    #[error(
        "columns of one scan must have the same elements per line, more than 0 and at most \
         {MAX_LINE_BYTES} bytes of them"
    )]
    LineElems,
    #[error("column {column} has {have} lines; {rows} rows need {need}")]
    TooFewLines {
        column: usize,
        have: usize,
        need: u64,
        rows: u64,
    },
    #[error("groups must be 1 to {MAX_GROUPS}, on an integer column")]
    BadGroup,
    #[error("group key {key} is not below the {groups} groups asked for")]
    GroupKey { key: i128, groups: u32 },
    #[error("a histogram needs 1 to {MAX_GROUPS} buckets and lo < hi")]
    BadHistogram,
    #[error("the scan asks for {0} result values, more than {MAX_RESULTS}")]
    TooManyResults(usize),
    #[error("line {line} of column {column} holds {have} bytes; {need} were expected")]
    ShortLine {
        column: usize,
        line: usize,
        have: usize,
        need: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Val {
    Int(i128),
    Float(f64),
}

impl Val {
    fn cmp_to(self, o: Val) -> Option<std::cmp::Ordering> {
        match (self, o) {
            (Val::Int(a), Val::Int(b)) => Some(a.cmp(&b)),
            (Val::Float(a), Val::Float(b)) => a.partial_cmp(&b),
            (Val::Int(a), Val::Float(b)) => (a as f64).partial_cmp(&b),
            (Val::Float(a), Val::Int(b)) => a.partial_cmp(&(b as f64)),
        }
    }
}

/// Computes a scan a line at a time: see the module docs.
///
/// Each line is done column by column, as a vectorised query engine does: the filter makes a
/// list of the rows that pass, the group column a key per row, and each aggregation then runs
/// one loop over its column, typed, with its kind chosen once per line. Accumulators are kept
/// as the result bits they end as.
#[derive(Debug)]
pub struct Evaluator {
    rows: u64,
    line_elems: usize,
    types: Vec<ElemType>,
    filter: Option<Filter>,
    group: Option<Group>,
    aggs: Vec<Agg>,
    /// Per group, per aggregation: its first value in `acc`.
    offsets: Vec<usize>,
    stride: usize,
    /// Histograms' counts, in the results' layout (the rest is filled in by `finish`).
    acc: Vec<u64>,
    /// Per column with a sum, minimum or maximum: all three, per group, computed in one pass
    /// (the fusion a DataFrame's `agg(["sum", "min", "max"])` asks for).
    fused: Vec<Fused>,
    /// Rows per group, if counted.
    counts: Vec<u64>,
    /// Which columns are read at all.
    used: Vec<bool>,
    /// Rows of the current line that pass the filter.
    sel: Vec<u32>,
    /// Group of each row of the current line.
    keys: Vec<u32>,
    /// A line of zeros, for lines never written.
    zeros: Vec<u8>,
}

impl Evaluator {
    /// Checks a scan (lines of every column: `lines[c]`) and readies its accumulators.
    pub fn new<L>(scan: &Scan<L>) -> Result<Evaluator, ScanError> {
        let nc = scan.columns.len();
        if nc == 0 || nc > MAX_COLUMNS || scan.aggs.is_empty() || scan.aggs.len() > MAX_AGGS {
            return Err(ScanError::Shape);
        }
        let le = scan.columns[0].line_elems;
        if le == 0
            || le as usize * 8 > MAX_LINE_BYTES
            || scan.columns.iter().any(|c| c.line_elems != le)
        {
            return Err(ScanError::LineElems);
        }
        let need = scan.rows.div_ceil(le as u64);
        for (i, c) in scan.columns.iter().enumerate() {
            if (c.lines.len() as u64) < need {
                return Err(ScanError::TooFewLines {
                    column: i,
                    have: c.lines.len(),
                    need,
                    rows: scan.rows,
                });
            }
        }
        let col = |c: u8| {
            scan.columns
                .get(c as usize)
                .map(|x| x.ty)
                .ok_or(ScanError::NoColumn(c, nc))
        };
        let mut used = vec![false; nc];
        if let Some(f) = scan.filter {
            col(f.column)?;
            used[f.column as usize] = true;
        }
        let groups = match scan.group {
            Some(g) => {
                if col(g.column)?.is_float() || g.groups == 0 || g.groups > MAX_GROUPS {
                    return Err(ScanError::BadGroup);
                }
                used[g.column as usize] = true;
                g.groups as usize
            }
            None => 1,
        };
        let mut offsets = Vec::with_capacity(scan.aggs.len());
        let mut init = Vec::new();
        let mut fused = Vec::new();
        for a in &scan.aggs {
            let ty = col(a.column)?;
            offsets.push(init.len());
            if let AggKind::Histogram { lo, hi, buckets } = a.kind {
                let ok = buckets > 0
                    && buckets <= MAX_GROUPS
                    && ty.value(lo).cmp_to(ty.value(hi)) == Some(std::cmp::Ordering::Less);
                if !ok {
                    return Err(ScanError::BadHistogram);
                }
            }
            let start = identity(a.kind, ty);
            if matches!(a.kind, AggKind::Sum | AggKind::Min | AggKind::Max)
                && !fused.iter().any(|f: &Fused| f.column == a.column)
            {
                fused.push(Fused {
                    column: a.column,
                    stats: vec![
                        [
                            identity(AggKind::Sum, ty),
                            identity(AggKind::Min, ty),
                            identity(AggKind::Max, ty),
                            0,
                        ];
                        groups
                    ],
                });
            }
            if a.kind != AggKind::Count {
                used[a.column as usize] = true;
            }
            init.extend(std::iter::repeat_n(start, a.width()));
        }
        let stride = init.len();
        let total = stride * groups;
        if total > MAX_RESULTS {
            return Err(ScanError::TooManyResults(total));
        }
        let acc = (0..groups).flat_map(|_| init.iter().copied()).collect();
        Ok(Evaluator {
            rows: scan.rows,
            line_elems: le as usize,
            types: scan.columns.iter().map(|c| c.ty).collect(),
            filter: scan.filter,
            group: scan.group,
            aggs: scan.aggs.clone(),
            offsets,
            stride,
            acc,
            fused,
            counts: if scan.aggs.iter().any(|a| a.kind == AggKind::Count) {
                vec![0; groups]
            } else {
                Vec::new()
            },
            used,
            sel: Vec::with_capacity(le as usize),
            keys: Vec::with_capacity(if scan.group.is_some() { le as usize } else { 0 }),
            zeros: Vec::new(),
        })
    }

    /// Lines the scan covers.
    pub fn lines(&self) -> usize {
        self.rows.div_ceil(self.line_elems as u64) as usize
    }

    /// Whether the scan reads column `c` (a line of a column it does not read may be `None`).
    pub fn reads(&self, c: usize) -> bool {
        self.used[c]
    }

    /// Adds line `line` of every column (`None`: all zeros).
    pub fn feed(&mut self, line: usize, columns: &[Option<&[u8]>]) -> Result<(), ScanError> {
        let first = line as u64 * self.line_elems as u64;
        let n = (self.rows.saturating_sub(first)).min(self.line_elems as u64) as usize;
        if n == 0 {
            return Ok(());
        }
        let nc = self.types.len();
        // A line never written, or a column not handed in at all, reads as zeros.
        let missing = (0..nc).any(|c| columns.get(c).copied().flatten().is_none());
        if missing && self.zeros.is_empty() {
            self.zeros = vec![0; self.line_elems * 8];
        }
        let mut data: [&[u8]; MAX_COLUMNS] = [&[]; MAX_COLUMNS];
        for (c, slot) in data.iter_mut().enumerate().take(nc) {
            if !self.used[c] {
                continue;
            }
            let need = n * self.types[c].size();
            *slot = match columns.get(c).copied().flatten() {
                None => &self.zeros[..need],
                Some(d) if d.len() < need => {
                    return Err(ScanError::ShortLine {
                        column: c,
                        line,
                        have: d.len(),
                        need,
                    })
                }
                Some(d) => &d[..need],
            };
        }
        let sel = match self.filter {
            Some(f) => {
                let d = data[f.column as usize];
                with_type!(
                    self.types[f.column as usize],
                    T,
                    select::<T>(d, f.cmp, f.value, &mut self.sel)
                );
                Some(&self.sel[..])
            }
            None => None,
        };
        let keys = match self.group {
            Some(g) => {
                self.keys.clear();
                let d = data[g.column as usize];
                let bad = with_type!(
                    self.types[g.column as usize],
                    T,
                    group_keys::<T>(d, g.groups, &mut self.keys)
                );
                if let Some(key) = bad {
                    return Err(ScanError::GroupKey {
                        key,
                        groups: g.groups,
                    });
                }
                Some(&self.keys[..])
            }
            None => None,
        };
        let rows = Rows {
            n,
            sel,
            keys,
            stride: self.stride,
        };
        // Rows are counted in the first fused pass, or in a pass of their own.
        if let Some((f, rest)) = self.fused.split_first_mut() {
            let c = f.column as usize;
            if self.counts.is_empty() {
                with_type!(
                    self.types[c],
                    T,
                    fused::<T, false>(data[c], &rows, &mut f.stats)
                );
            } else {
                with_type!(
                    self.types[c],
                    T,
                    fused::<T, true>(data[c], &rows, &mut f.stats)
                );
            }
            for f in rest {
                let c = f.column as usize;
                with_type!(
                    self.types[c],
                    T,
                    fused::<T, false>(data[c], &rows, &mut f.stats)
                );
            }
        } else if !self.counts.is_empty() {
            count_rows(&rows, &mut self.counts);
        }
        for (a, &off) in self.aggs.iter().zip(&self.offsets) {
            if let AggKind::Histogram { lo, hi, buckets } = a.kind {
                let d = data[a.column as usize];
                let acc = &mut self.acc[..];
                with_type!(self.types[a.column as usize], T, {
                    histogram::<T>(d, &rows, acc, off, lo, hi, buckets)
                });
            }
        }
        Ok(())
    }

    /// The results (see the module docs).
    pub fn finish(mut self) -> Vec<u64> {
        let groups = self.acc.len() / self.stride.max(1);
        for (a, &off) in self.aggs.iter().zip(&self.offsets) {
            let which = match a.kind {
                AggKind::Sum => 0,
                AggKind::Min => 1,
                AggKind::Max => 2,
                AggKind::Count => {
                    for g in 0..groups {
                        self.acc[g * self.stride + off] = match self.fused.first() {
                            Some(f) => f.stats[g][3],
                            None => self.counts[g],
                        };
                    }
                    continue;
                }
                AggKind::Histogram { .. } => continue,
            };
            let f = self
                .fused
                .iter()
                .find(|f| f.column == a.column)
                .expect("every summed column has its fused pass");
            for g in 0..groups {
                self.acc[g * self.stride + off] = f.stats[g][which];
            }
        }
        self.acc
    }
}

/// Runs `$e` with `$t` the Rust type of element type `$ty`.
macro_rules! with_type {
    ($ty:expr, $t:ident, $e:expr) => {
        match $ty {
            ElemType::U32 => {
                type $t = u32;
                $e
            }
            ElemType::U64 => {
                type $t = u64;
                $e
            }
            ElemType::I32 => {
                type $t = i32;
                $e
            }
            ElemType::I64 => {
                type $t = i64;
                $e
            }
            ElemType::F32 => {
                type $t = f32;
                $e
            }
            ElemType::F64 => {
                type $t = f64;
                $e
            }
        }
    };
}
use with_type;

/// An element type's arithmetic, on accumulators kept as result bits.
trait Num: Copy + PartialOrd {
    const SIZE: usize;
    fn load(b: &[u8]) -> Self;
    /// A constant given as raw bits.
    fn from_bits(bits: u64) -> Self;
    fn add(acc: u64, x: Self) -> u64;
    fn min(acc: u64, x: Self) -> u64;
    fn max(acc: u64, x: Self) -> u64;
    /// Integers only: the value, for group keys and histogram buckets.
    fn int(self) -> i128;
    fn bucket(self, lo: Self, hi: Self, buckets: u32) -> Option<usize>;
}

macro_rules! int_num {
    ($t:ty, $u:ty, $wide:ty) => {
        impl Num for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline(always)]
            fn load(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b[..Self::SIZE].try_into().expect("sized"))
            }
            fn from_bits(bits: u64) -> Self {
                bits as $u as $t
            }
            #[inline(always)]
            fn add(acc: u64, x: Self) -> u64 {
                acc.wrapping_add(x as $wide as u64)
            }
            #[inline(always)]
            fn min(acc: u64, x: Self) -> u64 {
                (acc as $wide).min(x as $wide) as u64
            }
            #[inline(always)]
            fn max(acc: u64, x: Self) -> u64 {
                (acc as $wide).max(x as $wide) as u64
            }
            #[inline(always)]
            fn int(self) -> i128 {
                self as i128
            }
            #[inline(always)]
            fn bucket(self, lo: Self, hi: Self, buckets: u32) -> Option<usize> {
                (self >= lo && self < hi).then(|| {
                    ((self as i128 - lo as i128) * buckets as i128 / (hi as i128 - lo as i128))
                        as usize
                })
            }
        }
    };
}
int_num!(u32, u32, u64);
int_num!(u64, u64, u64);
int_num!(i32, u32, i64);
int_num!(i64, u64, i64);

macro_rules! float_num {
    ($t:ty, $bits:ty) => {
        impl Num for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline(always)]
            fn load(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b[..Self::SIZE].try_into().expect("sized"))
            }
            fn from_bits(bits: u64) -> Self {
                <$t>::from_bits(bits as $bits)
            }
            #[inline(always)]
            fn add(acc: u64, x: Self) -> u64 {
                (f64::from_bits(acc) + x as f64).to_bits()
            }
            #[inline(always)]
            fn min(acc: u64, x: Self) -> u64 {
                // The accumulator is never NaN, so a NaN `x` (which compares false) leaves it.
                let (a, x) = (f64::from_bits(acc), x as f64);
                (if x < a { x } else { a }).to_bits()
            }
            #[inline(always)]
            fn max(acc: u64, x: Self) -> u64 {
                let (a, x) = (f64::from_bits(acc), x as f64);
                (if x > a { x } else { a }).to_bits()
            }
            fn int(self) -> i128 {
                unreachable!("group columns are integers (checked in new)")
            }
            #[inline(always)]
            fn bucket(self, lo: Self, hi: Self, buckets: u32) -> Option<usize> {
                let (v, lo, hi) = (self as f64, lo as f64, hi as f64);
                (v >= lo && v < hi).then(|| {
                    (((v - lo) / (hi - lo) * buckets as f64) as usize).min(buckets as usize - 1)
                })
            }
        }
    };
}
float_num!(f32, u32);
float_num!(f64, u64);

/// The current line's rows: how many, which pass the filter (`None`: all), their groups.
struct Rows<'a> {
    n: usize,
    /// The rows that pass the filter (`None`: all).
    sel: Option<&'a [u32]>,
    /// Each row's group (`None`: not grouped).
    keys: Option<&'a [u32]>,
    stride: usize,
}

impl Rows<'_> {
    /// Calls `f(row, value)` for every selected row.
    #[inline(always)]
    fn each<T: Num>(&self, d: &[u8], mut f: impl FnMut(usize, T)) {
        match self.sel {
            None => {
                for (r, c) in d.chunks_exact(T::SIZE).take(self.n).enumerate() {
                    f(r, T::load(c));
                }
            }
            Some(sel) => {
                for &r in sel {
                    let r = r as usize;
                    f(r, T::load(&d[r * T::SIZE..]));
                }
            }
        }
    }
}

/// The rows of a line where `value CMP constant` holds.
fn select<T: Num>(d: &[u8], cmp: Cmp, bits: u64, sel: &mut Vec<u32>) {
    let v = T::from_bits(bits);
    let n = d.len() / T::SIZE;
    sel.resize(n, 0);
    let mut k = 0;
    // Branch-free: every row is written, and the count moves on only past the ones that pass.
    macro_rules! pick {
        ($p:expr) => {
            for (r, c) in d.chunks_exact(T::SIZE).enumerate() {
                let x = T::load(c);
                sel[k] = r as u32;
                k += $p(x) as usize;
            }
        };
    }
    // NaN compares with nothing: only `Ne` holds for it, as `!=` says.
    match cmp {
        Cmp::Lt => pick!(|x: T| x < v),
        Cmp::Le => pick!(|x: T| x <= v),
        Cmp::Gt => pick!(|x: T| x > v),
        Cmp::Ge => pick!(|x: T| x >= v),
        Cmp::Eq => pick!(|x: T| x == v),
        Cmp::Ne => pick!(|x: T| x != v),
    }
    sel.truncate(k);
}

/// The group of every row of a line, or the first key that is not below `groups`.
fn group_keys<T: Num>(d: &[u8], groups: u32, keys: &mut Vec<u32>) -> Option<i128> {
    let mut bad = false;
    keys.extend(d.chunks_exact(T::SIZE).map(|c| {
        let k = T::load(c).int();
        bad |= !(0..groups as i128).contains(&k);
        k as u32
    }));
    bad.then(|| {
        d.chunks_exact(T::SIZE)
            .map(|c| T::load(c).int())
            .find(|k| !(0..groups as i128).contains(k))
            .expect("a bad key was seen")
    })
}

/// A column's sum, minimum and maximum per group, computed together.
#[derive(Debug)]
struct Fused {
    column: u8,
    /// Per group: sum, minimum, maximum (as result bits), and rows if this is the first
    /// fused column and the scan counts rows.
    stats: Vec<[u64; 4]>,
}

/// What an aggregation starts from (the result for no rows).
fn identity(kind: AggKind, ty: ElemType) -> u64 {
    let float = ty.is_float();
    match kind {
        AggKind::Sum if float => 0f64.to_bits(),
        AggKind::Min if float => f64::INFINITY.to_bits(),
        AggKind::Max if float => f64::NEG_INFINITY.to_bits(),
        AggKind::Min => match ty {
            ElemType::U32 => u32::MAX as u64,
            ElemType::U64 => u64::MAX,
            ElemType::I32 => i32::MAX as u64,
            _ => i64::MAX as u64,
        },
        AggKind::Max => match ty {
            ElemType::I32 => i32::MIN as i64 as u64,
            ElemType::I64 => i64::MIN as u64,
            _ => 0,
        },
        AggKind::Sum | AggKind::Count | AggKind::Histogram { .. } => 0,
    }
}

/// Adds a line of one column to its sum, minimum and maximum (and, with `COUNT`, counts the
/// rows), in one pass.
fn fused<T: Num, const COUNT: bool>(d: &[u8], rows: &Rows<'_>, stats: &mut [[u64; 4]]) {
    match rows.keys {
        None => {
            let [mut s, mut lo, mut hi, _] = stats[0];
            rows.each(d, |_, x: T| {
                s = T::add(s, x);
                lo = T::min(lo, x);
                hi = T::max(hi, x);
            });
            (stats[0][0], stats[0][1], stats[0][2]) = (s, lo, hi);
            if COUNT {
                stats[0][3] += rows.sel.map_or(rows.n, |s| s.len()) as u64;
            }
        }
        Some(keys) => rows.each(d, |r, x: T| {
            let st = &mut stats[keys[r] as usize];
            st[0] = T::add(st[0], x);
            st[1] = T::min(st[1], x);
            st[2] = T::max(st[2], x);
            if COUNT {
                st[3] += 1;
            }
        }),
    }
}

/// Counts a line's selected rows per group.
fn count_rows(rows: &Rows<'_>, counts: &mut [u64]) {
    match (rows.keys, rows.sel) {
        (None, sel) => counts[0] += sel.map_or(rows.n, |s| s.len()) as u64,
        (Some(keys), None) => {
            for &k in &keys[..rows.n] {
                counts[k as usize] += 1;
            }
        }
        (Some(keys), Some(sel)) => {
            for &r in sel {
                counts[keys[r as usize] as usize] += 1;
            }
        }
    }
}

/// Adds a line of one column to a histogram.
fn histogram<T: Num>(
    d: &[u8],
    rows: &Rows<'_>,
    acc: &mut [u64],
    off: usize,
    lo: u64,
    hi: u64,
    buckets: u32,
) {
    let (lo, hi) = (T::from_bits(lo), T::from_bits(hi));
    rows.each(d, |r, x: T| {
        if let Some(b) = x.bucket(lo, hi, buckets) {
            let base = rows.keys.map_or(0, |k| k[r] as usize * rows.stride);
            acc[base + off + b] += 1;
        }
    });
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ElemType::U32 => "u32",
            ElemType::U64 => "u64",
            ElemType::I32 => "i32",
            ElemType::I64 => "i64",
            ElemType::F32 => "f32",
            ElemType::F64 => "f64",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(ty: ElemType, le: u32, lines: usize) -> Column<()> {
        Column {
            ty,
            line_elems: le,
            lines: vec![(); lines],
        }
    }

    fn bytes_u64(v: &[u64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn a_filtered_grouped_scan_matches_a_plain_loop() {
        // 10 rows, 4 per line: key = i % 3, value = i * 10 (as f64), filter key != 1.
        let keys: Vec<u64> = (0..12).map(|i| i % 3).collect();
        let vals: Vec<u64> = (0..12).map(|i| (i as f64 * 10.0).to_bits()).collect();
        let scan = Scan {
            rows: 10,
            columns: vec![col(ElemType::U64, 4, 3), col(ElemType::F64, 4, 3)],
            filter: Some(Filter {
                column: 0,
                cmp: Cmp::Ne,
                value: 1,
            }),
            group: Some(Group {
                column: 0,
                groups: 3,
            }),
            aggs: vec![
                Agg {
                    column: 1,
                    kind: AggKind::Sum,
                },
                Agg {
                    column: 1,
                    kind: AggKind::Max,
                },
                Agg {
                    column: 0,
                    kind: AggKind::Count,
                },
                Agg {
                    column: 1,
                    kind: AggKind::Histogram {
                        lo: 0f64.to_bits(),
                        hi: 100f64.to_bits(),
                        buckets: 2,
                    },
                },
            ],
        };
        let mut ev = Evaluator::new(&scan).unwrap();
        for l in 0..ev.lines() {
            let (k, v) = (
                bytes_u64(&keys[l * 4..l * 4 + 4]),
                bytes_u64(&vals[l * 4..l * 4 + 4]),
            );
            ev.feed(l, &[Some(&k), Some(&v)]).unwrap();
        }
        let r = ev.finish();
        // Group 0: rows 0,3,6,9 -> 180, max 90, 4 rows, buckets [0,50): 0,30 ; [50,100): 60,90.
        // Group 1: filtered out: identities.
        // Group 2: rows 2,5,8 -> 150, max 80, 3 rows, buckets 20 | 50,80.
        let f = |x: f64| x.to_bits();
        assert_eq!(
            r,
            vec![
                f(180.0),
                f(90.0),
                4,
                2,
                2,
                f(0.0),
                f(f64::NEG_INFINITY),
                0,
                0,
                0,
                f(150.0),
                f(80.0),
                3,
                1,
                2
            ]
        );
    }

    #[test]
    fn signed_minimum_and_zero_lines() {
        let scan = Scan {
            rows: 6,
            columns: vec![col(ElemType::I32, 4, 2)],
            filter: None,
            group: None,
            aggs: vec![
                Agg {
                    column: 0,
                    kind: AggKind::Min,
                },
                Agg {
                    column: 0,
                    kind: AggKind::Sum,
                },
            ],
        };
        let mut ev = Evaluator::new(&scan).unwrap();
        let a: Vec<u8> = [-5i32, 3, 7, -1]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        ev.feed(0, &[Some(&a)]).unwrap();
        ev.feed(1, &[None]).unwrap();
        assert_eq!(ev.finish(), vec![-5i64 as u64, 4]);
    }

    #[test]
    fn bad_scans_are_refused_before_any_work() {
        let good = Scan {
            rows: 8,
            columns: vec![col(ElemType::F64, 4, 2)],
            filter: None,
            group: None,
            aggs: vec![Agg {
                column: 0,
                kind: AggKind::Sum,
            }],
        };
        assert!(Evaluator::new(&good).is_ok());
        let mut s = good.clone();
        s.rows = 9;
        assert!(matches!(
            Evaluator::new(&s),
            Err(ScanError::TooFewLines { .. })
        ));
        let mut s = good.clone();
        s.group = Some(Group {
            column: 0,
            groups: 4,
        });
        assert_eq!(Evaluator::new(&s).unwrap_err(), ScanError::BadGroup);
        let mut s = good.clone();
        s.aggs[0].column = 3;
        assert_eq!(Evaluator::new(&s).unwrap_err(), ScanError::NoColumn(3, 1));
        let mut s = good.clone();
        s.aggs[0].kind = AggKind::Histogram {
            lo: 5f64.to_bits(),
            hi: 1f64.to_bits(),
            buckets: 3,
        };
        assert_eq!(Evaluator::new(&s).unwrap_err(), ScanError::BadHistogram);
        let mut ev = Evaluator::new(&good).unwrap();
        assert!(matches!(
            ev.feed(0, &[Some(&[0u8; 8])]),
            Err(ScanError::ShortLine { .. })
        ));
    }

    #[test]
    fn group_keys_out_of_range_fail_the_scan() {
        let scan = Scan {
            rows: 2,
            columns: vec![col(ElemType::U64, 2, 1)],
            filter: None,
            group: Some(Group {
                column: 0,
                groups: 2,
            }),
            aggs: vec![Agg {
                column: 0,
                kind: AggKind::Count,
            }],
        };
        let mut ev = Evaluator::new(&scan).unwrap();
        assert!(matches!(
            ev.feed(0, &[Some(&bytes_u64(&[1, 2]))]),
            Err(ScanError::GroupKey { key: 2, groups: 2 })
        ));
    }

    /// A column's value at a row, decoded the plain way.
    #[derive(Debug, Clone, Copy)]
    enum V {
        I(i128),
        F(f64),
    }

    fn read(ty: ElemType, b: &[u8]) -> V {
        let mut w = [0u8; 8];
        w[..ty.size()].copy_from_slice(&b[..ty.size()]);
        let x = u64::from_le_bytes(w);
        match ty {
            ElemType::U32 => V::I(x as u32 as i128),
            ElemType::I32 => V::I(x as u32 as i32 as i128),
            ElemType::U64 => V::I(x as i128),
            ElemType::I64 => V::I(x as i64 as i128),
            ElemType::F32 => V::F(f32::from_bits(x as u32) as f64),
            ElemType::F64 => V::F(f64::from_bits(x)),
        }
    }

    /// The scan, row by row, as the module docs say it.
    fn reference(scan: &Scan<Option<Vec<u8>>>) -> Vec<u64> {
        let le = scan.columns[0].line_elems as usize;
        let val = |c: usize, r: usize| {
            let col = &scan.columns[c];
            let size = col.ty.size();
            match &col.lines[r / le] {
                Some(d) => read(col.ty, &d[(r % le) * size..]),
                None => read(col.ty, &[0; 8]),
            }
        };
        let mut ev = Evaluator::new(scan).unwrap();
        let stride = ev.stride;
        let mut acc = std::mem::take(&mut ev.acc);
        for r in 0..scan.rows as usize {
            if let Some(f) = scan.filter {
                let c = f.column as usize;
                let k = read(scan.columns[c].ty, &f.value.to_le_bytes());
                let o = match (val(c, r), k) {
                    (V::I(a), V::I(b)) => Some(a.cmp(&b)),
                    (V::F(a), V::F(b)) => a.partial_cmp(&b),
                    _ => unreachable!(),
                };
                use std::cmp::Ordering::*;
                let keep = match (f.cmp, o) {
                    (Cmp::Ne, None) => true,
                    (_, None) => false,
                    (Cmp::Lt, Some(o)) => o == Less,
                    (Cmp::Le, Some(o)) => o != Greater,
                    (Cmp::Gt, Some(o)) => o == Greater,
                    (Cmp::Ge, Some(o)) => o != Less,
                    (Cmp::Eq, Some(o)) => o == Equal,
                    (Cmp::Ne, Some(o)) => o != Equal,
                };
                if !keep {
                    continue;
                }
            }
            let base = match scan.group {
                Some(g) => match val(g.column as usize, r) {
                    V::I(k) => k as usize * stride,
                    V::F(_) => unreachable!(),
                },
                None => 0,
            };
            for (a, &off) in scan.aggs.iter().zip(&ev.offsets) {
                let slot = &mut acc[base + off];
                let ty = scan.columns[a.column as usize].ty;
                match (a.kind, val(a.column as usize, r)) {
                    (AggKind::Count, _) => *slot += 1,
                    (AggKind::Sum, V::I(x)) => *slot = slot.wrapping_add(x as u64),
                    (AggKind::Sum, V::F(x)) => *slot = (f64::from_bits(*slot) + x).to_bits(),
                    (AggKind::Min, V::I(x)) => {
                        let cur = read(ty, &slot.to_le_bytes());
                        if let V::I(c) = cur {
                            *slot = c.min(x) as u64;
                        }
                    }
                    (AggKind::Max, V::I(x)) => {
                        if let V::I(c) = read(ty, &slot.to_le_bytes()) {
                            *slot = c.max(x) as u64;
                        }
                    }
                    (AggKind::Min, V::F(x)) if x < f64::from_bits(*slot) => *slot = x.to_bits(),
                    (AggKind::Max, V::F(x)) if x > f64::from_bits(*slot) => *slot = x.to_bits(),
                    (AggKind::Min | AggKind::Max, V::F(_)) => {}
                    (AggKind::Histogram { lo, hi, buckets }, v) => {
                        let lo = read(ty, &lo.to_le_bytes());
                        let hi = read(ty, &hi.to_le_bytes());
                        let b = match (v, lo, hi) {
                            (V::I(v), V::I(lo), V::I(hi)) => (v >= lo && v < hi)
                                .then(|| ((v - lo) * buckets as i128 / (hi - lo)) as usize),
                            (V::F(v), V::F(lo), V::F(hi)) => (v >= lo && v < hi).then(|| {
                                (((v - lo) / (hi - lo) * buckets as f64) as usize)
                                    .min(buckets as usize - 1)
                            }),
                            _ => unreachable!(),
                        };
                        if let Some(b) = b {
                            acc[base + off + b] += 1;
                        }
                    }
                }
            }
        }
        acc
    }

    const TYPES: [ElemType; 6] = [
        ElemType::U32,
        ElemType::U64,
        ElemType::I32,
        ElemType::I64,
        ElemType::F32,
        ElemType::F64,
    ];

    /// Bits of a value of `ty` from a small pool, so filters and histograms cut somewhere:
    /// small integers, negative ones, extremes, and for floats fractions and NaN.
    fn pick(ty: ElemType, r: u64) -> u64 {
        let i = (r % 13) as i64 - 6;
        match ty {
            ElemType::U32 => [i as u32, u32::MAX, 0][(r % 3) as usize] as u64,
            ElemType::I32 => [i as i32, i32::MIN, i32::MAX][(r % 3) as usize] as u32 as u64,
            ElemType::U64 => [i as u64, u64::MAX, 3][(r % 3) as usize],
            ElemType::I64 => [i, i64::MIN, i64::MAX][(r % 3) as usize] as u64,
            ElemType::F32 => [i as f32 / 4.0, f32::NAN, -0.0][(r % 3) as usize].to_bits() as u64,
            ElemType::F64 => [i as f64 / 4.0, f64::NAN, 1e300][(r % 3) as usize].to_bits(),
        }
    }

    proptest::proptest! {
        #[test]
        fn the_columnar_evaluator_matches_row_by_row(
            rows in 0u64..40,
            le in 1u32..7,
            types in proptest::collection::vec(0usize..6, 1..4),
            seed in proptest::collection::vec(proptest::prelude::any::<u64>(), 400),
            holes in proptest::collection::vec(proptest::prelude::any::<bool>(), 40),
            filter in proptest::option::of((0u8..4, 1u8..7, proptest::prelude::any::<u64>())),
            grouped in proptest::prelude::any::<bool>(),
            aggs in proptest::collection::vec((0u8..4, 0u8..5, 1u32..5, proptest::prelude::any::<u64>()), 1..6),
        ) {
            // Column 0 is group keys below 3 (u32); the others are of random types.
            let mut tys = vec![ElemType::U32];
            tys.extend(types.iter().map(|&t| TYPES[t]));
            let nc = tys.len();
            let lines = rows.div_ceil(le as u64) as usize;
            let mut k = 0;
            let mut next = || { k += 1; seed[k % seed.len()] };
            let columns: Vec<Column<Option<Vec<u8>>>> = tys.iter().enumerate().map(|(c, &ty)| {
                let lines = (0..lines).map(|l| {
                    if c > 0 && holes[(l + c) % holes.len()] && l % 3 == 1 {
                        return None;
                    }
                    Some((0..le).flat_map(|_| {
                        let bits = if c == 0 { next() % 3 } else { pick(ty, next()) };
                        bits.to_le_bytes()[..ty.size()].to_vec()
                    }).collect())
                }).collect();
                Column { ty, line_elems: le, lines }
            }).collect();
            let filter = filter.map(|(c, cmp, r)| {
                let c = c % nc as u8;
                Filter { column: c, cmp: Cmp::from_u8(cmp).unwrap(), value: pick(tys[c as usize], r) }
            });
            let aggs = aggs.into_iter().map(|(c, kind, b, r)| {
                let c = c % nc as u8;
                let ty = tys[c as usize];
                let kind = match kind {
                    0 => AggKind::Sum,
                    1 => AggKind::Min,
                    2 => AggKind::Max,
                    3 => AggKind::Count,
                    _ => {
                        let (lo, hi) = if ty.is_float() {
                            ((-1.5f64).to_bits(), (r % 7) as f64)
                        } else {
                            (0, (r % 7 + 1) as f64)
                        };
                        match ty {
                            ElemType::F32 => AggKind::Histogram {
                                lo: (f64::from_bits(lo) as f32).to_bits() as u64,
                                hi: (hi as f32).to_bits() as u64,
                                buckets: b,
                            },
                            ElemType::F64 => AggKind::Histogram { lo, hi: hi.to_bits(), buckets: b },
                            _ => AggKind::Histogram { lo, hi: hi as u64, buckets: b },
                        }
                    }
                };
                Agg { column: c, kind }
            }).collect();
            let scan = Scan {
                rows,
                columns,
                filter,
                group: grouped.then_some(Group { column: 0, groups: 3 }),
                aggs,
            };
            let want = reference(&scan);
            let mut ev = Evaluator::new(&scan).unwrap();
            for l in 0..ev.lines() {
                let slices: Vec<Option<&[u8]>> =
                    scan.columns.iter().map(|c| c.lines[l].as_deref()).collect();
                ev.feed(l, &slices).unwrap();
            }
            proptest::prop_assert_eq!(ev.finish(), want);
        }
    }
}
