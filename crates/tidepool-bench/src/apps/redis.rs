//! redis-server under each system: filled with 4 KiB values, driven by redis-benchmark (GET,
//! SET, then BGSAVE under SET load), and checked, in the server and in its RDB file.

use super::launch::{peak_rss_of, sections_out, Launcher, SectionTotals, System};
use super::programs::Sizes;
use super::resp::Resp;
use crate::data::splitmix64;
use crate::meter::Held;
use anyhow::{anyhow, bail, Context, Result};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The value of key `i`: 4 KiB of random bytes (incompressible).
pub fn redis_value(i: u64) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut v = Vec::with_capacity(4096);
    while v.len() < 4096 {
        x = splitmix64(x);
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

/// redis-benchmark's key name for `i` (`key:__rand_int__`, 12 digits).
fn redis_key(i: u64) -> String {
    format!("key:{i:012}")
}

/// A redis-server under some system.
#[derive(Debug)]
pub struct RedisRun {
    child: Child,
    pub port: u16,
    dir: PathBuf,
    /// Where its sections are written at exit, under `tidepool run`.
    sections: Option<PathBuf>,
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
        let mut cmd = l.command(system, local, &argv)?;
        let sections = sections_out(&cmd);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start redis-server (scripts/setup installs it)")?;
        let mut run = RedisRun {
            child,
            port,
            dir: dir.to_path_buf(),
            sections,
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

    /// Shuts the server down; what its sections did, if it wrote them.
    pub fn shutdown(mut self) -> Result<Option<SectionTotals>> {
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
        Ok(self.sections.as_deref().and_then(SectionTotals::read))
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
    /// The bytes the system held for the server at their peak: while it was filled and served
    /// GETs, while it served SETs, and during BGSAVE (its child included).
    pub get_held: Held,
    pub set_held: Held,
    pub bgsave_held: Held,
    /// What the server's sections did over the whole run (fill, GET, SET, BGSAVE's child).
    pub sections: Option<SectionTotals>,
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
    let watch = l.watch(system, pid);
    let outcome = (|| -> Result<()> {
        server.fill(s.redis_keys)?;
        r.get_ops = Some(server.benchmark(l, "get", s.redis_requests, s.redis_keys)?);
        r.get_held = watch.take();
        r.set_ops = Some(server.benchmark(l, "set", s.redis_requests, s.redis_keys)?);
        r.set_held = watch.take();
        r.bgsave_seconds = Some(server.bgsave_under_load(l, s.redis_keys)?);
        r.bgsave_held = watch.take();
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
    r.sections = server.shutdown()?;
    verify_rdb(&rdb, s.redis_keys, port + 1000)?;
    let _ = std::fs::remove_file(&rdb);
    Ok(r)
}
