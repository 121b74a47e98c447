//! The evaluator against plain loops over the same data.

use super::*;
use tidepool_proto::scan::Column;

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
            Filter { column: c, cmp: Cmp::try_from(cmp).unwrap(), value: pick(tys[c as usize], r) }
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
