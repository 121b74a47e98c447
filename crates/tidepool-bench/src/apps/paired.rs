//! `tidepool-default` beside `tidepool-tuned`: the two differ only by the profile, and one run
//! of either varies by 15-35% on this machine (two runs of the same system, back to back),
//! more than the gain a profile is asked for. So when both are measured they run alternately,
//! [`runs`] times each, and each reports its median run; a note gives every run's figure.

use super::{Measured, RedisResult};
use crate::harness::Ctx;

/// How many times each of the two runs for one figure (once under `--quick`).
pub(super) fn runs(quick: bool) -> usize {
    if quick {
        1
    } else {
        3
    }
}

/// The figures of a run that a median is taken of: (name, value, higher is better).
fn figures(m: &Measured) -> Vec<(&'static str, Option<f64>, bool)> {
    match m {
        Measured::Redis(r) => vec![
            ("redis-get ops/s", r.get_ops, true),
            ("redis-set ops/s", r.set_ops, true),
            ("redis-bgsave s", r.bgsave_seconds, false),
        ],
        Measured::Program(_) => vec![("s", m.seconds(), false)],
    }
}

/// The index of the median of `runs` by figure `k` (a run without it counts as the worst).
fn median_index(runs: &[Measured], k: usize) -> usize {
    let mut order: Vec<(f64, usize)> = runs
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let (_, v, higher_better) = figures(m)[k];
            let key = match v {
                Some(v) if higher_better => -v,
                Some(v) => v,
                None => f64::INFINITY,
            };
            (key, i)
        })
        .collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    order[order.len() / 2].1
}

/// The median of `runs` (at least one): a program's median run; for Redis, each of its three
/// figures (and the bytes held meanwhile) from the run that is the median for that figure.
pub(super) fn median(mut runs: Vec<Measured>) -> Measured {
    let get = median_index(&runs, 0);
    if !matches!(runs[0], Measured::Redis(_)) {
        return runs.swap_remove(get);
    }
    let (set, bgsave) = (median_index(&runs, 1), median_index(&runs, 2));
    let redis = |i: usize| match &runs[i] {
        Measured::Redis(r) => r,
        Measured::Program(_) => unreachable!("every run is of the same workload"),
    };
    let (s, b) = (redis(set), redis(bgsave));
    let (set_ops, set_held, bgsave_seconds, bgsave_held) =
        (s.set_ops, s.set_held, b.bgsave_seconds, b.bgsave_held);
    let Measured::Redis(g) = runs.swap_remove(get) else {
        unreachable!("every run is of the same workload")
    };
    Measured::Redis(RedisResult {
        set_ops,
        set_held,
        bgsave_seconds,
        bgsave_held,
        ..g
    })
}

/// A note with every run's figures: `runs` of each system, in the order they ran.
pub(super) fn note(ctx: &mut Ctx, workload: &str, ratio: f64, runs: &[(&str, &[Measured])]) {
    let mut parts = Vec::new();
    for (system, ms) in runs {
        let Some(first) = ms.first() else {
            continue;
        };
        for (k, (name, ..)) in figures(first).into_iter().enumerate() {
            let values: Vec<String> = ms
                .iter()
                .map(|m| figures(m)[k].1.map_or("-".into(), |v| format!("{v:.1}")))
                .collect();
            parts.push(format!("{system} {name} {}", values.join(", ")));
        }
    }
    ctx.note(format!(
        "{workload} at {:.0}% local, tidepool-default and tidepool-tuned run alternately \
         (medians reported): {}",
        ratio * 100.0,
        parts.join("; ")
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::{Outcome, Ran};
    use crate::meter::Held;

    fn program(seconds: Option<f64>) -> Measured {
        Measured::Program(Ran {
            outcome: match seconds {
                Some(seconds) => Outcome::Done {
                    seconds,
                    answer: format!("{seconds}"),
                },
                None => Outcome::OomKilled,
            },
            peak_rss: 0,
            held: Held::default(),
            interrupts: None,
            sections: None,
        })
    }

    fn redis(get: f64, set: f64, bgsave: f64, peak_rss: u64) -> Measured {
        Measured::Redis(RedisResult {
            get_ops: Some(get),
            set_ops: Some(set),
            bgsave_seconds: Some(bgsave),
            peak_rss,
            ..Default::default()
        })
    }

    #[test]
    fn a_programs_median_run_is_the_middle_time_and_a_killed_run_the_worst() {
        let m = median(vec![program(Some(9.0)), program(None), program(Some(4.0))]);
        assert_eq!(m.seconds(), Some(9.0));
        let m = median(vec![
            program(Some(5.0)),
            program(Some(3.0)),
            program(Some(4.0)),
        ]);
        assert_eq!(m.seconds(), Some(4.0));
        assert_eq!(median(vec![program(Some(7.0))]).seconds(), Some(7.0));
    }

    #[test]
    fn redis_takes_each_figures_median_from_its_own_run() {
        let m = median(vec![
            redis(100.0, 30.0, 9.0, 1),
            redis(300.0, 20.0, 7.0, 2),
            redis(200.0, 10.0, 8.0, 3),
        ]);
        let Measured::Redis(r) = m else {
            panic!("not redis")
        };
        // GET 200 (run 3, whose other fields come along), SET 20 (run 2), BGSAVE 8 s (run 3).
        assert_eq!(
            (r.get_ops, r.set_ops, r.bgsave_seconds, r.peak_rss),
            (Some(200.0), Some(20.0), Some(8.0), 3)
        );
    }
}
