//! The `apps` suite: unmodified programs no one here wrote, with less local memory than they
//! use, under `tidepool run` and under Linux swap to zram.
//!
//! Workloads (each checks its answer; a wrong one fails the suite):
//! - `redis-get`, `redis-set`: redis-server holding N values of 4 KiB (random bytes: zram would
//!   flatter itself on patterns), driven by redis-benchmark on random keys, pipeline 16
//!   (`ops_per_s`); then `redis-bgsave`: BGSAVE while redis-benchmark keeps setting keys
//!   (`seconds`). The keys are read back from the server and from the RDB file (loaded into a
//!   second, native redis-server): every key there, every value sampled either the one written
//!   or redis-benchmark's.
//! - `pandas-groupby`: a DataFrame of random rows, grouped with sum and mean (`seconds`); the
//!   result's sha256 must be native's.
//! - `sort`: GNU sort of a generated text file larger than local memory (`seconds`); the
//!   output's sha256 must be native's.
//! - `python-dict`: CPython building and summing a dict of strings (`seconds`); the sum must be
//!   native's.
//!
//! Systems ([`System`]): `tidepool-local`, `tidepool-node` (`tidepool run` over the in-process
//! store or a `tidepool node` on the other CPU), `linux-zram` (a cgroup v1 memory group limited
//! to the same local size, swapping to zram) and `native`. Local memory is `local_ratio` (0.25
//! and 0.5) of each program's peak RSS, measured natively first. A peer the kernel OOM-killed
//! gets a row with metric `oom_killed` = 1.

use crate::pager::Zram;
use crate::{BenchOpts, Ctx, Suite};
use anyhow::{anyhow, bail, Context, Result};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Where a program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    TidepoolLocal,
    TidepoolNode,
    LinuxZram,
    Native,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::TidepoolLocal => "tidepool-local",
            System::TidepoolNode => "tidepool-node",
            System::LinuxZram => "linux-zram",
            System::Native => "native",
        }
    }

    /// The systems with less local memory than the program uses.
    pub const CONSTRAINED: [System; 3] = [
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
    zram: Option<Zram>,
    /// CPUs the load generators (redis-benchmark) run on.
    pub load_cpus: Option<Vec<usize>>,
}

impl Launcher {
    pub fn new(tidepool: PathBuf, preload: PathBuf, node: Option<String>) -> Launcher {
        Launcher {
            tidepool,
            preload,
            node,
            zram: None,
            load_cpus: None,
        }
    }

    /// The command that runs `argv` under `system` with `local` bytes of local memory.
    pub fn command(&self, system: System, local: u64, argv: &[OsString]) -> Result<Command> {
        let (prog, args) = argv.split_first().context("no program")?;
        Ok(match system {
            System::Native => {
                let mut c = Command::new(prog);
                c.args(args);
                c
            }
            System::TidepoolLocal | System::TidepoolNode => {
                let backend = if system == System::TidepoolNode {
                    self.node
                        .clone()
                        .context("tidepool-node needs a memory node")?
                } else {
                    "local:".into()
                };
                let mut c = Command::new(&self.tidepool);
                c.args([
                    "run",
                    "--local",
                    &local.to_string(),
                    "--backend",
                    &backend,
                    "--",
                ])
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

/// How a program ended.
#[derive(Debug)]
pub struct Ended {
    pub status: ExitStatus,
    pub seconds: f64,
    pub stdout: String,
    pub stderr: String,
    /// Peak resident set size, bytes (VmHWM, polled while it ran).
    pub peak_rss: u64,
}

impl Ended {
    /// Killed by SIGKILL: the kernel's OOM killer (nothing here sends it).
    pub fn oom_killed(&self) -> bool {
        self.status.signal() == Some(9 /* SIGKILL */)
    }
}

/// VmHWM of a process, bytes.
fn peak_rss_of(pid: u32) -> Option<u64> {
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

/// Runs `cmd` to its end, timing it and following its peak RSS.
pub fn run_to_end(mut cmd: Command) -> Result<Ended> {
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    let pid = child.id();
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
    let (stdout, stderr) = reader.join().map_err(|_| anyhow!("output reader"))?;
    Ok(Ended {
        status,
        seconds,
        stdout,
        stderr,
        peak_rss: peak,
    })
}

/// Sizes of one run of the suite.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub redis_keys: u64,
    pub redis_requests: u64,
    pub pandas_rows: u64,
    pub sort_lines: u64,
    pub dict_strings: u64,
}

impl Sizes {
    pub fn of(opts: &BenchOpts) -> Sizes {
        if opts.quick {
            Sizes {
                redis_keys: 32_768,
                redis_requests: 20_000,
                pandas_rows: 4_000_000,
                sort_lines: 600_000,
                dict_strings: 300_000,
            }
        } else {
            // 262144 values of 4 KiB: 1 GiB.
            Sizes {
                redis_keys: 262_144,
                redis_requests: 200_000,
                pandas_rows: 40_000_000,
                sort_lines: 6_000_000,
                dict_strings: 3_000_000,
            }
        }
    }
}

/// The real interpreter behind `python3` on PATH (a pyenv shim would add processes of its own
/// to every run), and whether it has pandas.
pub fn python() -> Result<(PathBuf, bool)> {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .context("python3 is not installed")?;
    let exe = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let pandas = Command::new(&exe)
        .args(["-c", "import pandas"])
        .status()
        .is_ok_and(|s| s.success());
    Ok((exe, pandas))
}

pub const PANDAS_SCRIPT: &str = r#"
import hashlib, sys, time
import numpy as np, pandas as pd
n = int(sys.argv[1])
t = time.perf_counter()
rng = np.random.default_rng(42)
df = pd.DataFrame({"k": rng.integers(0, 1000, n), "v": rng.random(n), "w": rng.integers(0, 100, n)})
g = df.groupby("k").agg({"v": ["sum", "mean"], "w": "sum"})
print(time.perf_counter() - t, hashlib.sha256(g.round(6).to_csv().encode()).hexdigest())
"#;

/// A program's run: its seconds and the answer it printed.
#[derive(Debug)]
pub enum Outcome {
    Done { seconds: f64, answer: String },
    OomKilled,
}

fn program_outcome(what: &str, ended: Ended) -> Result<Outcome> {
    if ended.oom_killed() {
        return Ok(Outcome::OomKilled);
    }
    if !ended.status.success() {
        bail!("{what} failed ({}): {}", ended.status, ended.stderr.trim());
    }
    let mut words = ended.stdout.split_whitespace();
    let seconds = words
        .next()
        .and_then(|w| w.parse().ok())
        .ok_or_else(|| anyhow!("{what} printed '{}'", ended.stdout.trim()))?;
    Ok(Outcome::Done {
        seconds,
        answer: words.collect::<Vec<_>>().join(" "),
    })
}

/// The pandas groupby, timed inside the script (imports excluded).
pub fn pandas(
    l: &Launcher,
    system: System,
    local: u64,
    python: &Path,
    rows: u64,
    dir: &Path,
) -> Result<(Outcome, u64)> {
    let ended = run_script(
        l,
        system,
        local,
        python,
        dir,
        "apps_pandas.py",
        PANDAS_SCRIPT,
        rows,
    )?;
    let peak = ended.peak_rss;
    Ok((program_outcome("pandas", ended)?, peak))
}

/// Writes `text` to `dir/name` and runs it with `python` and one number argument, to its end.
#[allow(clippy::too_many_arguments)]
fn run_script(
    l: &Launcher,
    system: System,
    local: u64,
    python: &Path,
    dir: &Path,
    name: &str,
    text: &str,
    arg: u64,
) -> Result<Ended> {
    let script = dir.join(name);
    std::fs::write(&script, text)?;
    let argv = [python.into(), script.into(), arg.to_string().into()];
    run_to_end(l.command(system, local, &argv)?)
}

/// The python-dict workload (the pager suite's script).
pub fn python_dict(
    l: &Launcher,
    system: System,
    local: u64,
    python: &Path,
    strings: u64,
    dir: &Path,
) -> Result<(Outcome, u64)> {
    let ended = run_script(
        l,
        system,
        local,
        python,
        dir,
        "apps_dict.py",
        crate::pager::DICT_SCRIPT,
        strings,
    )?;
    let peak = ended.peak_rss;
    // The script prints seconds, its own peak RSS and the sum; the sum is the answer.
    Ok((
        match program_outcome("python-dict", ended)? {
            Outcome::Done { seconds, answer } => Outcome::Done {
                seconds,
                answer: answer.split_whitespace().last().unwrap_or("").to_string(),
            },
            o => o,
        },
        peak,
    ))
}

/// A deterministic text file of `lines` lines for sort (hex keys and varying tails).
pub fn sort_input(dir: &Path, lines: u64) -> Result<PathBuf> {
    let path = dir.join(format!("apps_sort_{lines}.txt"));
    if path.exists() {
        return Ok(path);
    }
    let tmp = dir.join(format!("apps_sort_{lines}.tmp"));
    let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..lines {
        x = crate::far::splitmix64(x);
        let tail = 10 + (x >> 58) as usize;
        writeln!(w, "{x:016x} {}", "x".repeat(tail))?;
    }
    w.flush()?;
    drop(w);
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// GNU sort of `input` into a file; the answer is the output's sha256 (sha256sum).
pub fn sort(
    l: &Launcher,
    system: System,
    local: u64,
    input: &Path,
    dir: &Path,
) -> Result<(Outcome, u64)> {
    let output = dir.join(format!("apps_sort_{}.out", system.name()));
    let argv: Vec<OsString> = vec![
        "sort".into(),
        "-o".into(),
        output.clone().into(),
        input.into(),
    ];
    let mut cmd = l.command(system, local, &argv)?;
    cmd.env("LC_ALL", "C").env("TMPDIR", dir);
    let ended = run_to_end(cmd)?;
    if ended.oom_killed() {
        return Ok((Outcome::OomKilled, ended.peak_rss));
    }
    if !ended.status.success() {
        bail!("sort failed ({}): {}", ended.status, ended.stderr.trim());
    }
    let sum = Command::new("sha256sum").arg(&output).output()?;
    let answer = String::from_utf8_lossy(&sum.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string();
    let _ = std::fs::remove_file(&output);
    Ok((
        Outcome::Done {
            seconds: ended.seconds,
            answer,
        },
        ended.peak_rss,
    ))
}

// ---- redis -------------------------------------------------------------------------------------

/// The value of key `i`: 4 KiB of random bytes (incompressible).
pub fn redis_value(i: u64) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut v = Vec::with_capacity(4096);
    while v.len() < 4096 {
        x = crate::far::splitmix64(x);
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

/// redis-benchmark's key name for `i` (`key:__rand_int__`, 12 digits).
fn redis_key(i: u64) -> String {
    format!("key:{i:012}")
}

/// A connection speaking just enough RESP for the checks.
struct Resp {
    r: BufReader<TcpStream>,
    w: std::io::BufWriter<TcpStream>,
}

impl Resp {
    fn connect(port: u16) -> Result<Resp> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(600)))?;
        Ok(Resp {
            r: BufReader::new(s.try_clone()?),
            w: std::io::BufWriter::new(s),
        })
    }

    fn send(&mut self, parts: &[&[u8]]) -> Result<()> {
        write!(self.w, "*{}\r\n", parts.len())?;
        for p in parts {
            write!(self.w, "${}\r\n", p.len())?;
            self.w.write_all(p)?;
            self.w.write_all(b"\r\n")?;
        }
        Ok(())
    }

    /// One reply: a simple string, integer or error as text, a bulk string as bytes.
    fn reply(&mut self) -> Result<Vec<u8>> {
        self.w.flush()?;
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            bail!("redis closed the connection");
        }
        let line = line.trim_end();
        match line.as_bytes().first() {
            Some(b'+') | Some(b':') => Ok(line.as_bytes()[1..].to_vec()),
            Some(b'-') => bail!("redis said {line}"),
            Some(b'$') => {
                let n: i64 = line[1..].parse()?;
                if n < 0 {
                    return Ok(Vec::new());
                }
                let mut v = vec![0; n as usize + 2];
                self.r.read_exact(&mut v)?;
                v.truncate(n as usize);
                Ok(v)
            }
            _ => bail!("redis answered '{line}'"),
        }
    }

    fn call(&mut self, parts: &[&[u8]]) -> Result<Vec<u8>> {
        self.send(parts)?;
        self.reply()
    }

    fn info_field(&mut self, section: &str, field: &str) -> Result<String> {
        let info = self.call(&[b"INFO", section.as_bytes()])?;
        let info = String::from_utf8_lossy(&info);
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .map(|v| v.trim().to_string())
            .ok_or_else(|| anyhow!("INFO {section} lacks {field}"))
    }
}

/// A redis-server under some system.
#[derive(Debug)]
pub struct RedisRun {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl RedisRun {
    pub fn start(
        l: &Launcher,
        system: System,
        local: u64,
        port: u16,
        dir: &Path,
    ) -> Result<RedisRun> {
        let argv: Vec<OsString> = [
            "redis-server",
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dbfilename",
            &format!("apps-{port}.rdb"),
        ]
        .iter()
        .map(OsString::from)
        .chain(["--dir".into(), dir.as_os_str().to_owned()])
        .collect();
        let child = l
            .command(system, local, &argv)?
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start redis-server (scripts/setup installs it)")?;
        let mut run = RedisRun {
            child,
            port,
            dir: dir.to_path_buf(),
        };
        let start = Instant::now();
        loop {
            if let Ok(mut c) = Resp::connect(port) {
                if c.call(&[b"PING"]).is_ok() {
                    return Ok(run);
                }
            }
            if let Some(s) = run.child.try_wait()? {
                let mut err = String::new();
                if let Some(e) = run.child.stderr.as_mut() {
                    let _ = e.read_to_string(&mut err);
                }
                bail!("redis-server exited at start ({s}): {}", err.trim());
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!("redis-server did not answer within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How the server ended, if it has (an OOM kill shows as SIGKILL).
    pub fn ended(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn rdb(&self) -> PathBuf {
        self.dir.join(format!("apps-{}.rdb", self.port))
    }

    /// Writes `keys` values of 4 KiB, pipelined.
    pub fn fill(&self, keys: u64) -> Result<()> {
        let mut c = Resp::connect(self.port)?;
        let batch = 256;
        let mut i = 0;
        while i < keys {
            let n = batch.min(keys - i);
            for k in i..i + n {
                c.send(&[b"SET", redis_key(k).as_bytes(), &redis_value(k)])?;
            }
            for _ in 0..n {
                c.reply()?;
            }
            i += n;
        }
        Ok(())
    }

    /// redis-benchmark against this server: requests per second.
    pub fn benchmark(&self, l: &Launcher, test: &str, requests: u64, keys: u64) -> Result<f64> {
        let out = load_command(l, self.port, test, requests, keys)
            .output()
            .context("cannot run redis-benchmark (scripts/setup installs redis-tools)")?;
        let text = String::from_utf8_lossy(&out.stdout);
        // --csv: "test","rps",...
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(',').map(|f| f.trim_matches('"')).collect();
                (f.first()?.eq_ignore_ascii_case(test)).then(|| f.get(1)?.parse::<f64>().ok())?
            })
            .next()
            .ok_or_else(|| {
                anyhow!(
                    "redis-benchmark printed '{}' ({})",
                    text.trim(),
                    String::from_utf8_lossy(&out.stderr).trim()
                )
            })
    }

    /// BGSAVE while a SET load runs: seconds until the save is done.
    pub fn bgsave_under_load(&self, l: &Launcher, keys: u64) -> Result<f64> {
        let mut load = load_command(l, self.port, "set", u64::MAX / 2, keys)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot run redis-benchmark")?;
        std::thread::sleep(Duration::from_millis(300));
        let mut c = Resp::connect(self.port)?;
        let before = c.info_field("persistence", "rdb_last_bgsave_time_sec")?;
        let start = Instant::now();
        let said = c.call(&[b"BGSAVE"])?;
        let outcome = (|| -> Result<f64> {
            if !String::from_utf8_lossy(&said).contains("started") {
                bail!("BGSAVE answered '{}'", String::from_utf8_lossy(&said));
            }
            loop {
                std::thread::sleep(Duration::from_millis(20));
                if c.info_field("persistence", "rdb_bgsave_in_progress")? == "0" {
                    break;
                }
            }
            let secs = start.elapsed().as_secs_f64();
            let status = c.info_field("persistence", "rdb_last_bgsave_status")?;
            if status != "ok" {
                bail!("BGSAVE ended with status {status} (it was {before} s before)");
            }
            Ok(secs)
        })();
        let _ = load.kill();
        let _ = load.wait();
        outcome
    }

    /// Every key is there and sampled values are right (see [`verify_keys`]).
    pub fn verify(&self, keys: u64) -> Result<()> {
        verify_keys(self.port, keys)
    }

    pub fn shutdown(mut self) -> Result<()> {
        if let Ok(mut c) = Resp::connect(self.port) {
            let _ = c.send(&[b"SHUTDOWN", b"NOSAVE"]);
            let _ = c.w.flush();
        }
        let start = Instant::now();
        while self.child.try_wait()?.is_none() {
            if start.elapsed() > Duration::from_secs(20) {
                let _ = self.child.kill();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

fn load_command(l: &Launcher, port: u16, test: &str, requests: u64, keys: u64) -> Command {
    let mut cmd = match &l.load_cpus {
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(
                cpus.iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            );
            c.arg("redis-benchmark");
            c
        }
        None => Command::new("redis-benchmark"),
    };
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", test])
        .args(["-n", &requests.to_string(), "-r", &keys.to_string()])
        .args(["-d", "4096", "-P", "16", "-c", "50", "--csv"]);
    cmd
}

/// Every key is there; each sampled value is the one the fill wrote or one of the values
/// redis-benchmark's SET runs wrote (each run writes one random payload to every key it sets,
/// and two runs set keys here).
fn verify_keys(port: u16, keys: u64) -> Result<()> {
    let mut c = Resp::connect(port)?;
    let n: u64 = String::from_utf8_lossy(&c.call(&[b"DBSIZE"])?).parse()?;
    if n != keys {
        bail!("redis holds {n} keys, {keys} were written");
    }
    let step = (keys / 2000).max(1);
    let mut payloads: Vec<Vec<u8>> = Vec::new();
    for i in (0..keys).step_by(step as usize) {
        let v = c.call(&[b"GET", redis_key(i).as_bytes()])?;
        if v == redis_value(i) || payloads.contains(&v) {
            continue;
        }
        if v.len() != 4096 || payloads.len() == 2 {
            bail!(
                "key {} reads {} bytes that are neither what was written nor redis-benchmark's",
                redis_key(i),
                v.len()
            );
        }
        payloads.push(v);
    }
    Ok(())
}

/// Loads an RDB file into a native redis-server and checks it as [`RedisRun::verify`] does.
pub fn verify_rdb(rdb: &Path, keys: u64, port: u16) -> Result<()> {
    let dir = rdb.parent().context("rdb path")?;
    let name = rdb.file_name().context("rdb name")?;
    let mut child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .arg("--dir")
        .arg(dir)
        .arg("--dbfilename")
        .arg(name)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let outcome = (|| {
        let start = Instant::now();
        loop {
            if let Ok(mut c) = Resp::connect(port) {
                // PING answers -LOADING while the file loads.
                if c.call(&[b"PING"]).is_ok() {
                    break;
                }
            }
            if start.elapsed() > Duration::from_secs(120) {
                bail!("redis-server did not load {} within 120 s", rdb.display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        verify_keys(port, keys).with_context(|| format!("in the RDB file {}", rdb.display()))
    })();
    let _ = child.kill();
    let _ = child.wait();
    outcome
}

/// Results of one redis run.
#[derive(Debug, Default)]
pub struct RedisResult {
    pub get_ops: Option<f64>,
    pub set_ops: Option<f64>,
    pub bgsave_seconds: Option<f64>,
    /// The server was OOM-killed before these could be measured.
    pub oom_killed: bool,
    pub peak_rss: u64,
}

/// Fill, GET, SET, BGSAVE under SET load, and the checks, on one server.
pub fn redis(
    l: &Launcher,
    system: System,
    local: u64,
    s: &Sizes,
    port: u16,
    dir: &Path,
) -> Result<RedisResult> {
    let mut server = RedisRun::start(l, system, local, port, dir)?;
    let mut r = RedisResult::default();
    let pid = server.pid();
    let outcome = (|| -> Result<()> {
        server.fill(s.redis_keys)?;
        r.get_ops = Some(server.benchmark(l, "get", s.redis_requests, s.redis_keys)?);
        r.set_ops = Some(server.benchmark(l, "set", s.redis_requests, s.redis_keys)?);
        r.bgsave_seconds = Some(server.bgsave_under_load(l, s.redis_keys)?);
        r.peak_rss = peak_rss_of(pid).unwrap_or(0);
        server.verify(s.redis_keys)?;
        Ok(())
    })();
    if let Err(e) = outcome {
        // Ended by the OOM killer, or a real failure.
        std::thread::sleep(Duration::from_millis(200));
        if server
            .ended()
            .is_some_and(|st| st.signal() == Some(9 /* SIGKILL */))
        {
            r.oom_killed = true;
            return Ok(r);
        }
        let _ = server.shutdown();
        return Err(e.context(format!("redis-server under {}", system.name())));
    }
    let rdb = server.rdb();
    server.shutdown()?;
    verify_rdb(&rdb, s.redis_keys, port + 1000)?;
    let _ = std::fs::remove_file(&rdb);
    Ok(r)
}

// ---- the suite ---------------------------------------------------------------------------------

#[derive(Debug)]
pub struct AppsSuite;

const RATIOS: [f64; 2] = [0.25, 0.5];
const WORKLOADS: [&str; 4] = ["redis", "pandas-groupby", "sort", "python-dict"];

impl Suite for AppsSuite {
    fn name(&self) -> &'static str {
        "apps"
    }

    fn about(&self) -> &'static str {
        "unmodified programs with a quarter and a half of the memory they use: redis-server \
         (GET, SET, BGSAVE), pandas, GNU sort, CPython; tidepool run (local and node stores) vs \
         Linux swap to zram vs native"
    }

    fn steps(&self, _opts: &BenchOpts) -> u64 {
        (WORKLOADS.len() * (1 + RATIOS.len() * System::CONSTRAINED.len())) as u64
    }

    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        let s = Sizes::of(&ctx.opts);
        let exe = std::env::current_exe()?;
        let preload = crate::libs::next_to_exe("tidepool-preload", "libtidepool_preload.so")?;
        // As in the pager suite, a node with a CPU of its own polls for requests before it
        // sleeps (a cross-CPU wake-up per miss costs this VM more than serving the page). The
        // Redis workloads' load generator shares that CPU, and a polling node halves its
        // throughput there: Redis pages to a node that sleeps.
        let poll = crate::pager::NODE_BUSY_POLL_US.to_string();
        let polling = crate::store::NodeProcess::start_with("4G", &["--busy-poll-us", &poll])?;
        ctx.opts.placement.pin_server(polling.pid())?;
        let sleeping = crate::store::NodeProcess::start("4G")?;
        ctx.opts.placement.pin_server(sleeping.pid())?;
        ctx.note(format!(
            "tidepool-node: the node polls {poll} us for requests before it sleeps, except \
             under Redis, whose load generator shares the node's CPU"
        ));
        let node_url = |n: &crate::store::NodeProcess| format!("node://apps@{}", n.addr);
        let mut l = Launcher::new(exe, preload, Some(node_url(&polling)));
        l.load_cpus = ctx.opts.placement.server_cpus();
        let mut systems: Vec<System> = System::CONSTRAINED.to_vec();
        match Zram::start(8 << 30) {
            Ok(z) => l.zram = Some(z),
            Err(e) => {
                ctx.note(format!("linux-zram skipped: {e:#}"));
                systems.retain(|&sy| sy != System::LinuxZram);
            }
        }
        let dir = ctx.opts.out.join("apps-work");
        std::fs::create_dir_all(&dir)?;
        let (python, has_pandas) = python()?;
        let sort_file = sort_input(&dir, s.sort_lines)?;
        for workload in WORKLOADS {
            if workload == "pandas-groupby" && !has_pandas {
                ctx.note(format!(
                    "pandas-groupby skipped: {} has no pandas (scripts/setup installs it)",
                    python.display()
                ));
                for _ in 0..self.steps(&ctx.opts) / WORKLOADS.len() as u64 {
                    ctx.advance();
                }
                continue;
            }
            ctx.step(format!("{workload}: native"));
            l.node = Some(node_url(if workload == "redis" {
                &sleeping
            } else {
                &polling
            }));
            let mut port = 17_000u16;
            let run = |l: &Launcher, system: System, local: u64, port: u16| -> Result<Measured> {
                Ok(match workload {
                    "redis" => Measured::Redis(redis(l, system, local, &s, port, &dir)?),
                    "pandas-groupby" => {
                        Measured::Program(pandas(l, system, local, &python, s.pandas_rows, &dir)?)
                    }
                    "sort" => Measured::Program(sort(l, system, local, &sort_file, &dir)?),
                    _ => Measured::Program(python_dict(
                        l,
                        system,
                        local,
                        &python,
                        s.dict_strings,
                        &dir,
                    )?),
                })
            };
            let native = run(&l, System::Native, 0, port)?;
            port += 1;
            let peak = native.peak_rss();
            let want = native.answer();
            native.report(ctx, System::Native, workload, 1.0, peak, None)?;
            ctx.advance();
            for &ratio in &RATIOS {
                let local = ((peak as f64 * ratio) as u64).max(16 << 20);
                for &system in &systems {
                    ctx.step(format!(
                        "{workload}: {} at {:.0}% local",
                        system.name(),
                        ratio * 100.0
                    ));
                    let m = run(&l, system, local, port)?;
                    port += 1;
                    m.report(ctx, system, workload, ratio, peak, want.as_deref())?;
                    ctx.advance();
                }
            }
        }
        verdict(ctx);
        Ok(())
    }
}

enum Measured {
    Redis(RedisResult),
    Program((Outcome, u64)),
}

impl Measured {
    fn peak_rss(&self) -> u64 {
        match self {
            Measured::Redis(r) => r.peak_rss,
            Measured::Program((_, p)) => *p,
        }
    }

    fn answer(&self) -> Option<String> {
        match self {
            Measured::Program((Outcome::Done { answer, .. }, _)) => Some(answer.clone()),
            _ => None,
        }
    }

    /// Rows for the report; a wrong answer is an error.
    fn report(
        &self,
        ctx: &mut Ctx,
        system: System,
        workload: &str,
        ratio: f64,
        peak: u64,
        want: Option<&str>,
    ) -> Result<()> {
        let params = [
            ("local_ratio", ratio),
            ("peak_rss_mib", (peak >> 20) as f64),
        ];
        let name = system.name();
        match self {
            Measured::Redis(r) => {
                if r.oom_killed {
                    for w in ["redis-get", "redis-set", "redis-bgsave"] {
                        ctx.report.push(name, w, "oom_killed", 1.0, "", &params);
                    }
                    return Ok(());
                }
                if let Some(v) = r.get_ops {
                    ctx.report
                        .push(name, "redis-get", "ops_per_s", v, "ops/s", &params);
                }
                if let Some(v) = r.set_ops {
                    ctx.report
                        .push(name, "redis-set", "ops_per_s", v, "ops/s", &params);
                }
                if let Some(v) = r.bgsave_seconds {
                    ctx.report
                        .push(name, "redis-bgsave", "seconds", v, "s", &params);
                }
            }
            Measured::Program((Outcome::OomKilled, _)) => {
                ctx.report
                    .push(name, workload, "oom_killed", 1.0, "", &params);
            }
            Measured::Program((Outcome::Done { seconds, answer }, _)) => {
                if let Some(want) = want {
                    if answer != want {
                        bail!("{workload} under {name} at {:.0}% local answered '{answer}', natively '{want}'", ratio * 100.0);
                    }
                }
                ctx.report
                    .push(name, workload, "seconds", *seconds, "s", &params);
            }
        }
        Ok(())
    }
}

/// tidepool-local and tidepool-node against linux-zram on each workload and ratio, as notes
/// (issue 28 asks tidepool-node for >= 0.8x at 50% local).
fn verdict(ctx: &mut Ctx) {
    let mut notes = Vec::new();
    for w in [
        "redis-get",
        "redis-set",
        "redis-bgsave",
        "pandas-groupby",
        "sort",
        "python-dict",
    ] {
        for ratio in RATIOS {
            let (metric, higher_better) = if w == "redis-get" || w == "redis-set" {
                ("ops_per_s", true)
            } else {
                ("seconds", false)
            };
            let at = |sys: &str, m: &str| {
                ctx.report
                    .results
                    .iter()
                    .find(|r| {
                        r.system == sys
                            && r.workload == w
                            && r.metric == m
                            && r.params.get("local_ratio") == Some(&ratio)
                    })
                    .map(|r| r.value)
            };
            let zram = at("linux-zram", metric);
            for system in ["tidepool-local", "tidepool-node"] {
                let Some(t) = at(system, metric) else {
                    continue;
                };
                let text = match zram {
                    Some(z) => {
                        let x = if higher_better { t / z } else { z / t };
                        format!(
                            "{w} at {:.0}% local: {system} {x:.2}x linux-zram",
                            ratio * 100.0
                        )
                    }
                    None if at("linux-zram", "oom_killed").is_some() => format!(
                        "{w} at {:.0}% local: linux-zram was OOM-killed, {system} finished",
                        ratio * 100.0
                    ),
                    None => continue,
                };
                notes.push(text);
            }
        }
    }
    for n in notes {
        ctx.note(n);
    }
}
