//! Redis and Redis Cluster backend.
//!
//! Values live under `prefix + key as 8 big-endian bytes` (binary-safe, so the 8 bytes need no
//! encoding). The prefix keeps stores that share a server apart.
//!
//! Each batch is one round trip. On one server: `MSET`, `MGET`, a pipeline of `GETDEL`
//! (Redis >= 6.2) and one `DEL`. On a cluster, where one multi-key command cannot span hash
//! slots, every batch is a pipeline of single-key commands (`SET`, `GET`, `GETDEL`, `DEL`) that
//! the cluster pipeline splits by node, sending to all nodes before reading any answer.
//!
//! A connection serves one call at a time, so the store keeps a small pool of them: a call checks
//! one out (opening a new one when none is idle) and gives it back when done, and concurrent
//! callers never wait for each other's round trips. A connection whose call failed is dropped
//! rather than given back: after an I/O error a pipelined connection may still have answers in
//! flight, which the next call would read as its own.
//!
//! Failed calls are not retried: a `GETDEL` whose answer was lost may have happened, and
//! repeating it would read `None` where a value was. The error goes to the caller, who knows
//! whether the operation can be repeated.

use crate::tls::{ClientTls, TlsOptions};
use crate::{FarStore, ForkAware, Key, StoreError, StoreStats};
use bytes::Bytes;
use parking_lot::Mutex;
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{Connection, RedisError};
use std::fmt;
use std::io;
use std::time::Duration;

/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one read or write on an open connection may block. A far store must report a hung
/// server as an error, not hang its caller forever.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle connections kept per store; more are opened on demand and closed when given back.
const MAX_IDLE: usize = 16;
/// How long a write with `wait=N` waits for its replicas.
const WAIT_TIMEOUT: Duration = Duration::from_secs(2);
/// Redis refuses a bulk string longer than `proto-max-bulk-len`, 512 MiB unless configured.
const MAX_VALUE: usize = 512 << 20;
/// What to do when the client uses TLS and the server does not.
const PLAIN_REDIS_HINT: &str =
    "; is this the server's tls-port? A plain port takes redis:// (or redis+cluster://)";

/// Connections not in use, ready for the next call.
struct Pool<C> {
    idle: Mutex<Vec<C>>,
}

impl<C> Pool<C> {
    fn new(first: C) -> Pool<C> {
        Pool {
            idle: Mutex::new(vec![first]),
        }
    }

    fn take_idle(&self) -> Option<C> {
        self.idle.lock().pop()
    }

    fn give_back(&self, conn: C) {
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    fn idle_count(&self) -> usize {
        self.idle.lock().len()
    }

    /// Forgets the idle connections (a forked child's, shared with its parent): closing the
    /// child's copies of their sockets leaves the parent's connections open.
    fn forget_idle(&self) {
        self.idle.lock().clear();
    }
}

/// What the store talks to.
enum Target {
    Single {
        client: redis::Client,
        addr: String,
        pool: Pool<Connection>,
    },
    Cluster {
        client: ClusterClient,
        options: ClusterOptions,
        /// `h1:p1,h2:p2,...`, as given.
        nodes: String,
        pool: Pool<ClusterConnection>,
    },
}

/// A [`FarStore`] on one Redis server or a Redis Cluster.
pub struct RedisStore {
    target: Target,
    prefix: Vec<u8>,
    /// Connections use TLS (`rediss://`).
    tls: bool,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let idle = match &self.target {
            Target::Single { pool, .. } => pool.idle_count(),
            Target::Cluster { pool, .. } => pool.idle_count(),
        };
        f.debug_struct("RedisStore")
            .field("target", &self.describe())
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("idle_connections", &idle)
            .finish()
    }
}

const SINGLE: &str = "redis";
const CLUSTER: &str = "redis cluster";

impl RedisStore {
    /// Connects to the Redis server at `addr` (`[:password@]host:port[/DB]`). Values are kept
    /// under `prefix`, by default one unique to this store instance.
    pub fn connect(addr: &str, prefix: Option<String>) -> Result<RedisStore, StoreError> {
        Self::connect_with(addr, prefix, None)
    }

    /// [`RedisStore::connect`], over TLS when `tls` is given (`rediss://`).
    pub fn connect_with(
        addr: &str,
        prefix: Option<String>,
        tls: Option<&TlsOptions>,
    ) -> Result<RedisStore, StoreError> {
        let connect_error =
            |e: RedisError| hang_up_hint(refused_or_unreachable(SINGLE, addr, e), tls);
        let scheme = if tls.is_some() { "rediss" } else { "redis" };
        let url = if addr.contains('/') {
            format!("{scheme}://{addr}")
        } else {
            format!("{scheme}://{addr}/")
        };
        let client = match tls {
            None => redis::Client::open(url).map_err(connect_error)?,
            Some(opts) => {
                // The redis crate's own handshake waits without a timeout (a plain server
                // never answers it); ours fails fast and says why.
                let server = crate::tls::host_port(addr);
                ClientTls::from_options(server, opts)?.probe(
                    server,
                    addr,
                    SINGLE,
                    CONNECT_TIMEOUT,
                    PLAIN_REDIS_HINT,
                )?;
                match redis_certificates(opts)? {
                    Some(certs) => {
                        redis::Client::build_with_tls(url, certs).map_err(connect_error)?
                    }
                    None => redis::Client::open(url).map_err(connect_error)?,
                }
            }
        };
        // Open the first connection now, so that a wrong address fails here and not at the
        // first page fault.
        let first = open_single(&client).map_err(connect_error)?;
        Ok(RedisStore {
            target: Target::Single {
                client,
                addr: addr.to_string(),
                pool: Pool::new(first),
            },
            prefix: prefix.unwrap_or_else(crate::default_prefix).into_bytes(),
            tls: tls.is_some(),
        })
    }

    /// Connects to the Redis Cluster that `nodes` (`host:port` each) belong to; any reachable
    /// node is enough to discover the others.
    pub fn connect_cluster(
        nodes: &[String],
        prefix: Option<String>,
    ) -> Result<RedisStore, StoreError> {
        Self::connect_cluster_with(nodes, prefix, None)
    }

    /// [`RedisStore::connect_cluster`], over TLS when `tls` is given (`rediss+cluster://`).
    /// The nodes' certificates must name the addresses the cluster announces for them.
    pub fn connect_cluster_with(
        nodes: &[String],
        prefix: Option<String>,
        tls: Option<&TlsOptions>,
    ) -> Result<RedisStore, StoreError> {
        Self::connect_cluster_with_options(nodes, prefix, tls, ClusterOptions::default())
    }

    /// [`RedisStore::connect_cluster_with`], with replicas to wait for and a failover
    /// deadline.
    pub fn connect_cluster_with_options(
        nodes: &[String],
        prefix: Option<String>,
        tls: Option<&TlsOptions>,
        options: ClusterOptions,
    ) -> Result<RedisStore, StoreError> {
        let joined = nodes.join(",");
        let connect_error =
            |e: RedisError| hang_up_hint(refused_or_unreachable(CLUSTER, &joined, e), tls);
        let scheme = if tls.is_some() { "rediss" } else { "redis" };
        let mut builder = ClusterClient::builder(nodes.iter().map(|n| format!("{scheme}://{n}/")));
        if let Some(opts) = tls {
            probe_any(nodes, opts)?;
            if let Some(certs) = redis_certificates(opts)? {
                builder = builder.certs(certs);
            }
        }
        let client = builder
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(IO_TIMEOUT)
            // Retries serve redirects (MOVED/ASK) and TRYAGAIN while slots migrate; keep their
            // waits short so that a cluster that is down is reported within a second or so.
            .retries(4)
            .min_retry_wait(100)
            .max_retry_wait(1000)
            .build()
            .map_err(connect_error)?;
        let first = open_cluster(&client).map_err(connect_error)?;
        Ok(RedisStore {
            target: Target::Cluster {
                client,
                options,
                nodes: joined,
                pool: Pool::new(first),
            },
            prefix: prefix.unwrap_or_else(crate::default_prefix).into_bytes(),
            tls: tls.is_some(),
        })
    }

    fn redis_key(&self, key: Key) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + 8);
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(&key.to_be_bytes());
        k
    }

    fn backend(&self) -> &'static str {
        match self.target {
            Target::Single { .. } => SINGLE,
            Target::Cluster { .. } => CLUSTER,
        }
    }

    /// The server or node list, for messages.
    fn where_(&self) -> &str {
        match &self.target {
            Target::Single { addr, .. } => addr,
            Target::Cluster { nodes, .. } => nodes,
        }
    }

    fn hint(&self) -> &'static str {
        match self.target {
            Target::Single { .. } => "is the server still running?",
            Target::Cluster { .. } => "are the cluster's nodes still running?",
        }
    }

    /// Runs `single` or `cluster` on a pooled connection. The connection goes back to the pool
    /// only if the call succeeded.
    fn call<T>(
        &self,
        op: &'static str,
        single: impl FnOnce(&mut Connection) -> redis::RedisResult<T>,
        cluster: impl Fn(&mut ClusterConnection) -> redis::RedisResult<T>,
    ) -> Result<T, StoreError> {
        let result = match &self.target {
            Target::Single { client, pool, .. } => {
                let mut conn = match pool.take_idle() {
                    Some(c) => c,
                    None => open_single(client).map_err(|e| self.reconnect_error(e))?,
                };
                let r = single(&mut conn);
                if r.is_ok() {
                    pool.give_back(conn);
                }
                r
            }
            Target::Cluster {
                client,
                pool,
                options,
                ..
            } => {
                // Through a failover (a master gone, its replica not yet promoted) every call
                // fails; each try takes a fresh connection, which reads the slot map anew, until
                // the deadline.
                let deadline = std::time::Instant::now() + options.failover;
                let mut pause = Duration::from_millis(20);
                loop {
                    let conn = match pool.take_idle() {
                        Some(c) => Ok(c),
                        None => open_cluster(client),
                    };
                    let r = conn.and_then(|mut conn| {
                        let r = cluster(&mut conn);
                        if r.is_ok() {
                            pool.give_back(conn);
                        }
                        r
                    });
                    match r {
                        Err(e) if failing_over(&e) && std::time::Instant::now() < deadline => {
                            tracing::debug!("redis cluster {op}: {e}; retrying");
                            pool.forget_idle();
                            std::thread::sleep(pause);
                            pause = (pause * 2).min(Duration::from_millis(500));
                        }
                        r => break r,
                    }
                }
            }
        };
        result.map_err(|e| self.run_error(op, e))
    }

    fn reconnect_error(&self, e: RedisError) -> StoreError {
        if is_auth_failure(&e) {
            return refused_or_unreachable(self.backend(), self.where_(), e);
        }
        StoreError::Connect {
            backend: self.backend(),
            addr: self.where_().to_string(),
            cause: to_io_error(&e, format!("{e}")),
        }
    }

    /// Maps an error on an open connection: lost connections become [`StoreError::Io`], answers
    /// the server gave become [`StoreError::Backend`]; both name the server.
    fn run_error(&self, op: &'static str, e: RedisError) -> StoreError {
        if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
            StoreError::Io {
                backend: self.backend(),
                op,
                cause: to_io_error(&e, format!("{}: {e}; {}", self.where_(), self.hint())),
            }
        } else {
            StoreError::Backend {
                backend: self.backend(),
                message: format!("{} answered {op} with an error: {e}", self.where_()),
                source: Some(Box::new(e)),
            }
        }
    }

    fn check_sizes(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        match items.iter().find(|(_, v)| v.len() > MAX_VALUE) {
            Some((_, v)) => Err(StoreError::ValueTooLarge {
                backend: self.backend(),
                len: v.len(),
                max: MAX_VALUE,
            }),
            None => Ok(()),
        }
    }

    fn check_count(
        &self,
        op: &'static str,
        values: Vec<Option<Vec<u8>>>,
        want: usize,
    ) -> Result<Vec<Option<Bytes>>, StoreError> {
        if values.len() != want {
            return Err(StoreError::Protocol {
                backend: self.backend(),
                detail: format!(
                    "{} answered {op} of {want} keys with {} values",
                    self.where_(),
                    values.len()
                ),
            });
        }
        Ok(values.into_iter().map(|v| v.map(Bytes::from)).collect())
    }
}

/// The redis crate's form of a `ca=` file; `None`: the system's roots (its default).
fn redis_certificates(opts: &TlsOptions) -> Result<Option<redis::TlsCertificates>, StoreError> {
    let Some(path) = &opts.ca else {
        return Ok(None);
    };
    // Checked here so that a bad file is named; the crate would only say "Unable to parse".
    crate::tls::read_ca_file(path)?;
    let pem = std::fs::read(path).map_err(|e| StoreError::TlsSetup {
        reason: format!("cannot read CA certificates from {}: {e}", path.display()),
    })?;
    Ok(Some(redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    }))
}

/// Runs a TLS handshake with the first cluster node that answers; the error of the first node
/// that answered wrongly (not TLS, certificate refused) if none did right.
fn probe_any(nodes: &[String], opts: &TlsOptions) -> Result<(), StoreError> {
    let mut first_error = None;
    for n in nodes {
        let server = crate::tls::host_port(n);
        let r = ClientTls::from_options(server, opts)
            .and_then(|t| t.probe(server, n, CLUSTER, CONNECT_TIMEOUT, PLAIN_REDIS_HINT));
        match r {
            Ok(()) => return Ok(()),
            Err(e @ (StoreError::Tls { .. } | StoreError::TlsSetup { .. })) => {
                return Err(e);
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.expect("a cluster URL names at least one node"))
}

/// How a Redis Cluster store rides out failures: [`ClusterOptions::default`], then the setters
/// below for what differs from the defaults each one names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterOptions {
    /// Replicas every write must reach (Redis `WAIT`) before it is acknowledged, so that it
    /// survives its master's failover; `None` acknowledges once the masters have it.
    pub(crate) wait: Option<u32>,
    /// How long a call keeps retrying while the cluster cannot serve it (a master lost and
    /// not yet replaced) before it fails.
    pub(crate) failover: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            wait: None,
            failover: Duration::from_secs(15),
        }
    }
}

impl ClusterOptions {
    /// Replicas every write must reach (Redis `WAIT`) before it is acknowledged, so that it
    /// survives its master's failover.
    /// Default: none, a write is acknowledged once the masters have it.
    pub fn wait(mut self, replicas: u32) -> ClusterOptions {
        self.wait = Some(replicas);
        self
    }

    /// How long a call keeps retrying while the cluster cannot serve it (a master lost and
    /// not yet replaced) before it fails.
    /// Default: 15 s.
    pub fn failover(mut self, value: Duration) -> ClusterOptions {
        self.failover = value;
        self
    }
}

/// Whether an error is what a cluster answers while it fails over (a node unreachable, slots
/// without a master, redirections mid-change), worth a retry on a fresh slot map.
fn failing_over(e: &RedisError) -> bool {
    use redis::ErrorKind::*;
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ClusterDown
                | TryAgain
                | MasterDown
                | ReadOnly
                | Moved
                | Ask
                | ClusterConnectionNotFound
        )
}

fn open_single(client: &redis::Client) -> redis::RedisResult<Connection> {
    let conn = client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(conn)
}

fn open_cluster(client: &ClusterClient) -> redis::RedisResult<ClusterConnection> {
    let conn = client.get_connection()?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(conn)
}

/// An `io::Error` with the kind the Redis error suggests and the given message.
fn to_io_error(e: &RedisError, message: String) -> io::Error {
    let kind = if e.is_timeout() {
        io::ErrorKind::TimedOut
    } else if e.is_connection_refusal() {
        io::ErrorKind::ConnectionRefused
    } else if e.is_connection_dropped() {
        io::ErrorKind::ConnectionReset
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, message)
}

impl FarStore for RedisStore {
    fn fork_aware(&self) -> Option<&dyn ForkAware> {
        Some(self)
    }

    /// A cluster call retries through a failover for `failover`, a write with `wait` then
    /// waits as long for its replicas, and its last try may take the I/O timeout.
    fn patience(&self) -> Duration {
        match &self.target {
            Target::Single { .. } => Duration::ZERO,
            Target::Cluster { options, .. } if options.wait.is_some() => {
                2 * options.failover + IO_TIMEOUT
            }
            Target::Cluster { options, .. } => options.failover + IO_TIMEOUT,
        }
    }

    fn describe(&self) -> String {
        let s = if self.tls { "s" } else { "" };
        match &self.target {
            Target::Single { addr, .. } => crate::redact(&format!("redis{s}://{addr}")),
            Target::Cluster { nodes, .. } => crate::redact(&format!("redis{s}+cluster://{nodes}")),
        }
    }

    fn write_many(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        if items.is_empty() {
            return Ok(());
        }
        self.check_sizes(items)?;
        let keys: Vec<Vec<u8>> = items.iter().map(|(k, _)| self.redis_key(*k)).collect();
        self.call(
            "write",
            |conn| {
                let mut mset = redis::cmd("MSET");
                for (key, (_, value)) in keys.iter().zip(items) {
                    mset.arg(key.as_slice()).arg(*value);
                }
                mset.query::<()>(conn)
            },
            |conn| {
                let mut pipe = redis::cluster::ClusterPipeline::with_capacity(items.len());
                for (key, (_, value)) in keys.iter().zip(items) {
                    pipe.cmd("SET").arg(key.as_slice()).arg(*value).ignore();
                }
                pipe.query::<()>(conn)?;
                let Target::Cluster {
                    options:
                        ClusterOptions {
                            wait: Some(n),
                            failover,
                        },
                    ..
                } = &self.target
                else {
                    return Ok(());
                };
                // Sent to every master; the answer is the fewest replicas any of them reached.
                // A replica behind (a busy host: one took more than 2 s beside a loaded test
                // suite) gets as long as a failover may take, WAIT after WAIT, before the write
                // counts as lost.
                let started = std::time::Instant::now();
                loop {
                    let reached: i64 = redis::cmd("WAIT")
                        .arg(*n)
                        .arg(WAIT_TIMEOUT.as_millis() as u64)
                        .query(conn)?;
                    if reached >= *n as i64 {
                        return Ok(());
                    }
                    if started.elapsed() >= *failover {
                        return Err(RedisError::from((
                            redis::ErrorKind::ResponseError,
                            "a write did not reach its replicas",
                            format!(
                                "{reached} of the {n} replicas asked for (wait={n}) took it \
                                 within {} ms; are the replicas running and in sync?",
                                started.elapsed().as_millis()
                            ),
                        )));
                    }
                }
            },
        )
    }

    fn read_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let rkeys: Vec<Vec<u8>> = keys.iter().map(|k| self.redis_key(*k)).collect();
        let values = self.call(
            "read",
            |conn| {
                let mut mget = redis::cmd("MGET");
                for key in &rkeys {
                    mget.arg(key.as_slice());
                }
                mget.query::<Vec<Option<Vec<u8>>>>(conn)
            },
            |conn| {
                let mut pipe = redis::cluster::ClusterPipeline::with_capacity(rkeys.len());
                for key in &rkeys {
                    pipe.cmd("GET").arg(key.as_slice());
                }
                pipe.query::<Vec<Option<Vec<u8>>>>(conn)
            },
        )?;
        self.check_count("read", values, keys.len())
    }

    fn take_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        if let Target::Cluster { .. } = self.target {
            // Read, then delete: each can be retried through a failover, where a GETDEL whose
            // answer was lost could not (the retry would find the values gone).
            let values = self.read_many(keys)?;
            self.remove_many(keys)?;
            return Ok(values);
        }
        let rkeys: Vec<Vec<u8>> = keys.iter().map(|k| self.redis_key(*k)).collect();
        let values = self.call(
            "take",
            |conn| {
                let mut pipe = redis::pipe();
                for key in &rkeys {
                    pipe.cmd("GETDEL").arg(key.as_slice());
                }
                pipe.query::<Vec<Option<Vec<u8>>>>(conn)
            },
            |conn| {
                let mut pipe = redis::cluster::ClusterPipeline::with_capacity(rkeys.len());
                for key in &rkeys {
                    pipe.cmd("GETDEL").arg(key.as_slice());
                }
                pipe.query::<Vec<Option<Vec<u8>>>>(conn)
            },
        )?;
        self.check_count("take", values, keys.len())
    }

    fn remove_many(&self, keys: &[Key]) -> Result<(), StoreError> {
        if keys.is_empty() {
            return Ok(());
        }
        let rkeys: Vec<Vec<u8>> = keys.iter().map(|k| self.redis_key(*k)).collect();
        self.call(
            "remove",
            |conn| {
                let mut del = redis::cmd("DEL");
                for key in &rkeys {
                    del.arg(key.as_slice());
                }
                del.query::<()>(conn)
            },
            |conn| {
                let mut pipe = redis::cluster::ClusterPipeline::with_capacity(rkeys.len());
                for key in &rkeys {
                    pipe.cmd("DEL").arg(key.as_slice()).ignore();
                }
                pipe.query::<()>(conn)
            },
        )
    }

    /// On one server, `far_bytes` is the server's `used_memory` (all its data, not only this
    /// store's). A cluster reports nothing: that would take a round trip to every node.
    fn stats(&self) -> Result<StoreStats, StoreError> {
        if let Target::Cluster { .. } = self.target {
            return Ok(StoreStats::default());
        }
        let info = self.call(
            "stats",
            |conn| redis::cmd("INFO").arg("memory").query::<String>(conn),
            // Not reached: a cluster returned above.
            |_| Ok(String::new()),
        )?;
        let used_memory = info
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse::<u64>().ok());
        Ok(StoreStats {
            far_bytes: used_memory,
            objects: None,
            extra: vec![],
        })
    }
}

/// A wrong or missing password is not an unreachable server: say which it is.
fn is_auth_failure(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH") | Some("WRONGPASS"))
}

/// A plain connection that the server hangs up on at its first command is most likely at a
/// TLS port (Redis's TLS port drops a connection whose first bytes are not a handshake).
fn hang_up_hint(e: StoreError, tls: Option<&TlsOptions>) -> StoreError {
    match e {
        StoreError::Connect {
            backend,
            addr,
            cause,
        } if tls.is_none()
            && matches!(
                cause.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            ) =>
        {
            let cause = io::Error::new(
                cause.kind(),
                format!(
                    "{cause}; the server hung up at the first command: if this is its TLS \
                     port (tls-port), write rediss:// (or rediss+cluster://)"
                ),
            );
            StoreError::Connect {
                backend,
                addr,
                cause,
            }
        }
        e => e,
    }
}

fn refused_or_unreachable(backend: &'static str, addr: &str, e: RedisError) -> StoreError {
    if is_auth_failure(&e) {
        return StoreError::Backend {
            backend,
            message: format!(
                "the server at {} refused the password (authentication failed): \
                 put the right one in the URL, as redis://:PASSWORD@host:port",
                crate::redact(addr)
            ),
            source: None,
        };
    }
    StoreError::Connect {
        backend,
        addr: addr.to_string(),
        cause: to_io_error(&e, format!("{e}")),
    }
}

impl ForkAware for RedisStore {
    fn after_fork_in_child(&self) {
        match &self.target {
            Target::Single { pool, .. } => pool.forget_idle(),
            Target::Cluster { pool, .. } => pool.forget_idle(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_prefix_then_big_endian_bytes() {
        let store = RedisStore {
            target: Target::Single {
                client: redis::Client::open("redis://127.0.0.1:1/").unwrap(),
                addr: "127.0.0.1:1".into(),
                pool: Pool {
                    idle: Mutex::new(Vec::new()),
                },
            },
            prefix: b"p:".to_vec(),
            tls: false,
        };
        assert_eq!(
            store.redis_key(0x0102_0304_0506_0708),
            b"p:\x01\x02\x03\x04\x05\x06\x07\x08".to_vec()
        );
        assert_eq!(store.describe(), "redis://127.0.0.1:1");
    }

    #[test]
    fn an_unreachable_server_fails_at_connect_naming_it() {
        // Port 1 on loopback: nothing listens there, so the connection is refused at once.
        let e = RedisStore::connect("127.0.0.1:1", None).unwrap_err();
        assert!(matches!(e, StoreError::Connect { .. }), "{e:?}");
        assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
        let e = RedisStore::connect_cluster(&["127.0.0.1:1".into()], None).unwrap_err();
        assert!(matches!(e, StoreError::Connect { .. }), "{e:?}");
        assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    }
}
