//! `tidepool run`, `tidepool resize` and `tidepool status`: unmodified programs with their heap
//! in far memory, and their budgets changed while they run.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use tidepool_node::format_size;
use tidepool_pager::run_env::{self, Join, RunEnv};

/// Where `tidepool run` finds libtidepool_preload.so: `TIDEPOOL_PRELOAD` if set, else where
/// the package installs it (`../lib/tidepool/` from this executable: /usr/lib/tidepool/ for
/// /usr/bin/tidepool), else next to this executable (a cargo build).
pub(crate) fn preload_library() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("TIDEPOOL_PRELOAD") {
        let path = PathBuf::from(path);
        if !path.exists() {
            bail!(
                "TIDEPOOL_PRELOAD names {}, which does not exist",
                path.display()
            );
        }
        return Ok(path);
    }
    let installed = std::env::current_exe().ok().and_then(|exe| {
        let lib = exe
            .parent()?
            .parent()?
            .join("lib/tidepool/libtidepool_preload.so");
        lib.exists().then_some(lib)
    });
    match installed {
        Some(lib) => Ok(lib),
        None => tidepool_bench::libs::next_to_exe("tidepool-preload", "libtidepool_preload.so"),
    }
}

/// The coordinator socket to join: `coord` (which must answer), else `$TIDEPOOL_COORD` or the
/// default socket if a coordinator answers there, else none.
pub(crate) fn coord_socket(
    coord: Option<&std::path::Path>,
    no_coord: bool,
) -> Result<Option<PathBuf>> {
    use tidepool_sys::seqpacket::Channel;
    if no_coord {
        return Ok(None);
    }
    match coord {
        Some(path) => {
            Channel::connect(path).with_context(|| {
                format!(
                    "no coordinator answers at {} (start one with `tidepool coord --socket \
                     {0}`, or run without --coord)",
                    path.display()
                )
            })?;
            Ok(Some(path.to_path_buf()))
        }
        None => {
            let path = std::env::var_os("TIDEPOOL_COORD")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(tidepool_coord::default_socket);
            Ok(Channel::connect(&path).is_ok().then_some(path))
        }
    }
}

/// How `tidepool run` joins a coordinator.
#[derive(Debug, Clone, clap::Args)]
pub struct JoinArgs {
    /// Join the coordinator at this socket [default: $TIDEPOOL_COORD, else `tidepool coord`'s
    /// default socket; joined if a coordinator answers there].
    #[arg(long, value_name = "SOCKET", conflicts_with = "no_coord")]
    pub coord: Option<PathBuf>,
    /// Do not join a coordinator: the budget stays --local.
    #[arg(long)]
    pub no_coord: bool,
    /// The coordinator's weight for this program (its gains count this many times).
    #[arg(long, default_value_t = 1.0)]
    pub weight: f64,
    /// The least local memory the coordinator leaves it while the host has room [default:
    /// the coordinator's floor].
    #[arg(long, value_parser = crate::parse_size_arg)]
    pub min: Option<u64>,
    /// The most local memory the coordinator gives it [default: no limit].
    #[arg(long, value_parser = crate::parse_size_arg)]
    pub max: Option<u64>,
    /// Its name on the coordinator's dashboard [default: the program's].
    #[arg(long)]
    pub name: Option<String>,
}

impl JoinArgs {
    /// The socket to join: the one named (which must answer), else the default one if a
    /// coordinator answers there, else none.
    fn socket(&self) -> Result<Option<PathBuf>> {
        coord_socket(self.coord.as_deref(), self.no_coord)
    }

    fn check(&self, local: u64) -> Result<()> {
        if !(self.weight.is_finite() && self.weight > 0.0) {
            bail!("--weight {} must be a positive number", self.weight);
        }
        if let (Some(min), Some(max)) = (self.min, self.max) {
            if min > max {
                bail!(
                    "--min {} is more than --max {}",
                    format_size(min),
                    format_size(max)
                );
            }
        }
        if let Some(max) = self.max.filter(|&m| m < local) {
            bail!(
                "--local {} is more than --max {}",
                format_size(local),
                format_size(max)
            );
        }
        Ok(())
    }
}

/// How `tidepool run` treats the program, beside its budget and store.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct RunOpts {
    /// Print faults, hits, prefetch accuracy and bytes moved when the program exits. A
    /// dynamically linked program that leaves with a raw exit_group system call, skipping its
    /// C library's exit handlers (a Go program built with cgo), prints nothing: ask
    /// `tidepool status PID` while it runs.
    #[arg(long)]
    pub stats: bool,
    /// Run a program the pager cannot serve (set-user-ID, a script whose interpreter is
    /// statically linked) anyway, all of its memory local.
    #[arg(long)]
    pub allow_unpaged: bool,
    /// Seconds a page fault may wait before the program is stopped (status 70) with a
    /// message saying why; 0 turns the watchdog off [default: 5].
    #[arg(long, env = run_env::FAULT_DEADLINE, value_parser = crate::parse_seconds)]
    pub fault_deadline: Option<f64>,
    /// Local memory of each child the program forks without exec, for the pages the child
    /// brings in or writes; the pages it still shares with its parent are counted in the
    /// parent's --local [default: a quarter of the parent's budget at the fork].
    #[arg(long, value_parser = crate::parse_size_arg)]
    pub child_local: Option<u64>,
}

/// Replaces this process with `program`, its heap paged over `backend` with `local` bytes
/// mapped. Returns only on failure.
pub fn run(
    local: u64,
    backend: &str,
    opts: &RunOpts,
    profile: Option<&Path>,
    join: &JoinArgs,
    program: &[OsString],
) -> Result<()> {
    let RunOpts {
        stats,
        allow_unpaged,
        fault_deadline,
        child_local,
    } = *opts;
    let (name, args) = program.split_first().context("no program given")?;
    if local < 1 << 20 {
        bail!("--local {local} is too small: give the program at least 1M of local memory");
    }
    join.check(local)?;
    if let Some(why) = tidepool_sys::probe::Need::Userfaultfd.missing() {
        bail!(
            "this host does not let tidepool page programs for this user: {why}. {}",
            tidepool_sys::probe::DOCTOR_HINT
        );
    }
    // The file the program runs from, looked up on PATH once.
    let found = find_program(name);
    if !allow_unpaged {
        if let Some(why) = found.as_deref().and_then(|p| unpageable(p, false)) {
            bail!(
                "{} cannot be paged: {why}. It would run with all of its memory local; \
                 pass --allow-unpaged to run it anyway",
                name.to_string_lossy()
            );
        }
    }
    // Fail here, with the URL in the message, rather than inside the program.
    let store = tidepool_store::open(backend).with_context(|| {
        format!(
            "the far store {} is not usable",
            tidepool_store::redact(backend)
        )
    })?;
    drop(store);
    let lib = preload_library()?;
    let mut preload = lib.into_os_string();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    // A statically linked program is started by `tidepool` itself, which watches over it.
    let loaded = found
        .clone()
        .filter(|p| tidepool_sys::exec_static::is_static(p));
    let mut cmd = match &loaded {
        Some(path) => crate::run_static::loader_command(path, name)?,
        None => Command::new(name),
    };
    cmd.args(args).env("LD_PRELOAD", preload);
    let mut env = RunEnv::new(local, backend);
    env.stats = stats;
    env.child_local = child_local;
    env.fault_deadline = fault_deadline.map(std::time::Duration::from_secs_f64);
    if let Some(path) = profile {
        // The program's process (exec keeps this pid; a static program's loader is a child,
        // which reports for it) says at exit if the profile fitted none of its images.
        env.profile = profile_for(path, found.as_deref(), name)?.map(|p| (p, std::process::id()));
    }
    env.coord = join.socket()?.map(|socket| Join {
        socket,
        weight: join.weight,
        min: join.min,
        max: join.max,
        name: join.name.clone(),
    });
    // What tune and the tests ask of every process, and the comparison switches, pass on
    // from this process's environment.
    env.pass_on_from_env();
    env.to_command(&mut cmd);
    if loaded.is_some() {
        return crate::run_static::supervise(cmd, name);
    }
    // exec: the program takes this process's place, so its exit status and signals are the
    // caller's directly.
    let err = cmd.exec();
    Err(err).with_context(|| format!("cannot run {}", name.to_string_lossy()))
}

/// The profile in `path`, checked (an unreadable or malformed one is an error), as the absolute
/// path to hand the program if it may fit the program in `file`; `None`, with a message saying
/// why, if it was made for another program or another build. A script (a pyenv shim, say) may
/// exec anything: its profile is handed on, each process applies it only if it runs the build
/// the profile is for, and the program's process says at exit if none did.
fn profile_for(path: &Path, file: Option<&Path>, name: &OsString) -> Result<Option<PathBuf>> {
    use tidepool_pager::profile::{Fit, Profile, Program};
    let profile = Profile::read(path)?;
    let path = std::fs::canonicalize(path)?;
    if file.is_some_and(|f| runs_in(f) != f) {
        return Ok(Some(path));
    }
    let me = file.and_then(|p| Program::of_file(p).ok());
    let shown = |p: &Program| match &p.build_id {
        Some(id) => format!("{} (build {id})", p.name),
        None => format!("{} (no build id)", p.name),
    };
    match me.as_ref().map(|me| (me, profile.fit(me))) {
        Some((_, Fit::Applies)) => return Ok(Some(path)),
        Some((me, Fit::OtherBuild)) => eprintln!(
            "tidepool run: the profile {} was tuned on {}, and this is {}: its call sites may have moved, so it is ignored (tune this build: tidepool tune)",
            path.display(),
            shown(&profile.program),
            shown(me)
        ),
        Some((me, _)) => eprintln!(
            "tidepool run: the profile {} is for {}, not {}: ignored",
            path.display(),
            shown(&profile.program),
            shown(me)
        ),
        None => eprintln!(
            "tidepool run: cannot tell which program {} runs, so the profile {} is ignored",
            name.to_string_lossy(),
            path.display()
        ),
    }
    Ok(None)
}

/// The executable a process started from `path` runs: the interpreter of a `#!` script
/// (`/usr/bin/env NAME` looked up on PATH), else the file itself.
pub(crate) fn runs_in(path: &Path) -> PathBuf {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    let Some(line) = head[..n].strip_prefix(b"#!") else {
        return path.to_path_buf();
    };
    let line = String::from_utf8_lossy(line.split(|&b| b == b'\n').next().unwrap_or_default())
        .into_owned();
    let mut words = line.split_whitespace();
    let Some(interp) = words.next() else {
        return path.to_path_buf();
    };
    if Path::new(interp).file_name().is_some_and(|n| n == "env") {
        if let Some(found) = words
            .find(|w| !w.starts_with('-'))
            .and_then(|w| find_program(&OsString::from(w)))
        {
            return found;
        }
    }
    PathBuf::from(interp)
}

/// The file `name` runs: itself if it has a slash, else the first match on PATH.
pub(crate) fn find_program(name: &OsString) -> Option<PathBuf> {
    let name = PathBuf::from(name);
    if name.components().count() > 1 {
        return Some(name);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(&name))
        .find(|p| p.is_file())
}

/// Why the pager cannot serve the program in `path`, if it cannot: it comes in through
/// LD_PRELOAD, which the loader ignores for a set-user-ID or set-group-ID program run by
/// someone else. A statically linked program is loaded by `tidepool` itself
/// (`run_static.rs`); a script is judged by its interpreter, which must load the library.
fn unpageable(path: &std::path::Path, interpreter: bool) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    let (euid, egid) = effective_ids();
    if meta.mode() & 0o4000 != 0 && meta.uid() != euid {
        return Some(format!(
            "{} is set-user-ID, and the dynamic loader ignores LD_PRELOAD for it",
            path.display()
        ));
    }
    if meta.mode() & 0o2000 != 0 && meta.gid() != egid {
        return Some(format!(
            "{} is set-group-ID, and the dynamic loader ignores LD_PRELOAD for it",
            path.display()
        ));
    }
    let mut head = vec![0u8; 4096];
    let n = {
        use std::io::Read;
        std::fs::File::open(path).ok()?.read(&mut head).ok()?
    };
    head.truncate(n);
    if let Some(line) = head.strip_prefix(b"#!") {
        let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
        let interp = String::from_utf8_lossy(line);
        let interp = interp.split_whitespace().next()?;
        return unpageable(std::path::Path::new(interp), true);
    }
    (interpreter && tidepool_sys::exec_static::is_static(path)).then(|| {
        format!(
            "its interpreter {} is statically linked, so it never loads the library that \
             pages its memory (run the interpreter itself: tidepool run --local SIZE -- {} \
             SCRIPT)",
            path.display(),
            path.display()
        )
    })
}

/// The effective user and group ids of this process.
fn effective_ids() -> (u32, u32) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(u32::MAX)
    };
    (field("Uid:"), field("Gid:"))
}

/// Changes the local budget of the program `pid` runs under `tidepool run`.
pub fn resize(pid: u32, local: u64) -> Result<()> {
    // The pager checks the size and explains a refusal; its reply comes back as the error.
    let reply = tidepool_pager::control::request(pid, &format!("budget {local}"))?;
    let now = reply
        .strip_prefix("budget ")
        .and_then(|n| n.trim().parse::<u64>().ok())
        .map(format_size)
        .unwrap_or_else(|| reply.trim().to_string());
    println!("process {pid}: local budget now {now}");
    Ok(())
}

/// Adds a memory node to the far store of the program `pid` runs under `tidepool run`.
pub fn add_node(pid: u32, addr: &str) -> Result<()> {
    tidepool_pager::control::request(pid, &format!("add-node {addr}"))?;
    println!("process {pid}: memory node {addr} added to its far store");
    Ok(())
}

/// Prints the pager statistics of the program `pid` runs under `tidepool run`.
pub fn status(pid: u32) -> Result<()> {
    let reply = tidepool_pager::control::request(pid, "stats")?;
    println!("{}", reply.trim_end());
    Ok(())
}
