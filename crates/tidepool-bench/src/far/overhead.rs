//! The `far` suite, part (c): what each way of reaching a far vector costs when all of it is
//! local, against a plain `Vec` (AIFM's lesson: per-element metadata and bookkeeping made it
//! slow even with all data local).
//!
//! A vector of [`ELEMS`] u64s (64 MiB) in a direct-mapped section that holds all of it, loaded
//! first. Workloads, in nanoseconds per element: `scan` (sum of every element in order),
//! `random-read` (sum of elements at random indices) and `random-rmw` (increment elements at
//! random indices). Systems: `native` (a `Vec`), `tidepool-far-slice` (`local`/`local_mut`:
//! the whole vector as one slice), `tidepool-far-lines` (line guards: `line_iter` to scan, a
//! guard per access at random) and `tidepool-far-elem` (`iter` to scan, `get`/`update` at
//! random).

use crate::data::splitmix64;
use crate::harness::{Ctx, Matrix, Pass, Sample, System, Turns, Workload};
use anyhow::{Context, Result};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;
use tidepool_far::{Far, FarVec, Section, SectionConfig, Structure};

const ELEMS: usize = 8 << 20;
const RANDOM_OPS: usize = 4 << 20;
const WORKLOADS: [&str; 3] = ["scan", "random-read", "random-rmw"];

/// How the vector is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// A `Vec`.
    Native,
    /// `local`/`local_mut`: the whole vector as one slice.
    Slice,
    /// Line guards.
    Lines,
    /// Element by element.
    Elem,
}

impl System for Access {
    fn name(&self) -> &'static str {
        match self {
            Access::Native => "native",
            Access::Slice => "tidepool-far-slice",
            Access::Lines => "tidepool-far-lines",
            Access::Elem => "tidepool-far-elem",
        }
    }
}

const SYSTEMS: [Access; 4] = [Access::Native, Access::Slice, Access::Lines, Access::Elem];

/// The three workloads, timed together on one vector (one sample reads all three).
#[derive(Debug)]
struct Overhead;

impl Workload for Overhead {
    fn name(&self) -> &str {
        "overhead against a Vec"
    }

    fn params(&self) -> Vec<(&'static str, f64)> {
        vec![("local_ratio", 1.0), ("elems", ELEMS as f64)]
    }
}

/// Random indices below `n` (SplitMix64 of `i`).
fn index(i: u64, n: usize) -> usize {
    (splitmix64(i.wrapping_add(11)) % n as u64) as usize
}

/// Nanoseconds per element of `f` (which returns how many elements it did).
fn time(f: impl FnOnce() -> Result<usize>) -> Result<f64> {
    let t0 = Instant::now();
    let n = f()?;
    Ok(t0.elapsed().as_nanos() as f64 / n as f64)
}

/// One round: ns/element of every workload on `system`; checksums must agree across systems.
fn round(system: Access, idx: &[usize]) -> Result<[(f64, u64); 3]> {
    let far = Far::new(Arc::new(tidepool_store::LocalStore::new()));
    let section = Section::new(SectionConfig::new(Structure::Direct, 4096, ELEMS * 8))?;
    let v: FarVec<u64> = FarVec::new(&far, &section, ELEMS)?;
    let mut plain: Vec<u64> = Vec::new();
    if system == Access::Native {
        plain = (0..ELEMS as u64).collect();
    } else {
        v.fill_with(|i| i as u64)?;
        v.load_all()?;
    }
    let mut out = [(0.0, 0u64); 3];
    let mut sum = 0u64;
    out[0].0 = time(|| {
        sum = match system {
            Access::Native => black_box(&plain).iter().sum(),
            Access::Slice => v.local().context("not one slice")?.iter().sum(),
            Access::Lines => {
                let mut s = 0u64;
                for l in v.line_iter() {
                    s += l?.iter().sum::<u64>();
                }
                s
            }
            _ => v.iter().try_fold(0u64, |a, x| x.map(|x| a + x))?,
        };
        Ok(ELEMS)
    })?;
    out[0].1 = sum;
    out[1].0 = time(|| {
        sum = 0;
        match system {
            Access::Native => idx.iter().for_each(|&i| sum += plain[i]),
            Access::Slice => {
                let s = v.local().context("not one slice")?;
                idx.iter().for_each(|&i| sum += s[i]);
            }
            Access::Lines => {
                for &i in idx {
                    let l = v.line(i)?;
                    sum += l[i - l.first];
                }
            }
            _ => {
                for &i in idx {
                    sum += v.get(i)?;
                }
            }
        }
        Ok(idx.len())
    })?;
    out[1].1 = sum;
    out[2].0 = time(|| {
        match system {
            Access::Native => idx.iter().for_each(|&i| plain[i] += 1),
            Access::Slice => {
                let mut s = v.local_mut().context("not one slice")?;
                idx.iter().for_each(|&i| s[i] += 1);
            }
            Access::Lines => {
                for &i in idx {
                    let mut l = v.line_mut(i)?;
                    let first = l.first;
                    l[i - first] += 1;
                }
            }
            _ => {
                for &i in idx {
                    v.update(i, |x| *x += 1)?;
                }
            }
        }
        Ok(idx.len())
    })?;
    out[2].1 = if system == Access::Native {
        plain.iter().sum()
    } else {
        v.local().context("not one slice")?.iter().sum()
    };
    Ok(out)
}

/// Part (c): see the module docs.
pub(super) fn run(ctx: &mut Ctx, rounds: usize) -> Result<()> {
    let idx: Vec<usize> = (0..RANDOM_OPS as u64).map(|i| index(i, ELEMS)).collect();
    // The round and the sums its first system computed: every system must agree.
    let mut sums: Option<(Pass, Vec<u64>)> = None;
    let samples = Matrix::new(&SYSTEMS, &[Overhead], rounds)
        .turns(Turns::Rotate)
        .run(ctx, |_, pass, _, &system| {
            let got = round(system, &idx)?;
            let these: Vec<u64> = got.iter().map(|g| g.1).collect();
            match &sums {
                Some((p, s)) if *p == pass && *s != these => anyhow::bail!(
                    "{} computed different sums: {these:?} against {s:?}",
                    system.name()
                ),
                Some((p, _)) if *p == pass => {}
                _ => sums = Some((pass, these)),
            }
            let mut sample = Sample::new();
            for (w, (ns, _)) in WORKLOADS.iter().zip(got) {
                sample = sample
                    .median("ns_per_elem", "ns", ns)
                    .in_workload(format!("overhead-{w}"));
            }
            Ok(sample)
        })?;
    samples.report_by(ctx, |r| (r.system.clone(), r.workload.clone()));
    Ok(())
}
