//! What a suite is to the harness, and what it gets while it runs.

use super::placement::BenchOpts;
use crate::report::Report;
use anyhow::Result;
use indicatif::ProgressBar;

/// What a suite gets while it runs.
#[derive(Debug)]
pub struct Ctx {
    pub opts: BenchOpts,
    pub report: Report,
    pub progress: ProgressBar,
}

impl Ctx {
    /// Records that a peer or measurement could not run, and why; the rest still reports.
    pub fn note(&mut self, msg: impl Into<String>) {
        let msg = msg.into();
        // Straight to stderr: the progress bar hides its own output when not on a terminal.
        self.progress.suspend(|| eprintln!("note: {msg}"));
        self.report.notes.push(msg);
    }

    /// Says what the suite is doing now, beside the progress bar.
    pub fn step(&self, what: impl Into<String>) {
        self.progress.set_message(what.into());
    }

    /// One of the suite's [`Suite::steps`] is done.
    pub fn advance(&self) {
        self.progress.inc(1);
    }
}

/// One benchmark suite.
pub trait Suite {
    fn name(&self) -> &'static str;
    fn about(&self) -> &'static str;
    /// How many progress steps `run` will take.
    fn steps(&self, opts: &BenchOpts) -> u64;
    fn run(&self, ctx: &mut Ctx) -> Result<()>;
}
