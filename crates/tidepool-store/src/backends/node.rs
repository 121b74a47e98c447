//! The memory-node backend: a client of `tidepool node`.
//!
//! [`NodeClient`] speaks the protocol. It keeps a pool of connections and gives each calling
//! thread its own for the length of a call, so threads never queue behind one another on a
//! socket and no answer has to be handed from a reader thread to a waiting caller (a wake-up
//! across CPUs costs more than the request itself on small VMs). One call may still carry many
//! outstanding requests: [`NodeClient::pipeline`] sends them together and matches the answers by
//! request id, in whatever order they come.
//!
//! All connections of one client share a session id, so the objects it put belong to the client
//! as a whole and are released by the node only when its last connection closes.
//!
//! A forked child ([`NodeClient::after_fork_in_child`]) takes a session of its own for what it
//! puts, and keeps its copies of the parent's connections open without ever using them: while
//! they are open, the parent's session (whose objects the child may still read) lives on, even
//! after the parent has exited. They close when the child exits or execs.
//!
//! [`NodeStore`] is the [`FarStore`] over it: it maps the caller's keys to the node's handles.

use crate::tls::ClientTls;
use crate::{FarStore, FetchMode, Key, StoreError, StoreStats};
use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use std::io::{IoSlice, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tidepool_proto::scan::{Column, Scan};
use tidepool_proto::{
    decode_response, peek_header, put_header, ErrorCode, Handle, HelloInfo, ItemResult, Op,
    Request, Response, HEADER_LEN, MAX_BODY, RESPONSE_BIT,
};

const BACKEND: &str = "memory node";
const MIN_READ: usize = 16 << 10;
/// Payloads at least this large are sent from the caller's memory by a vectored write instead of
/// being copied into the send buffer.
const GATHER_MIN: usize = 1024;
/// Send buffer asked for each connection (the kernel doubles it, up to net.core.wmem_max).
const SEND_BUFFER: usize = 2 << 20;
/// The most buffers one writev takes (Linux's IOV_MAX).
const IOV_MAX: usize = 1024;
/// A node that has not answered for this long is treated as gone.
/// How long a TLS handshake may take before the node is taken for one that does not use TLS.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// What to do when the client uses TLS and the node does not.
const PLAIN_NODE_HINT: &str =
    "; remove tls=1 from the URL, or start the node with --tls-cert and --tls-key";

/// One piece of an outgoing batch: bytes in the batch's own buffer, or a caller's payload.
#[derive(Debug)]
enum Seg<'a> {
    Own(usize, usize),
    Borrowed(&'a [u8]),
}

/// Requests to send together. Small fields are encoded into one buffer; large payloads stay
/// where the caller has them and go out through `writev`, so a 4 KiB page is copied once, by
/// the kernel, on its way to the node. Request ids are the requests' positions in the batch:
/// a connection carries one batch at a time and is dropped if a batch fails.
#[derive(Debug, Default)]
pub struct Batch<'a> {
    own: BytesMut,
    segs: Vec<Seg<'a>>,
    ops: Vec<Op>,
}

impl<'a> Batch<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    fn close_own(&mut self, from: usize) {
        let to = self.own.len();
        if to > from {
            match self.segs.last_mut() {
                Some(Seg::Own(_, end)) if *end == from => *end = to,
                _ => self.segs.push(Seg::Own(from, to)),
            }
        }
    }

    /// Adds a request encoded whole into the batch's buffer.
    pub fn push(&mut self, req: &Request) {
        let from = self.own.len();
        req.encode(self.ops.len() as u64, &mut self.own);
        self.close_own(from);
        self.ops.push(req.op());
    }

    fn header(&mut self, op: Op, body_len: usize) {
        let from = self.own.len();
        put_header(
            &mut self.own,
            op as u8,
            self.ops.len() as u64,
            body_len as u32,
        );
        self.close_own(from);
        self.ops.push(op);
    }

    fn fixed(&mut self, f: impl FnOnce(&mut BytesMut)) {
        let from = self.own.len();
        f(&mut self.own);
        self.close_own(from);
    }

    fn blob(&mut self, data: &'a [u8]) {
        self.fixed(|b| b.put_u32_le(data.len() as u32));
        if data.len() >= GATHER_MIN {
            self.segs.push(Seg::Borrowed(data));
        } else {
            self.fixed(|b| b.put_slice(data));
        }
    }

    /// Adds a put-many of `items`.
    pub fn put_many(&mut self, items: &[&'a [u8]]) {
        let body = 4 + items.iter().map(|d| 4 + d.len()).sum::<usize>();
        self.header(Op::PutMany, body);
        self.fixed(|b| b.put_u32_le(items.len() as u32));
        for d in items {
            self.blob(d);
        }
    }

    /// Adds a write-many of `items`.
    pub fn write_many(&mut self, items: &[(Handle, &'a [u8])]) {
        let body = 4 + items
            .iter()
            .map(|(_, d)| Handle::ENCODED_LEN + 4 + d.len())
            .sum::<usize>();
        self.header(Op::WriteMany, body);
        self.fixed(|b| b.put_u32_le(items.len() as u32));
        for (h, d) in items {
            self.fixed(|b| b.put_slice(&h.to_bytes()));
            self.blob(d);
        }
    }

    /// Adds an evict-and-fetch: `evict` items are written in place when they carry a handle,
    /// put anew otherwise.
    pub fn evict_fetch(
        &mut self,
        evict: &[(Option<Handle>, &'a [u8])],
        fetch: &[Handle],
        take: bool,
    ) {
        let body = 1
            + 4
            + evict
                .iter()
                .map(|(h, d)| 1 + h.map_or(0, |_| Handle::ENCODED_LEN) + 4 + d.len())
                .sum::<usize>()
            + 4
            + fetch.len() * Handle::ENCODED_LEN;
        self.header(Op::EvictFetch, body);
        self.fixed(|b| {
            b.put_u8(take as u8);
            b.put_u32_le(evict.len() as u32);
        });
        for (h, d) in evict {
            self.fixed(|b| match h {
                Some(h) => {
                    b.put_u8(1);
                    b.put_slice(&h.to_bytes());
                }
                None => b.put_u8(0),
            });
            self.blob(d);
        }
        self.fixed(|b| {
            b.put_u32_le(fetch.len() as u32);
            for h in fetch {
                b.put_slice(&h.to_bytes());
            }
        });
    }
}

/// One connection, used by one thread at a time.
pub struct NodeConn {
    stream: TcpStream,
    rbuf: BytesMut,
    /// Nanoseconds to ask for an answer without sleeping (see [`NodeOptions::poll`]).
    poll_ns: u64,
    /// The longest wait for the node to take a request or send an answer.
    timeout: Duration,
    /// `None`: plain TCP, the bytes go straight between the socket and the buffers.
    tls: Option<Box<rustls::ClientConnection>>,
}

impl std::fmt::Debug for NodeConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConn")
            .field("stream", &self.stream)
            .field("buffered", &self.rbuf.len())
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl NodeConn {
    fn open(
        addr: &str,
        tenant: &str,
        token: &str,
        session: u64,
        tls: Option<&ClientTls>,
        options: &NodeOptions,
    ) -> Result<(NodeConn, HelloInfo), StoreError> {
        let timeout = options.timeout;
        let connect_err = |source| StoreError::Connect {
            backend: BACKEND,
            addr: addr.to_string(),
            cause: source,
        };
        let mut stream = connect_within(addr, timeout).map_err(connect_err)?;
        stream.set_nodelay(true).map_err(connect_err)?;
        // Room for a whole batch of pages in one writev rather than a write that sleeps until
        // the node has drained the first 16 KiB. (A fixed receive buffer measured worse than the
        // kernel's automatic tuning, so that one is left alone.)
        if let Err(e) = tidepool_sys::set_send_buffer(&stream, SEND_BUFFER) {
            tracing::debug!("cannot enlarge the send buffer: {e}");
        }
        let tls = match tls {
            None => None,
            Some(t) => {
                stream
                    .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
                    .map_err(connect_err)?;
                Some(Box::new(t.handshake(
                    &mut stream,
                    BACKEND,
                    addr,
                    PLAIN_NODE_HINT,
                    &busy_answer,
                )?))
            }
        };
        stream
            .set_read_timeout(Some(timeout))
            .map_err(connect_err)?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(connect_err)?;
        let mut conn = NodeConn {
            stream,
            rbuf: BytesMut::with_capacity(64 << 10),
            poll_ns: 0,
            timeout,
            tls,
        };
        let hello = Request::Hello {
            tenant: tenant.to_string(),
            token: token.to_string(),
            session,
            store: options.store.clone(),
        };
        match conn.call(&hello)? {
            Response::Hello(info) => Ok((conn, info)),
            Response::Error { code, message } => Err(StoreError::Node {
                op: "hello",
                code,
                message: if code == ErrorCode::AuthFailed {
                    format!(
                        "tenant '{tenant}' was refused at {addr}: {message}; check the tenant \
                         name and token (node://tenant:token@host:port or TIDEPOOL_TOKEN)"
                    )
                } else {
                    message
                },
            }),
            other => Err(unexpected("hello", &other)),
        }
    }

    /// Sends one request and waits for its answer.
    pub fn call(&mut self, req: &Request) -> Result<Response, StoreError> {
        let mut b = Batch::new();
        b.push(req);
        Ok(self.exchange(&b)?.pop().expect("one answer"))
    }

    /// Sends every request at once, then collects the answers (matched by id, in any order)
    /// and returns them in request order.
    pub fn pipeline(&mut self, reqs: &[Request]) -> Result<Vec<Response>, StoreError> {
        let mut b = Batch::new();
        for r in reqs {
            b.push(r);
        }
        self.exchange(&b)
    }

    /// Sends a batch and returns its answers in request order.
    pub fn exchange(&mut self, batch: &Batch<'_>) -> Result<Vec<Response>, StoreError> {
        self.send_batch(batch)?;
        self.answers(&batch.ops)
    }

    /// The first half of [`NodeConn::exchange`]: sends the batch without waiting.
    fn send_batch(&mut self, batch: &Batch<'_>) -> Result<(), StoreError> {
        let timeout = self.timeout;
        self.send(batch).map_err(|source| StoreError::Io {
            backend: BACKEND,
            op: "send",
            cause: past_deadline(source, timeout),
        })
    }

    /// The second half: the answers to requests `ops` sent, in request order.
    fn answers(&mut self, ops: &[Op]) -> Result<Vec<Response>, StoreError> {
        let mut answers: Vec<Option<Response>> = vec![None; ops.len()];
        for _ in 0..ops.len() {
            let (id, resp, op) = self.read_response()?;
            let i = id as usize;
            match answers.get_mut(i) {
                Some(slot @ None) if ops[i] as u8 | RESPONSE_BIT == op => *slot = Some(resp),
                _ => {
                    return Err(StoreError::Protocol {
                        backend: BACKEND,
                        detail: format!(
                            "answer (op 0x{op:02x}) to request {id}, which is not outstanding"
                        ),
                    })
                }
            }
        }
        Ok(answers
            .into_iter()
            .map(|a| a.expect("all answered"))
            .collect())
    }

    fn send(&mut self, batch: &Batch<'_>) -> std::io::Result<()> {
        let mut slices: Vec<IoSlice<'_>> = batch
            .segs
            .iter()
            .map(|s| match *s {
                Seg::Own(a, b) => IoSlice::new(&batch.own[a..b]),
                Seg::Borrowed(d) => IoSlice::new(d),
            })
            .collect();
        if let Some(tls) = &mut self.tls {
            return crate::tls::write_all_vectored(tls, &mut self.stream, &mut slices, IOV_MAX);
        }
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let take = rest.len().min(IOV_MAX);
            match self.stream.write_vectored(&rest[..take]) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut rest, n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Receives, first asking without sleeping for up to `poll_ns` (yielding the CPU between
    /// asks, so a node on the same CPU still runs), then sleeping in recv. An answer that comes
    /// within the poll costs no wake-up; across CPUs of a VM a wake-up costs tens of
    /// microseconds, more than the answer itself.
    fn recv_polling(&mut self) -> std::io::Result<usize> {
        let start = std::time::Instant::now();
        loop {
            match tidepool_sys::recv_into_now(&self.stream, &mut self.rbuf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if start.elapsed().as_nanos() as u64 >= self.poll_ns {
                        return tidepool_sys::recv_into(&self.stream, &mut self.rbuf);
                    }
                    std::thread::yield_now();
                }
                r => return r,
            }
        }
    }

    /// Reads one answer: (request id, response, op byte).
    fn read_response(&mut self) -> Result<(u64, Response, u8), StoreError> {
        loop {
            let op = self.rbuf.get(3).copied().unwrap_or(0);
            match decode_response(&mut self.rbuf, MAX_BODY) {
                Ok(Some((id, r))) => return Ok((id, r, op)),
                Ok(None) => {}
                Err(e) => {
                    // A TLS record (a handshake, or an alert refusing our plain bytes) where a
                    // frame should be: the node expects TLS.
                    let tls_record = self.tls.is_none()
                        && matches!(self.rbuf.first(), Some(0x15 | 0x16))
                        && self.rbuf.get(1) == Some(&0x03);
                    return Err(StoreError::Protocol {
                        backend: BACKEND,
                        detail: if tls_record {
                            "the node answered with TLS: it accepts only TLS connections; add \
                             tls=1 to the URL (and ca=FILE for a private CA)"
                                .to_string()
                        } else {
                            e.to_string()
                        },
                    });
                }
            }
            // Make room for at least the rest of the frame in progress.
            let pending = match peek_header(&self.rbuf, MAX_BODY) {
                Ok(Some(h)) => (HEADER_LEN + h.body_len as usize).saturating_sub(self.rbuf.len()),
                _ => 0,
            };
            self.rbuf.reserve(pending.max(MIN_READ));
            let n = loop {
                let r = match &mut self.tls {
                    None if self.poll_ns > 0 => self.recv_polling(),
                    None => tidepool_sys::recv_into(&self.stream, &mut self.rbuf),
                    Some(tls) => crate::tls::read_plain(tls, &mut self.stream, &mut self.rbuf),
                };
                match r {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    r => break r,
                }
            }
            .map_err(|source| StoreError::Io {
                backend: BACKEND,
                op: "receive",
                cause: past_deadline(source, self.timeout),
            })?;
            if n == 0 {
                return Err(StoreError::Io {
                    backend: BACKEND,
                    op: "receive",
                    cause: std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the node closed the connection",
                    ),
                });
            }
        }
    }
}

/// Connects to the first address of `addr` that answers within `timeout` (a host that is gone
/// drops the SYN, and a plain connect would wait minutes).
fn connect_within(addr: &str, timeout: Duration) -> std::io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = None;
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{addr} resolves to no address"),
        )
    }))
}

/// A socket timeout (SO_RCVTIMEO or SO_SNDTIMEO fired) said as what it means.
fn past_deadline(e: std::io::Error, timeout: Duration) -> std::io::Error {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the node did not respond within {timeout:?}: it is stopped, overloaded or \
                 unreachable (timeout_ms in the URL sets the limit)"
            ),
        ),
        _ => e,
    }
}

/// The node's refusal at its connection limit, which it sends in the clear before any TLS
/// handshake.
fn busy_answer(bytes: &[u8]) -> Option<StoreError> {
    match decode_response(&mut BytesMut::from(bytes), MAX_BODY) {
        Ok(Some((_, Response::Error { code, message }))) if code == ErrorCode::Busy => {
            Some(StoreError::Node {
                op: "hello",
                code,
                message,
            })
        }
        _ => None,
    }
}

fn unexpected(op: &'static str, got: &Response) -> StoreError {
    match got {
        Response::Error { code, message } => StoreError::Node {
            op,
            code: *code,
            message: message.clone(),
        },
        other => StoreError::Protocol {
            backend: BACKEND,
            detail: format!("unexpected answer to {op}: {other:?}"),
        },
    }
}

fn item_error(op: &'static str, code: ErrorCode) -> StoreError {
    StoreError::Node {
        op,
        code,
        message: code.describe().to_string(),
    }
}

/// How a client talks to its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOptions {
    /// How long each request asks for its answer without sleeping before it sleeps (zero:
    /// sleep at once). Plain TCP only: a TLS connection sleeps at once.
    pub poll: Duration,
    /// The longest wait to connect, for the node to take a request, or for its answer; past
    /// it the request fails (and `tidepool run` stops the program, exit 70).
    pub timeout: Duration,
    /// What store the node is one of (`ec=4+2 over h1,...`), said at hello so that the node
    /// refuses a client of the same tenant whose store has other settings; empty for a store
    /// on this node alone.
    pub store: String,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            poll: DEFAULT_POLL,
            timeout: DEFAULT_TIMEOUT,
            store: String::new(),
        }
    }
}

/// See [`NodeOptions::timeout`]; the URL's `timeout_ms` sets it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request polls for its answer before sleeping, unless the URL's `poll_us` says
/// otherwise. Measured in `tidepool bench pager` (issue 28): with the node on another CPU of
/// this VM, an unpipelined 4 KiB get took 82 us sleeping and 24 us polling; a page miss 85 us
/// and 51 us. An answer later than this costs the poll on top of the wake-up.
pub const DEFAULT_POLL: Duration = Duration::from_micros(100);

/// A client of one memory node, shared by any number of threads. Its Debug form leaves the
/// token out.
pub struct NodeClient {
    addr: String,
    tenant: String,
    token: String,
    tls: Option<ClientTls>,
    options: NodeOptions,
    session: AtomicU64,
    info: HelloInfo,
    pool: Mutex<Vec<NodeConn>>,
    /// Connections inherited from the process that forked this one: never used, kept open so
    /// that its session (and every earlier one up the line of forks) outlives it.
    keepalive: Mutex<Vec<NodeConn>>,
}

impl std::fmt::Debug for NodeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeClient")
            .field("addr", &self.addr)
            .field("tenant", &self.tenant)
            .field("token", &if self.token.is_empty() { "" } else { "***" })
            .field("tls", &self.tls)
            .field("info", &self.info)
            .field("pooled", &self.pool.try_lock().map(|p| p.len()))
            .finish()
    }
}

/// A batch sent by [`NodeClient::send`] whose answers have not been read yet. Dropped
/// unfinished (a caller returning early on another node's error), it still reads its answers:
/// closing the connection instead could end the client's session, and the node frees
/// everything a session put when its last connection closes.
#[derive(Debug)]
pub struct InFlight<'c> {
    client: &'c NodeClient,
    conn: Option<NodeConn>,
    ops: Vec<Op>,
}

impl InFlight<'_> {
    /// Waits for the answers, in request order, and gives the connection back.
    pub fn finish(mut self) -> Result<Vec<Response>, StoreError> {
        self.collect()
    }

    fn collect(&mut self) -> Result<Vec<Response>, StoreError> {
        let mut conn = self.conn.take().expect("answers read once");
        let r = conn.answers(&self.ops);
        self.client.checkin(conn, &r);
        r
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.conn.is_some() {
            let _ = self.collect();
        }
    }
}

impl NodeClient {
    /// Connects and authenticates once, so a wrong address or token fails here.
    pub fn connect(addr: &str, tenant: &str, token: &str) -> Result<NodeClient, StoreError> {
        Self::connect_with(addr, tenant, token, None)
    }

    /// [`NodeClient::connect`], over TLS when `tls` is given (every connection of the pool).
    pub fn connect_with(
        addr: &str,
        tenant: &str,
        token: &str,
        tls: Option<ClientTls>,
    ) -> Result<NodeClient, StoreError> {
        Self::connect_with_options(addr, tenant, token, tls, NodeOptions::default())
    }

    /// [`NodeClient::connect_with`], polling and timing out as `options` say.
    pub fn connect_with_options(
        addr: &str,
        tenant: &str,
        token: &str,
        tls: Option<ClientTls>,
        options: NodeOptions,
    ) -> Result<NodeClient, StoreError> {
        let session = new_session_id();
        let (conn, info) = NodeConn::open(addr, tenant, token, session, tls.as_ref(), &options)?;
        Ok(NodeClient {
            addr: addr.to_string(),
            tenant: tenant.to_string(),
            token: token.to_string(),
            tls,
            options,
            session: AtomicU64::new(session),
            info,
            pool: Mutex::new(vec![conn]),
            keepalive: Mutex::new(Vec::new()),
        })
    }

    /// In a forked child, before anything else: the inherited connections become keep-alives
    /// of the parent's session, and this client starts a session of its own.
    pub fn after_fork_in_child(&self) {
        let inherited = std::mem::take(&mut *self.pool.lock());
        self.keepalive.lock().extend(inherited);
        self.session.store(new_session_id(), Ordering::Relaxed);
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether the connections use TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// What the node said at hello: tenant id, quota, capacity, frame limit.
    pub fn info(&self) -> HelloInfo {
        self.info
    }

    /// Runs `f` on a connection of this thread's own; a connection that failed is dropped,
    /// not returned to the pool.
    pub fn with_conn<R>(
        &self,
        f: impl FnOnce(&mut NodeConn) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let mut conn = self.checkout()?;
        let r = f(&mut conn);
        self.checkin(conn, &r);
        r
    }

    fn checkout(&self) -> Result<NodeConn, StoreError> {
        let pooled = self.pool.lock().pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => {
                let session = self.session.load(Ordering::Relaxed);
                NodeConn::open(
                    &self.addr,
                    &self.tenant,
                    &self.token,
                    session,
                    self.tls.as_ref(),
                    &self.options,
                )?
                .0
            }
        };
        conn.poll_ns = self.options.poll.as_nanos().min(u64::MAX as u128) as u64;
        Ok(conn)
    }

    /// Returns a connection to the pool unless its last use failed on the wire.
    fn checkin<R>(&self, conn: NodeConn, r: &Result<R, StoreError>) {
        if !matches!(r, Err(StoreError::Io { .. } | StoreError::Protocol { .. })) {
            self.pool.lock().push(conn);
        }
    }

    /// Sends a batch on a connection of its own and returns at once; [`InFlight::finish`]
    /// collects the answers. Batches sent this way to several nodes wait out their round
    /// trips together.
    pub fn send(&self, batch: &Batch<'_>) -> Result<InFlight<'_>, StoreError> {
        let mut conn = self.checkout()?;
        // A connection that failed to send is dropped with the error.
        conn.send_batch(batch)?;
        Ok(InFlight {
            client: self,
            conn: Some(conn),
            ops: batch.ops.clone(),
        })
    }

    pub fn call(&self, req: &Request) -> Result<Response, StoreError> {
        self.with_conn(|c| c.call(req))
    }

    pub fn pipeline(&self, reqs: &[Request]) -> Result<Vec<Response>, StoreError> {
        self.with_conn(|c| c.pipeline(reqs))
    }

    /// Sends a batch (see [`Batch`]) and returns its answers in request order.
    pub fn exchange(&self, batch: &Batch<'_>) -> Result<Vec<Response>, StoreError> {
        self.with_conn(|c| c.exchange(batch))
    }

    pub fn put(&self, data: Bytes) -> Result<Handle, StoreError> {
        match self.call(&Request::Put { data })? {
            Response::Handle(h) => Ok(h),
            other => Err(unexpected("put", &other)),
        }
    }

    pub fn get(&self, handle: Handle) -> Result<Bytes, StoreError> {
        match self.call(&Request::Get { handle })? {
            Response::Data(d) => Ok(d),
            other => Err(unexpected("get", &other)),
        }
    }

    pub fn take(&self, handle: Handle) -> Result<Bytes, StoreError> {
        match self.call(&Request::Take { handle })? {
            Response::Data(d) => Ok(d),
            other => Err(unexpected("take", &other)),
        }
    }

    pub fn write(&self, handle: Handle, data: Bytes) -> Result<(), StoreError> {
        match self.call(&Request::Write { handle, data })? {
            Response::Done => Ok(()),
            other => Err(unexpected("write", &other)),
        }
    }

    pub fn free(&self, handle: Handle) -> Result<(), StoreError> {
        match self.call(&Request::Free { handle })? {
            Response::Done => Ok(()),
            other => Err(unexpected("free", &other)),
        }
    }

    pub fn put_many(&self, items: Vec<Bytes>) -> Result<Vec<ItemResult<Handle>>, StoreError> {
        match self.call(&Request::PutMany { items })? {
            Response::Handles(v) => Ok(v),
            other => Err(unexpected("put-many", &other)),
        }
    }

    pub fn get_many(&self, handles: Vec<Handle>) -> Result<Vec<ItemResult<Bytes>>, StoreError> {
        match self.call(&Request::GetMany { handles })? {
            Response::DataMany(v) => Ok(v),
            other => Err(unexpected("get-many", &other)),
        }
    }

    pub fn take_many(&self, handles: Vec<Handle>) -> Result<Vec<ItemResult<Bytes>>, StoreError> {
        match self.call(&Request::TakeMany { handles })? {
            Response::DataMany(v) => Ok(v),
            other => Err(unexpected("take-many", &other)),
        }
    }

    pub fn free_many(&self, handles: Vec<Handle>) -> Result<Vec<ItemResult<()>>, StoreError> {
        match self.call(&Request::FreeMany { handles })? {
            Response::DoneMany(v) => Ok(v),
            other => Err(unexpected("free-many", &other)),
        }
    }

    /// The node's counters for this tenant (`tenant.*`) and for itself (`node.*`).
    pub fn stats(&self) -> Result<Vec<(String, u64)>, StoreError> {
        match self.call(&Request::Stats)? {
            Response::Stats(v) => Ok(v),
            other => Err(unexpected("stats", &other)),
        }
    }
}

/// A fresh non-zero session id (zero asks the node for a session of the connection's own).
fn new_session_id() -> u64 {
    loop {
        let s: u64 = rand_u64();
        if s != 0 {
            break s;
        }
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS per process; mixing in time and pid keeps clients of
    // one process distinct too.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}

const SHARDS: usize = 64;
/// Most keys one read asks for: the node's frames are limited (16 MiB by default, said at
/// hello), and 1024 values of a page each answer in 4 MiB.
const CHUNK_ITEMS: usize = 1024;
/// Most items one write carries (the protocol's limit is 65536).
const CHUNK_WRITES: usize = 8192;
/// Most handles one free request carries (16 bytes each).
const CHUNK_FREES: usize = 32768;

/// Splits `items` into runs of at most `max_items` items and `max_bytes` bytes (as `bytes`
/// counts them; a single larger item goes alone).
pub(crate) fn runs<T>(
    items: &[T],
    max_items: usize,
    max_bytes: usize,
    bytes: impl Fn(&T) -> usize,
) -> Vec<&[T]> {
    let mut out = Vec::new();
    let (mut start, mut sum) = (0, 0);
    for (i, it) in items.iter().enumerate() {
        if i > start && (i - start == max_items || sum + bytes(it) > max_bytes) {
            out.push(&items[start..i]);
            start = i;
            sum = 0;
        }
        sum += bytes(it);
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

/// Splits a write into runs of at most [`CHUNK_WRITES`] items and `max_bytes` payload bytes.
fn write_chunks<'a, 'b>(
    items: &'b [(Key, &'a [u8])],
    max_bytes: usize,
) -> Vec<&'b [(Key, &'a [u8])]> {
    runs(items, CHUNK_WRITES, max_bytes, |(_, v)| v.len())
}

/// A [`FarStore`] on a memory node: keys map to the handles the node issued.
#[derive(Debug)]
pub struct NodeStore {
    client: NodeClient,
    handles: Box<[Mutex<FxHashMap<Key, Handle>>]>,
}

impl NodeStore {
    pub fn connect(addr: &str, tenant: &str, token: &str) -> Result<NodeStore, StoreError> {
        Ok(Self::with_client(NodeClient::connect(addr, tenant, token)?))
    }

    /// A store over a client already connected (over TLS, with options: see
    /// [`NodeClient::connect_with_options`]).
    pub fn with_client(client: NodeClient) -> NodeStore {
        NodeStore {
            client,
            handles: (0..SHARDS)
                .map(|_| Mutex::new(FxHashMap::default()))
                .collect(),
        }
    }

    pub fn client(&self) -> &NodeClient {
        &self.client
    }

    fn shard(&self, key: Key) -> &Mutex<FxHashMap<Key, Handle>> {
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.handles[h as usize % SHARDS]
    }

    /// Payload bytes one write may carry: half the node's frame limit.
    fn max_write_bytes(&self) -> usize {
        (self.client.info().max_body as usize / 2).max(1 << 16)
    }

    fn lookup(&self, key: Key) -> Option<Handle> {
        self.shard(key).lock().get(&key).copied()
    }

    /// A column named by keys, named by the handles the node knows (`None`: never written).
    fn column(&self, c: &Column<Key>) -> Column<Option<Handle>> {
        Column {
            ty: c.ty,
            line_elems: c.line_elems,
            lines: c.lines.iter().map(|&k| self.lookup(k)).collect(),
        }
    }

    fn forget(&self, key: Key) -> Option<Handle> {
        self.shard(key).lock().remove(&key)
    }

    /// Records a new handle; returns the one it replaced (a concurrent writer's), to be freed.
    fn remember(&self, key: Key, h: Handle) -> Option<Handle> {
        self.shard(key)
            .lock()
            .insert(key, h)
            .filter(|old| *old != h)
    }

    fn free_quietly(&self, handles: Vec<Handle>) -> Result<(), StoreError> {
        for chunk in handles.chunks(CHUNK_FREES) {
            // Stale answers are fine here: the object is gone either way.
            self.client.free_many(chunk.to_vec())?;
        }
        Ok(())
    }

    /// Puts values for keys that had no handle (or whose block was too small), remembering the
    /// new handles and freeing any they replace.
    fn put_new(&self, items: Vec<(Key, &[u8])>) -> Result<(), StoreError> {
        if items.is_empty() {
            return Ok(());
        }
        let (keys, data): (Vec<Key>, Vec<&[u8]>) = items.into_iter().unzip();
        let mut b = Batch::new();
        b.put_many(&data);
        match self.client.exchange(&b)?.pop() {
            Some(Response::Handles(v)) => self.adopt(&keys, v, "put"),
            Some(other) => Err(unexpected("put-many", &other)),
            None => unreachable!("one answer per request"),
        }
    }

    fn adopt(
        &self,
        keys: &[Key],
        results: Vec<ItemResult<Handle>>,
        op: &'static str,
    ) -> Result<(), StoreError> {
        let mut replaced = vec![];
        let mut first_err = None;
        for (key, r) in keys.iter().zip(results) {
            match r {
                Ok(h) => replaced.extend(self.remember(*key, h)),
                Err(code) => {
                    first_err.get_or_insert(item_error(op, code));
                }
            }
        }
        self.free_quietly(replaced)?;
        first_err.map_or(Ok(()), Err)
    }

    fn data_results(
        &self,
        op: &'static str,
        keys: &[Key],
        handles: &[Option<Handle>],
        results: Vec<ItemResult<Bytes>>,
    ) -> Result<Vec<Option<Bytes>>, StoreError> {
        let mut results = results.into_iter();
        let mut out = Vec::with_capacity(keys.len());
        for h in handles {
            out.push(match h {
                None => None,
                // A key we hold a handle for must be there: a refusal means the data was lost
                // (node restarted, session released), which must never read as "empty".
                Some(_) => Some(
                    results
                        .next()
                        .ok_or_else(|| StoreError::Protocol {
                            backend: BACKEND,
                            detail: format!("{op} answered too few items"),
                        })?
                        .map_err(|code| item_error(op, code))?,
                ),
            });
        }
        Ok(out)
    }
}

impl NodeStore {
    /// Sends a write and returns without waiting for the node; [`PendingWrite::finish`]
    /// completes it. Writes to several nodes begun one after another wait out their round trips
    /// together. A write too large for one request is done whole here.
    pub fn write_begin<'a>(
        &self,
        items: &[(Key, &'a [u8])],
    ) -> Result<PendingWrite<'_, 'a>, StoreError> {
        let mut w = PendingWrite {
            store: self,
            in_place: vec![],
            in_place_keys: vec![],
            fresh_keys: vec![],
            sent: None,
        };
        let items = last_per_key(items);
        if write_chunks(&items, self.max_write_bytes()).len() > 1 {
            self.write_many(&items)?;
            return Ok(w);
        }
        let mut fresh_data: Vec<&[u8]> = vec![];
        for (k, v) in items {
            match self.lookup(k) {
                Some(h) => {
                    w.in_place.push((h, v));
                    w.in_place_keys.push(k);
                }
                None => {
                    w.fresh_keys.push(k);
                    fresh_data.push(v);
                }
            }
        }
        let mut b = Batch::new();
        if !w.in_place.is_empty() {
            b.write_many(&w.in_place);
        }
        if !fresh_data.is_empty() {
            b.put_many(&fresh_data);
        }
        if !b.is_empty() {
            w.sent = Some(self.client.send(&b)?);
        }
        Ok(w)
    }

    /// Sends a read and returns without waiting, as [`NodeStore::write_begin`] does.
    pub fn read_begin(&self, keys: &[Key]) -> Result<PendingRead<'_>, StoreError> {
        if keys.len() > CHUNK_ITEMS {
            return Ok(PendingRead::Done(self.read_many(keys)?));
        }
        let handles: Vec<Option<Handle>> = keys.iter().map(|k| self.lookup(*k)).collect();
        let present: Vec<Handle> = handles.iter().flatten().copied().collect();
        if present.is_empty() {
            return Ok(PendingRead::Done(vec![None; keys.len()]));
        }
        let mut b = Batch::new();
        b.push(&Request::GetMany { handles: present });
        Ok(PendingRead::Sent {
            store: self,
            keys: keys.to_vec(),
            handles,
            sent: self.client.send(&b)?,
        })
    }
}

/// A write sent by [`NodeStore::write_begin`].
#[derive(Debug)]
pub struct PendingWrite<'s, 'a> {
    store: &'s NodeStore,
    in_place: Vec<(Handle, &'a [u8])>,
    in_place_keys: Vec<Key>,
    fresh_keys: Vec<Key>,
    sent: Option<InFlight<'s>>,
}

impl PendingWrite<'_, '_> {
    /// Waits for the node's answers and records the handles it issued.
    pub fn finish(self) -> Result<(), StoreError> {
        let Some(sent) = self.sent else {
            return Ok(());
        };
        let store = self.store;
        let mut answers = sent.finish()?.into_iter();
        let mut regrow = vec![];
        if !self.in_place.is_empty() {
            match answers.next() {
                Some(Response::DoneMany(v)) => {
                    for ((key, (_, data)), r) in
                        self.in_place_keys.iter().zip(&self.in_place).zip(v)
                    {
                        match r {
                            Ok(()) => {}
                            // The old block is too small for the new value, or a concurrent
                            // remove freed it: put it anew (a replaced handle is freed when the
                            // new one is remembered).
                            Err(ErrorCode::TooLarge | ErrorCode::StaleHandle) => {
                                regrow.push((*key, *data))
                            }
                            Err(code) => return Err(item_error("write", code)),
                        }
                    }
                }
                Some(other) => return Err(unexpected("write-many", &other)),
                None => unreachable!("one answer per request"),
            }
        }
        if !self.fresh_keys.is_empty() {
            match answers.next() {
                Some(Response::Handles(v)) => store.adopt(&self.fresh_keys, v, "put")?,
                Some(other) => return Err(unexpected("put-many", &other)),
                None => unreachable!("one answer per request"),
            }
        }
        store.put_new(regrow)
    }
}

/// A read sent by [`NodeStore::read_begin`].
#[derive(Debug)]
pub enum PendingRead<'s> {
    Done(Vec<Option<Bytes>>),
    Sent {
        store: &'s NodeStore,
        keys: Vec<Key>,
        handles: Vec<Option<Handle>>,
        sent: InFlight<'s>,
    },
}

impl PendingRead<'_> {
    /// Waits for the node's answer: each key's value, `None` for a key never written.
    pub fn finish(self) -> Result<Vec<Option<Bytes>>, StoreError> {
        match self {
            PendingRead::Done(v) => Ok(v),
            PendingRead::Sent {
                store,
                keys,
                handles,
                sent,
            } => match sent.finish()?.pop() {
                Some(Response::DataMany(results)) => {
                    store.data_results("get", &keys, &handles, results)
                }
                Some(other) => Err(unexpected("get-many", &other)),
                None => unreachable!("one answer per request"),
            },
        }
    }
}

/// The last value for each key, in first-seen order: a batch naming a key twice means its last
/// value.
pub(crate) fn last_per_key<'a>(items: &[(Key, &'a [u8])]) -> Vec<(Key, &'a [u8])> {
    if items.len() < 2 {
        return items.to_vec();
    }
    let mut index: FxHashMap<Key, usize> = FxHashMap::default();
    let mut out: Vec<(Key, &[u8])> = Vec::with_capacity(items.len());
    for &(k, v) in items {
        match index.get(&k) {
            Some(&i) => out[i].1 = v,
            None => {
                index.insert(k, out.len());
                out.push((k, v));
            }
        }
    }
    out
}

impl FarStore for NodeStore {
    fn after_fork_in_child(&self) {
        self.client.after_fork_in_child();
    }

    fn describe(&self) -> String {
        let tls = if self.client.uses_tls() { "?tls=1" } else { "" };
        format!("node://{}{tls}", self.client.addr)
    }

    fn write_many(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        let chunks = write_chunks(items, self.max_write_bytes());
        if chunks.len() > 1 {
            return chunks.into_iter().try_for_each(|c| self.write_many(c));
        }
        self.write_begin(items)?.finish()
    }

    fn read_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        if keys.len() > CHUNK_ITEMS {
            let mut out = Vec::with_capacity(keys.len());
            for c in keys.chunks(CHUNK_ITEMS) {
                out.extend(self.read_many(c)?);
            }
            return Ok(out);
        }
        self.read_begin(keys)?.finish()
    }

    fn take_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        if keys.len() > CHUNK_ITEMS {
            let mut out = Vec::with_capacity(keys.len());
            for c in keys.chunks(CHUNK_ITEMS) {
                out.extend(self.take_many(c)?);
            }
            return Ok(out);
        }
        let handles: Vec<Option<Handle>> = keys.iter().map(|k| self.forget(*k)).collect();
        let present: Vec<Handle> = handles.iter().flatten().copied().collect();
        if present.is_empty() {
            return Ok(vec![None; keys.len()]);
        }
        let results = self.client.take_many(present)?;
        self.data_results("take", keys, &handles, results)
    }

    fn remove_many(&self, keys: &[Key]) -> Result<(), StoreError> {
        let handles: Vec<Handle> = keys.iter().filter_map(|k| self.forget(*k)).collect();
        self.free_quietly(handles)
    }

    fn scan(&self, scan: &Scan<Key>) -> Result<Option<Vec<u64>>, StoreError> {
        let req = Request::Scan(Scan {
            rows: scan.rows,
            columns: scan.columns.iter().map(|c| self.column(c)).collect(),
            filter: scan.filter,
            group: scan.group,
            aggs: scan.aggs.clone(),
        });
        match self.client.call(&req)? {
            Response::Values(v) => Ok(Some(v)),
            other => Err(unexpected("scan", &other)),
        }
    }

    fn gather(&self, column: &Column<Key>, indices: &[u64]) -> Result<Option<Bytes>, StoreError> {
        let req = Request::Gather {
            column: self.column(column),
            indices: indices.to_vec(),
        };
        match self.client.call(&req)? {
            Response::Data(d) => Ok(Some(d)),
            other => Err(unexpected("gather", &other)),
        }
    }

    fn evict_fetch(
        &self,
        evict: &[(Key, &[u8])],
        fetch: &[Key],
        mode: FetchMode,
    ) -> Result<Vec<Option<Bytes>>, StoreError> {
        if evict.len() + fetch.len() > CHUNK_ITEMS
            || evict.iter().map(|(_, v)| v.len()).sum::<usize>() > self.max_write_bytes()
        {
            // Too much for one request: in parts, the writes first (a fetched key that is also
            // evicted must see the evicted value).
            self.write_many(evict)?;
            return match mode {
                FetchMode::Keep => self.read_many(fetch),
                FetchMode::Take => self.take_many(fetch),
            };
        }
        let evict = last_per_key(evict);
        // A key both evicted and fetched is answered from the evicted value; with Take it need
        // not travel at all.
        let evicted_here: FxHashMap<Key, &[u8]> = evict.iter().copied().collect();
        let fetched_keys: FxHashSet<Key> = fetch.iter().copied().collect();
        let mut items: Vec<(Option<Handle>, &[u8])> = vec![];
        let mut item_keys = vec![];
        let mut drop_handles = vec![];
        for &(k, v) in &evict {
            if mode == FetchMode::Take && fetched_keys.contains(&k) {
                drop_handles.extend(self.forget(k));
                continue;
            }
            items.push((self.lookup(k), v));
            item_keys.push(k);
        }
        let fetch_handles: Vec<Option<Handle>> = fetch
            .iter()
            .map(|k| {
                if evicted_here.contains_key(k) {
                    None
                } else if mode == FetchMode::Take {
                    self.forget(*k)
                } else {
                    self.lookup(*k)
                }
            })
            .collect();
        let fetch_flat: Vec<Handle> = fetch_handles.iter().flatten().copied().collect();
        let mut b = Batch::new();
        b.evict_fetch(&items, &fetch_flat, mode == FetchMode::Take);
        let (evicted, fetched) = match self.client.exchange(&b)?.pop() {
            Some(Response::EvictFetch { evicted, fetched }) => (evicted, fetched),
            Some(other) => return Err(unexpected("evict-fetch", &other)),
            None => unreachable!("one answer per request"),
        };
        let mut regrow = vec![];
        for ((k, (handle, data)), r) in item_keys.iter().zip(&items).zip(evicted) {
            match r {
                Ok(h) => drop_handles.extend(self.remember(*k, h)),
                Err(ErrorCode::TooLarge | ErrorCode::StaleHandle) if handle.is_some() => {
                    regrow.push((*k, *data))
                }
                Err(code) => return Err(item_error("evict", code)),
            }
        }
        self.free_quietly(drop_handles)?;
        self.put_new(regrow)?;
        let mut from_node = self.data_results("fetch", fetch, &fetch_handles, fetched)?;
        for (i, k) in fetch.iter().enumerate() {
            if let Some(v) = evicted_here.get(k) {
                from_node[i] = Some(Bytes::copy_from_slice(v));
            }
        }
        Ok(from_node)
    }

    fn stats(&self) -> Result<StoreStats, StoreError> {
        let counters = self.client.stats()?;
        let get = |name: &str| counters.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
        Ok(StoreStats {
            far_bytes: get("tenant.bytes_allocated"),
            objects: get("tenant.objects"),
            extra: counters,
        })
    }
}
