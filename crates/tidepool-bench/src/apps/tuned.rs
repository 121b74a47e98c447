//! `tidepool-tuned`: each workload under a profile that `tidepool tune` made on an input a
//! tenth of the measured one's size (a third under `--quick`, whose inputs are small already;
//! never on the measured run), at the same share of that smaller run's own native peak RSS.
//! Tune checks the profile again on a third of the measured input (`--check-arg`), and keeps
//! it only if it is 3% faster there too.
//!
//! Redis is tuned through a driver script: redis-server filled by redis-benchmark with 4 KiB
//! values, then read and written at random keys (the measured workload fills with random
//! bytes; the profile is about where the server's memory comes from and how it is used, not
//! the values' bytes).

use super::launch::{Launcher, System};
use super::programs::{sort_input, Sizes, PANDAS_SCRIPT};
use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Rounds of `tidepool tune` per profile, at most (it stops when nothing is left to try):
/// enough for the prefetch ladder and then a section or two kept longer.
const ROUNDS: u32 = 8;
/// How long one tuning may take before it is given up.
const DEADLINE: Duration = Duration::from_secs(30 * 60);

/// The driver redis-server is tuned with: it prints nothing, and redis-server keeps the
/// script's process (`exec`), the one `tidepool run` applies the profile to.
const REDIS_DRIVER: &str = r#"#!/bin/sh
# redis-server filled with 4 KiB values, then read and written at random keys (tidepool tune).
port=$1 keys=$2 requests=$3
(
  i=0
  until redis-cli -p "$port" ping; do
    i=$((i + 1)); [ "$i" -gt 300 ] && break; sleep 0.1
  done
  redis-benchmark -p "$port" -t set -n "$keys" -r "$keys" -d 4096 -P 16 -q
  redis-benchmark -p "$port" -t get -n "$requests" -r "$keys" -d 4096 -P 16 -q
  redis-benchmark -p "$port" -t set -n "$requests" -r "$keys" -d 4096 -P 16 -q
  redis-cli -p "$port" shutdown nosave
) >/dev/null 2>&1 &
exec redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
  --loglevel warning >/dev/null
"#;

/// A workload's command on its tuning input: its argv, its environment, and whether its
/// output varies from run to run (a Python script prints its own time).
struct Small {
    argv: Vec<OsString>,
    env: Vec<(&'static str, OsString)>,
    output_varies: bool,
}

/// The sizes a workload is tuned at: `s` over `by`.
fn smaller(s: &Sizes, by: u64) -> Sizes {
    Sizes {
        redis_keys: s.redis_keys / by,
        redis_requests: s.redis_requests / by,
        pandas_rows: s.pandas_rows / by,
        sort_lines: s.sort_lines / by,
        dict_strings: s.dict_strings / by,
        map_entries: s.map_entries / by,
    }
}

fn small(workload: &str, s: &Sizes, dir: &Path, python: &Path) -> Result<Small> {
    let script = |name: &str, text: &str, arg: u64| -> Result<Small> {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        Ok(Small {
            argv: vec![python.into(), path.into(), arg.to_string().into()],
            env: Vec::new(),
            output_varies: true,
        })
    };
    Ok(match workload {
        "redis" => {
            let path = dir.join("apps_redis_tune.sh");
            std::fs::write(&path, REDIS_DRIVER)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))?;
            let argv = [path.into_os_string()]
                .into_iter()
                .chain(
                    [16_900, s.redis_keys, s.redis_requests]
                        .iter()
                        .map(|n| n.to_string().into()),
                )
                .collect();
            Small {
                argv,
                env: Vec::new(),
                output_varies: false,
            }
        }
        "pandas-groupby" => script("apps_pandas_tune.py", PANDAS_SCRIPT, s.pandas_rows)?,
        "python-dict" => script(
            "apps_dict_tune.py",
            crate::worker::DICT_SCRIPT,
            s.dict_strings,
        )?,
        "sort" => {
            let input = sort_input(dir, s.sort_lines)?;
            Small {
                argv: vec![
                    "sort".into(),
                    "-o".into(),
                    dir.join("apps_sort_tune.out").into(),
                    input.into(),
                ],
                env: vec![("LC_ALL", "C".into()), ("TMPDIR", dir.into())],
                output_varies: false,
            }
        }
        w => Small {
            argv: super::runtimes::argv(w, dir, s.runtime_entries(w))?,
            env: Vec::new(),
            output_varies: false,
        },
    })
}

/// Local memory for `small`: `ratio` of its native peak RSS.
fn local_for(l: &Launcher, workload: &str, small: &Small, ratio: f64) -> Result<u64> {
    let mut native = l.command(System::Native, 0, &small.argv)?;
    native.envs(small.env.iter().map(|(k, v)| (k, v)));
    let ended = l.run_to_end(System::Native, native)?;
    if !ended.status.success() {
        bail!(
            "{workload}'s tuning input failed natively ({}): {}",
            ended.status,
            ended.stderr.trim()
        );
    }
    Ok(super::local_bytes(ended.peak_rss, ratio))
}

/// Tunes `workload` on its smaller input (the measured sizes `s`, over 10, or 3 if `quick`)
/// at `ratio` of that input's native peak RSS, and has tune check the profile again on a
/// third of the measured input (not under `--quick`), at the same share of its own peak: a
/// profile that does not carry over from a tenth to a third is left empty, not applied to the
/// whole. The profile's path.
pub(super) fn tune(
    l: &Launcher,
    workload: &str,
    ratio: f64,
    (s, quick): (&Sizes, bool),
    dir: &Path,
    python: &Path,
) -> Result<PathBuf> {
    let input = small(
        workload,
        &smaller(s, if quick { 3 } else { 10 }),
        dir,
        python,
    )?;
    let local = local_for(l, workload, &input, ratio)?;
    let larger = if quick {
        None
    } else {
        let third = small(workload, &smaller(s, 3), dir, python)?;
        let local = local_for(l, workload, &third, ratio)?;
        Some((third.argv, local))
    };
    let pct = (ratio * 100.0).round();
    let profile = dir.join(format!("{workload}-{pct}.toml"));
    let log = dir.join(format!("{workload}-{pct}.tune.log"));
    let mut cmd = Command::new(&l.tidepool);
    cmd.args(["tune", "--rounds", &ROUNDS.to_string()])
        .arg("--local")
        .arg(local.to_string())
        .arg("--out")
        .arg(&profile);
    if input.output_varies {
        cmd.arg("--ignore-output");
    }
    if let Some((argv, local)) = &larger {
        cmd.arg("--check-local").arg(local.to_string());
        for a in &argv[1..] {
            cmd.arg("--check-arg").arg(a);
        }
    }
    cmd.arg("--")
        .args(&input.argv)
        .envs(input.env.iter().map(|(k, v)| (k, v)))
        .env("TIDEPOOL_PRELOAD", &l.preload)
        .env_remove(tidepool_pager::run_env::SECTIONS_OUT)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?);
    let mut child = cmd.spawn().context("cannot start tidepool tune")?;
    let started = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "tidepool tune of {workload} took over {} s (its log: {})",
                DEADLINE.as_secs(),
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(8).collect();
        bail!(
            "tidepool tune of {workload} failed ({status}): {}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    Ok(profile)
}

/// What a tuning found, in one line: its rounds and the sections it gave a policy.
pub(super) fn summary(profile: &Path) -> String {
    match tidepool_pager::profile::Profile::read(profile) {
        Ok(p) => describe(&p, profile),
        Err(_) => format!("{} cannot be read", profile.display()),
    }
}

/// [`summary`] of profile `p`, read from `profile`.
fn describe(p: &tidepool_pager::profile::Profile, profile: &Path) -> String {
    let sections: Vec<String> = p
        .sections
        .iter()
        .map(|s| {
            let policy =
                tidepool_pager::Policy::new(s.prefetch.into(), s.line).keeping(s.keep.into());
            format!("{} {policy}", s.name)
        })
        .collect();
    // How it was tuned: the command (in the file), the rounds' times, and why the profile was
    // left empty if it was.
    let parts: Vec<&str> = p.tuned.as_deref().unwrap_or("").split("; ").collect();
    let rounds = parts
        .iter()
        .find(|s| s.starts_with("rounds took"))
        .unwrap_or(&"");
    let emptied = parts.iter().find_map(|s| s.strip_prefix("left empty: "));
    let bound = parts
        .iter()
        .find(|s| s.starts_with("an oracle reads"))
        .map_or(String::new(), |b| format!("; {b}"));
    format!(
        "{} ({rounds}{bound}); policies: {}",
        profile.display(),
        match (sections.is_empty(), emptied) {
            (false, _) => sections.join(", "),
            (true, Some(why)) => format!("none ({why})"),
            (true, None) => "none (no change helped)".to_string(),
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidepool_pager::profile::{Profile, Program};

    #[test]
    fn a_summary_says_why_a_profile_was_left_empty() {
        let mut p = Profile::new(Program {
            name: "python3".into(),
            build_id: None,
        });
        p.tuned = Some("tidepool tune --local 8M -- python3 x.py; rounds took 1.00, 2.00 s".into());
        let at = Path::new("/tmp/p.toml");
        let s = describe(&p, at);
        assert!(s.contains("(rounds took 1.00, 2.00 s)"), "{s}");
        assert!(s.contains("none (no change helped)"), "{s}");
        p.tuned = Some(format!(
            "{}; an oracle reads 90 of round 0's 100 pages: 1.11x fewer at most; left empty: \
             the profile did not make the program 3% faster",
            p.tuned.unwrap()
        ));
        let s = describe(&p, at);
        assert!(
            s.contains("(rounds took 1.00, 2.00 s; an oracle reads 90 of round 0's 100 pages: 1.11x fewer at most)"),
            "{s}"
        );
        assert!(
            s.contains("none (the profile did not make the program 3% faster)"),
            "{s}"
        );
    }
}
