//! One workload of the suite measured everywhere: natively first (its peak RSS sets local
//! memory, its answer is the one every other run must give), then under each constrained
//! system at each share of local memory: `tidepool-tuned` after its tuning and beside
//! `tidepool-default` (`paired.rs`), `linux-zram` once more if the kernel OOM-killed it.

use super::{
    local_bytes, paired, pandas, python_dict, ratio_wanted, redis, runtimes, sort, tuned, Launcher,
    Measured, Sizes, System, RATIOS,
};
use crate::harness::Ctx;
use anyhow::Result;
use std::ffi::OsString;
use std::path::Path;

/// What every run of the suite's workloads reads.
pub(super) struct Inputs<'a> {
    pub(super) s: &'a Sizes,
    /// The suite's work directory.
    pub(super) dir: &'a Path,
    pub(super) python: &'a Path,
    /// The file `sort` sorts.
    pub(super) sort_file: &'a Path,
}

/// One workload's runs, each on a port of its own.
pub(super) struct Runs<'a> {
    workload: &'static str,
    inputs: &'a Inputs<'a>,
    /// A runtime workload's command line.
    runtime_argv: Option<Vec<OsString>>,
    port: u16,
}

/// The native run's figures every other run is measured against.
struct Native {
    peak: u64,
    want: Option<String>,
}

impl<'a> Runs<'a> {
    /// The runs of `workload` (`runtime_argv`: a runtime workload's command line).
    pub(super) fn new(
        workload: &'static str,
        inputs: &'a Inputs<'a>,
        runtime_argv: Option<Vec<OsString>>,
    ) -> Runs<'a> {
        Runs {
            workload,
            inputs,
            runtime_argv,
            port: 17_000,
        }
    }

    /// Runs the workload once under `system` with `local` bytes.
    fn run(&mut self, l: &Launcher, system: System, local: u64) -> Result<Measured> {
        let (i, workload, port) = (self.inputs, self.workload, self.port);
        let m = match workload {
            "redis" => Measured::Redis(redis(l, system, local, i.s, port, i.dir)?),
            "pandas-groupby" => {
                Measured::Program(pandas(l, system, local, i.python, i.s.pandas_rows, i.dir)?)
            }
            "sort" => Measured::Program(sort(l, system, local, i.sort_file, i.dir)?),
            "go-map" | "jvm-hashmap" | "node-map" => Measured::Program(runtimes::run(
                l,
                system,
                local,
                workload,
                self.runtime_argv.as_deref().unwrap_or_default(),
            )?),
            _ => Measured::Program(python_dict(
                l,
                system,
                local,
                i.python,
                i.s.dict_strings,
                i.dir,
            )?),
        };
        self.port += 1;
        Ok(m)
    }

    /// Measures the workload natively, then under each of `systems` at each share of local
    /// memory wanted.
    pub(super) fn measure(
        mut self,
        ctx: &mut Ctx,
        l: &mut Launcher,
        systems: &[System],
    ) -> Result<()> {
        let workload = self.workload;
        let native = self.run(l, System::Native, 0)?;
        let base = Native {
            peak: native.peak_rss(),
            want: native.answer(),
        };
        native.report(ctx, System::Native, workload, 1.0, base.peak, None)?;
        ctx.advance();
        // tidepool-default is measured beside tidepool-tuned when both are (`paired.rs`).
        let pairing =
            systems.contains(&System::TidepoolTuned) && systems.contains(&System::TidepoolDefault);
        for ratio in RATIOS.into_iter().filter(|&r| ratio_wanted(r)) {
            let local = local_bytes(base.peak, ratio);
            for &system in systems {
                if pairing && system == System::TidepoolDefault {
                    continue;
                }
                if system == System::TidepoolTuned && !self.tune(ctx, l, ratio) {
                    ctx.advance();
                    if pairing {
                        let sys = System::TidepoolDefault;
                        let m = self.run(l, sys, local)?;
                        m.report(ctx, sys, workload, ratio, base.peak, base.want.as_deref())?;
                        ctx.advance();
                    }
                    continue;
                }
                if pairing && system == System::TidepoolTuned {
                    self.paired(ctx, l, ratio, local, &base)?;
                    continue;
                }
                self.single(ctx, l, system, (ratio, local), &base)?;
            }
        }
        Ok(())
    }

    /// Has `tidepool tune` make tidepool-tuned's profile on a tenth of the input at `ratio`,
    /// for the launcher to run with; `false` (said in a note) if it could not.
    fn tune(&self, ctx: &mut Ctx, l: &mut Launcher, ratio: f64) -> bool {
        let (i, workload) = (self.inputs, self.workload);
        ctx.step(format!(
            "{workload}: tidepool tune on a tenth of the input at {:.0}% local",
            ratio * 100.0
        ));
        match tuned::tune(l, workload, ratio, (i.s, ctx.opts.quick), i.dir, i.python) {
            Ok(profile) => {
                ctx.note(format!(
                    "{workload} at {:.0}% local: tidepool-tuned's profile: {}",
                    ratio * 100.0,
                    tuned::summary(&profile)
                ));
                l.profile = Some(profile);
                true
            }
            Err(e) => {
                ctx.note(format!(
                    "{workload} at {:.0}% local: tidepool-tuned skipped: {e:#}",
                    ratio * 100.0
                ));
                false
            }
        }
    }

    /// tidepool-default and tidepool-tuned in turns, a few runs each; each reported by its
    /// median run.
    fn paired(
        &mut self,
        ctx: &mut Ctx,
        l: &Launcher,
        ratio: f64,
        local: u64,
        base: &Native,
    ) -> Result<()> {
        let workload = self.workload;
        let pair = [System::TidepoolDefault, System::TidepoolTuned];
        let n = paired::runs(ctx.opts.quick);
        let mut runs: [Vec<Measured>; 2] = Default::default();
        for i in 0..n {
            for (k, sys) in pair.into_iter().enumerate() {
                ctx.step(format!(
                    "{workload}: {} at {:.0}% local, run {} of {n}",
                    sys.name(),
                    ratio * 100.0,
                    i + 1
                ));
                runs[k].push(self.run(l, sys, local)?);
            }
        }
        if n > 1 {
            let shown = [
                (pair[0].name(), runs[0].as_slice()),
                (pair[1].name(), runs[1].as_slice()),
            ];
            paired::note(ctx, workload, ratio, &shown);
        }
        for (sys, ms) in pair.into_iter().zip(runs) {
            paired::median(ms).report(
                ctx,
                sys,
                workload,
                ratio,
                base.peak,
                base.want.as_deref(),
            )?;
            ctx.advance();
        }
        Ok(())
    }

    /// One run under `system` at `ratio` (`local` bytes), reported.
    fn single(
        &mut self,
        ctx: &mut Ctx,
        l: &Launcher,
        system: System,
        (ratio, local): (f64, u64),
        base: &Native,
    ) -> Result<()> {
        let workload = self.workload;
        ctx.step(format!(
            "{workload}: {} at {:.0}% local",
            system.name(),
            ratio * 100.0
        ));
        let mut m = self.run(l, system, local)?;
        // The kernel's memory-cgroup reclaim into zram gives up now and then
        // while a program allocates (dmesg: "Memory cgroup out of memory"; CPython's
        // dict at 25% local in most runs, at 50% in some): one such run says little
        // about zram's speed, so it gets a second one, as a user would give it.
        if system == System::LinuxZram && m.oom_killed() {
            ctx.note(format!(
                "{workload}: linux-zram at {:.0}% local was OOM-killed; running it again",
                ratio * 100.0
            ));
            m = self.run(l, system, local)?;
        }
        m.report(
            ctx,
            system,
            workload,
            ratio,
            base.peak,
            base.want.as_deref(),
        )?;
        ctx.advance();
        Ok(())
    }
}
