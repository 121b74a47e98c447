//! Offloaded scans: what a `Scan` request asks a memory node to compute over typed far
//! vectors it stores. The evaluator that computes it is the `tidepool-query` crate (the node
//! runs it on its objects; far vectors run the same code on their local cache).
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

use num_enum::{IntoPrimitive, TryFromPrimitive};
use std::fmt;

/// The element type of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoPrimitive, TryFromPrimitive)]
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
    pub fn size(self) -> usize {
        match self {
            ElemType::U32 | ElemType::I32 | ElemType::F32 => 4,
            _ => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, ElemType::F32 | ElemType::F64)
    }
}

/// A comparison of a column's value with a constant: `value CMP constant`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoPrimitive, TryFromPrimitive)]
#[repr(u8)]
pub enum Cmp {
    Lt = 1,
    Le = 2,
    Gt = 3,
    Ge = 4,
    Eq = 5,
    Ne = 6,
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
