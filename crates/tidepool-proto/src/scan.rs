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
//! largest value, an empty maximum its smallest (floats: +inf and -inf).

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

    fn holds(self, o: Option<std::cmp::Ordering>) -> bool {
        use std::cmp::Ordering::*;
        match (self, o) {
            // NaN compares with nothing.
            (Cmp::Ne, None) => true,
            (_, None) => false,
            (Cmp::Lt, Some(o)) => o == Less,
            (Cmp::Le, Some(o)) => o != Greater,
            (Cmp::Gt, Some(o)) => o == Greater,
            (Cmp::Ge, Some(o)) => o != Less,
            (Cmp::Eq, Some(o)) => o == Equal,
            (Cmp::Ne, Some(o)) => o != Equal,
        }
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

/// An aggregation's running state for one group.
#[derive(Debug, Clone, Copy)]
enum Acc {
    Int(i128),
    Float(f64),
}

/// Computes a scan a line at a time: see the module docs.
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
    acc: Vec<Acc>,
    /// Decoded values of the current line, per column.
    vals: Vec<Vec<Val>>,
    /// Which columns are read at all.
    used: Vec<bool>,
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
        for a in &scan.aggs {
            let ty = col(a.column)?;
            offsets.push(init.len());
            let float = ty.is_float();
            let start = match a.kind {
                AggKind::Sum if float => Acc::Float(0.0),
                AggKind::Min if float => Acc::Float(f64::INFINITY),
                AggKind::Max if float => Acc::Float(f64::NEG_INFINITY),
                AggKind::Sum | AggKind::Count => Acc::Int(0),
                AggKind::Min => Acc::Int(match ty {
                    ElemType::U32 => u32::MAX as i128,
                    ElemType::U64 => u64::MAX as i128,
                    ElemType::I32 => i32::MAX as i128,
                    _ => i64::MAX as i128,
                }),
                AggKind::Max => Acc::Int(match ty {
                    ElemType::I32 => i32::MIN as i128,
                    ElemType::I64 => i64::MIN as i128,
                    _ => 0,
                }),
                AggKind::Histogram { lo, hi, buckets } => {
                    let ok = buckets > 0
                        && buckets <= MAX_GROUPS
                        && ty.value(lo).cmp_to(ty.value(hi)) == Some(std::cmp::Ordering::Less);
                    if !ok {
                        return Err(ScanError::BadHistogram);
                    }
                    Acc::Int(0)
                }
            };
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
            vals: vec![Vec::new(); nc],
            used,
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
        for (c, data) in columns.iter().enumerate().take(self.types.len()) {
            let v = &mut self.vals[c];
            v.clear();
            if !self.used[c] {
                continue;
            }
            let ty = self.types[c];
            let size = ty.size();
            match data {
                None => v.resize(n, ty.value(0)),
                Some(d) if d.len() < n * size => {
                    return Err(ScanError::ShortLine {
                        column: c,
                        line,
                        have: d.len(),
                        need: n * size,
                    })
                }
                Some(d) => decode(ty, &d[..n * size], v),
            }
        }
        for r in 0..n {
            if let Some(f) = self.filter {
                let t = self.types[f.column as usize];
                let v = self.vals[f.column as usize][r];
                if !f.cmp.holds(v.cmp_to(t.value(f.value))) {
                    continue;
                }
            }
            let base = match self.group {
                Some(g) => {
                    let Val::Int(k) = self.vals[g.column as usize][r] else {
                        unreachable!("group columns are integers (checked in new)")
                    };
                    if k < 0 || k >= g.groups as i128 {
                        return Err(ScanError::GroupKey {
                            key: k,
                            groups: g.groups,
                        });
                    }
                    k as usize * self.stride
                }
                None => 0,
            };
            for (a, &off) in self.aggs.iter().zip(&self.offsets) {
                let slot = base + off;
                if a.kind == AggKind::Count {
                    if let Acc::Int(x) = &mut self.acc[slot] {
                        *x += 1;
                    }
                    continue;
                }
                let v = self.vals[a.column as usize][r];
                match (a.kind, &mut self.acc[slot], v) {
                    (AggKind::Sum, Acc::Int(s), Val::Int(x)) => *s = s.wrapping_add(x),
                    (AggKind::Sum, Acc::Float(s), Val::Float(x)) => *s += x,
                    (AggKind::Min, Acc::Int(s), Val::Int(x)) => *s = (*s).min(x),
                    (AggKind::Min, Acc::Float(s), Val::Float(x)) => *s = s.min(x),
                    (AggKind::Max, Acc::Int(s), Val::Int(x)) => *s = (*s).max(x),
                    (AggKind::Max, Acc::Float(s), Val::Float(x)) => *s = s.max(x),
                    (AggKind::Histogram { lo, hi, buckets }, _, v) => {
                        let ty = self.types[a.column as usize];
                        if let Some(b) = bucket(v, ty.value(lo), ty.value(hi), buckets) {
                            if let Acc::Int(x) = &mut self.acc[slot + b] {
                                *x += 1;
                            }
                        }
                    }
                    _ => unreachable!("accumulators match their column's type"),
                }
            }
        }
        Ok(())
    }

    /// The results (see the module docs).
    pub fn finish(self) -> Vec<u64> {
        self.acc
            .into_iter()
            .map(|a| match a {
                Acc::Int(x) => x as u64,
                Acc::Float(x) => x.to_bits(),
            })
            .collect()
    }
}

fn decode(ty: ElemType, d: &[u8], out: &mut Vec<Val>) {
    let four = |c: &[u8]| [c[0], c[1], c[2], c[3]];
    let eight = |c: &[u8]| [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]];
    match ty {
        ElemType::U32 => out.extend(
            d.chunks_exact(4)
                .map(|c| Val::Int(u32::from_le_bytes(four(c)) as i128)),
        ),
        ElemType::I32 => out.extend(
            d.chunks_exact(4)
                .map(|c| Val::Int(i32::from_le_bytes(four(c)) as i128)),
        ),
        ElemType::F32 => out.extend(
            d.chunks_exact(4)
                .map(|c| Val::Float(f32::from_le_bytes(four(c)) as f64)),
        ),
        ElemType::U64 => out.extend(
            d.chunks_exact(8)
                .map(|c| Val::Int(u64::from_le_bytes(eight(c)) as i128)),
        ),
        ElemType::I64 => out.extend(
            d.chunks_exact(8)
                .map(|c| Val::Int(i64::from_le_bytes(eight(c)) as i128)),
        ),
        ElemType::F64 => out.extend(
            d.chunks_exact(8)
                .map(|c| Val::Float(f64::from_le_bytes(eight(c)))),
        ),
    }
}

/// The bucket of `v` among `buckets` equal parts of `[lo, hi)`.
fn bucket(v: Val, lo: Val, hi: Val, buckets: u32) -> Option<usize> {
    let b = buckets as i128;
    match (v, lo, hi) {
        (Val::Int(v), Val::Int(lo), Val::Int(hi)) => {
            (v >= lo && v < hi).then(|| ((v - lo) * b / (hi - lo)) as usize)
        }
        (Val::Float(v), Val::Float(lo), Val::Float(hi)) => (v >= lo && v < hi)
            .then(|| (((v - lo) / (hi - lo) * buckets as f64) as usize).min(buckets as usize - 1)),
        _ => None,
    }
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
}
