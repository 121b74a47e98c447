//! mimalloc-bench's programs as its `bench.sh` runs them, how each reports how fast it ran,
//! and which of them print the same output under every allocator.

use std::path::Path;

/// How a program tells how fast it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Figure {
    /// Its wall time, measured here.
    WallTime,
    /// larson: `Throughput = N operations per second`.
    Throughput,
    /// xmalloc-test: `rtime: X`, a time in seconds for a fixed amount of work.
    RelativeTime,
    /// rptest: `N memory ops/CPU second`.
    MemoryOps,
    /// glibc-thread: `N iterations`, in a run of fixed length.
    Iterations,
}

impl Figure {
    /// The report's metric and unit.
    pub(super) fn metric(self) -> (&'static str, &'static str) {
        match self {
            Figure::WallTime | Figure::RelativeTime => ("seconds", "s"),
            Figure::Throughput => ("ops_per_s", "ops/s"),
            Figure::MemoryOps => ("ops_per_cpu_s", "ops/CPU s"),
            Figure::Iterations => ("iterations", "iterations"),
        }
    }

    pub(super) fn higher_is_better(self) -> bool {
        matches!(
            self,
            Figure::Throughput | Figure::MemoryOps | Figure::Iterations
        )
    }

    /// The figure in the program's standard output (not for [`Figure::WallTime`]).
    pub(super) fn read(self, stdout: &str) -> Option<f64> {
        match self {
            Figure::WallTime => None,
            Figure::Throughput => number_after(stdout, "Throughput ="),
            Figure::RelativeTime => number_after(stdout, "rtime:"),
            Figure::MemoryOps => number_before(stdout, " memory ops"),
            Figure::Iterations => number_before(stdout, " iterations"),
        }
    }
}

/// Which output of a program must match glibc's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// None: it prints nothing, or figures that vary.
    Nothing,
    /// Every line but timing lines, in order.
    Lines,
    /// Every line but timing lines, in any order (threads print as they go).
    LinesAnyOrder,
}

/// One of mimalloc-bench's programs and how its `bench.sh` runs it.
#[derive(Debug)]
pub(super) struct Program {
    /// The workload's name and the binary's, in `DIR/out/bench/`.
    pub(super) name: &'static str,
    /// Arguments; `{procs}` is the machine's CPU count, `{bench}` is `DIR/bench`.
    pub(super) args: &'static str,
    /// Shorter arguments for `--quick`, where the program has any.
    pub(super) quick_args: Option<&'static str>,
    /// Standard input, under `DIR/bench/` (else /dev/null).
    pub(super) stdin: Option<&'static str>,
    /// Input files it reads, under `DIR/bench/`.
    pub(super) inputs: &'static [&'static str],
    pub(super) figure: Figure,
    pub(super) check: Check,
    /// Runs `{procs}` threads at once (then it gets every CPU: `cpus_for` in `mod.rs`).
    pub(super) threaded: bool,
}

pub(super) const PROGRAMS: [Program; 13] = [
    Program {
        name: "larson",
        args: "5 8 1000 5000 100 4141 {procs}",
        quick_args: Some("1 8 1000 5000 100 4141 {procs}"),
        stdin: None,
        inputs: &[],
        figure: Figure::Throughput,
        check: Check::Nothing,
        threaded: true,
    },
    Program {
        name: "alloc-test",
        args: "1",
        quick_args: None,
        stdin: None,
        inputs: &[],
        figure: Figure::WallTime,
        check: Check::LinesAnyOrder,
        threaded: false,
    },
    Program {
        name: "cfrac",
        args: "17545186520507317056371138836327483792789528",
        // The number bench.sh factored before it was made to take 5 s.
        quick_args: Some("175451865205073170563711388363274837927895"),
        stdin: None,
        inputs: &[],
        figure: Figure::WallTime,
        check: Check::Lines,
        threaded: false,
    },
    Program {
        name: "espresso",
        args: "{bench}/espresso/largest.espresso",
        quick_args: None,
        stdin: None,
        inputs: &["espresso/largest.espresso"],
        figure: Figure::WallTime,
        check: Check::Lines,
        threaded: false,
    },
    Program {
        name: "barnes",
        args: "",
        quick_args: None,
        stdin: Some("barnes/input"),
        inputs: &["barnes/input"],
        figure: Figure::WallTime,
        check: Check::Lines,
        threaded: false,
    },
    Program {
        name: "xmalloc-test",
        args: "-w {procs} -t 5 -s 64",
        quick_args: Some("-w {procs} -t 1 -s 64"),
        stdin: None,
        inputs: &[],
        figure: Figure::RelativeTime,
        check: Check::Nothing,
        threaded: true,
    },
    Program {
        name: "cache-scratch",
        args: "{procs} 1000 1 2000000 {procs}",
        quick_args: None,
        stdin: None,
        inputs: &[],
        figure: Figure::WallTime,
        check: Check::Nothing,
        threaded: true,
    },
    Program {
        name: "cache-thrash",
        args: "{procs} 1000 1 2000000 {procs}",
        quick_args: None,
        stdin: None,
        inputs: &[],
        figure: Figure::WallTime,
        check: Check::Nothing,
        threaded: true,
    },
    Program {
        name: "mstress",
        args: "{procs} 50 25",
        quick_args: None,
        stdin: None,
        inputs: &[],
        figure: Figure::WallTime,
        // It reports corrupted blocks on stderr.
        check: Check::Lines,
        threaded: true,
    },
    Program {
        name: "rptest",
        args: "{procs} 0 1 2 500 1000 100 8 16000",
        quick_args: Some("{procs} 0 1 2 100 1000 100 8 16000"),
        stdin: None,
        inputs: &[],
        figure: Figure::MemoryOps,
        check: Check::Nothing,
        threaded: true,
    },
    Program {
        name: "glibc-simple",
        args: "",
        quick_args: None,
        stdin: None,
        inputs: &[],
        figure: Figure::WallTime,
        check: Check::Nothing,
        threaded: false,
    },
    Program {
        name: "glibc-thread",
        args: "{procs}",
        quick_args: None,
        stdin: None,
        inputs: &[],
        figure: Figure::Iterations,
        check: Check::Nothing,
        threaded: true,
    },
    Program {
        name: "malloc-large",
        args: "",
        quick_args: None,
        stdin: None,
        inputs: &[],
        figure: Figure::WallTime,
        check: Check::Nothing,
        threaded: false,
    },
];

/// How to get the programs, for every note saying they are missing.
const HOW_TO_GET: &str = "clone https://github.com/daanx/mimalloc-bench, run its \
     `./build-bench-env.sh bench`, and pass the checkout with --mimalloc-bench DIR (or \
     TIDEPOOL_MIMALLOC_BENCH=DIR)";

/// The programs of the checkout in `dir` that can run, and notes on those that cannot.
pub(super) fn available(dir: Option<&Path>) -> (Vec<&'static Program>, Vec<String>) {
    let names: Vec<&str> = PROGRAMS.iter().map(|p| p.name).collect();
    let Some(dir) = dir else {
        return (
            Vec::new(),
            vec![format!(
                "mimalloc-bench's programs ({}) are skipped: {HOW_TO_GET}",
                names.join(", ")
            )],
        );
    };
    let (mut found, mut missing) = (Vec::new(), Vec::new());
    for p in &PROGRAMS {
        let mut needs = vec![dir.join("out/bench").join(p.name)];
        needs.extend(p.inputs.iter().map(|i| dir.join("bench").join(i)));
        match needs.iter().find(|f| !f.is_file()) {
            None => found.push(p),
            Some(f) => missing.push(format!("{} (no {})", p.name, f.display())),
        }
    }
    let notes = if missing.is_empty() {
        Vec::new()
    } else {
        vec![format!(
            "mimalloc-bench programs skipped, not built in {}: {}; {HOW_TO_GET}",
            dir.display(),
            missing.join(", ")
        )]
    };
    (found, notes)
}

/// The number right after the first `marker` in `text`.
fn number_after(text: &str, marker: &str) -> Option<f64> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let word = rest.split_whitespace().next()?;
    word.trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .ok()
}

/// The number right before the first `marker` in `text`.
fn number_before(text: &str, marker: &str) -> Option<f64> {
    let before = &text[..text.find(marker)?];
    let start = before
        .rfind(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map_or(0, |i| i + 1);
    before[start..].trim_start_matches('.').parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_read_from_the_programs_own_lines() {
        let larson = "Throughput = 30955553 operations per second, relative time: 32.304s.\n\
                      Done sleeping...\n";
        assert_eq!(Figure::Throughput.read(larson), Some(30955553.0));
        let xmalloc = "rtime: 6.550, free/sec: 15.268 M\n";
        assert_eq!(Figure::RelativeTime.read(xmalloc), Some(6.55));
        let rptest = "crt          2 threads random linear size [8,16000] 500 loops 1000 allocs \
                      100 ops: ........2450717 memory ops/CPU second (36MiB peak, 421% overhead)\n";
        assert_eq!(Figure::MemoryOps.read(rptest), Some(2450717.0));
        assert_eq!(
            Figure::Iterations.read("125873486 iterations\n"),
            Some(125873486.0)
        );
        assert_eq!(Figure::Throughput.read("Segmentation fault\n"), None);
        assert_eq!(Figure::WallTime.read(larson), None);
    }

    #[test]
    fn missing_programs_are_named_with_how_to_get_them() {
        let (found, notes) = available(None);
        assert!(found.is_empty());
        assert!(notes[0].contains("--mimalloc-bench") && notes[0].contains("larson"));
        let (found, notes) = available(Some(Path::new("/nonexistent")));
        assert!(found.is_empty());
        assert!(
            notes[0].contains("/nonexistent/out/bench/cfrac"),
            "{notes:?}"
        );
    }
}
