//! Runs offloaded scans: the evaluator of a `tidepool_proto::scan::Scan` over the lines of
//! typed far vectors, where the data is. The memory node runs it on the objects it stores; far
//! vectors run the same code over their local cache, so both give the same answer.
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

use tidepool_proto::scan::{
    Agg, AggKind, Cmp, ElemType, Filter, Group, Scan, MAX_AGGS, MAX_COLUMNS, MAX_GROUPS,
    MAX_LINE_BYTES, MAX_RESULTS,
};

#[cfg(test)]
mod tests;

/// Why a scan cannot run (the whole request fails with this).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
        let le = check_shape(scan)?;
        let mut used = vec![false; scan.columns.len()];
        let groups = filter_and_groups(scan, &mut used)?;
        let Accumulators {
            offsets,
            init,
            fused,
        } = accumulators(scan, groups, &mut used)?;
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
        let data = line_data(&self.types, &self.used, &self.zeros, columns, line, n)?;
        let sel = select_line(self.filter, &self.types, &data, &mut self.sel);
        let keys = group_line(self.group, &self.types, &data, &mut self.keys)?;
        let rows = Rows {
            n,
            sel,
            keys,
            stride: self.stride,
        };
        fused_line(&mut self.fused, &mut self.counts, &self.types, &data, &rows);
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

/// The scan's elements per line, once its columns and aggregations are counted and every
/// column is checked to have that many elements per line and lines enough for the rows.
fn check_shape<L>(scan: &Scan<L>) -> Result<u32, ScanError> {
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
    Ok(le)
}

/// The type of column `c` of the scan, if it has one.
fn column_type<L>(scan: &Scan<L>, c: u8) -> Result<ElemType, ScanError> {
    scan.columns
        .get(c as usize)
        .map(|x| x.ty)
        .ok_or(ScanError::NoColumn(c, scan.columns.len()))
}

/// Checks the filter's and the grouping's columns, marks them `used`, and returns how many
/// groups there are (one if not grouped).
fn filter_and_groups<L>(scan: &Scan<L>, used: &mut [bool]) -> Result<usize, ScanError> {
    if let Some(f) = scan.filter {
        column_type(scan, f.column)?;
        used[f.column as usize] = true;
    }
    Ok(match scan.group {
        Some(g) => {
            if column_type(scan, g.column)?.is_float() || g.groups == 0 || g.groups > MAX_GROUPS {
                return Err(ScanError::BadGroup);
            }
            used[g.column as usize] = true;
            g.groups as usize
        }
        None => 1,
    })
}

/// What a scan's aggregations start from (see [`accumulators`]).
struct Accumulators {
    /// Each aggregation's first value in a group's results.
    offsets: Vec<usize>,
    /// A group's results before the first line.
    init: Vec<u64>,
    /// The fused sum/minimum/maximum passes, one per column that needs one.
    fused: Vec<Fused>,
}

/// Checks the aggregations and readies their accumulators; marks the columns they read
/// `used`.
fn accumulators<L>(
    scan: &Scan<L>,
    groups: usize,
    used: &mut [bool],
) -> Result<Accumulators, ScanError> {
    let mut offsets = Vec::with_capacity(scan.aggs.len());
    let mut init = Vec::new();
    let mut fused = Vec::new();
    for a in &scan.aggs {
        let ty = column_type(scan, a.column)?;
        offsets.push(init.len());
        if let AggKind::Histogram { lo, hi, buckets } = a.kind {
            let ok = buckets > 0
                && buckets <= MAX_GROUPS
                && value(ty, lo).cmp_to(value(ty, hi)) == Some(std::cmp::Ordering::Less);
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
    Ok(Accumulators {
        offsets,
        init,
        fused,
    })
}

/// The bytes of the current line's `n` rows of every column the scan reads (`zeros` for a
/// column not handed in), refused if a line handed in is short.
fn line_data<'a>(
    types: &[ElemType],
    used: &[bool],
    zeros: &'a [u8],
    columns: &[Option<&'a [u8]>],
    line: usize,
    n: usize,
) -> Result<[&'a [u8]; MAX_COLUMNS], ScanError> {
    let mut data: [&[u8]; MAX_COLUMNS] = [&[]; MAX_COLUMNS];
    for (c, slot) in data.iter_mut().enumerate().take(types.len()) {
        if !used[c] {
            continue;
        }
        let need = n * types[c].size();
        *slot = match columns.get(c).copied().flatten() {
            None => &zeros[..need],
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
    Ok(data)
}

/// The rows of the line that pass the filter, listed in `sel` (`None`: no filter, all pass).
fn select_line<'s>(
    filter: Option<Filter>,
    types: &[ElemType],
    data: &[&[u8]],
    sel: &'s mut Vec<u32>,
) -> Option<&'s [u32]> {
    let f = filter?;
    let d = data[f.column as usize];
    with_type!(
        types[f.column as usize],
        T,
        select::<T>(d, f.cmp, f.value, sel)
    );
    Some(&sel[..])
}

/// Each row's group, listed in `keys` (`None`: not grouped), refused if a key is not below
/// the groups asked for.
fn group_line<'k>(
    group: Option<Group>,
    types: &[ElemType],
    data: &[&[u8]],
    keys: &'k mut Vec<u32>,
) -> Result<Option<&'k [u32]>, ScanError> {
    let Some(g) = group else {
        return Ok(None);
    };
    keys.clear();
    let d = data[g.column as usize];
    let bad = with_type!(
        types[g.column as usize],
        T,
        group_keys::<T>(d, g.groups, keys)
    );
    if let Some(key) = bad {
        return Err(ScanError::GroupKey {
            key,
            groups: g.groups,
        });
    }
    Ok(Some(&keys[..]))
}

/// Runs the line's fused sum/minimum/maximum passes; rows are counted in the first of them, or
/// in a pass of their own if there is none.
fn fused_line(
    passes: &mut [Fused],
    counts: &mut [u64],
    types: &[ElemType],
    data: &[&[u8]],
    rows: &Rows<'_>,
) {
    if let Some((f, rest)) = passes.split_first_mut() {
        let c = f.column as usize;
        if counts.is_empty() {
            with_type!(types[c], T, fused::<T, false>(data[c], rows, &mut f.stats));
        } else {
            with_type!(types[c], T, fused::<T, true>(data[c], rows, &mut f.stats));
        }
        for f in rest {
            let c = f.column as usize;
            with_type!(types[c], T, fused::<T, false>(data[c], rows, &mut f.stats));
        }
    } else if !counts.is_empty() {
        count_rows(rows, counts);
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
///
/// A plain loop over a buffer sized first, as `select` does: written as `Vec::extend` over a
/// mapped iterator, LLVM left the extend out of line once the evaluator had a crate of its own,
/// and grouped scans ran at 0.73x (4M rows, `examples/query`).
fn group_keys<T: Num>(d: &[u8], groups: u32, keys: &mut Vec<u32>) -> Option<i128> {
    let mut bad = false;
    let n = d.len() / T::SIZE;
    let start = keys.len();
    keys.resize(start + n, 0);
    for (key, c) in keys[start..].iter_mut().zip(d.chunks_exact(T::SIZE)) {
        let k = T::load(c).int();
        bad |= !(0..groups as i128).contains(&k);
        *key = k as u32;
    }
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

/// A value given as raw bits of this type (as `Filter::value` and histogram bounds are).
fn value(ty: ElemType, bits: u64) -> Val {
    match ty {
        ElemType::U32 => Val::Int(bits as u32 as i128),
        ElemType::U64 => Val::Int(bits as i128),
        ElemType::I32 => Val::Int(bits as u32 as i32 as i128),
        ElemType::I64 => Val::Int(bits as i64 as i128),
        ElemType::F32 => Val::Float(f32::from_bits(bits as u32) as f64),
        ElemType::F64 => Val::Float(f64::from_bits(bits)),
    }
}
