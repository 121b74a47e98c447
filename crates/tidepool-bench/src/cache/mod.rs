//! The `cache` suite: `tidepool cache` against memcached, both real servers on loopback with
//! the same number of threads, driven by the harness's load generator ([`load`]: 1 KiB
//! values, keys drawn uniformly, one request in flight per connection, a miss followed by a
//! set of the key as a look-aside client does).
//!
//! - `get-heavy` (90% gets) and `set-heavy` (90% sets) over keys that all fit: `ops_per_s`
//!   and `p50_us`/`p99_us`. memcached's `-m` is what tidepool-cache holds once filled (the
//!   size a user would have given it for the same data).
//! - `pressure` ([`pressure`]): each server alone in a memory cgroup standing for a machine,
//!   filled, under load, when an antagonist takes most of the machine's memory for a while:
//!   `oom_kills`, `swapped_mib` (the server's, at most) and `hit_ratio` once the antagonist
//!   has left.

pub mod load;
mod pressure;

use crate::harness::{
    matrix_steps, BenchOpts, Ctx, Matrix, Pass, Sample, Suite, System, Turns, Workload,
};
use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tidepool_peers::Memcached;

/// Worker threads of both servers.
pub const THREADS: usize = 2;
/// Client connections.
const CONNS: usize = 32;

#[derive(Debug)]
pub struct CacheSuite;

/// How big a run is.
struct Scale {
    keys: u64,
    round: Duration,
}

fn scale(opts: &BenchOpts) -> Scale {
    if opts.quick {
        Scale {
            keys: 50_000,
            round: Duration::from_secs(3),
        }
    } else {
        Scale {
            keys: 200_000,
            round: Duration::from_secs(8),
        }
    }
}

impl Suite for CacheSuite {
    fn name(&self) -> &'static str {
        "cache"
    }

    fn about(&self) -> &'static str {
        "tidepool cache (memcached's protocol on soft memory) against memcached: get-heavy and \
         set-heavy throughput and latency with 1 KiB values; pressure: OOM kills, swap and hit \
         ratio when an antagonist takes the machine's memory"
    }

    fn steps(&self, opts: &BenchOpts) -> u64 {
        matrix_steps(MIXES.len(), opts.rounds()) + pressure::steps(opts)
    }

    fn run(&self, ctx: &mut Ctx) -> Result<()> {
        // TIDEPOOL_BENCH_PARTS=m runs only the mixes, =p only pressure.
        let parts = std::env::var("TIDEPOOL_BENCH_PARTS").unwrap_or_else(|_| "mp".into());
        if parts.contains('m') {
            mixes(ctx)?;
        }
        if parts.contains('p') {
            pressure::run(ctx)?;
        }
        verdict(ctx);
        Ok(())
    }
}

/// A running server of either kind.
#[derive(Debug)]
pub struct Server {
    name: &'static str,
    child: Option<Child>,
    /// memcached started by the peers crate (it kills it when dropped).
    memcached: Option<Memcached>,
    pub addr: SocketAddr,
}

impl System for Server {
    fn name(&self) -> &'static str {
        self.name
    }

    fn server_pids(&self) -> Vec<u32> {
        vec![self.pid()]
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Server {
    pub fn pid(&self) -> u32 {
        match (&self.child, &self.memcached) {
            (Some(c), _) => c.id(),
            (_, Some(m)) => m.pid(),
            _ => 0,
        }
    }

    /// `tidepool cache` from `cmd` (this executable's `cache` command, maybe in a cgroup),
    /// once it says where it listens.
    pub fn tidepool(mut cmd: Command) -> Result<Server> {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start tidepool cache")?;
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut first)
            .context("reading tidepool cache's first line")?;
        let addr = first.trim().rsplit(' ').next().and_then(|a| a.parse().ok());
        let Some(addr) = addr else {
            let _ = child.kill();
            bail!("tidepool cache said {first:?}, not where it listens");
        };
        Ok(Server {
            name: "tidepool-cache",
            child: Some(child),
            memcached: None,
            addr,
        })
    }

    /// The command line of `tidepool cache` on a free port with the suite's threads and no
    /// coordinator (its `auto` budget follows the machine).
    pub fn tidepool_args(reserve_mib: u64) -> Vec<String> {
        [
            "cache",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            &THREADS.to_string(),
            "--no-coord",
            "--reserve",
            &format!("{reserve_mib}M"),
        ]
        .map(String::from)
        .to_vec()
    }

    pub fn memcached(memory_mib: u64) -> Result<Server> {
        let m = Memcached::start_with(memory_mib.max(64) as u32, THREADS, 1 << 20)
            .context("cannot start memcached (scripts/setup installs it)")?;
        let addr = m.addr().parse().context("memcached's address")?;
        Ok(Server {
            name: "memcached",
            child: None,
            memcached: Some(m),
            addr,
        })
    }

    /// One `stats` value.
    pub fn stat(&self, name: &str) -> Result<u64> {
        stat(self.addr, name)
    }

    /// Answers `version` within `patience`.
    pub fn wait_ready(&self, patience: Duration) -> Result<()> {
        let t = Instant::now();
        loop {
            if self.stat("pid").is_ok() {
                return Ok(());
            }
            if t.elapsed() > patience {
                bail!("{} did not answer within {patience:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One `stats` value of the server at `addr`.
pub fn stat(addr: SocketAddr, name: &str) -> Result<u64> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"stats\r\n")?;
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    while !out.ends_with(b"END\r\n") {
        let n = s.read(&mut buf)?;
        if n == 0 {
            bail!("the server closed the connection during stats");
        }
        out.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&out);
    text.lines()
        .find_map(|l| {
            l.strip_prefix(&format!("STAT {name} "))?
                .trim()
                .parse()
                .ok()
        })
        .with_context(|| format!("no stat {name}"))
}

/// A get/set mix.
#[derive(Debug)]
struct Mix {
    name: &'static str,
    get_share: f64,
}

const MIXES: [Mix; 2] = [
    Mix {
        name: "get-heavy",
        get_share: 0.9,
    },
    Mix {
        name: "set-heavy",
        get_share: 0.1,
    },
];

impl Workload for Mix {
    fn name(&self) -> &str {
        self.name
    }

    fn params(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("get_share", self.get_share),
            ("value_bytes", load::VALUE_BYTES as f64),
            ("threads", THREADS as f64),
            ("conns", CONNS as f64),
        ]
    }
}

/// get-heavy and set-heavy on both servers, filled first.
fn mixes(ctx: &mut Ctx) -> Result<()> {
    let sc = scale(&ctx.opts);
    ctx.step("starting tidepool cache");
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args(Server::tidepool_args(256));
    let tp = Server::tidepool(cmd)?;
    tp.wait_ready(Duration::from_secs(10))?;
    ctx.step(format!("filling tidepool cache with {} values", sc.keys));
    load::fill(tp.addr, 0..sc.keys)?;
    // memcached gets what tidepool-cache holds once filled, at least the data and its overhead.
    let held_mib = tp.stat("limit_maxbytes")? >> 20;
    let data_mib = (sc.keys * (load::VALUE_BYTES as u64 + 100)) >> 20;
    let mc_mib = held_mib.max(data_mib * 5 / 4);
    ctx.step(format!("starting memcached -m {mc_mib}"));
    let mc = Server::memcached(mc_mib)?;
    mc.wait_ready(Duration::from_secs(10))?;
    ctx.step(format!("filling memcached with {} values", sc.keys));
    load::fill(mc.addr, 0..sc.keys)?;
    ctx.report.notes.push(format!(
        "{} keys of {} B; memcached -m {mc_mib} (tidepool cache's budget once filled: {held_mib} \
         MiB); {THREADS} threads each; {CONNS} connections, one request in flight each",
        sc.keys,
        load::VALUE_BYTES
    ));
    let systems = [tp, mc];
    let samples = Matrix::new(&systems, &MIXES, ctx.opts.rounds())
        .turns(Turns::Rotate)
        .warm_up()
        .run(ctx, |_, pass, w, s| {
            let spec = load::Spec {
                addr: s.addr,
                conns: CONNS,
                keys: sc.keys,
                get_share: w.get_share,
                duration: if pass == Pass::WarmUp {
                    Duration::from_secs(1)
                } else {
                    sc.round
                },
                seed: 7,
            };
            let cpu0 = crate::store::cpu_seconds(s.pid()).unwrap_or(0.0);
            let o = load::run(&spec)?;
            let cpu = crate::store::cpu_seconds(s.pid()).unwrap_or(0.0) - cpu0;
            if o.errors > 0 {
                bail!("{} error replies", o.errors);
            }
            Ok(Sample::new()
                .median("ops_per_s", "ops/s", o.ops_per_s())
                .per_op("server_cpu_us_per_op", "us", cpu * 1e6, o.ops)
                .median("hit_ratio", "ratio", o.hit_ratio())
                .latency(o.latency))
        })?;
    samples.report(ctx);
    Ok(())
}

/// The goals, as notes: throughput at least memcached's, p99 no worse.
fn verdict(ctx: &mut Ctx) {
    let get = |sys: &str, w: &str, m: &str| {
        ctx.report
            .results
            .iter()
            .find(|r| r.system == sys && r.workload == w && r.metric == m)
            .map(|r| r.value)
    };
    let mut notes = Vec::new();
    for mix in &MIXES {
        let w = mix.name;
        if let (Some(t), Some(m)) = (
            get("tidepool-cache", w, "ops_per_s"),
            get("memcached", w, "ops_per_s"),
        ) {
            notes.push(format!(
                "{w}: tidepool-cache {:.2}x memcached's throughput (goal >= 1.0)",
                t / m
            ));
        }
        if let (Some(t), Some(m)) = (
            get("tidepool-cache", w, "p99_us"),
            get("memcached", w, "p99_us"),
        ) {
            notes.push(format!(
                "{w}: p99 {t:.0} us against memcached's {m:.0} us (goal: no worse)"
            ));
        }
    }
    ctx.report.notes.extend(notes);
}
