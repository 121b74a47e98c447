//! `tidepool doctor`: what each feature needs from this host, checked one by one, with the one
//! thing to change where something is missing.
//!
//! Every check is made for real (a userfaultfd object opened, a memfd mapped, a socket
//! connected), never read off a version number alone, and as the user who runs the command:
//! what root has, another user may lack.

use anyhow::Result;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use tidepool_sys::probe::Need;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Present.
    Ok,
    /// Missing, but the feature still works (slower, or with less).
    Limited,
    /// Missing: the feature cannot work here.
    Missing,
}

/// One thing a feature needs, as found.
#[derive(Debug, Clone)]
pub struct Check {
    pub level: Level,
    /// What was checked and what was found.
    pub found: String,
    /// The one thing to change, where something is missing.
    pub fix: Option<String>,
}

impl Check {
    fn ok(found: impl Into<String>) -> Check {
        Check {
            level: Level::Ok,
            found: found.into(),
            fix: None,
        }
    }

    fn limited(found: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            level: Level::Limited,
            found: found.into(),
            fix: Some(fix.into()),
        }
    }

    fn missing(found: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            level: Level::Missing,
            found: found.into(),
            fix: Some(fix.into()),
        }
    }
}

/// A feature and what it needs.
#[derive(Debug, Clone)]
pub struct Feature {
    pub name: String,
    pub checks: Vec<Check>,
}

impl Feature {
    /// The worst of its checks.
    pub fn level(&self) -> Level {
        self.checks
            .iter()
            .map(|c| c.level)
            .max()
            .unwrap_or(Level::Ok)
    }
}

/// `tidepool doctor [--url URL]`: prints every feature's checks; fails if a feature cannot work.
pub fn run(url: Option<&str>) -> Result<()> {
    let features = examine(url);
    print!("{}", render(&features));
    let broken: Vec<&str> = features
        .iter()
        .filter(|f| f.level() == Level::Missing)
        .map(|f| f.name.as_str())
        .collect();
    if !broken.is_empty() {
        anyhow::bail!(
            "{} cannot work on this host as it is: {}. The fixes are above",
            if broken.len() == 1 {
                "one feature"
            } else {
                "some features"
            },
            broken.join("; ")
        );
    }
    Ok(())
}

/// Every feature's checks, on this host, as this user.
pub fn examine(url: Option<&str>) -> Vec<Feature> {
    let mut features = vec![
        Feature {
            name: "tidepool run (paging an unmodified program)".into(),
            checks: paging(),
        },
        Feature {
            name: "tidepool run of statically linked programs (Go, musl)".into(),
            checks: vec![seccomp_listener()],
        },
        Feature {
            name: "soft memory (SoftMap, SoftDict, tidepool cache)".into(),
            checks: soft_memory(),
        },
        Feature {
            name: "tidepool coord (moving idle memory between programs)".into(),
            checks: vec![coordinator()],
        },
        Feature {
            name: "tidepool bench (the peers: zram, memory cgroups)".into(),
            checks: benches(),
        },
    ];
    if let Some(url) = url {
        features.push(Feature {
            name: format!("the far store {}", tidepool_store::redact(url)),
            checks: vec![store(url)],
        });
    }
    features
}

/// The report, a feature a paragraph: its verdict, then each check with its fix.
pub fn render(features: &[Feature]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "tidepool doctor: {}\n", host_line());
    for f in features {
        let verdict = match f.level() {
            Level::Ok => "works",
            Level::Limited => "works, with less",
            Level::Missing => "DOES NOT WORK",
        };
        let _ = writeln!(out, "{}: {verdict}", f.name);
        for c in &f.checks {
            let mark = match c.level {
                Level::Ok => "ok",
                Level::Limited => "limited",
                Level::Missing => "MISSING",
            };
            let _ = writeln!(out, "  {mark:8} {}", c.found);
            if let Some(fix) = &c.fix {
                let _ = writeln!(out, "  {:8} fix: {fix}", "");
            }
        }
        out.push('\n');
    }
    out
}

/// The kernel and the user the checks ran as.
fn host_line() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let uid = rustix::process::geteuid().as_raw();
    let who = if uid == 0 { " (root)" } else { "" };
    format!("Linux {}, checked as uid {uid}{who}", kernel.trim())
}

/// The user's name for a fix that names it (`uid N` where it has none).
fn user_name() -> String {
    let uid = rustix::process::geteuid().as_raw();
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|p| {
            p.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.get(2) == Some(&uid.to_string().as_str())).then(|| f[0].to_string())
            })
        })
        .unwrap_or_else(|| uid.to_string())
}

/// The pager's needs: 4 KiB pages, a userfaultfd object that takes the kernel's faults too,
/// UFFDIO_MOVE, and the preload library.
fn paging() -> Vec<Check> {
    let mut checks = Vec::new();
    match tidepool_sys::uffd::Uffd::open() {
        Ok(uffd) => {
            checks.push(Check::ok(
                "userfaultfd that also takes the kernel's faults (4 KiB pages)",
            ));
            checks.push(if uffd.can_move() {
                Check::ok("UFFDIO_MOVE: evicted pages are moved out, not copied")
            } else {
                Check::limited(
                    "no UFFDIO_MOVE (Linux before 6.8): evicted pages are copied, and the \
                     probation tier that keeps them mapped is off",
                    "a kernel of 6.8 or later",
                )
            });
        }
        Err(e) => checks.push(Check::missing(
            format!("userfaultfd that also takes the kernel's faults: {e}"),
            format!(
                "let user {} open /dev/userfaultfd read-write (`setfacl -m u:{0}:rw \
                 /dev/userfaultfd`, or a udev rule: KERNEL==\"userfaultfd\", GROUP=\"tidepool\", \
                 MODE=\"0660\"), or run as root",
                user_name()
            ),
        )),
    }
    checks.push(match crate::run::preload_library() {
        Ok(lib) => Check::ok(format!("the preload library: {}", lib.display())),
        Err(e) => Check::missing(
            format!("the preload library: {e}"),
            "reinstall tidepool (the package puts it in /usr/lib/tidepool/), or set \
                 TIDEPOOL_PRELOAD to its path",
        ),
    });
    checks
}

/// Statically linked programs' memory calls reach the pager through seccomp user
/// notification (Linux 5.0).
fn seccomp_listener() -> Check {
    let actions =
        std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail").unwrap_or_default();
    if actions.split_whitespace().any(|a| a == "user_notif") {
        Check::ok("seccomp user notification")
    } else {
        Check::missing(
            "seccomp user notification (not in /proc/sys/kernel/seccomp/actions_avail)",
            "a kernel of 5.0 or later built with CONFIG_SECCOMP_FILTER; until then run \
             dynamically linked programs only",
        )
    }
}

/// Soft memory's arenas: a memfd whose holes raise SIGBUS (a user-mode userfaultfd), better
/// with shmem huge pages.
fn soft_memory() -> Vec<Check> {
    use tidepool_sys::memfd::{ShmemHugePages, SigbusMap};
    let mut checks = vec![match SigbusMap::create(2 << 20, 2 << 20) {
        Ok(_) => Check::ok("a memfd whose holes raise SIGBUS (userfaultfd, user faults only)"),
        Err(e) => Check::missing(
            format!(
                "a memfd whose holes raise SIGBUS: {}",
                e.to_string()
                    .trim_end_matches(tidepool_sys::probe::DOCTOR_HINT)
                    .trim_end_matches("; ")
            ),
            "sysctl vm.unprivileged_userfaultfd=1, or a kernel of 5.11 or later (which lets \
             any user catch its own faults), or run as root",
        ),
    }];
    checks.push(match ShmemHugePages::detect() {
        ShmemHugePages::Enabled => {
            Check::ok("shmem huge pages: memory is taken back at ~200 GiB/s")
        }
        _ => Check::limited(
            "shmem huge pages are off: memory is taken back at ~5 GiB/s instead of ~200",
            "echo within_size > /sys/kernel/mm/transparent_hugepage/shmem_enabled",
        ),
    });
    checks.push(memory_cgroups());
    checks.push(match tidepool_soft::budget::mem_available() {
        Some(bytes) => Check::ok(format!(
            "idle memory to grow into: MemAvailable {} MiB",
            bytes >> 20
        )),
        None => Check::missing(
            "MemAvailable in /proc/meminfo (soft memory sizes itself by it)",
            "mount /proc (a container without it cannot run soft memory)",
        ),
    });
    checks
}

/// The cgroup layout, and the memory cgroups whose limits soft memory stays within (v1's
/// memory controller or v2's unified hierarchy: both are read).
fn memory_cgroups() -> Check {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let v1 = own.lines().any(|l| {
        l.split(':')
            .nth(1)
            .is_some_and(|c| c.split(',').any(|c| c == "memory"))
    });
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let layout = match (v1, v2) {
        (true, _) if Path::new("/sys/fs/cgroup/memory").is_dir() => "cgroup v1 (memory controller)",
        (true, _) => "cgroup v1, its memory controller not mounted at /sys/fs/cgroup/memory",
        (false, true) => "cgroup v2 (unified)",
        (false, false) => "no cgroup filesystem",
    };
    match tidepool_soft::budget::MemoryView::of_this_process().cgroups() {
        0 => Check::limited(
            format!("{layout}: no memory cgroup with limits is readable, so soft memory sizes itself by MemAvailable alone"),
            "mount the cgroup filesystem (read-only will do) where the process can read its \
             memory limits, e.g. in a container",
        ),
        n => Check::ok(format!(
            "{layout}: soft memory stays within the limits of its memory cgroup and those \
             above it ({n})"
        )),
    }
}

/// The coordinator's socket: one answering, or a place `tidepool coord` can make it.
fn coordinator() -> Check {
    let socket = std::env::var_os("TIDEPOOL_COORD")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(tidepool_coord::default_socket);
    if tidepool_sys::seqpacket::Channel::connect(&socket).is_ok() {
        return Check::ok(format!("a coordinator answers at {}", socket.display()));
    }
    match can_create_beside(&socket) {
        Ok(dir) => Check::ok(format!(
            "none running; `tidepool coord` would listen at {} ({} is writable)",
            socket.display(),
            dir.display()
        )),
        Err(why) => Check::missing(
            format!("cannot make the socket {}: {why}", socket.display()),
            "give `tidepool coord --socket PATH` a path in a directory of yours, and the \
             same path to programs in TIDEPOOL_COORD",
        ),
    }
}

/// The nearest existing directory above `path`, if this user may write into it.
fn can_create_beside(path: &Path) -> Result<PathBuf, String> {
    let mut dir = path.parent().ok_or("the path has no directory")?;
    while !dir.exists() {
        dir = dir.parent().ok_or("no directory of it exists")?;
    }
    rustix::fs::access(dir, rustix::fs::Access::WRITE_OK)
        .map(|()| dir.to_path_buf())
        .map_err(|e| format!("{} is not writable ({e})", dir.display()))
}

/// The benchmarks' peers: root, the cgroup v1 memory controller, zram and swapon.
fn benches() -> Vec<Check> {
    let mut checks = vec![
        match Need::Root.missing() {
            None => Check::ok("root (to make cgroups and swap devices)"),
            Some(why) => Check::missing(why, "run `tidepool bench` as root (sudo)"),
        },
        match Need::CgroupV1Memory.missing() {
            None => Check::ok("the cgroup v1 memory controller at /sys/fs/cgroup/memory"),
            Some(why) => Check::missing(
                format!("{why} is missing: the peers run in v1 memory cgroups"),
                "boot with systemd.unified_cgroup_hierarchy=0 (a hybrid layout), or mount \
                 it: mkdir -p /sys/fs/cgroup/memory && mount -t cgroup -o memory none \
                 /sys/fs/cgroup/memory",
            ),
        },
    ];
    let zram = Path::new("/sys/block/zram0").exists()
        || Path::new("/sys/class/zram-control").exists()
        || Path::new("/sys/module/zram").exists();
    checks.push(if zram {
        Check::ok("zram (the swap the paging suites compare with)")
    } else {
        Check::missing(
            "zram: no /sys/block/zram0 and the module is not loaded",
            "modprobe zram (the package linux-modules-extra-$(uname -r) on Ubuntu)",
        )
    });
    checks.push(if on_path("swapon") && on_path("mkswap") {
        Check::ok("swapon and mkswap")
    } else {
        Check::missing(
            "swapon and mkswap are not on PATH",
            "apt install util-linux (or your distribution's package with them)",
        )
    });
    checks
}

/// Whether `program` is an executable file in a directory of PATH.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|d| {
            let p = d.join(program);
            p.is_file() && rustix::fs::access(&p, rustix::fs::Access::EXEC_OK).is_ok()
        })
    })
}

/// A far store the user named: opened, and its counters read.
fn store(url: &str) -> Check {
    let shown = tidepool_store::redact(url);
    match tidepool_store::open(url).and_then(|s| s.stats()) {
        Ok(stats) => Check::ok(format!(
            "reachable; it holds {} bytes",
            stats
                .far_bytes
                .map_or("an unknown number of".to_string(), |b| b.to_string())
        )),
        Err(e) => Check::missing(
            format!("{shown} is not usable: {e:#}"),
            "start the server (`tidepool node --listen ADDR`), or correct the URL's address \
             and token",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feature_is_as_good_as_its_worst_check() {
        let f = Feature {
            name: "x".into(),
            checks: vec![Check::ok("a"), Check::limited("b", "c")],
        };
        assert_eq!(f.level(), Level::Limited);
        let f = Feature {
            name: "x".into(),
            checks: vec![Check::missing("a", "fix a"), Check::limited("b", "c")],
        };
        assert_eq!(f.level(), Level::Missing);
    }

    #[test]
    fn the_report_names_each_missing_piece_with_its_fix() {
        let text = render(&[Feature {
            name: "paging".into(),
            checks: vec![
                Check::ok("one"),
                Check::missing("two is absent", "install two"),
            ],
        }]);
        assert!(text.contains("paging: DOES NOT WORK"), "{text}");
        assert!(text.contains("MISSING  two is absent"), "{text}");
        assert!(text.contains("fix: install two"), "{text}");
    }

    #[test]
    fn a_directory_that_exists_is_found_above_a_missing_path() {
        let dir = std::env::temp_dir();
        let found = can_create_beside(&dir.join("no/such/dir/sock")).unwrap();
        assert_eq!(found, dir);
    }
}
