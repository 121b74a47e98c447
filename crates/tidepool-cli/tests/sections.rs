//! `tidepool run --stats` names the program's memory by what asked for it: a C program maps two
//! ranges from two functions, and the report has a section for each, by symbol, with its own
//! faults and prefetches; the answer is native's.

mod common;

use common::{c_program, output_within, preload, text, verify_job};
use std::process::Command;
use std::time::Duration;

#[test]
fn stats_name_each_call_site_that_mapped_memory() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let program = c_program("sections", &["-rdynamic", "-fno-optimize-sibling-calls"]);
    let native = output_within(&mut Command::new(&program), Duration::from_secs(60));
    assert!(native.status.success());
    let paged = output_within(
        Command::new(env!("CARGO_BIN_EXE_tidepool"))
            .args(["run", "--local", "8M", "--stats", "--"])
            .arg(&program)
            .env("TIDEPOOL_PRELOAD", preload()),
        Duration::from_secs(120),
    );
    let (stdout, stderr) = text(&paged);
    assert!(paged.status.success(), "{}: {stderr}", paged.status);
    assert_eq!(stdout, String::from_utf8_lossy(&native.stdout));
    // "mmap sections-...!grab_arena   faults  far reads  evicted  prefetched  used"
    let section = |symbol: &str| -> Vec<u64> {
        let line = stderr
            .lines()
            .find(|l| l.contains(&format!("!{symbol} ")) && l.contains(" mmap "))
            .unwrap_or_else(|| panic!("no section for {symbol} in:\n{stderr}"));
        line.split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect()
    };
    let (arena, table) = (section("grab_arena"), section("grab_table"));
    // faults, far reads, evicted, prefetched
    assert!(arena[0] > 0 && table[0] > 0, "{arena:?} {table:?}");
    assert!(
        arena[2] > 0 && table[2] > 0,
        "both were evicted: {arena:?} {table:?}"
    );
    assert!(arena[3] > 0, "the walk was followed: {arena:?}\n{stderr}");
}

/// `tidepool run --profile FILE --stats -- sections`: exit status, stdout, stderr.
fn run_with_profile(profile: &str) -> (bool, String, String) {
    let program = c_program("sections", &["-rdynamic", "-fno-optimize-sibling-calls"]);
    run_program_with_profile(profile, &program)
}

/// `tidepool run --profile FILE --stats -- PROGRAM`, FILE holding `profile`.
fn run_program_with_profile(profile: &str, program: &std::path::Path) -> (bool, String, String) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let file = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "profile-{}-{}.toml",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::write(&file, profile).unwrap();
    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_tidepool"))
            .args(["run", "--local", "8M", "--stats", "--profile"])
            .arg(&file)
            .arg("--")
            .arg(program)
            .env("TIDEPOOL_PRELOAD", preload()),
        Duration::from_secs(120),
    );
    let (stdout, stderr) = text(&out);
    (out.status.success(), stdout, stderr)
}

fn native_answer() -> String {
    let program = c_program("sections", &["-rdynamic", "-fno-optimize-sibling-calls"]);
    let out = output_within(&mut Command::new(&program), Duration::from_secs(60));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The policy column of a sections line (the last but one: local MiB is last).
fn policy(words: &[String]) -> &str {
    &words[words.len() - 2]
}

/// The sections line of `symbol` in a `--stats` report, split in words.
fn section_words(stderr: &str, symbol: &str) -> Vec<String> {
    stderr
        .lines()
        .find(|l| l.contains(&format!("!{symbol} ")) && l.contains(" mmap "))
        .unwrap_or_else(|| panic!("no section for {symbol} in:\n{stderr}"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_profile_sets_the_policy_of_the_sections_it_names() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let program = c_program("sections", &["-rdynamic", "-fno-optimize-sibling-calls"]);
    let me = tidepool_pager::profile::Program::of_file(&program).unwrap();
    let mut profile = tidepool_pager::profile::Profile::new(me.clone());
    let entry = |symbol: &str, prefetch: &str, line: u8| {
        let text = format!(
            "version = 1\n[program]\nname = \"x\"\n[[section]]\nname = \"mmap {}!{symbol}\"\nprefetch = \"{prefetch}\"\nline = {line}\n",
            me.name
        );
        tidepool_pager::profile::Profile::parse(&text, "entry")
            .unwrap()
            .sections[0]
            .clone()
    };
    profile.sections.push(entry("grab_arena", "off", 1));
    profile.sections.push(entry("grab_table", "own", 2));
    let (ok, stdout, stderr) = run_with_profile(&profile.to_toml());
    assert!(ok, "{stderr}");
    assert_eq!(stdout, native_answer());
    let (arena, table) = (
        section_words(&stderr, "grab_arena"),
        section_words(&stderr, "grab_table"),
    );
    // ... faults, far reads, evicted, prefetched, used, policy, local MiB
    assert_eq!(policy(&arena), "off", "{arena:?}");
    assert_eq!(arena[arena.len() - 4], "0", "nothing prefetched: {arena:?}");
    assert_eq!(policy(&table), "own/2", "{table:?}");
    assert!(arena.last().unwrap().parse::<f64>().is_ok(), "{arena:?}");
    assert!(!stderr.contains("ignored"), "{stderr}");
}

#[test]
fn a_profile_for_another_program_or_build_changes_nothing_and_says_so() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let program = c_program("sections", &["-rdynamic", "-fno-optimize-sibling-calls"]);
    let me = tidepool_pager::profile::Program::of_file(&program).unwrap();
    let section = format!(
        "[[section]]\nname = \"mmap {}!grab_arena\"\nprefetch = \"off\"\n",
        me.name
    );
    for (program, says) in [
        (
            "name = \"redis-server\"\n".to_string(),
            "is for redis-server",
        ),
        (
            format!("name = \"{}\"\nbuild_id = \"00ff\"\n", me.name),
            "tuned on",
        ),
    ] {
        let (ok, stdout, stderr) =
            run_with_profile(&format!("version = 1\n[program]\n{program}{section}"));
        assert!(ok, "{stderr}");
        assert_eq!(stdout, native_answer());
        assert!(
            stderr.contains(says) && stderr.contains("ignored"),
            "{stderr}"
        );
        let arena = section_words(&stderr, "grab_arena");
        assert_eq!(policy(&arena), "shared", "{arena:?}");
    }
}

#[test]
fn a_malformed_profile_stops_tidepool_run_with_the_reason() {
    let (ok, _, stderr) = run_with_profile("version = 1\n[program]\nname = \"x\"\nturbo = true\n");
    assert!(!ok);
    assert!(
        stderr.contains("not a profile") && stderr.contains("turbo"),
        "{stderr}"
    );
}

/// A wrapper script (as a pyenv shim is) that execs the program: the profile reaches the
/// program's process through it, and one for another program says at exit that it changed
/// nothing.
#[test]
fn a_profile_passes_through_a_wrapper_script_to_the_program_it_fits() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let program = c_program("sections", &["-rdynamic", "-fno-optimize-sibling-calls"]);
    let me = tidepool_pager::profile::Program::of_file(&program).unwrap();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let shim = dir.join(format!("shim-{}", std::process::id()));
    std::fs::write(
        &shim,
        format!("#!/bin/sh\nexec {} \"$@\"\n", program.display()),
    )
    .unwrap();
    std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let section = format!(
        "[[section]]\nname = \"mmap {}!grab_arena\"\nprefetch = \"off\"\n",
        me.name
    );
    for (program_line, fits) in [
        (
            format!(
                "name = \"{}\"\nbuild_id = \"{}\"\n",
                me.name,
                me.build_id.clone().unwrap()
            ),
            true,
        ),
        ("name = \"redis-server\"\n".to_string(), false),
    ] {
        let (ok, stdout, stderr) = run_program_with_profile(
            &format!("version = 1\n[program]\n{program_line}{section}"),
            &shim,
        );
        assert!(ok, "{stderr}");
        assert_eq!(stdout, native_answer());
        let arena = section_words(&stderr, "grab_arena");
        if fits {
            assert_eq!(policy(&arena), "off", "{stderr}");
            assert!(!stderr.contains("changed nothing"), "{stderr}");
        } else {
            assert_eq!(policy(&arena), "shared", "{stderr}");
            assert!(
                stderr.contains("is for redis-server") && stderr.contains("changed nothing"),
                "{stderr}"
            );
        }
    }
}

/// `tidepool tune` runs the program a few times (one of them recording its faults for the
/// offline search) and writes a profile for it that `tidepool run --profile` applies.
#[test]
fn tune_writes_a_profile_that_run_applies() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let program = c_program("sections", &["-rdynamic", "-fno-optimize-sibling-calls"]);
    let me = tidepool_pager::profile::Program::of_file(&program).unwrap();
    let file = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tuned-{}.toml", std::process::id()));
    // Through a shell that forks the program rather than exec it, as a wrapper script
    // without `exec` does: the shell's report that the profile is not for it is no failure.
    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_tidepool"))
            .args(["tune", "--local", "8M", "--rounds", "3", "--out"])
            .arg(&file)
            .args(["--", "sh", "-c", "\"$0\"; true"])
            .arg(&program)
            .env("TIDEPOOL_PRELOAD", preload()),
        Duration::from_secs(300),
    );
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("round 0") && stderr.contains("round 1"),
        "{stderr}"
    );
    // The trace round recorded the faults, and the offline search printed each busy
    // section's access classes.
    assert!(stderr.contains("trace round"), "{stderr}");
    assert!(
        stderr.contains("demand faults") && stderr.contains("% sequential"),
        "{stderr}"
    );
    // The oracle's bound over the trace is printed and kept in the profile.
    assert!(
        stderr.contains("oracle: with all 2048 pages of the budget and foresight"),
        "{stderr}"
    );
    let profile = tidepool_pager::profile::Profile::read(&file).unwrap();
    assert_eq!(profile.program, me);
    let tuned = profile.tuned.as_deref().unwrap();
    assert!(tuned.contains("--local 8.0 MiB"), "{tuned}");
    assert!(tuned.contains("; an oracle reads "), "{tuned}");
    for s in &profile.sections {
        assert!(s.why.is_some(), "every choice says why: {s:?}");
    }
    // A change kept in the rounds is checked against the defaults in alternating runs.
    assert!(
        !stderr.contains(" kept (") || stderr.contains("check: 3 runs each"),
        "{stderr}"
    );
    let (ok, stdout, stderr) = run_with_profile(&std::fs::read_to_string(&file).unwrap());
    assert!(ok, "{stderr}");
    assert_eq!(stdout, native_answer());
    assert!(
        !stderr.contains("ignored") && !stderr.contains("changed nothing"),
        "{stderr}"
    );
}

/// `tidepool run --local 8M` of the verification workload (64 MiB, two threads, three passes,
/// every word checked) with `args` before `--`: status, stdout, stderr.
fn verify_with(
    args: &[&std::ffi::OsStr],
    sections_out: Option<&std::path::Path>,
) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tidepool"));
    cmd.args(["run", "--local", "8M", "--stats"])
        .args(args)
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_tidepool"))
        .args(verify_job(64 << 20, 3, false))
        .env("TIDEPOOL_PRELOAD", preload());
    if let Some(dir) = sections_out {
        cmd.env("TIDEPOOL_RUN_SECTIONS_OUT", dir);
    }
    let out = output_within(&mut cmd, Duration::from_secs(300));
    let (stdout, stderr) = text(&out);
    (out.status.success(), stdout, stderr)
}

/// No wrong byte with any profile: the verification workload under profiles that give every
/// section it has the most aggressive policies there are (lines of up to 16 pages, every
/// prefetcher, pages kept high or pinned, shares of the budget, one that pins everything, more
/// than the budget holds, and one that holds every section to 5% of it).
#[test]
fn the_verification_workload_is_right_under_aggressive_profiles() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    use tidepool_pager::profile::{KeepName, Observed, PrefetchName, Profile, SectionEntry};
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("verify-sections-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ok, stdout, stderr) = verify_with(&[], Some(&dir));
    assert!(
        ok && stdout.contains(", 0 wrong words"),
        "{stdout}\n{stderr}"
    );
    let observed = Observed::read_dir(&dir).unwrap();
    let me = &observed[0];
    assert!(!me.sections.is_empty(), "{observed:?}");
    let prefetches = [
        PrefetchName::Sweep,
        PrefetchName::Own,
        PrefetchName::Off,
        PrefetchName::Shared,
        PrefetchName::Successor,
    ];
    let keeps = [KeepName::Pin, KeepName::High, KeepName::Normal];
    let mixed = |i: usize| {
        let share = [0u8, 5, 50][i % 3];
        (
            prefetches[i % 5],
            [16u8, 8, 4, 2][i % 4],
            keeps[i % 3],
            share,
        )
    };
    let pin_all = |_| (PrefetchName::Sweep, 16u8, KeepName::Pin, 0);
    // Every section held to 5% of the budget: they are all over it, all the time.
    let successors = |_| (PrefetchName::Successor, 4u8, KeepName::High, 5);
    // Each profile, and a policy that `--stats` must then show.
    for (what, policy, shown) in [
        (
            "mixed",
            &mixed as &dyn Fn(usize) -> (PrefetchName, u8, KeepName, u8),
            " pin",
        ),
        ("everything pinned", &pin_all, "sweep/16 pin"),
        (
            "successor tables everywhere",
            &successors,
            "successor/4 keep 5%",
        ),
    ] {
        let mut profile = Profile::new(me.program.clone());
        for (i, s) in me.sections.iter().enumerate() {
            let (prefetch, line, keep, share) = policy(i);
            profile.sections.push(SectionEntry {
                name: s.name.clone(),
                prefetch,
                line,
                keep,
                share,
                why: None,
            });
        }
        let file = dir.join("aggressive.toml");
        std::fs::write(&file, profile.to_toml()).unwrap();
        let (ok, stdout, stderr) = verify_with(&["--profile".as_ref(), file.as_os_str()], None);
        assert!(ok, "{what}: {stdout}\n{stderr}");
        assert!(
            stdout.contains(", 0 wrong words"),
            "{what}: {stdout}\n{stderr}"
        );
        assert!(!stderr.contains("ignored"), "{what}: {stderr}");
        assert!(
            stderr.contains(shown),
            "{what}: the policies show: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
