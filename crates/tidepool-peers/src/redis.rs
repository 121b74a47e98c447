//! Redis on loopback: one standalone server (optionally serving TLS too), or a Redis Cluster of
//! masters and replicas.

use crate::process::{
    free_cluster_port, free_port, launch, Launch, Process, TempDir, REDIS_CLI, REDIS_PROBE,
    REDIS_SERVER,
};
use crate::{tls, PeerError};
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a new cluster may take until every node reports `cluster_state:ok`.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::testing::{ask, port_is_closed};

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
}
