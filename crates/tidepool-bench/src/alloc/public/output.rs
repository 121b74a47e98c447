//! What the programs print: the output of those whose answers do not depend on time, compared
//! with glibc's after their timing lines are dropped.

use super::programs::Check;
use crate::report::Row;
use std::path::Path;

/// What one run printed, for the comparison with glibc's.
#[derive(Debug)]
pub(super) struct Output {
    pub(super) program: &'static str,
    pub(super) system: &'static str,
    pub(super) text: String,
}

/// A program whose output is compared, with its workload's parameters (for the rows).
pub(super) type Checked = (&'static str, Vec<(&'static str, f64)>);

/// A `same_output` row (1 or 0) per program in `checked` and allocator besides glibc, and a
/// note for each mismatch (both outputs kept under `out/alloc-outputs/`).
pub(super) fn compare_outputs(
    checked: &[Checked],
    outputs: &[Output],
    out: &Path,
) -> (Vec<Row>, Vec<String>) {
    let (mut rows, mut notes) = (Vec::new(), Vec::new());
    for (name, params) in checked {
        let name = *name;
        let of = |system: &str| -> Vec<&str> {
            outputs
                .iter()
                .filter(|o| o.program == name && o.system == system)
                .map(|o| o.text.as_str())
                .collect()
        };
        let reference = of("glibc");
        let Some(&expected) = reference.first() else {
            continue;
        };
        if reference.iter().any(|t| *t != expected) {
            notes.push(format!(
                "{name}: its output under glibc varies between runs; not compared"
            ));
            continue;
        }
        let mut systems: Vec<&'static str> = Vec::new();
        for o in outputs.iter().filter(|o| o.program == name) {
            if o.system != "glibc" && !systems.contains(&o.system) {
                systems.push(o.system);
            }
        }
        for system in systems {
            let differing = of(system).into_iter().find(|t| *t != expected);
            if let Some(text) = differing {
                let kept = out.join("alloc-outputs");
                let saved = std::fs::create_dir_all(&kept).is_ok()
                    && std::fs::write(kept.join(format!("{name}.glibc.txt")), expected).is_ok()
                    && std::fs::write(kept.join(format!("{name}.{system}.txt")), text).is_ok();
                notes.push(format!(
                    "error: {name} printed something else under {system} than under glibc \
                     ({}){}",
                    first_difference(expected, text, system),
                    if saved {
                        format!("; both are in {}", kept.display())
                    } else {
                        String::new()
                    }
                ));
            }
            rows.push(Row {
                system: system.to_string(),
                workload: name.to_string(),
                metric: "same_output".into(),
                value: if differing.is_some() { 0.0 } else { 1.0 },
                unit: "1=yes".into(),
                params: params.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            });
        }
    }
    (rows, notes)
}

/// The first line where glibc's output `a` and `system`'s `b` differ, quoted.
fn first_difference(a: &str, b: &str, system: &str) -> String {
    let (mut la, mut lb) = (a.lines(), b.lines());
    loop {
        match (la.next(), lb.next()) {
            (Some(x), Some(y)) if x == y => continue,
            (None, None) => return "same lines".into(),
            (x, y) => {
                return format!(
                    "glibc: '{}', {system}: '{}'",
                    x.unwrap_or("<end>"),
                    y.unwrap_or("<end>")
                )
            }
        }
    }
}

/// A program's output as compared with glibc's: timing lines dropped, lines sorted if their
/// order may vary, stderr after stdout.
pub(super) fn comparable(check: Check, stdout: &str, stderr: &str) -> String {
    let keep = |text: &str| -> Vec<String> {
        text.lines()
            .map(str::trim_end)
            .filter(|l| !is_timing_line(l))
            .map(String::from)
            .collect()
    };
    let (mut out, mut err) = (keep(stdout), keep(stderr));
    if check == Check::LinesAnyOrder {
        out.sort();
        err.sort();
    }
    let mut text = out.join("\n");
    if !err.is_empty() {
        text.push_str("\n-- stderr --\n");
        text.push_str(&err.join("\n"));
    }
    text
}

/// Whether a line reports a time, which differs from run to run: barnes's `COMPUTETIME = 3`
/// (and its `...START`, `...END`), a number with a unit of time (`in 4372 ms`, `32.304s`), or
/// `time:` itself.
fn is_timing_line(line: &str) -> bool {
    if let Some((key, _)) = line.split_once('=') {
        let key = key.trim();
        if !key.is_empty()
            && key.chars().all(|c| c.is_ascii_uppercase())
            && ["TIME", "START", "END"].iter().any(|s| key.ends_with(s))
        {
            return true;
        }
    }
    const UNITS: [&str; 7] = ["ns", "us", "ms", "s", "sec", "secs", "seconds"];
    let words: Vec<&str> = line
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| ",;()".contains(c))
                .trim_end_matches('.')
        })
        .collect();
    let spaced = words
        .windows(2)
        .any(|w| is_number(w[0]) && UNITS.contains(&w[1]));
    let attached = words.iter().any(|w| {
        UNITS
            .iter()
            .any(|u| w.strip_suffix(u).is_some_and(is_number))
    });
    spaced || attached || line.contains("time:")
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.parse::<f64>().is_ok() && s.chars().all(|c| c.is_ascii_digit() || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_lines_are_dropped_and_the_rest_compared() {
        let barnes = "\t\tHack code: Plummer model\n\n\
             \x20    nbody     dtime       eps       tol\n\
             \x20   163840   0.02500    0.0500      1.00\n\n\
             COMPUTESTART  =   1795741453\n\
             COMPUTEEND    =   1795741457\n\
             COMPUTETIME   =            4\n\
             TRACKTIME     =            2\n\
             PARTITIONTIME =            0\t 0.00\n\
             FORCECALCTIME =            2\t 1.00\n";
        let kept = comparable(Check::Lines, barnes, "");
        assert!(
            !kept.contains("TIME") && !kept.contains("COMPUTE"),
            "{kept}"
        );
        assert!(
            kept.contains("Plummer") && kept.contains("163840"),
            "{kept}"
        );
        // Another run, other times: the same.
        let later = barnes
            .replace("1795741453", "1795741999")
            .replace("=            4", "= 5");
        assert_eq!(comparable(Check::Lines, &later, ""), kept);

        // alloc-test: the threads' lines come in either order, and one line has the time.
        let a = "about to run thread 0...\n    ...done\n\
                 1 threads made 100000000 alloc/dealloc operations in 4372 ms (43 ms per 1 million)\n";
        let b = "    ...done\nabout to run thread 0...\n\
                 1 threads made 100000000 alloc/dealloc operations in 5195 ms (51 ms per 1 million)\n";
        assert_eq!(
            comparable(Check::LinesAnyOrder, a, "threads: 1\n"),
            comparable(Check::LinesAnyOrder, b, "threads: 1\n")
        );
        assert_ne!(
            comparable(Check::Lines, a, ""),
            comparable(Check::Lines, b, "")
        );

        // Answers stay, whatever digits they hold; corruption on stderr counts.
        let cfrac = "17545186520507317056371138836327483792789528 = 856070387728264 * 20495027946319472471219512627";
        assert!(!is_timing_line(cfrac));
        assert!(!is_timing_line(
            "start with 2 threads with a 50% load-per-thread and 25 iterations"
        ));
        assert!(is_timing_line("relative time: 32.304s."));
        assert!(is_timing_line(
            "Total 100 freed in 5.00 seconds. 1.2M free/second"
        ));
        assert_ne!(
            comparable(Check::Lines, "x\n", ""),
            comparable(Check::Lines, "x\n", "memory corruption at block 0x1 at 3\n")
        );
    }

    #[test]
    fn mismatches_become_zero_rows_and_notes() {
        let out = |system, text: &str| Output {
            program: "cfrac",
            system,
            text: text.into(),
        };
        let outputs = [
            out("glibc", "n = a * b"),
            out("tidepool", "n = a * b"),
            out("jemalloc", "n = a * c"),
        ];
        let dir = std::env::temp_dir().join(format!("tp-public-{}", std::process::id()));
        let (rows, notes) = compare_outputs(&[("cfrac", Vec::new())], &outputs, &dir);
        let got: Vec<(&str, f64)> = rows.iter().map(|r| (r.system.as_str(), r.value)).collect();
        assert_eq!(got, [("tidepool", 1.0), ("jemalloc", 0.0)]);
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].contains("jemalloc") && notes[0].contains("n = a * c"),
            "{notes:?}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
