//! The rounds x systems loop: every system measured on every workload, round after round, and
//! the rounds' samples combined into report rows.
//!
//! Several short rounds beat one long one on a shared machine: alternating systems spreads
//! drift over all of them, and the median drops the round a neighbour disturbed.

use super::ctx::Ctx;
use crate::report::Row;
use anyhow::Result;
use hdrhistogram::Histogram;
use std::fmt;

/// A system a suite compares: one way of doing the work (a server, an allocator, a runtime).
pub trait System {
    /// The name the report's rows carry (`tidepool-node`, `redis`, `linux-zram`).
    fn name(&self) -> &'static str;

    /// Server processes of the system, which the harness pins where the placement puts
    /// servers for each workload. None by default: the system runs in its client.
    fn server_pids(&self) -> Vec<u32> {
        Vec::new()
    }
}

/// One workload at one parameter point.
pub trait Workload {
    /// The name the report's rows carry (`get-batched`, `seq-scan`).
    fn name(&self) -> &str;

    /// How progress and failure notes name a run of this workload on `system`.
    fn on(&self, system: &str) -> String {
        format!("{} on {system}", self.name())
    }

    /// The parameter point, as the report's `params`.
    fn params(&self) -> Vec<(&'static str, f64)> {
        Vec::new()
    }

    /// The params of rows of `metric` (by default all of [`Workload::params`]).
    fn params_for(&self, metric: &str) -> Vec<(&'static str, f64)> {
        let _ = metric;
        self.params()
    }

    /// A latency workload: servers are placed by `Placement::for_workload(true)`.
    fn latency(&self) -> bool {
        false
    }
}

/// The order systems take within a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turns {
    /// Every round takes the systems in the order they were declared.
    InOrder,
    /// Round `r` starts at the `r`-th of the systems that run the workload and wraps around,
    /// so no system is always first (or always warm).
    Rotate,
    /// Each system runs all its rounds before the next one starts: for measurements that
    /// start (and break) servers of their own, one system at a time.
    Consecutive,
}

/// Which pass over the matrix a measurement belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// The unrecorded pass before the rounds (see [`Matrix::warm_up`]).
    WarmUp,
    /// Round `n`, from 0.
    Round(usize),
}

/// How a metric's readings over the rounds become one value.
#[derive(Debug, Clone)]
enum Combine {
    /// The median of the rounds.
    Median(f64),
    /// The last round's (for figures that depend on the data, not on time).
    Last(f64),
    /// Totals over the rounds divided by their operations; no row if no operation was counted.
    PerOp { total: f64, ops: u64 },
    /// A latency histogram in nanoseconds, pooled over the rounds: rows `p50_us` and `p99_us`.
    Latency(Box<Histogram<u64>>),
}

/// One reading of a [`Sample`].
#[derive(Debug, Clone)]
struct Reading {
    /// A system other than the one measured, when one measurement times several.
    system: Option<&'static str>,
    /// A workload other than the one measured, when one measurement times several.
    workload: Option<String>,
    metric: String,
    unit: &'static str,
    value: Combine,
}

/// What measuring one system on one workload in one round gave: metrics and their values.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    readings: Vec<Reading>,
}

impl Sample {
    pub fn new() -> Sample {
        Sample::default()
    }

    fn push(mut self, metric: impl Into<String>, unit: &'static str, value: Combine) -> Self {
        self.readings.push(Reading {
            system: None,
            workload: None,
            metric: metric.into(),
            unit,
            value,
        });
        self
    }

    /// A figure reported as its median over the rounds.
    pub fn median(self, metric: impl Into<String>, unit: &'static str, value: f64) -> Self {
        self.push(metric, unit, Combine::Median(value))
    }

    /// A figure reported as the last round's.
    pub fn last(self, metric: impl Into<String>, unit: &'static str, value: f64) -> Self {
        self.push(metric, unit, Combine::Last(value))
    }

    /// A cost per operation: `total` over `ops`, each summed over the rounds.
    pub fn per_op(
        self,
        metric: impl Into<String>,
        unit: &'static str,
        total: f64,
        ops: u64,
    ) -> Self {
        self.push(metric, unit, Combine::PerOp { total, ops })
    }

    /// Per-operation latencies (nanoseconds), pooled over the rounds and reported as `p50_us`
    /// and `p99_us`.
    pub fn latency(self, ns: Histogram<u64>) -> Self {
        self.push("latency", "us", Combine::Latency(Box::new(ns)))
    }

    /// Files the last reading under `system` instead of the system measured (one
    /// measurement that times two systems side by side).
    pub fn of(mut self, system: &'static str) -> Self {
        if let Some(r) = self.readings.last_mut() {
            r.system = Some(system);
        }
        self
    }

    /// Files the last reading under `workload` instead of the workload measured (one
    /// measurement that times several workloads).
    pub fn in_workload(mut self, workload: impl Into<String>) -> Self {
        if let Some(r) = self.readings.last_mut() {
            r.workload = Some(workload.into());
        }
        self
    }
}

/// The median of `v` (0 if empty); sorts `v`.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

/// The geometric mean of `v` (the mean of ratios that treats 2x and 0.5x alike); NaN if empty.
pub fn geomean(v: &[f64]) -> f64 {
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
}

/// Progress steps [`Matrix::run`] takes for `workloads` workloads and `rounds` rounds: one per
/// workload and round.
pub fn matrix_steps(workloads: usize, rounds: usize) -> u64 {
    (workloads * rounds) as u64
}

/// Which (workload, system) pairs a [`Matrix`] measures.
type Runs<'a, S, W> = Box<dyn Fn(&W, &S) -> bool + 'a>;

/// A rounds x systems x workloads plan.
pub struct Matrix<'a, S, W> {
    systems: &'a [S],
    workloads: &'a [W],
    rounds: usize,
    turns: Turns,
    warm_up: bool,
    note_failures: bool,
    runs: Runs<'a, S, W>,
}

impl<S, W> fmt::Debug for Matrix<'_, S, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Matrix")
            .field("systems", &self.systems.len())
            .field("workloads", &self.workloads.len())
            .field("rounds", &self.rounds)
            .field("turns", &self.turns)
            .field("warm_up", &self.warm_up)
            .field("note_failures", &self.note_failures)
            .finish()
    }
}

impl<'a, S: System, W: Workload> Matrix<'a, S, W> {
    /// Every system on every workload, `rounds` times, systems in declared order; a failed
    /// measurement fails the run.
    pub fn new(systems: &'a [S], workloads: &'a [W], rounds: usize) -> Self {
        Matrix {
            systems,
            workloads,
            rounds,
            turns: Turns::InOrder,
            warm_up: false,
            note_failures: false,
            runs: Box::new(|_, _| true),
        }
    }

    /// The order systems take within a round.
    pub fn turns(mut self, turns: Turns) -> Self {
        self.turns = turns;
        self
    }

    /// One unrecorded pass over every workload and system before the rounds: fresh
    /// connections grow their TCP windows and allocators settle over the first second of
    /// traffic, and that would tilt whichever system and round came first.
    pub fn warm_up(mut self) -> Self {
        self.warm_up = true;
        self
    }

    /// A failed measurement becomes a note and the rest still runs (the kernel's OOM killer
    /// sometimes fires on a small cgroup): the cell has one sample fewer.
    pub fn note_failures(mut self) -> Self {
        self.note_failures = true;
        self
    }

    /// Only the (workload, system) pairs for which `runs` holds are measured.
    pub fn only(mut self, runs: impl Fn(&W, &S) -> bool + 'a) -> Self {
        self.runs = Box::new(runs);
        self
    }

    /// The systems that run workload `w`, in the order round `round` takes them.
    fn order(&self, w: &W, round: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.systems.len())
            .filter(|&s| (self.runs)(w, &self.systems[s]))
            .collect();
        if self.turns == Turns::Rotate && !order.is_empty() {
            let n = order.len();
            order.rotate_left(round % n);
        }
        order
    }

    /// Pins system `s`'s servers where `w`'s placement puts them.
    fn place(&self, ctx: &Ctx, w: &W, s: &S) -> Result<()> {
        let placement = ctx.opts.placement.for_workload(w.latency());
        s.server_pids()
            .into_iter()
            .try_for_each(|p| placement.pin_server(p))
    }

    /// Runs the plan: `measure` is called for each system on each workload in each round
    /// (and once before, with [`Pass::WarmUp`], if asked for). Returns the samples.
    pub fn run(
        &self,
        ctx: &mut Ctx,
        mut measure: impl FnMut(&mut Ctx, Pass, &W, &S) -> Result<Sample>,
    ) -> Result<Samples<'a, S, W>> {
        let mut cells: Vec<Vec<Vec<Sample>>> = self
            .workloads
            .iter()
            .map(|_| self.systems.iter().map(|_| Vec::new()).collect())
            .collect();
        if self.warm_up {
            for w in self.workloads {
                for s in self.order(w, 0).into_iter().map(|s| &self.systems[s]) {
                    ctx.step(format!("warming up {}", w.on(s.name())));
                    self.place(ctx, w, s)?;
                    measure(ctx, Pass::WarmUp, w, s)?;
                }
            }
        }
        let mut one = |ctx: &mut Ctx, round: usize, wi: usize, si: usize| -> Result<()> {
            let (w, s) = (&self.workloads[wi], &self.systems[si]);
            let what = w.on(s.name());
            ctx.step(format!("round {} of {}: {what}", round + 1, self.rounds));
            self.place(ctx, w, s)?;
            match measure(ctx, Pass::Round(round), w, s) {
                Ok(sample) => cells[wi][si].push(sample),
                Err(e) if self.note_failures => {
                    ctx.note(format!("{what}, round {}: {e:#}", round + 1))
                }
                Err(e) => return Err(e.context(what)),
            }
            Ok(())
        };
        if self.turns == Turns::Consecutive {
            for (wi, w) in self.workloads.iter().enumerate() {
                for si in self.order(w, 0) {
                    for round in 0..self.rounds {
                        one(ctx, round, wi, si)?;
                        ctx.advance();
                    }
                }
            }
        } else {
            for round in 0..self.rounds {
                for (wi, w) in self.workloads.iter().enumerate() {
                    for si in self.order(w, round) {
                        one(ctx, round, wi, si)?;
                    }
                    ctx.advance();
                }
            }
        }
        Ok(Samples {
            systems: self.systems,
            workloads: self.workloads,
            cells,
        })
    }
}

/// Every round's sample of every (workload, system) pair of a [`Matrix`].
#[derive(Debug)]
pub struct Samples<'a, S, W> {
    systems: &'a [S],
    workloads: &'a [W],
    /// `cells[workload][system]`: one sample per round that measured it.
    cells: Vec<Vec<Vec<Sample>>>,
}

impl<S: System, W: Workload> Samples<'_, S, W> {
    /// The report's rows: per workload, then per system (both in declared order), each
    /// metric in the order it was first read, combined over the rounds.
    pub fn rows(&self) -> Vec<Row> {
        let mut rows = Vec::new();
        for (w, by_system) in self.workloads.iter().zip(&self.cells) {
            for (s, samples) in self.systems.iter().zip(by_system) {
                rows.extend(combine(s.name(), w, samples));
            }
        }
        rows
    }

    /// Adds [`Samples::rows`] to the report.
    pub fn report(&self, ctx: &mut Ctx) {
        ctx.report.results.extend(self.rows());
    }

    /// Adds [`Samples::rows`] to the report in the order of `key` (stable: rows with equal
    /// keys keep their order).
    pub fn report_by<K: Ord>(&self, ctx: &mut Ctx, key: impl FnMut(&Row) -> K) {
        let mut rows = self.rows();
        rows.sort_by_key(key);
        ctx.report.results.extend(rows);
    }
}

/// One cell's rows: its readings grouped by (system, workload, metric) in first-read order.
fn combine(system: &'static str, w: &impl Workload, samples: &[Sample]) -> Vec<Row> {
    // (system, workload, metric, unit) -> readings, in first-read order.
    type Key = (&'static str, String, String, &'static str);
    let mut groups: Vec<(Key, Vec<&Combine>)> = Vec::new();
    for r in samples.iter().flat_map(|s| &s.readings) {
        let key = (
            r.system.unwrap_or(system),
            r.workload.clone().unwrap_or_else(|| w.name().to_string()),
            r.metric.clone(),
            r.unit,
        );
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(&r.value),
            None => groups.push((key, vec![&r.value])),
        }
    }
    let mut rows = Vec::new();
    for ((system, workload, metric, unit), values) in groups {
        let mut row = |metric: &str, value: f64| {
            rows.push(Row {
                system: system.to_string(),
                workload: workload.clone(),
                metric: metric.to_string(),
                value,
                unit: unit.to_string(),
                params: w
                    .params_for(metric)
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            })
        };
        match values[0] {
            Combine::Median(_) => {
                let mut v: Vec<f64> = values
                    .iter()
                    .filter_map(|c| match c {
                        Combine::Median(x) => Some(*x),
                        _ => None,
                    })
                    .collect();
                row(&metric, median(&mut v));
            }
            Combine::Last(_) => {
                if let Some(Combine::Last(x)) = values.last() {
                    row(&metric, *x);
                }
            }
            Combine::PerOp { .. } => {
                let (mut total, mut ops) = (0.0, 0);
                for c in &values {
                    if let Combine::PerOp { total: t, ops: n } = c {
                        total += t;
                        ops += n;
                    }
                }
                if ops > 0 {
                    row(&metric, total / ops as f64);
                }
            }
            Combine::Latency(first) => {
                let mut pooled = (**first).clone();
                for c in &values[1..] {
                    if let Combine::Latency(h) = c {
                        pooled
                            .add(&**h)
                            .expect("histograms of one metric share bounds");
                    }
                }
                let us = |q: f64| pooled.value_at_quantile(q) as f64 / 1000.0;
                row("p50_us", us(0.5));
                row("p99_us", us(0.99));
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::placement::{BenchOpts, Placement};
    use crate::report::Report;

    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Sys(&'static str);

    impl System for Sys {
        fn name(&self) -> &'static str {
            self.0
        }
    }

    struct Work(&'static str);

    impl Workload for Work {
        fn name(&self) -> &str {
            self.0
        }
        fn params(&self) -> Vec<(&'static str, f64)> {
            vec![("n", 1.0)]
        }
    }

    fn ctx(rounds_dir: &str) -> Ctx {
        Ctx {
            opts: BenchOpts {
                quick: true,
                out: std::env::temp_dir().join(rounds_dir),
                placement: Placement::Free,
                mimalloc_bench: None,
            },
            report: Report::new("test", true),
            progress: indicatif::ProgressBar::hidden(),
        }
    }

    #[test]
    fn rotation_alternates_systems_round_by_round_and_rows_are_medians() {
        let systems = [Sys("a"), Sys("b"), Sys("c")];
        let workloads = [Work("w")];
        let mut ctx = ctx("matrix-rotate");
        let mut seen = Vec::new();
        let samples = Matrix::new(&systems, &workloads, 3)
            .turns(Turns::Rotate)
            .only(|_, s| s.0 != "c")
            .run(&mut ctx, |_, pass, _, s| {
                seen.push((pass, s.0));
                let Pass::Round(r) = pass else { unreachable!() };
                Ok(Sample::new().median("x", "u", r as f64 * 10.0))
            })
            .unwrap();
        let order: Vec<&str> = seen.iter().map(|p| p.1).collect();
        assert_eq!(order, ["a", "b", "b", "a", "a", "b"]);
        let rows = samples.rows();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].system.as_str(), rows[0].value), ("a", 10.0));
        assert_eq!(rows[0].params.get("n"), Some(&1.0));
    }

    #[test]
    fn failures_become_notes_when_asked_and_latency_pools() {
        let systems = [Sys("a")];
        let workloads = [Work("w")];
        let mut ctx = ctx("matrix-notes");
        let samples = Matrix::new(&systems, &workloads, 2)
            .note_failures()
            .run(&mut ctx, |_, pass, _, _| {
                if pass == Pass::Round(0) {
                    anyhow::bail!("boom");
                }
                let mut h = Histogram::new_with_bounds(100, 10_000_000_000, 3).unwrap();
                h.record(1024).unwrap();
                Ok(Sample::new()
                    .latency(h)
                    .per_op("cpu", "us", 4.0, 2)
                    .last("far", "bytes", 7.0)
                    .of("other"))
            })
            .unwrap();
        assert_eq!(ctx.report.notes, ["w on a, round 1: boom"]);
        let rows: Vec<(String, String, f64)> = samples
            .rows()
            .into_iter()
            .map(|r| (r.system, r.metric, r.value))
            .collect();
        let names: Vec<(&str, &str)> = rows
            .iter()
            .map(|(s, m, _)| (s.as_str(), m.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("a", "p50_us"),
                ("a", "p99_us"),
                ("a", "cpu"),
                ("other", "far")
            ]
        );
        // 1024 ns, to the histogram's three significant figures.
        assert!((rows[0].2 - 1.024).abs() < 0.1, "{rows:?}");
        assert_eq!((rows[2].2, rows[3].2), (2.0, 7.0));
    }
}
