//! The `far` suite, part (b): DataFrame-style analytics over far vectors on a real
//! `tidepool node`, offloaded to the node against fetched and computed here.
//!
//! A table of `rows` rows in three far columns: `region` (u32, 64 groups), `qty` (u32) and
//! `price` (f64), 16 bytes a row. The query is
//! `df[df.qty > 20].groupby("region").price.agg(["sum", "min", "max", "count"])`: a filter, a
//! group-by and aggregations over one column that one pass computes together. Systems:
//! - `tidepool-far-offload`: the query runs on the node (`Offload::Always`);
//! - `tidepool-far-fetch`: the lines come here and the query runs here (`Offload::Never`),
//!   through sections of the ratio's size, prefetching as usual;
//! - `tidepool-far-auto`: the cost model decides (`Offload::Auto`); where it ran is reported;
//! - `native`: plain vectors, all local.
//!
//! Each system gets a fresh client and freshly written columns, runs the query [`RUNS`] times
//! and reports the median, in rows per second. Every answer is checked against the native one.

use crate::data::splitmix64;
use crate::harness::{median, Ctx, Matrix, Pass, Sample, System, Turns, Workload};
use crate::node::NodeProcess;
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;
use tidepool_far::{Cmp, Far, FarVec, Offload, Query, Ran, Section, SectionConfig, Structure};

pub(super) const RATIOS: [f64; 3] = [0.1, 0.5, 1.0];

/// Where the query runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
    /// Far columns, the query on the node.
    Offload,
    /// Far columns, the lines fetched and the query run here.
    Fetch,
    /// Far columns, the cost model choosing.
    Auto,
    /// Plain vectors, all local (at 100% only).
    Native,
}

impl System for Where {
    fn name(&self) -> &'static str {
        match self {
            Where::Offload => "tidepool-far-offload",
            Where::Fetch => "tidepool-far-fetch",
            Where::Auto => "tidepool-far-auto",
            Where::Native => "native",
        }
    }
}

const SYSTEMS: [Where; 4] = [Where::Offload, Where::Fetch, Where::Auto, Where::Native];

/// The query at one local-memory ratio of the columns' footprint.
#[derive(Debug, Clone, Copy)]
struct QueryAt {
    ratio: f64,
    rows: usize,
    footprint: u64,
}

impl QueryAt {
    fn pct(&self) -> u64 {
        (self.ratio * 100.0).round() as u64
    }
}

impl Workload for QueryAt {
    fn name(&self) -> &str {
        "query"
    }

    fn on(&self, system: &str) -> String {
        format!("query on {system} at {}% local", self.pct())
    }

    fn params(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("local_ratio", self.pct() as f64 / 100.0),
            ("rows", self.rows as f64),
            ("footprint_mib", (self.footprint >> 20) as f64),
        ]
    }
}
/// Queries per system and round; the first one may be the cost model's exploration.
const RUNS: usize = 4;
const GROUPS: u32 = 64;
const MIN_QTY: u32 = 20;

/// Row `i`: (region, qty, price), from SplitMix64 of `i`.
fn row(i: u64) -> (u32, u32, f64) {
    let z = splitmix64(i.wrapping_add(7));
    (
        (z % GROUPS as u64) as u32,
        ((z >> 8) % 100) as u32,
        ((z >> 20) % 100_000) as f64 / 100.0,
    )
}

/// Per group: sum, min, max, count.
type Groups = Vec<(f64, f64, f64, u64)>;

fn native(rows: usize) -> (f64, Groups) {
    let (mut region, mut qty, mut price) = (
        Vec::with_capacity(rows),
        Vec::with_capacity(rows),
        Vec::with_capacity(rows),
    );
    for i in 0..rows as u64 {
        let (r, q, p) = row(i);
        region.push(r);
        qty.push(q);
        price.push(p);
    }
    let mut times = Vec::new();
    let mut out = Vec::new();
    for _ in 0..RUNS {
        let t0 = Instant::now();
        let mut g = vec![(0.0, f64::INFINITY, f64::NEG_INFINITY, 0u64); GROUPS as usize];
        for i in 0..rows {
            if qty[i] > MIN_QTY {
                let a = &mut g[region[i] as usize];
                a.0 += price[i];
                a.1 = a.1.min(price[i]);
                a.2 = a.2.max(price[i]);
                a.3 += 1;
            }
        }
        times.push(t0.elapsed().as_secs_f64());
        out = std::hint::black_box(g);
    }
    (rows as f64 / median(&mut times), out)
}

/// Writes a column a line at a time through its section (whole lines: nothing fetched).
fn column<T>(
    far: &Far,
    section: &Rc<Section>,
    rows: usize,
    f: impl Fn(u64) -> T,
) -> Result<FarVec<T>>
where
    T: tidepool_far::Elem,
{
    let v: FarVec<T> = FarVec::new(far, section, rows)?;
    v.fill_with(|i| f(i as u64))?;
    Ok(v)
}

/// Rows per second of the query over far columns on the node at `url`, with `local` bytes of
/// sections; where the last run ran; and the share of the time spent waiting on fetches.
fn far(url: &str, rows: usize, local: u64, how: Offload, want: &Groups) -> Result<(f64, Ran, f64)> {
    let far = Far::new(tidepool_store::open(url)?);
    // Lines of 1024 elements: 4 KiB for the u32 columns, 8 KiB for price; each column's
    // section is its share of the budget (half for price, a quarter each for the others).
    let section = |line: usize, share: u64| {
        Section::new(SectionConfig::new(
            Structure::Full,
            line,
            ((share as usize).max(4 * line) / line) * line,
        ))
    };
    let (rs, qs, ps) = (
        section(4096, local / 4)?,
        section(4096, local / 4)?,
        section(8192, local / 2)?,
    );
    let region = column(&far, &rs, rows, |i| row(i).0)?;
    let qty = column(&far, &qs, rows, |i| row(i).1)?;
    let price = column(&far, &ps, rows, |i| row(i).2)?;
    let mut times = Vec::new();
    let mut ran = Ran::Local;
    let fetching = || -> u64 { [&rs, &qs, &ps].iter().map(|s| s.stats().fetch_nanos).sum() };
    let (wait0, t_all) = (fetching(), Instant::now());
    for _ in 0..RUNS {
        let t0 = Instant::now();
        let mut q = Query::new();
        let (r, n, p) = (q.column(&region)?, q.column(&qty)?, q.column(&price)?);
        q.filter(n, Cmp::Gt, MIN_QTY).group_by(r, GROUPS);
        let (sum, min, max, count) = (q.sum(p), q.min(p), q.max(p), q.count());
        let a = q.run(how)?;
        times.push(t0.elapsed().as_secs_f64());
        ran = a.ran;
        let got: Groups = (0..a.groups())
            .map(|g| {
                (
                    a.get(g, &sum),
                    a.get(g, &min),
                    a.get(g, &max),
                    a.get(g, &count),
                )
            })
            .collect();
        if &got != want {
            bail!("the query's answer ({ran:?}) differs from the native one");
        }
    }
    let wait = (fetching() - wait0) as f64 / t_all.elapsed().as_nanos() as f64;
    Ok((rows as f64 / median(&mut times), ran, wait))
}

/// Part (b): see the module docs. `rows` rows, `rounds` rounds, one step per round and ratio.
pub(super) fn run(ctx: &mut Ctx, rows: usize, rounds: usize) -> Result<()> {
    let footprint = rows as u64 * 16;
    // Room for the columns, and for a fresh set per system while the old one is freed.
    let node = NodeProcess::start(&(footprint * 4).to_string())?;
    // A throughput workload: the node gets a CPU of its own, as a memory node would.
    ctx.opts
        .placement
        .for_workload(false)
        .pin_server(node.pid())?;
    let url = format!("node://far-query@{}", node.addr);
    let mut placed: BTreeMap<u64, Vec<Ran>> = Default::default();
    let mut waits: BTreeMap<u64, Vec<f64>> = Default::default();
    let (native_rate, want) = native(rows);
    let workloads = RATIOS.map(|ratio| QueryAt {
        ratio,
        rows,
        footprint,
    });
    let samples = Matrix::new(&SYSTEMS, &workloads, rounds)
        .turns(Turns::Rotate)
        .only(|w, &s| s != Where::Native || w.ratio == 1.0)
        .note_failures()
        .run(ctx, |_, pass, w, &s| {
            let how = match s {
                Where::Offload => Offload::Always,
                Where::Fetch => Offload::Never,
                Where::Auto => Offload::Auto,
                Where::Native => {
                    // The first round's native run is the one that gave the answers.
                    let v = if pass == Pass::Round(0) {
                        native_rate
                    } else {
                        native(rows).0
                    };
                    return Ok(Sample::new().median("rows_per_s", "rows/s", v));
                }
            };
            let local = (footprint as f64 * w.ratio) as u64;
            let (v, ran, wait) = far(&url, rows, local, how, &want)?;
            if how == Offload::Never {
                waits.entry(w.pct()).or_default().push(wait);
            }
            if how == Offload::Auto {
                placed.entry(w.pct()).or_default().push(ran);
            }
            Ok(Sample::new().median("rows_per_s", "rows/s", v))
        })?;
    samples.report_by(ctx, |r| {
        (
            r.system.clone(),
            r.params
                .get("local_ratio")
                .map(|x| (x * 100.0).round() as u64),
        )
    });
    for (pct, mut w) in waits {
        let w = median(&mut w);
        ctx.note(format!(
            "query at {pct}% local: fetching waits for lines {:.0}% of its time (streams fetch \
             ahead on a thread of their own, which shares the client's CPU here)",
            w * 100.0
        ));
    }
    for (pct, ran) in placed {
        let node = ran.iter().filter(|&&r| r == Ran::Node).count();
        ctx.note(format!(
            "query at {pct}% local: tidepool-far-auto ran on the node in {node} of {} rounds",
            ran.len()
        ));
    }
    Ok(())
}
