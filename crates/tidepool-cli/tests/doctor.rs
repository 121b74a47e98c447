//! `tidepool doctor`: on a host that has what tidepool needs it says every feature works; where
//! a piece is taken away (another user without /dev/userfaultfd rights, a cgroup layout without
//! the v1 memory controller) it names that piece and its fix, and `tidepool run` points to it.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Output};
use tidepool_sys::probe::Need;

/// `tidepool doctor`, with the preload library the tests build, and without `CARGO` (under
/// which it would build the library itself).
fn doctor() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tidepool"));
    cmd.arg("doctor")
        .env("TIDEPOOL_PRELOAD", common::preload())
        .env_remove("CARGO")
        .env_remove("TIDEPOOL_COORD");
    cmd
}

/// A feature's verdict line: "NAME: VERDICT".
fn verdict<'a>(report: &'a str, feature: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.starts_with(feature))
        .unwrap_or_else(|| panic!("no {feature:?} in:\n{report}"))
}

/// The report, which must have its two halves: the report and the verdict's exit status.
fn report(out: &Output) -> String {
    let (stdout, stderr) = common::text(out);
    let broken = stdout.contains("DOES NOT WORK");
    assert_eq!(out.status.success(), !broken, "{stdout}\n{stderr}");
    if broken {
        assert!(stderr.contains("cannot work on this host"), "{stderr}");
    }
    stdout
}

#[test]
fn on_a_host_with_everything_the_paging_and_soft_memory_features_work() {
    tidepool_sys::skip_unless!(Need::Userfaultfd);
    let out = doctor().output().unwrap();
    let text = report(&out);
    assert!(text.starts_with("tidepool doctor: Linux "), "{text}");
    for feature in [
        "tidepool run (paging an unmodified program)",
        "soft memory",
        "tidepool coord",
    ] {
        assert!(
            verdict(&text, feature).contains(": works"),
            "{feature}:\n{text}"
        );
    }
    if Need::Root.missing().is_none() && Need::CgroupV1Memory.missing().is_none() {
        let line = format!(
            "{:8} the cgroup v1 memory controller at /sys/fs/cgroup/memory",
            "ok"
        );
        assert!(text.contains(&line), "{text}");
    }
}

/// Another user, without rights to /dev/userfaultfd (and without the system call's privilege),
/// learns from the doctor what to change, and `tidepool run` sends them there.
#[test]
fn another_user_without_userfaultfd_rights_is_told_the_fix() {
    tidepool_sys::skip_unless!(Need::Root, Need::Userfaultfd);
    let open_to_all = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
        .is_ok_and(|v| v.trim() == "1");
    let dev_mode = std::fs::metadata("/dev/userfaultfd")
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()))
        .unwrap_or(0);
    if open_to_all || dev_mode & 0o006 != 0 {
        eprintln!("skipped: every user may use userfaultfd on this host");
        return;
    }
    let out = doctor()
        .env_remove("XDG_RUNTIME_DIR")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = report(&out);
    assert!(!out.status.success());
    assert!(
        verdict(&text, "tidepool run (paging").contains("DOES NOT WORK"),
        "{text}"
    );
    assert!(
        text.contains("MISSING  userfaultfd that also takes the kernel's faults"),
        "{text}"
    );
    assert!(
        text.contains("open /dev/userfaultfd read-write (`setfacl -m u:nobody:rw"),
        "{text}"
    );

    let run = Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .args(["run", "--local", "8M", "--", "true"])
        .env("TIDEPOOL_PRELOAD", common::preload())
        .env_remove("CARGO")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let (_, stderr) = common::text(&run);
    assert!(!run.status.success(), "{stderr}");
    assert!(stderr.contains("/dev/userfaultfd"), "{stderr}");
    assert!(stderr.contains("`tidepool doctor`"), "{stderr}");
}

/// A cgroup layout without the v1 memory controller (an empty tmpfs over /sys/fs/cgroup, in a
/// mount namespace of the test's own): the benchmarks' need is named, with the fix.
#[test]
fn a_layout_without_the_v1_memory_controller_is_named() {
    tidepool_sys::skip_unless!(Need::Root);
    let unshare = ["/usr/bin/unshare", "/bin/unshare"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    let Some(unshare) = unshare else {
        eprintln!("skipped: no unshare(1) to make a mount namespace");
        return;
    };
    let out = Command::new(unshare)
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs none /sys/fs/cgroup && exec \"$0\" doctor")
        .arg(env!("CARGO_BIN_EXE_tidepool"))
        .env("TIDEPOOL_PRELOAD", common::preload())
        .env_remove("CARGO")
        .env_remove("TIDEPOOL_COORD")
        .output()
        .unwrap();
    let text = report(&out);
    assert!(
        verdict(&text, "tidepool bench").contains("DOES NOT WORK"),
        "{text}"
    );
    assert!(
        text.contains("MISSING  the cgroup v1 memory controller (mounted at /sys/fs/cgroup/memory) is missing"),
        "{text}"
    );
    assert!(
        text.contains("fix: boot with systemd.unified_cgroup_hierarchy=0"),
        "{text}"
    );
    // Soft memory still works, sized by MemAvailable alone, and says so.
    assert!(verdict(&text, "soft memory").contains("works"), "{text}");
    assert!(
        text.contains("sizes itself by MemAvailable alone"),
        "{text}"
    );
}

#[test]
fn completions_and_man_pages_come_from_the_command_definitions() {
    let out = Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .args(["completions", "bash"])
        .output()
        .unwrap();
    let (bash, stderr) = common::text(&out);
    assert!(out.status.success(), "{stderr}");
    for word in ["doctor", "run", "--local", "node"] {
        assert!(bash.contains(word), "{word} not completed");
    }
    let dir = tempfile_dir();
    let out = Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .arg("manpages")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", common::text(&out));
    let page = std::fs::read_to_string(dir.join("tidepool-run.1")).unwrap();
    assert!(page.starts_with(".ie"), "not roff: {page:.200}");
    assert!(page.contains("\\-\\-local"), "{page:.2000}");
    assert!(dir.join("tidepool.1").exists());
    for internal in ["bench-worker", "manpages", "help"] {
        let page = dir.join(format!("tidepool-{internal}.1"));
        assert!(!page.exists(), "{} has a page", page.display());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A fresh directory under the test's scratch space.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("man-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}
