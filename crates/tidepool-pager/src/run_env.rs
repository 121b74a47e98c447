//! The settings `tidepool run` hands the preload library through the program's environment,
//! as one struct: `tidepool run` (and `tidepool tune`, the static loader) write it with
//! [`RunEnv::to_command`], the preload library reads it with [`RunEnv::from_env`], so the two
//! sides of the process boundary share every name, form and default.
//!
//! The variables stay in the environment: a wrapper script (a pyenv shim, say) passes them on to
//! the program it runs, and programs the program starts get pagers of their own. Every variable
//! is listed with its default in the README's table of environment variables.
//!
//! A field added here is a compile error at each place that builds the struct, which is the
//! point: the struct has public fields and no `#[non_exhaustive]`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use tidepool_sys::size::parse_size;

/// The local budget in bytes (`256M` forms accepted); paging is off without it.
pub const LOCAL: &str = "TIDEPOOL_RUN_LOCAL";
/// The far store's URL (default `local:`, the in-process store).
pub const BACKEND: &str = "TIDEPOOL_RUN_BACKEND";
/// `1`: print the pager's statistics to standard error at exit.
pub const STATS: &str = "TIDEPOOL_RUN_STATS";
/// The budget of a child forked without exec (default: a quarter of the parent's).
pub const CHILD_LOCAL: &str = "TIDEPOOL_RUN_CHILD_LOCAL";
/// Seconds a fault may wait before the watchdog stops the program (default 5; 0: never).
pub const FAULT_DEADLINE: &str = "TIDEPOOL_RUN_FAULT_DEADLINE";
/// A profile's path (`tidepool run --profile`).
pub const PROFILE: &str = "TIDEPOOL_RUN_PROFILE";
/// The pid of the process that reports at exit whether the profile fitted it.
pub const PROFILE_PID: &str = "TIDEPOOL_RUN_PROFILE_PID";
/// A directory each process writes what its sections did to (`tidepool tune`).
pub const SECTIONS_OUT: &str = "TIDEPOOL_RUN_SECTIONS_OUT";
/// With [`SECTIONS_OUT`]: record this many demand faults (at most
/// [`crate::fault_trace::CAPACITY_MAX`]) and write them there too (`tidepool tune`'s offline
/// search, `fault_trace.rs`).
pub const FAULT_TRACE: &str = "TIDEPOOL_RUN_FAULT_TRACE";
/// A coordinator's socket to join.
pub const COORD: &str = "TIDEPOOL_RUN_COORD";
/// The registration's weight (default 1).
pub const WEIGHT: &str = "TIDEPOOL_RUN_WEIGHT";
/// The least budget the coordinator may leave the program.
pub const MIN: &str = "TIDEPOOL_RUN_MIN";
/// The most budget the coordinator may give the program.
pub const MAX: &str = "TIDEPOOL_RUN_MAX";
/// The name the program registers under (default: its command name).
pub const NAME: &str = "TIDEPOOL_RUN_NAME";
/// For tests of the watchdog: the fault handlers stop for good after this many faults.
pub const STALL_AFTER: &str = "TIDEPOOL_RUN_STALL_AFTER";
/// `0`: the plain in-process store keeps far pages as copies, not moved frames.
pub const FRAMES: &str = "TIDEPOOL_RUN_FRAMES";
/// `0`: the compressing in-process store keeps a copy of a page that came back.
pub const DROP_COPIES: &str = "TIDEPOOL_RUN_DROP_COPIES";
/// `0`: no probation tier in front of a store outside the process.
pub const PROBATION: &str = "TIDEPOOL_RUN_PROBATION";
/// `0`: a budget that grows does not bring evicted pages back before they are asked for.
pub const REFILL: &str = "TIDEPOOL_RUN_REFILL";
/// `0`: every fault handler reads faults, rather than one following the program's CPU.
pub const FOLLOW: &str = "TIDEPOOL_RUN_FOLLOW";

/// Every variable of the contract, in the order the README lists them.
pub const ALL: [&str; 20] = [
    LOCAL,
    BACKEND,
    STATS,
    CHILD_LOCAL,
    FAULT_DEADLINE,
    PROFILE,
    PROFILE_PID,
    SECTIONS_OUT,
    FAULT_TRACE,
    COORD,
    WEIGHT,
    MIN,
    MAX,
    NAME,
    STALL_AFTER,
    FRAMES,
    DROP_COPIES,
    PROBATION,
    REFILL,
    FOLLOW,
];

/// What `tidepool run` tells the preload library. Its Debug form hides the store URL's
/// password and token.
#[derive(Clone, PartialEq)]
pub struct RunEnv {
    /// The local budget, bytes.
    pub local: u64,
    /// The far store's URL.
    pub backend: String,
    /// Print the pager's statistics at exit.
    pub stats: bool,
    /// The budget of a child forked without exec (`None`: a quarter of the parent's).
    pub child_local: Option<u64>,
    /// How long a fault may wait before the watchdog stops the program (`None`: the pager's
    /// default; zero: no watchdog).
    pub fault_deadline: Option<Duration>,
    /// The profile to apply, and the pid whose process says at exit if it fitted none of its
    /// images.
    pub profile: Option<(PathBuf, u32)>,
    /// Where each process writes what its sections did (`tidepool tune`).
    pub sections_out: Option<PathBuf>,
    /// How many demand faults each process records and writes beside its sections (0: none).
    pub fault_trace: usize,
    /// The coordinator to join.
    pub coord: Option<Join>,
    /// For tests of the watchdog: the fault handlers stop after this many faults.
    pub stall_after: Option<u64>,
    /// Parts of the pager that are on unless turned off, to compare.
    pub switches: Switches,
}

/// How the program joins a coordinator.
#[derive(Debug, Clone, PartialEq)]
pub struct Join {
    pub socket: PathBuf,
    pub weight: f64,
    pub min: Option<u64>,
    pub max: Option<u64>,
    /// `None`: the program's command name.
    pub name: Option<String>,
}

/// Parts of the pager that are on unless a variable set to `0` turns them off, to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switches {
    /// The plain in-process store keeps far pages as frames moved with UFFDIO_MOVE.
    pub frames: bool,
    /// The compressing in-process store keeps no copy of a page that came back.
    pub drop_copies: bool,
    /// A store outside the process gets a probation tier in front of it.
    pub probation: bool,
    /// A budget that grows brings evicted pages back before they are asked for.
    pub refill: bool,
    /// One fault handler follows the program's CPU.
    pub follow: bool,
}

impl Default for Switches {
    fn default() -> Switches {
        Switches {
            frames: true,
            drop_copies: true,
            probation: true,
            refill: true,
            follow: true,
        }
    }
}

/// A variable of the contract that holds something it cannot.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{var}={value} is not {want}")]
pub struct EnvError {
    pub var: &'static str,
    pub value: String,
    pub want: &'static str,
}

impl std::fmt::Debug for RunEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunEnv")
            .field("local", &self.local)
            .field("backend", &tidepool_store::redact(&self.backend))
            .field("stats", &self.stats)
            .field("child_local", &self.child_local)
            .field("fault_deadline", &self.fault_deadline)
            .field("profile", &self.profile)
            .field("sections_out", &self.sections_out)
            .field("fault_trace", &self.fault_trace)
            .field("coord", &self.coord)
            .field("stall_after", &self.stall_after)
            .field("switches", &self.switches)
            .finish()
    }
}

impl RunEnv {
    /// A budget and a store, everything else at its default.
    pub fn new(local: u64, backend: &str) -> RunEnv {
        RunEnv {
            local,
            backend: backend.to_string(),
            stats: false,
            child_local: None,
            fault_deadline: None,
            profile: None,
            sections_out: None,
            fault_trace: 0,
            coord: None,
            stall_after: None,
            switches: Switches::default(),
        }
    }

    /// Writes every variable of the contract into `cmd`'s environment: the ones this holds set,
    /// the others removed, so nothing of an outer `tidepool run` leaks into an inner one.
    pub fn to_command(&self, cmd: &mut Command) {
        for var in ALL {
            cmd.env_remove(var);
        }
        for (var, value) in self.vars() {
            cmd.env(var, value);
        }
    }

    /// The variables this sets, with their values.
    pub fn vars(&self) -> Vec<(&'static str, OsString)> {
        let mut v: Vec<(&'static str, OsString)> = vec![
            (LOCAL, self.local.to_string().into()),
            (BACKEND, self.backend.clone().into()),
        ];
        let mut put = |var, value: Option<OsString>| v.extend(value.map(|x| (var, x)));
        put(STATS, self.stats.then(|| "1".into()));
        put(CHILD_LOCAL, self.child_local.map(|b| b.to_string().into()));
        put(
            FAULT_DEADLINE,
            self.fault_deadline
                .map(|d| d.as_secs_f64().to_string().into()),
        );
        if let Some((path, pid)) = &self.profile {
            put(PROFILE, Some(path.clone().into()));
            put(PROFILE_PID, Some(pid.to_string().into()));
        }
        put(SECTIONS_OUT, self.sections_out.clone().map(Into::into));
        put(
            FAULT_TRACE,
            (self.fault_trace > 0).then(|| self.fault_trace.to_string().into()),
        );
        if let Some(j) = &self.coord {
            put(COORD, Some(j.socket.clone().into()));
            put(WEIGHT, Some(j.weight.to_string().into()));
            put(MIN, j.min.map(|b| b.to_string().into()));
            put(MAX, j.max.map(|b| b.to_string().into()));
            put(NAME, j.name.clone().map(Into::into));
        }
        put(STALL_AFTER, self.stall_after.map(|n| n.to_string().into()));
        let s = self.switches;
        for (var, on) in [
            (FRAMES, s.frames),
            (DROP_COPIES, s.drop_copies),
            (PROBATION, s.probation),
            (REFILL, s.refill),
            (FOLLOW, s.follow),
        ] {
            put(var, (!on).then(|| "0".into()));
        }
        v
    }

    /// The settings in this process's environment; `None` if `TIDEPOOL_RUN_LOCAL` is unset
    /// (paging is off).
    pub fn from_env() -> Result<Option<RunEnv>, EnvError> {
        RunEnv::from_vars(|var| std::env::var_os(var))
    }

    /// The settings `get` gives, as [`RunEnv::from_env`] reads them.
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<Option<RunEnv>, EnvError> {
        let text = |var: &str| get(var).map(|v| v.to_string_lossy().into_owned());
        let Some(local) = text(LOCAL) else {
            return Ok(None);
        };
        let mut env = RunEnv::new(
            size(LOCAL, &local)?,
            &text(BACKEND).unwrap_or_else(|| "local:".into()),
        );
        env.stats = text(STATS).is_some_and(|v| !v.is_empty() && v != "0");
        env.child_local = text(CHILD_LOCAL)
            .map(|v| size(CHILD_LOCAL, &v))
            .transpose()?;
        env.fault_deadline = text(FAULT_DEADLINE)
            .map(|v| {
                v.parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s >= 0.0)
                    .map(Duration::from_secs_f64)
                    .ok_or_else(|| {
                        bad(
                            FAULT_DEADLINE,
                            &v,
                            "a number of seconds (e.g. 5, 0.5; 0 turns the watchdog off)",
                        )
                    })
            })
            .transpose()?;
        env.profile = get(PROFILE).map(|p| {
            let pid = text(PROFILE_PID).and_then(|p| p.parse().ok()).unwrap_or(0);
            (PathBuf::from(p), pid)
        });
        env.coord = Join::from_vars(&get)?;
        env.pass_on_from_vars(&get);
        Ok(Some(env))
    }
}

impl RunEnv {
    /// Takes from this process's environment what `tidepool run` passes on rather than sets:
    /// where tune wants the sections (and a fault trace) written, the watchdog tests' stall, and the comparison
    /// switches.
    pub fn pass_on_from_env(&mut self) {
        self.pass_on_from_vars(&|var| std::env::var_os(var));
    }

    fn pass_on_from_vars(&mut self, get: &impl Fn(&str) -> Option<OsString>) {
        self.sections_out = get(SECTIONS_OUT)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        self.fault_trace = get(FAULT_TRACE)
            .and_then(|v| v.to_string_lossy().parse().ok())
            .unwrap_or(0);
        self.stall_after = get(STALL_AFTER).and_then(|v| v.to_string_lossy().parse().ok());
        self.switches = Switches::from_vars(get);
    }
}

impl Join {
    fn from_vars(get: &impl Fn(&str) -> Option<OsString>) -> Result<Option<Join>, EnvError> {
        let Some(socket) = get(COORD).filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let text = |var: &str| get(var).map(|v| v.to_string_lossy().into_owned());
        let weight = match text(WEIGHT) {
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|w| w.is_finite() && *w > 0.0)
                .ok_or_else(|| bad(WEIGHT, &v, "a positive number"))?,
            None => 1.0,
        };
        Ok(Some(Join {
            socket: socket.into(),
            weight,
            min: text(MIN).map(|v| size(MIN, &v)).transpose()?,
            max: text(MAX).map(|v| size(MAX, &v)).transpose()?,
            name: text(NAME),
        }))
    }
}

impl Switches {
    fn from_vars(get: &impl Fn(&str) -> Option<OsString>) -> Switches {
        let on = |var| get(var).is_none_or(|v| v != "0");
        Switches {
            frames: on(FRAMES),
            drop_copies: on(DROP_COPIES),
            probation: on(PROBATION),
            refill: on(REFILL),
            follow: on(FOLLOW),
        }
    }
}

fn bad(var: &'static str, value: &str, want: &'static str) -> EnvError {
    EnvError {
        var,
        value: value.to_string(),
        want,
    }
}

fn size(var: &'static str, value: &str) -> Result<u64, EnvError> {
    parse_size(value).map_err(|_| bad(var, value, "a size (use e.g. 64M or 2G)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&'static str, OsString)]) -> Result<Option<RunEnv>, EnvError> {
        let map: HashMap<&str, OsString> = vars.iter().cloned().collect();
        RunEnv::from_vars(|v| map.get(v).cloned())
    }

    #[test]
    fn what_run_writes_the_preload_reads_back() {
        let mut env = RunEnv::new(64 << 20, "node://127.0.0.1:7000");
        env.stats = true;
        env.child_local = Some(16 << 20);
        env.fault_deadline = Some(Duration::from_millis(2500));
        env.profile = Some(("/tmp/p.toml".into(), 42));
        env.sections_out = Some("/tmp/out".into());
        env.fault_trace = 1000;
        env.coord = Some(Join {
            socket: "/run/coord.sock".into(),
            weight: 2.5,
            min: Some(1 << 20),
            max: None,
            name: Some("svc".into()),
        });
        env.stall_after = Some(7);
        env.switches.refill = false;
        env.switches.frames = false;
        assert_eq!(read(&env.vars()).unwrap(), Some(env.clone()));
        let plain = RunEnv::new(1 << 30, "local:");
        assert_eq!(read(&plain.vars()).unwrap(), Some(plain.clone()));
        assert_eq!(plain.vars().len(), 2, "defaults are not written");
    }

    #[test]
    fn a_bad_value_names_its_variable_and_what_it_wants() {
        let err = read(&[(LOCAL, "lots".into())]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "TIDEPOOL_RUN_LOCAL=lots is not a size (use e.g. 64M or 2G)"
        );
        let err = read(&[
            (LOCAL, "1G".into()),
            (COORD, "/s".into()),
            (WEIGHT, "-1".into()),
        ])
        .unwrap_err();
        assert_eq!(err.var, WEIGHT);
        assert!(read(&[]).unwrap().is_none(), "no budget: paging is off");
        let env = read(&[(LOCAL, "256M".into())]).unwrap().unwrap();
        assert_eq!((env.local, env.backend.as_str()), (256 << 20, "local:"));
    }

    #[test]
    fn the_debug_form_hides_the_stores_password() {
        let env = RunEnv::new(1 << 30, "redis://:hunter2@127.0.0.1:6379");
        let shown = format!("{env:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("127.0.0.1:6379"),
            "{shown}"
        );
    }

    #[test]
    fn writing_clears_what_an_outer_run_set() {
        let mut cmd = Command::new("true");
        cmd.env(PROFILE, "/old.toml").env(STATS, "1");
        RunEnv::new(1 << 30, "local:").to_command(&mut cmd);
        let set: HashMap<_, _> = cmd.get_envs().collect();
        assert_eq!(set.get(std::ffi::OsStr::new(PROFILE)), Some(&None));
        assert_eq!(set.get(std::ffi::OsStr::new(STATS)), Some(&None));
    }
}
