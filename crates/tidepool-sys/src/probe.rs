//! What this machine lets a process do, for tests that need more than a user's rights: they
//! skip with the reason printed instead of failing (`skip_unless!`).

use std::path::Path;

/// What the commands add when they stop for a reason of the host's (a missing kernel feature,
/// a permission, a cgroup layout) rather than of their arguments.
pub const DOCTOR_HINT: &str =
    "`tidepool doctor` checks everything tidepool needs on this host and names the fix";

/// Something a test needs from the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Running as root (to run programs as another user, or to make cgroups).
    Root,
    /// The cgroup v1 memory controller, with this process's cgroup in it.
    CgroupV1Memory,
    /// A userfaultfd object that also catches the kernel's faults (what the pager uses).
    Userfaultfd,
}

impl Need {
    /// `None` if the machine has it; else what is missing and how to get it.
    pub fn missing(self) -> Option<String> {
        match self {
            Need::Root => {
                // SAFETY: geteuid has no preconditions and cannot fail.
                let uid = unsafe { libc::geteuid() };
                (uid != 0).then(|| format!("root (running as uid {uid})"))
            }
            Need::CgroupV1Memory => {
                let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
                let in_v1 = own.lines().any(|l| {
                    l.split(':')
                        .nth(1)
                        .is_some_and(|c| c.split(',').any(|c| c == "memory"))
                });
                (!(in_v1 && Path::new("/sys/fs/cgroup/memory").is_dir())).then(|| {
                    "the cgroup v1 memory controller (mounted at /sys/fs/cgroup/memory)".to_string()
                })
            }
            Need::Userfaultfd => crate::userfaultfd(0, crate::FaultsFrom::UserAndKernel)
                .err()
                .map(|e| format!("userfaultfd with kernel faults: {e}")),
        }
    }
}

/// `None` if the machine has everything in `needs`; else each thing missing.
pub fn missing(needs: &[Need]) -> Option<String> {
    let m: Vec<String> = needs.iter().filter_map(|n| n.missing()).collect();
    (!m.is_empty()).then(|| m.join("; and "))
}

/// Returns from the calling test, saying why, unless the machine has everything named:
/// `tidepool_sys::skip_unless!(Need::Root, Need::CgroupV1Memory);`
#[macro_export]
macro_rules! skip_unless {
    ($($need:expr),+ $(,)?) => {
        if let Some(why) = $crate::probe::missing(&[$($need),+]) {
            eprintln!("skipped: this test needs {why}");
            return;
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_missing_exactly_when_not_root() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert_eq!(Need::Root.missing().is_none(), root);
        if !root {
            assert!(missing(&[Need::Root]).unwrap().starts_with("root"));
        }
    }

    #[test]
    fn skip_unless_returns_before_the_rest_when_something_is_missing() {
        fn guarded(ran: &mut bool) {
            crate::skip_unless!(Need::Root, Need::CgroupV1Memory);
            *ran = true;
        }
        let mut ran = false;
        guarded(&mut ran);
        assert_eq!(ran, missing(&[Need::Root, Need::CgroupV1Memory]).is_none());
    }
}
