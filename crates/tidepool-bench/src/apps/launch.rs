//! Running a program under each system: natively, under `tidepool run` (as a user types it, the
//! plain in-process store, or a memory node) or in a memory cgroup swapping to zram; to its
//! end, timed, its peak RSS, the bytes each system holds for it and the cross-CPU interrupts
//! the machine took meanwhile followed.

use crate::harness::on_any_cpu;
use crate::meter::{FarGauge, Gauge, Held, Watch};
use crate::zram::Zram;
use anyhow::{anyhow, Context, Result};
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tidepool_sys::interrupts::Interrupts;

/// Where a program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    /// `tidepool run --local N -- PROGRAM`: the default store, pages compressed in process.
    TidepoolDefault,
    /// `tidepool-default` with `--profile`: a profile `tidepool tune` made on a smaller input
    /// ([`Launcher::profile`]).
    TidepoolTuned,
    /// The plain in-process store (`local:?compress=none`): the pager alone, saving nothing.
    TidepoolLocal,
    TidepoolNode,
    LinuxZram,
    Native,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::TidepoolDefault => "tidepool-default",
            System::TidepoolTuned => "tidepool-tuned",
            System::TidepoolLocal => "tidepool-local",
            System::TidepoolNode => "tidepool-node",
            System::LinuxZram => "linux-zram",
            System::Native => "native",
        }
    }

    /// The systems with less local memory than the program uses.
    pub const CONSTRAINED: [System; 5] = [
        System::TidepoolDefault,
        System::TidepoolTuned,
        System::TidepoolLocal,
        System::TidepoolNode,
        System::LinuxZram,
    ];
}

/// Starts programs under each system.
#[derive(Debug)]
pub struct Launcher {
    /// The `tidepool` executable.
    pub tidepool: PathBuf,
    /// libtidepool_preload.so.
    pub preload: PathBuf,
    /// The memory node's URL, for `tidepool-node`.
    pub node: Option<String>,
    /// Swap to zram and a memory cgroup, for `linux-zram`.
    pub(super) zram: Option<Zram>,
    /// CPUs the load generators (redis-benchmark) run on.
    pub load_cpus: Option<Vec<usize>>,
    /// The profile `tidepool-tuned` runs with.
    pub profile: Option<PathBuf>,
    /// Where each `tidepool run` writes what its sections did (`TIDEPOOL_RUN_SECTIONS_OUT`), a
    /// fresh directory per run under this one ([`SectionTotals`]).
    pub sections_dir: Option<PathBuf>,
    runs: std::cell::Cell<u32>,
}

impl Launcher {
    pub fn new(tidepool: PathBuf, preload: PathBuf, node: Option<String>) -> Launcher {
        Launcher {
            tidepool,
            preload,
            node,
            zram: None,
            load_cpus: None,
            profile: None,
            sections_dir: None,
            runs: std::cell::Cell::new(0),
        }
    }

    /// [`Launcher::command`] on any CPU (see [`on_any_cpu`]), except for a node-backed run,
    /// which stays off the node's CPU.
    pub fn command_anywhere(
        &self,
        system: System,
        local: u64,
        argv: &[OsString],
    ) -> Result<Command> {
        let c = self.command(system, local, argv)?;
        Ok(match system {
            System::TidepoolNode => c,
            _ => on_any_cpu(&c),
        })
    }

    /// The command that runs `argv` under `system` with `local` bytes of local memory, where
    /// the bench's clients are pinned.
    pub fn command(&self, system: System, local: u64, argv: &[OsString]) -> Result<Command> {
        let (prog, args) = argv.split_first().context("no program")?;
        Ok(match system {
            System::Native => {
                let mut c = Command::new(prog);
                c.args(args);
                c
            }
            System::TidepoolDefault
            | System::TidepoolTuned
            | System::TidepoolLocal
            | System::TidepoolNode => {
                let mut c = Command::new(&self.tidepool);
                c.args(["run", "--local", &local.to_string()]);
                if let Some(dir) = &self.sections_dir {
                    let n = self.runs.get() + 1;
                    self.runs.set(n);
                    let out = dir.join(format!("{}-{n}", system.name()));
                    std::fs::create_dir_all(&out)?;
                    c.env(SECTIONS_OUT, out);
                }
                match system {
                    System::TidepoolTuned => c.arg("--profile").arg(
                        self.profile
                            .as_deref()
                            .context("tidepool-tuned needs a profile")?,
                    ),
                    System::TidepoolNode => c.args([
                        "--backend",
                        self.node
                            .as_deref()
                            .context("tidepool-node needs a memory node")?,
                    ]),
                    System::TidepoolLocal => c.args(["--backend", "local:?compress=none"]),
                    _ => &mut c,
                };
                c.arg("--")
                    .arg(prog)
                    .args(args)
                    .env("TIDEPOOL_PRELOAD", &self.preload);
                c
            }
            System::LinuxZram => {
                let mut c = self
                    .zram
                    .as_ref()
                    .context("linux-zram is not set up")?
                    .command(local)?;
                c.arg(prog).args(args);
                c
            }
        })
    }
}

impl Launcher {
    /// How the bytes `system` holds on this machine for a program are counted.
    pub fn gauge(&self, system: System) -> Gauge {
        match (system, &self.zram) {
            (System::LinuxZram, Some(z)) => z.gauge(),
            _ => Gauge::Processes,
        }
    }

    /// The memory node holding the program's far bytes, under `tidepool-node`.
    pub fn far_gauge(&self, system: System) -> Option<FarGauge> {
        match system {
            System::TidepoolNode => self.node.clone().map(|url| FarGauge { url }),
            _ => None,
        }
    }

    /// Starts following the bytes `system` holds for program `pid`.
    pub fn watch(&self, system: System, pid: u32) -> Watch {
        Watch::start(pid, &self.gauge(system), self.far_gauge(system).as_ref())
    }

    /// Runs `cmd` (made by [`Launcher::command`] for `system`) to its end.
    pub fn run_to_end(&self, system: System, cmd: Command) -> Result<Ended> {
        run_to_end(cmd, |pid| self.watch(system, pid))
    }
}

/// How a program ended.
#[derive(Debug)]
pub struct Ended {
    pub status: ExitStatus,
    pub seconds: f64,
    pub stdout: String,
    pub stderr: String,
    /// Peak resident set size, bytes (VmHWM, polled while it ran).
    pub peak_rss: u64,
    /// The bytes its system held for it, at their peak.
    pub held: Held,
    /// The cross-CPU interrupts this machine took while it ran (none where /proc/interrupts
    /// cannot be read): what its paging cost the other CPU too.
    pub interrupts: Option<Interrupts>,
    /// What its sections did, under `tidepool run` with [`Launcher::sections_dir`].
    pub sections: Option<SectionTotals>,
}

/// The variable `tidepool run` passes on: where each process writes its sections at exit.
use tidepool_pager::run_env::SECTIONS_OUT;

/// Where `cmd` has its processes write their sections, if it does.
pub(super) fn sections_out(cmd: &Command) -> Option<PathBuf> {
    cmd.get_envs()
        .find(|(k, _)| *k == SECTIONS_OUT)
        .and_then(|(_, v)| v.map(PathBuf::from))
}

/// What the sections of every process of a run did, summed: the pager's misses and its
/// prefetcher's record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SectionTotals {
    pub far_reads: u64,
    pub prefetched: u64,
    pub used: u64,
}

impl SectionTotals {
    /// The totals in `dir`, where a run's processes wrote their sections; `None` if none did.
    pub fn read(dir: &std::path::Path) -> Option<SectionTotals> {
        let records = tidepool_pager::profile::Observed::read_dir(dir).ok()?;
        let mut t = SectionTotals::default();
        for s in records.iter().flat_map(|o| &o.sections) {
            t.far_reads += s.far_reads;
            t.prefetched += s.prefetched;
            t.used += s.used;
        }
        let _ = std::fs::remove_dir_all(dir);
        (!records.is_empty()).then_some(t)
    }

    /// Used prefetched pages over prefetched pages, a percentage, if any were prefetched.
    pub fn accuracy_pct(&self) -> Option<f64> {
        (self.prefetched > 0).then(|| 100.0 * self.used as f64 / self.prefetched as f64)
    }
}

impl Ended {
    /// Killed by SIGKILL: the kernel's OOM killer (nothing here sends it).
    pub fn oom_killed(&self) -> bool {
        self.status.signal() == Some(9 /* SIGKILL */)
    }
}

/// VmHWM of a process, bytes.
pub(super) fn peak_rss_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib << 10)
}

/// Runs `cmd` to its end, timing it and following its peak RSS and what `watch` follows.
pub fn run_to_end(mut cmd: Command, watch: impl FnOnce(u32) -> Watch) -> Result<Ended> {
    let sections = sections_out(&cmd);
    let before = Interrupts::now();
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    let pid = child.id();
    let watch = watch(pid);
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let (mut o, mut e) = (String::new(), String::new());
        let t = std::thread::spawn(move || {
            let _ = err.read_to_string(&mut e);
            e
        });
        let _ = out.read_to_string(&mut o);
        (o, t.join().unwrap_or_default())
    });
    let mut peak = 0;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        peak = peak.max(peak_rss_of(pid).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(20));
    };
    let seconds = start.elapsed().as_secs_f64();
    let interrupts = Interrupts::now().zip(before).map(|(now, b)| now.since(b));
    let held = watch.finish();
    let (stdout, stderr) = reader.join().map_err(|_| anyhow!("output reader"))?;
    Ok(Ended {
        status,
        seconds,
        stdout,
        stderr,
        peak_rss: peak,
        held,
        interrupts,
        sections: sections.as_deref().and_then(SectionTotals::read),
    })
}
