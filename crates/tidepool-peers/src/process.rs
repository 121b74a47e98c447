//! What every peer server shares: a temporary directory of its own, a child process killed on
//! drop, a free loopback port, and a launch that waits until the server answers its liveness
//! probe (starting it again on a new port if another process took the port in between).

use crate::PeerError;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to answer its first liveness probe.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How often a server is started again on a new port after losing its port to someone else.
const PORT_ATTEMPTS: usize = 8;
/// Log lines quoted in an error.
const LOG_TAIL_LINES: usize = 25;

/// A temporary directory that is removed with everything in it when dropped.
#[derive(Debug)]
pub(crate) struct TempDir {
    pub(crate) path: PathBuf,
}

impl TempDir {
    pub(crate) fn new(label: &str) -> Result<TempDir, PeerError> {
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
pub(crate) struct Process {
    pub(crate) child: Child,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A program the peers need, with the Debian package that provides it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Program {
    pub(crate) binary: &'static str,
    pub(crate) package: &'static str,
}

pub(crate) const REDIS_SERVER: Program = Program {
    binary: "redis-server",
    package: "redis-server",
};
pub(crate) const REDIS_CLI: Program = Program {
    binary: "redis-cli",
    package: "redis-tools",
};
pub(crate) const MEMCACHED: Program = Program {
    binary: "memcached",
    package: "memcached",
};

impl Program {
    /// The program's path on `PATH`, or the error that tells how to install it.
    pub(crate) fn locate(self) -> Result<PathBuf, PeerError> {
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
pub(crate) fn free_port() -> Result<u16, PeerError> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|source| PeerError::NoFreePort { source })?;
    let port = listener
        .local_addr()
        .map_err(|source| PeerError::NoFreePort { source })?
        .port();
    Ok(port)
}

/// A free port `p` whose cluster bus port `p + 10000` is free too (Redis Cluster needs both).
pub(crate) fn free_cluster_port() -> Result<u16, PeerError> {
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

/// Whether process `pid` holds the socket listening on port `port` (its inode in
/// /proc/net/tcp among the process's descriptors). A probe's answer counts only then: between
/// [`free_port`] and the server's bind another server may take the port (a test's
/// `tidepool cache` beside, which answers memcached's probe too), and the test would talk to
/// it. Where /proc cannot tell, the answer is trusted.
fn holds_port(pid: u32, port: u16) -> bool {
    let Ok(tcp) = fs::read_to_string("/proc/net/tcp") else {
        return true;
    };
    let suffix = format!(":{port:04X}");
    // Fields: sl, local address, remote address, state (0A: listening), ..., inode (10th).
    let inodes: Vec<String> = tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let listening = f.get(1)?.ends_with(&suffix) && *f.get(3)? == "0A";
            let inode = f.get(9)?;
            listening.then(|| format!("socket:[{inode}]"))
        })
        .collect();
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return true;
    };
    fds.flatten().any(|fd| {
        fs::read_link(fd.path()).is_ok_and(|to| inodes.iter().any(|i| to.as_os_str() == i.as_str()))
    })
}

fn lost_its_port(tail: &str) -> bool {
    tail.contains("Address already in use") || tail.contains("failed to listen")
}

/// Sends `request` and reads one line of the answer.
pub(crate) fn ask_line(addr: SocketAddr, request: &[u8]) -> io::Result<String> {
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
pub(crate) struct Probe {
    pub(crate) request: &'static [u8],
    pub(crate) answer_prefix: &'static str,
}

pub(crate) const REDIS_PROBE: Probe = Probe {
    request: b"PING\r\n",
    answer_prefix: "+PONG",
};
pub(crate) const MEMCACHED_PROBE: Probe = Probe {
    request: b"version\r\n",
    answer_prefix: "VERSION ",
};

/// A server process being started: what `launch` needs to run it and to explain a failure.
pub(crate) struct Launch<'a> {
    pub(crate) program: Program,
    pub(crate) probe: Probe,
    /// Builds the command line for a port.
    pub(crate) command: &'a dyn Fn(&Path, u16) -> Command,
    /// Picks a port.
    pub(crate) port: fn() -> Result<u16, PeerError>,
    /// Log files to quote on failure (the server's own log and its captured stdout/stderr).
    pub(crate) logs: Vec<PathBuf>,
    /// Where stdout and stderr go.
    pub(crate) stdio_log: PathBuf,
}

/// Starts the server and waits until it answers, starting it again on a new port if its port
/// was taken in between.
pub(crate) fn launch(launch: &Launch<'_>) -> Result<(Process, u16), PeerError> {
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
            if line.starts_with(launch.probe.answer_prefix) && holds_port(process.child.id(), port)
            {
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

/// What the peers' tests share: one line of a server's answer, and whether its port is closed.
#[cfg(test)]
pub(crate) mod testing {
    use std::net::TcpStream;
    use std::time::Duration;

    pub(crate) fn ask(addr: &str, request: &[u8]) -> String {
        super::ask_line(addr.parse().unwrap(), request).unwrap()
    }

    pub(crate) fn port_is_closed(addr: &str) -> bool {
        TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_millis(200)).is_err()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_counts_as_a_servers_only_if_the_server_listens_on_it() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(holds_port(std::process::id(), port));
        let mut other = Command::new("sleep").arg("30").spawn().unwrap();
        assert!(!holds_port(other.id(), port), "another process's port");
        other.kill().unwrap();
        other.wait().unwrap();
        drop(listener);
        assert!(!holds_port(std::process::id(), port), "a closed port");
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
