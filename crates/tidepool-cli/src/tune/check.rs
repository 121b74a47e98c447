//! The final check of `tidepool tune` for a program: the profile against the default
//! policies, alternating runs at the tuning's size and, if asked, at a larger one.

use super::{command_line, run_round, ProgramTune, RunName};
use anyhow::{bail, Result};
use std::ffi::OsString;
use std::path::Path;
use tidepool_pager::profile::{Profile, Program};

/// Runs of the program with the profile and without it, alternating, before tune believes
/// the profile makes it faster at all.
const CHECKS: usize = 3;

/// The most a profile's median time in the final check may be against the default's for the
/// profile to stay: a profile within noise of the default stays out, since the run it is made
/// for is larger and may not forgive it (pandas tuned at 4M rows kept its numpy section's
/// pages high on a check of 4.36 s against 4.42, and ran 0.83x the default at 40M).
const CHECK_FASTER: f64 = 0.97;

/// The larger run the final check repeats on: the program's arguments (`None`: the tuning's)
/// and local memory (`None`: the tuning's).
#[derive(Debug, Clone)]
pub struct Larger {
    pub args: Option<Vec<OsString>>,
    pub local: Option<u64>,
}

impl Larger {
    /// From `--check-arg`s and `--check-local`: none if neither was given.
    pub fn from_args(args: Vec<OsString>, local: Option<u64>) -> Option<Larger> {
        (!args.is_empty() || local.is_some()).then(|| Larger {
            args: (!args.is_empty()).then_some(args),
            local,
        })
    }

    /// The tuning `t` as it runs for this check: the same program, store and settings, with
    /// these arguments and this local memory.
    pub(super) fn tuning(&self, t: &ProgramTune) -> ProgramTune {
        let mut larger = t.clone();
        if let Some(args) = &self.args {
            larger.program.truncate(1);
            larger.program.extend(args.iter().cloned());
        }
        larger.local = self.local.unwrap_or(t.local);
        larger
    }
}

/// The final check: [`check_at`] at the tuning's input and budget, then, if the profile
/// passed and `--check-arg` or `--check-local` was given, at that larger run too. A profile
/// that fails either is emptied; `notes` (the profile's `tuned` line) say why, or where the
/// profile was checked.
pub(super) fn check(
    t: &ProgramTune,
    me: &Program,
    profile: &mut Profile,
    dir: &Path,
    notes: &mut Vec<String>,
) -> Result<()> {
    if profile.sections.is_empty() {
        return Ok(());
    }
    let mut why = check_at(t, me, profile, dir, RunName::Check)?;
    if let (None, Some(larger)) = (&why, &t.larger) {
        let lt = larger.tuning(t);
        let at = format!(
            "--local {} -- {}",
            tidepool_node::format_size(lt.local),
            command_line(&lt.program)
        );
        eprintln!("larger check at {at}");
        why = check_at(&lt, me, profile, dir, RunName::Larger)?
            .map(|why| format!("on the larger check, {why}"));
        if why.is_none() {
            notes.push(format!("checked at {at}"));
        }
    }
    if let Some(why) = why {
        eprintln!("{why}: the profile is left empty");
        profile.sections.clear();
        notes.push(format!("left empty: {why}"));
    }
    Ok(())
}

/// Runs the program [`CHECKS`] times with `profile` and as many without, alternating (the
/// rounds' times are one run each, and runs vary by 15% and more), each run named by `name`:
/// `Some(why)` if the profile's median time is not 3% below the default's ([`CHECK_FASTER`]).
/// Fails if a run with the profile printed something else than the run without it before.
fn check_at(
    t: &ProgramTune,
    me: &Program,
    profile: &Profile,
    dir: &Path,
    name: fn(usize, bool) -> RunName,
) -> Result<Option<String>> {
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..CHECKS {
        let (off, on) = (name(i, false), name(i, true));
        let default = run_round(t, &mut Some(me.clone()), None, dir, off, 0)?;
        without.push(default.seconds);
        let profiled = run_round(t, &mut Some(me.clone()), Some(profile), dir, on, 0)?;
        with.push(profiled.seconds);
        if !t.ignore_output && profiled.output != default.output {
            bail!(
                "the program printed something else in {on} than in {off}: a profile must \
                 never change an answer, so this is a bug in tidepool (work files in {})",
                dir.display()
            );
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (w, d) = (median(&mut with), median(&mut without));
    eprintln!(
        "check: {CHECKS} runs each, alternating: median {w:.2} s with the profile, {d:.2} s without"
    );
    Ok((w > d * CHECK_FASTER).then(|| {
        format!("the profile did not make the program 3% faster (median {w:.2} s against {d:.2} s)")
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuning() -> ProgramTune {
        ProgramTune {
            local: 8 << 20,
            backend: "local:".into(),
            out: None,
            rounds: 4,
            from: None,
            ignore_output: false,
            larger: None,
            program: ["sort", "-o", "small.out", "small.txt"]
                .map(OsString::from)
                .to_vec(),
        }
    }

    #[test]
    fn no_larger_check_unless_asked() {
        assert!(Larger::from_args(Vec::new(), None).is_none());
    }

    #[test]
    fn a_larger_check_keeps_the_program_and_replaces_its_arguments() {
        let args = ["-o", "large.out", "large.txt"]
            .map(OsString::from)
            .to_vec();
        let l = Larger::from_args(args, Some(24 << 20)).unwrap();
        let lt = l.tuning(&tuning());
        assert_eq!(command_line(&lt.program), "sort -o large.out large.txt");
        assert_eq!(lt.local, 24 << 20);
        assert_eq!(lt.backend, "local:");
    }

    #[test]
    fn a_larger_check_of_only_a_budget_runs_the_same_input() {
        let l = Larger::from_args(Vec::new(), Some(4 << 20)).unwrap();
        let lt = l.tuning(&tuning());
        assert_eq!(command_line(&lt.program), "sort -o small.out small.txt");
        assert_eq!(lt.local, 4 << 20);
    }

    #[test]
    fn larger_check_runs_have_work_files_of_their_own() {
        for i in 0..CHECKS {
            for with in [false, true] {
                assert_ne!(
                    RunName::Check(i, with).stem(),
                    RunName::Larger(i, with).stem()
                );
            }
        }
        assert_eq!(
            RunName::Larger(1, true).to_string(),
            "larger check run 1 with the profile"
        );
    }
}
