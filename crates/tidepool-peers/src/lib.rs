//! Peer servers on loopback, for tests and benchmarks: one Redis, a Redis Cluster, one memcached.
//!
//! Each server runs as a child process on `127.0.0.1`, on a port nobody else was using, with its
//! files in a temporary directory of its own. Starting returns only once the server answers its
//! protocol's liveness command, so a caller can connect at once. Dropping the value kills the
//! process(es) and removes the directory, so a failing test leaves nothing running.
//!
//! Ports are found by binding `127.0.0.1:0` and closing the socket again; another process can
//! take the port in between, so a server that exits because its address is in use is started
//! again on a new port.
#![forbid(unsafe_code)]

pub mod tls;

use std::fmt;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to answer its first liveness probe.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a new cluster may take until every node reports `cluster_state:ok`.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a server is started again on a new port after losing its port to someone else.
const PORT_ATTEMPTS: usize = 8;
/// Log lines quoted in an error.
const LOG_TAIL_LINES: usize = 25;

/// Why a peer server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("{binary} not found on PATH; install it (apt-get install {package}) or run .ci/run")]
    NotInstalled {
        binary: &'static str,
        package: &'static str,
    },

    #[error("cannot create a temporary directory under {parent} (check that it exists and is writable, or set TMPDIR)")]
    TempDir {
        parent: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("cannot find a free port on 127.0.0.1")]
    NoFreePort {
        #[source]
        source: io::Error,
    },

    #[error("cannot run {binary}")]
    Spawn {
        binary: &'static str,
        #[source]
        source: io::Error,
    },

    #[error("{binary} exited during startup ({status}); the end of its log {log}:\n{tail}")]
    Exited {
        binary: &'static str,
        status: ExitStatus,
        log: PathBuf,
        tail: String,
    },

    #[error("{binary} did not answer on {addr} within {}s; the end of its log {log}:\n{tail}", timeout.as_secs())]
    NotAnswering {
        binary: &'static str,
        addr: String,
        timeout: Duration,
        log: PathBuf,
        tail: String,
    },

    #[error("{binary} lost its port to another process {attempts} times in a row; is something grabbing loopback ports?")]
    PortsTaken {
        binary: &'static str,
        attempts: usize,
    },

    #[error("'redis-cli --cluster create' failed ({status}):\n{output}")]
    ClusterCreate { status: ExitStatus, output: String },

    #[error("Redis Cluster node {addr} did not report cluster_state:ok within {}s; it last said: {last}", timeout.as_secs())]
    ClusterNotReady {
        addr: String,
        timeout: Duration,
        last: String,
    },

    #[error("cannot make test certificates: {0}")]
    Certificates(String),

    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A temporary directory that is removed with everything in it when dropped.
#[derive(Debug)]
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn new(label: &str) -> Result<TempDir, PeerError> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let parent = std::env::temp_dir();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        loop {
            let path = parent.join(format!(
                "tidepool-{label}-{}-{nanos:x}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            // create_dir (not create_dir_all) fails if the name exists, so two peers never share.
            match fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(source) => return Err(PeerError::TempDir { parent, source }),
            }
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// A child process that is killed (and reaped) when dropped.
#[derive(Debug)]
struct Process {
    child: Child,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A program the peers need, with the Debian package that provides it.
#[derive(Debug, Clone, Copy)]
struct Program {
    binary: &'static str,
    package: &'static str,
}

const REDIS_SERVER: Program = Program {
    binary: "redis-server",
    package: "redis-server",
};
const REDIS_CLI: Program = Program {
    binary: "redis-cli",
    package: "redis-tools",
};
const MEMCACHED: Program = Program {
    binary: "memcached",
    package: "memcached",
};

impl Program {
    /// The program's path on `PATH`, or the error that tells how to install it.
    fn locate(self) -> Result<PathBuf, PeerError> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|dir| dir.join(self.binary))
            .find(|p| is_executable(p))
            .ok_or(PeerError::NotInstalled {
                binary: self.binary,
                package: self.package,
            })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> Result<u16, PeerError> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|source| PeerError::NoFreePort { source })?;
    let port = listener
        .local_addr()
        .map_err(|source| PeerError::NoFreePort { source })?
        .port();
    Ok(port)
}

/// A free port `p` whose cluster bus port `p + 10000` is free too (Redis Cluster needs both).
fn free_cluster_port() -> Result<u16, PeerError> {
    let mut last_error = None;
    for _ in 0..64 {
        let port = free_port()?;
        let Some(bus) = port.checked_add(10_000) else {
            continue;
        };
        match TcpListener::bind(("127.0.0.1", bus)) {
            Ok(_) => return Ok(port),
            Err(e) => last_error = Some(e),
        }
    }
    Err(PeerError::NoFreePort {
        source: last_error.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                "every port offered was too high to have a cluster bus port (port + 10000)",
            )
        }),
    })
}

/// The last lines of the given log files, for error messages.
fn log_tail(logs: &[PathBuf]) -> String {
    let mut out = String::new();
    for log in logs {
        let mut text = String::new();
        if File::open(log)
            .and_then(|mut f| f.read_to_string(&mut text))
            .is_err()
        {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(LOG_TAIL_LINES);
        for line in &lines[start..] {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
    }
    if out.is_empty() {
        out.push_str("  (the log is empty)\n");
    }
    out
}

fn lost_its_port(tail: &str) -> bool {
    tail.contains("Address already in use") || tail.contains("failed to listen")
}

/// Sends `request` and reads one line of the answer.
fn ask_line(addr: SocketAddr, request: &[u8]) -> io::Result<String> {
    let timeout = Duration::from_millis(500);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(request)?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    Ok(line)
}

/// How a server proves it is up.
#[derive(Debug, Clone, Copy)]
struct Probe {
    request: &'static [u8],
    answer_prefix: &'static str,
}

const REDIS_PROBE: Probe = Probe {
    request: b"PING\r\n",
    answer_prefix: "+PONG",
};
const MEMCACHED_PROBE: Probe = Probe {
    request: b"version\r\n",
    answer_prefix: "VERSION ",
};

/// A server process being started: what `launch` needs to run it and to explain a failure.
struct Launch<'a> {
    program: Program,
    probe: Probe,
    /// Builds the command line for a port.
    command: &'a dyn Fn(&Path, u16) -> Command,
    /// Picks a port.
    port: fn() -> Result<u16, PeerError>,
    /// Log files to quote on failure (the server's own log and its captured stdout/stderr).
    logs: Vec<PathBuf>,
    /// Where stdout and stderr go.
    stdio_log: PathBuf,
}

/// Starts the server and waits until it answers, starting it again on a new port if its port
/// was taken in between.
fn launch(launch: &Launch<'_>) -> Result<(Process, u16), PeerError> {
    let binary = launch.program.locate()?;
    for _ in 0..PORT_ATTEMPTS {
        let port = (launch.port)()?;
        let stdio = File::create(&launch.stdio_log).map_err(|source| PeerError::Spawn {
            binary: launch.program.binary,
            source,
        })?;
        let stderr = stdio.try_clone().map_err(|source| PeerError::Spawn {
            binary: launch.program.binary,
            source,
        })?;
        let child = (launch.command)(&binary, port)
            .stdin(Stdio::null())
            .stdout(stdio)
            .stderr(stderr)
            .spawn()
            .map_err(|source| PeerError::Spawn {
                binary: launch.program.binary,
                source,
            })?;
        let mut process = Process { child };
        match wait_until_answering(&mut process, port, launch)? {
            Some(()) => return Ok((process, port)),
            None => continue, // lost the port; try another
        }
    }
    Err(PeerError::PortsTaken {
        binary: launch.program.binary,
        attempts: PORT_ATTEMPTS,
    })
}

/// `Some(())` once the server answers, `None` if it exited because its port was taken.
fn wait_until_answering(
    process: &mut Process,
    port: u16,
    launch: &Launch<'_>,
) -> Result<Option<()>, PeerError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = process.child.try_wait() {
            let tail = log_tail(&launch.logs);
            if lost_its_port(&tail) {
                return Ok(None);
            }
            return Err(PeerError::Exited {
                binary: launch.program.binary,
                status,
                log: launch.logs[0].clone(),
                tail,
            });
        }
        if let Ok(line) = ask_line(addr, launch.probe.request) {
            if line.starts_with(launch.probe.answer_prefix) {
                return Ok(Some(()));
            }
        }
        if Instant::now() >= deadline {
            return Err(PeerError::NotAnswering {
                binary: launch.program.binary,
                addr: addr.to_string(),
                timeout: START_TIMEOUT,
                log: launch.logs[0].clone(),
                tail: log_tail(&launch.logs),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One `redis-server` on loopback, without persistence. Killed when dropped.
pub struct RedisServer {
    // Field order matters: the process dies before its directory is removed.
    process: Process,
    port: u16,
    /// With [`RedisServer::start_tls`]: the port that speaks TLS (`port` stays plain).
    tls_port: Option<u16>,
    dir: TempDir,
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("addr", &self.addr())
            .field("pid", &self.pid())
            .field("dir", &self.dir.path)
            .finish()
    }
}

impl RedisServer {
    /// Starts a standalone Redis.
    pub fn start() -> Result<RedisServer, PeerError> {
        Self::start_with(&[], free_port)
    }

    /// Starts a standalone Redis serving TLS with `certs` on [`RedisServer::tls_addr`], and
    /// plain TCP on [`RedisServer::addr`] as usual. (Debian's redis-server is built with TLS.)
    pub fn start_tls(certs: &tls::TestCerts) -> Result<RedisServer, PeerError> {
        let tls_port = free_port()?;
        let (cert, key, ca) = (
            certs.cert().display().to_string(),
            certs.key().display().to_string(),
            certs.ca().display().to_string(),
        );
        let port = tls_port.to_string();
        let mut server = Self::start_with(
            &[
                "--tls-port",
                &port,
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &ca,
                "--tls-auth-clients",
                "no",
            ],
            free_port,
        )?;
        server.tls_port = Some(tls_port);
        Ok(server)
    }

    /// `127.0.0.1:TLS_PORT`, for a server started with [`RedisServer::start_tls`].
    pub fn tls_addr(&self) -> Option<String> {
        self.tls_port.map(|p| format!("127.0.0.1:{p}"))
    }

    fn start_with(
        extra: &[&str],
        port: fn() -> Result<u16, PeerError>,
    ) -> Result<RedisServer, PeerError> {
        let dir = TempDir::new("redis")?;
        let log = dir.path.join("redis.log");
        let stdio_log = dir.path.join("redis.stdio.log");
        let command = |binary: &Path, port: u16| {
            let mut cmd = Command::new(binary);
            cmd.arg("--port")
                .arg(port.to_string())
                .args(["--bind", "127.0.0.1"])
                .args(["--protected-mode", "no"])
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                .args(["--daemonize", "no"])
                .arg("--dir")
                .arg(&dir.path)
                .arg("--logfile")
                .arg(&log)
                .args(extra);
            cmd
        };
        let (process, port) = launch(&Launch {
            program: REDIS_SERVER,
            probe: REDIS_PROBE,
            command: &command,
            port,
            logs: vec![log.clone(), stdio_log.clone()],
            stdio_log,
        })?;
        Ok(RedisServer {
            process,
            port,
            tls_port: None,
            dir,
        })
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The store URL for this server, `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    pub fn pid(&self) -> u32 {
        self.process.child.id()
    }

    /// Kills the server (SIGKILL, as a crash would) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.process.child.kill();
        let _ = self.process.child.wait();
    }
}

/// A Redis Cluster on loopback: masters, and optionally replicas of each. Every node is killed
/// when dropped.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCluster")
            .field("nodes", &self.addrs())
            .finish()
    }
}

impl RedisCluster {
    /// Starts `masters` cluster-enabled Redis servers (Redis needs at least 3), joins them with
    /// `redis-cli --cluster create`, and waits until every node reports `cluster_state:ok`.
    pub fn start(masters: usize) -> Result<RedisCluster, PeerError> {
        Self::start_with_replicas(masters, 0, 5000)
    }

    /// [`RedisCluster::start`] with `replicas` replicas of each master, which take over a
    /// master that stops answering for `node_timeout_ms`. Returns once every replica is in
    /// sync with its master. Replicas may take over however stale they are
    /// (`cluster-replica-validity-factor 0`), as a test of failover needs.
    pub fn start_with_replicas(
        masters: usize,
        replicas: usize,
        node_timeout_ms: u64,
    ) -> Result<RedisCluster, PeerError> {
        let cli = REDIS_CLI.locate()?;
        let timeout = node_timeout_ms.to_string();
        let mut nodes = Vec::with_capacity(masters * (1 + replicas));
        for _ in 0..masters * (1 + replicas) {
            // The config file lives in the node's own directory (`--dir`), where a relative
            // name resolves.
            nodes.push(RedisServer::start_with(
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    &timeout,
                    "--cluster-replica-validity-factor",
                    "0",
                ],
                free_cluster_port,
            )?);
        }
        let cluster = RedisCluster { nodes };
        let output = Command::new(cli)
            .arg("--cluster")
            .arg("create")
            .args(cluster.addrs())
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|source| PeerError::Spawn {
                binary: REDIS_CLI.binary,
                source,
            })?;
        if !output.status.success() {
            return Err(PeerError::ClusterCreate {
                status: output.status,
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            });
        }
        for node in &cluster.nodes {
            wait_for_cluster_ok(node.port)?;
        }
        for i in 0..cluster.nodes.len() {
            if !cluster.is_master(i) {
                wait_for(
                    cluster.nodes[i].port,
                    "INFO replication\r\n",
                    "master_link_status:up",
                )?;
            }
        }
        Ok(cluster)
    }

    /// Whether node `i` is a master now (as it says itself).
    pub fn is_master(&self, i: usize) -> bool {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.nodes[i].port));
        bulk_command(addr, "INFO replication\r\n")
            .map(|info| info.lines().any(|l| l.trim() == "role:master"))
            .unwrap_or(false)
    }

    /// Kills node `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Each node's `127.0.0.1:PORT`.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::addr).collect()
    }

    /// The nodes as a store URL's host list: `127.0.0.1:p1,127.0.0.1:p2,...`.
    pub fn url_hosts(&self) -> String {
        self.addrs().join(",")
    }

    /// The store URL for this cluster, `redis+cluster://127.0.0.1:p1,...`.
    pub fn url(&self) -> String {
        format!("redis+cluster://{}", self.url_hosts())
    }

    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().map(RedisServer::pid).collect()
    }
}

/// Polls `CLUSTER INFO` on one node until it says `cluster_state:ok`.
fn wait_for_cluster_ok(port: u16) -> Result<(), PeerError> {
    wait_for(port, "CLUSTER INFO\r\n", "cluster_state:ok")
}

/// Polls a command whose answer is a bulk string of `field:value` lines on one node until one
/// of the lines is `want`.
fn wait_for(port: u16, command: &str, want: &str) -> Result<(), PeerError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let field = want.split(':').next().unwrap_or(want);
    let deadline = Instant::now() + CLUSTER_TIMEOUT;
    loop {
        let last = match bulk_command(addr, command) {
            Ok(info) if info.lines().any(|l| l.trim() == want) => return Ok(()),
            Ok(info) => info
                .lines()
                .find(|l| l.starts_with(field))
                .unwrap_or("no such line")
                .trim()
                .to_string(),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(PeerError::ClusterNotReady {
                addr: addr.to_string(),
                timeout: CLUSTER_TIMEOUT,
                last,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The body of the bulk-string reply to `command` (inline form, ending in CRLF).
fn bulk_command(addr: SocketAddr, command: &str) -> io::Result<String> {
    let timeout = Duration::from_millis(500);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(command.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut header = String::new();
    reader.read_line(&mut header)?;
    let len: usize = header
        .strip_prefix('$')
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, header.trim().to_string()))?;
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body)?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// One `memcached` on loopback, TCP only, with a 2 MiB item size limit. Killed when dropped.
pub struct Memcached {
    process: Process,
    port: u16,
    dir: TempDir,
}

impl fmt::Debug for Memcached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Memcached")
            .field("addr", &self.addr())
            .field("pid", &self.pid())
            .field("dir", &self.dir.path)
            .finish()
    }
}

impl Memcached {
    /// The largest value (item) the server accepts, as passed to `-I`.
    pub const ITEM_SIZE_LIMIT: usize = 2 << 20;

    /// Starts memcached with `memory_mib` MiB of item memory.
    pub fn start(memory_mib: u32) -> Result<Memcached, PeerError> {
        let dir = TempDir::new("memcached")?;
        let stdio_log = dir.path.join("memcached.log");
        let as_root = running_as_root();
        let command = |binary: &Path, port: u16| {
            let mut cmd = Command::new(binary);
            cmd.args(["-l", "127.0.0.1"])
                .arg("-p")
                .arg(port.to_string())
                .args(["-U", "0"])
                .arg("-m")
                .arg(memory_mib.to_string())
                .args(["-I", "2m"])
                .args(["-t", "2"]);
            // memcached refuses to run as root unless told which user to be.
            if as_root {
                cmd.args(["-u", "root"]);
            }
            cmd
        };
        let (process, port) = launch(&Launch {
            program: MEMCACHED,
            probe: MEMCACHED_PROBE,
            command: &command,
            port: free_port,
            logs: vec![stdio_log.clone()],
            stdio_log,
        })?;
        Ok(Memcached { process, port, dir })
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The store URL for this server, `memcached://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("memcached://{}", self.addr())
    }

    pub fn pid(&self) -> u32 {
        self.process.child.id()
    }
}

/// Whether this process runs as root: `/proc/self` belongs to the process's effective user.
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// Where distributions put shared libraries: Debian and Ubuntu, Fedora and RHEL, then the rest.
const LIBRARY_DIRS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
];

/// An installed shared library by file name (`libjemalloc.so.2`), wherever this distribution
/// keeps it.
pub fn shared_library(file: &str) -> Option<PathBuf> {
    LIBRARY_DIRS
        .iter()
        .map(|d| Path::new(d).join(file))
        .find(|p| p.exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(addr: &str, request: &[u8]) -> String {
        ask_line(addr.parse().unwrap(), request).unwrap()
    }

    fn port_is_closed(addr: &str) -> bool {
        TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_millis(200)).is_err()
    }

    #[test]
    fn redis_answers_and_goes_away_on_drop() {
        let redis = RedisServer::start().unwrap();
        let addr = redis.addr();
        assert!(ask(&addr, b"PING\r\n").starts_with("+PONG"));
        assert_eq!(ask(&addr, b"CONFIG GET save\r\n"), "*2\r\n");
        let dir = redis.dir.path.clone();
        assert!(
            dir.join("redis.log").exists(),
            "redis must log to its own file"
        );
        drop(redis);
        assert!(
            port_is_closed(&addr),
            "redis still listening on {addr} after drop"
        );
        assert!(!dir.exists(), "{} not removed", dir.display());
    }

    #[test]
    fn two_redis_servers_get_different_ports() {
        let a = RedisServer::start().unwrap();
        let b = RedisServer::start().unwrap();
        assert_ne!(a.addr(), b.addr());
        assert_ne!(a.pid(), b.pid());
    }

    #[test]
    fn memcached_answers_and_goes_away_on_drop() {
        let mc = Memcached::start(64).unwrap();
        let addr = mc.addr();
        assert!(ask(&addr, b"version\r\n").starts_with("VERSION "));
        drop(mc);
        assert!(
            port_is_closed(&addr),
            "memcached still listening on {addr} after drop"
        );
    }

    #[test]
    fn cluster_of_three_is_ok_on_every_node() {
        let cluster = RedisCluster::start(3).unwrap();
        let addrs = cluster.addrs();
        assert_eq!(addrs.len(), 3);
        assert_eq!(cluster.url_hosts(), addrs.join(","));
        for addr in &addrs {
            let info = bulk_command(addr.parse().unwrap(), "CLUSTER INFO\r\n").unwrap();
            assert!(info.contains("cluster_state:ok"), "{addr}: {info}");
            assert!(info.contains("cluster_known_nodes:3"), "{addr}: {info}");
        }
        drop(cluster);
        for addr in &addrs {
            assert!(
                port_is_closed(addr),
                "cluster node {addr} still up after drop"
            );
        }
    }

    #[test]
    fn a_missing_binary_says_how_to_install_it() {
        let missing = Program {
            binary: "tidepool-no-such-server",
            package: "tidepool-no-such-package",
        };
        let e = missing.locate().unwrap_err().to_string();
        assert!(
            e.contains("tidepool-no-such-server not found on PATH")
                && e.contains("apt-get install tidepool-no-such-package")
                && e.contains(".ci/run"),
            "{e}"
        );
    }

    #[test]
    fn a_server_that_fails_to_start_shows_its_log() {
        let dir = TempDir::new("bad-redis").unwrap();
        let log = dir.path.join("redis.log");
        let stdio_log = dir.path.join("stdio.log");
        let command = |binary: &Path, port: u16| {
            let mut cmd = Command::new(binary);
            cmd.arg("--port")
                .arg(port.to_string())
                .args(["--no-such-option", "yes"]);
            cmd
        };
        let e = launch(&Launch {
            program: REDIS_SERVER,
            probe: REDIS_PROBE,
            command: &command,
            port: free_port,
            logs: vec![log, stdio_log.clone()],
            stdio_log,
        })
        .unwrap_err();
        assert!(matches!(e, PeerError::Exited { .. }), "{e:?}");
        assert!(e.to_string().contains("no-such-option"), "{e}");
    }
}
