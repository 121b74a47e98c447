//! One connection to a memory node: batches of frames out (small payloads copied, large ones
//! gathered from the caller's memory), answers matched by request id, TLS or plain.

use super::client::NodeOptions;
use crate::tls::ClientTls;
use crate::StoreError;
use bytes::{BufMut, BytesMut};
use std::io::{IoSlice, Write};
use std::net::TcpStream;
use std::time::Duration;
use tidepool_proto::decode_response;
use tidepool_proto::peek_header;
use tidepool_proto::put_header;
use tidepool_proto::ErrorCode;
use tidepool_proto::Handle;
use tidepool_proto::HelloInfo;
use tidepool_proto::Op;
use tidepool_proto::Request;
use tidepool_proto::Response;
use tidepool_proto::HEADER_LEN;
use tidepool_proto::MAX_BODY;
use tidepool_proto::RESPONSE_BIT;

pub(super) const BACKEND: &str = "memory node";
pub(super) const MIN_READ: usize = 16 << 10;
/// Payloads at least this large are sent from the caller's memory by a vectored write instead of
/// being copied into the send buffer.
pub(super) const GATHER_MIN: usize = 1024;
/// Send buffer asked for each connection (the kernel doubles it, up to net.core.wmem_max).
pub(super) const SEND_BUFFER: usize = 2 << 20;
/// The most buffers one writev takes (Linux's IOV_MAX).
pub(super) const IOV_MAX: usize = 1024;
/// A node that has not answered for this long is treated as gone.
/// How long a TLS handshake may take before the node is taken for one that does not use TLS.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// What to do when the client uses TLS and the node does not.
pub(super) const PLAIN_NODE_HINT: &str =
    "; remove tls=1 from the URL, or start the node with --tls-cert and --tls-key";

/// One piece of an outgoing batch: bytes in the batch's own buffer, or a caller's payload.
#[derive(Debug)]
pub(super) enum Seg<'a> {
    Own(usize, usize),
    Borrowed(&'a [u8]),
}

/// Requests to send together. Small fields are encoded into one buffer; large payloads stay
/// where the caller has them and go out through `writev`, so a 4 KiB page is copied once, by
/// the kernel, on its way to the node. Request ids are the requests' positions in the batch:
/// a connection carries one batch at a time and is dropped if a batch fails.
#[derive(Debug, Default)]
pub struct Batch<'a> {
    pub(super) own: BytesMut,
    pub(super) segs: Vec<Seg<'a>>,
    pub(super) ops: Vec<Op>,
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

    pub(super) fn close_own(&mut self, from: usize) {
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

    pub(super) fn header(&mut self, op: Op, body_len: usize) {
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

    pub(super) fn fixed(&mut self, f: impl FnOnce(&mut BytesMut)) {
        let from = self.own.len();
        f(&mut self.own);
        self.close_own(from);
    }

    pub(super) fn blob(&mut self, data: &'a [u8]) {
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
    pub(super) stream: TcpStream,
    pub(super) rbuf: BytesMut,
    /// Nanoseconds to ask for an answer without sleeping (see [`NodeOptions::poll`]).
    pub(super) poll_ns: u64,
    /// The longest wait for the node to take a request or send an answer.
    pub(super) timeout: Duration,
    /// `None`: plain TCP, the bytes go straight between the socket and the buffers.
    pub(super) tls: Option<Box<rustls::ClientConnection>>,
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
    pub(super) fn open(
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
    pub(super) fn send_batch(&mut self, batch: &Batch<'_>) -> Result<(), StoreError> {
        let timeout = self.timeout;
        self.send(batch).map_err(|source| StoreError::Io {
            backend: BACKEND,
            op: "send",
            cause: past_deadline(source, timeout),
        })
    }

    /// The second half: the answers to requests `ops` sent, in request order.
    pub(super) fn answers(&mut self, ops: &[Op]) -> Result<Vec<Response>, StoreError> {
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

    pub(super) fn send(&mut self, batch: &Batch<'_>) -> std::io::Result<()> {
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
    pub(super) fn recv_polling(&mut self) -> std::io::Result<usize> {
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
    pub(super) fn read_response(&mut self) -> Result<(u64, Response, u8), StoreError> {
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
pub(super) fn connect_within(addr: &str, timeout: Duration) -> std::io::Result<TcpStream> {
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
pub(super) fn past_deadline(e: std::io::Error, timeout: Duration) -> std::io::Error {
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
pub(super) fn busy_answer(bytes: &[u8]) -> Option<StoreError> {
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

pub(super) fn unexpected(op: &'static str, got: &Response) -> StoreError {
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

pub(super) fn item_error(op: &'static str, code: ErrorCode) -> StoreError {
    StoreError::Node {
        op,
        code,
        message: code.describe().to_string(),
    }
}
