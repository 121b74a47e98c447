//! Event-loop I/O workers. Each worker serves many connections from one epoll loop (mio): it
//! reads every ready connection until the socket is drained, serves all the frames that came,
//! and answers each connection with one write. On small VMs a wake-up costs more than a 4 KiB
//! request, so one wake-up must serve everything that is ready rather than one connection's
//! batch (as a thread per connection would).
//!
//! A TLS connection (`tidepool node --tls-cert`) runs the same loop with rustls between the
//! socket and the buffers: records are read with `read_tls`, decrypted by
//! `process_new_packets` and taken from `reader()`; answers go into `writer()` and out with
//! `write_tls`. Plain connections never touch that code: the transport is chosen by one
//! branch on an `Option`, and their bytes still go straight between the socket and the buffers
//! (object bytes straight from the arena).

use crate::conn::{Conn, Served, Splice};
use crate::counters::{Failure, WorkerMetrics};
use crate::shared::Shared;
use bytes::{Buf, BytesMut};
use crossbeam_channel::{Receiver, Sender};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use rustls::ServerConnection;
use smallvec::SmallVec;
use std::collections::HashMap;
use std::io::{self, BufRead, IoSlice, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tidepool_proto::{ErrorCode, FrameWriter, Op, MAGIC, RESPONSE_BIT};

const WAKE: Token = Token(usize::MAX);
const READ_RESERVE: usize = 128 << 10;
/// Reads per connection per turn before the others get theirs.
const READ_BUDGET: usize = 16;
/// The most buffers one writev takes (Linux's IOV_MAX).
const IOV_MAX: usize = 1024;
/// Parts of an answer kept without allocating: a batch of up to four objects (buffer, object,
/// ..., buffer); an unpipelined get has three.
const PARTS_INLINE: usize = 9;

/// The accept thread's side of a worker.
#[derive(Debug)]
pub(crate) struct WorkerHandle {
    tx: Sender<(std::net::TcpStream, u64)>,
    waker: Arc<Waker>,
    join: Option<JoinHandle<()>>,
}

impl WorkerHandle {
    pub fn spawn(shared: Arc<Shared>, index: usize) -> io::Result<WorkerHandle> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        let (tx, rx) = crossbeam_channel::unbounded();
        let join = std::thread::Builder::new()
            .name(format!("tp-io-{index}"))
            .spawn(move || run(&shared, index, poll, rx))?;
        Ok(WorkerHandle {
            tx,
            waker,
            join: Some(join),
        })
    }

    /// Hands a new connection to this worker.
    pub fn adopt(&self, stream: std::net::TcpStream, id: u64) -> io::Result<()> {
        self.tx
            .send((stream, id))
            .map_err(|_| io::Error::other("worker has stopped"))?;
        self.waker.wake()
    }

    pub fn wake(&self) {
        let _ = self.waker.wake();
    }

    pub fn join(&mut self) {
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

/// A TLS connection's rustls state.
struct Tls {
    conn: ServerConnection,
    /// The client's first byte has been looked at (a plain-TCP client is told to use TLS).
    checked_first_byte: bool,
}

struct Client<'a> {
    token: Token,
    stream: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    conn: Conn<'a>,
    /// `None`: plain TCP.
    tls: Option<Box<Tls>>,
    writable_interest: bool,
    /// A malformed frame was answered; close once the answer is out.
    closing: bool,
    /// Serving stopped at the outstanding limit with frames left in `rbuf`.
    unserved: bool,
    /// This connection's share of the worker's unsent-bytes gauge.
    reported_unsent: usize,
}

enum Drive {
    Idle,
    /// Read budget used up with data possibly left, or room made after the outstanding limit
    /// stopped serving: drive again soon.
    Again,
    Close,
}

impl Client<'_> {
    /// Answers waiting for the client: bytes in `wbuf` and object bytes still to be spliced in
    /// from the arena. (A TLS connection also has up to rustls's buffer limit, 64 KiB, of
    /// encrypted records queued.)
    fn outstanding(&self) -> usize {
        self.wbuf.len() + self.conn.spliced_bytes()
    }

    fn tls_wants_write(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.conn.wants_write())
    }

    /// One turn of a connection: reads and serves until the socket is drained, the read
    /// budget is spent or the outstanding limit reached, then sends.
    fn drive(&mut self, registry: &Registry, limit: usize, metrics: &WorkerMetrics) -> Drive {
        if self.flush(metrics).is_err() {
            return Drive::Close;
        }
        let mut outcome = Drive::Idle;
        let mut reads = 0;
        let mut at_limit = false;
        loop {
            if self.closing {
                break;
            }
            if self.outstanding() >= limit {
                at_limit = true;
                break;
            }
            if self.unserved {
                self.serve(limit, metrics);
                continue;
            }
            if reads == READ_BUDGET {
                outcome = Drive::Again;
                break;
            }
            if self.rbuf.capacity() - self.rbuf.len() < READ_RESERVE / 2 {
                self.rbuf.reserve(READ_RESERVE);
            }
            let room = self.rbuf.capacity() - self.rbuf.len();
            let Some(received) = self.receive(metrics) else {
                return Drive::Close;
            };
            match received {
                Ok(0) => return Drive::Close,
                Ok(n) => {
                    reads += 1;
                    self.serve(limit, metrics);
                    // A plain read that did not fill the room took everything the socket had:
                    // anything arriving later raises a new edge, so asking again now would only
                    // cost a system call that says "would block" (one in three per request).
                    if self.tls.is_none() && n < room && !self.unserved {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    // A refused TLS record leaves an alert queued: send it before closing.
                    let _ = self.flush(metrics);
                    return Drive::Close;
                }
            }
        }
        self.end_turn(registry, limit, at_limit, outcome, metrics)
    }

    /// Reads what the socket has into `rbuf` (through rustls on a TLS connection): the bytes
    /// of requests read, or `None` if a plain-TCP client came to a TLS node (it was told so
    /// and is to be closed).
    fn receive(&mut self, metrics: &WorkerMetrics) -> Option<io::Result<usize>> {
        Some(match &mut self.tls {
            None => tidepool_sys::recv_into(&self.stream, &mut self.rbuf).inspect(|&n| {
                metrics.received(n);
            }),
            Some(tls) => match tls_receive(tls, &mut self.stream, &mut self.rbuf, metrics) {
                Ok(Received::Plain(n)) => Ok(n),
                Ok(Received::PlainClient) => {
                    refuse_plain_client(&mut self.stream, metrics);
                    return None;
                }
                Err(e) => Err(e),
            },
        })
    }

    /// After a turn's reads: sends what the answers left, asks for write readiness while
    /// anything waits, updates the unsent-bytes gauge, and says when to drive again.
    fn end_turn(
        &mut self,
        registry: &Registry,
        limit: usize,
        at_limit: bool,
        mut outcome: Drive,
        metrics: &WorkerMetrics,
    ) -> Drive {
        if self.flush(metrics).is_err()
            || (self.closing && self.wbuf.is_empty() && !self.tls_wants_write())
        {
            return Drive::Close;
        }
        // Serving stopped at the limit and the flush has since made room: no event will come
        // for requests already read (or still in the socket, under edge triggering), so come
        // back on the next turn.
        if at_limit && self.outstanding() < limit {
            outcome = Drive::Again;
        }
        let want_write = !self.wbuf.is_empty() || self.tls_wants_write();
        if want_write != self.writable_interest {
            let interest = if want_write {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            if registry
                .reregister(&mut self.stream, self.token, interest)
                .is_err()
            {
                return Drive::Close;
            }
            self.writable_interest = want_write;
        }
        let now = self.outstanding();
        if now != self.reported_unsent {
            metrics.unsent_changed(self.reported_unsent, now);
            self.reported_unsent = now;
        }
        outcome
    }

    /// Serves the frames in `rbuf` up to the outstanding limit, timing them for the latency
    /// histogram (two clock reads per batch, not per request).
    fn serve(&mut self, limit: usize, metrics: &WorkerMetrics) {
        let start = Instant::now();
        let Served {
            frames,
            at_limit,
            malformed,
        } = self.conn.on_bytes(&mut self.rbuf, &mut self.wbuf, limit);
        metrics.served(frames, start.elapsed());
        self.unserved = at_limit;
        if malformed {
            self.closing = true;
        }
    }

    /// Sends as much of the pending answers as the socket takes now. Object bytes still in the
    /// arena go out in the same writev (or, with TLS, are encrypted straight from the arena);
    /// whatever the socket does not take now is copied out and its guards released, so no
    /// guard outlives this call.
    fn flush(&mut self, metrics: &WorkerMetrics) -> io::Result<()> {
        if self.tls.is_some() {
            return self.flush_tls(metrics);
        }
        if self.conn.has_splices() {
            return self.flush_spliced(metrics);
        }
        while !self.wbuf.is_empty() {
            match self.stream.write(&self.wbuf) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    metrics.sent(n);
                    self.wbuf.advance(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn flush_spliced(&mut self, metrics: &WorkerMetrics) -> io::Result<()> {
        let shared: &Shared = self.conn.sh;
        let splices = self.conn.take_splices();
        let mut out = Outgoing::new(&self.wbuf, &splices, shared);
        while !out.is_done() {
            match self.stream.write_vectored(&out.iov()) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    metrics.sent(n);
                    out.advance(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if out.is_done() {
            // All sent (the common case): keep both buffers' room for the next answers.
            drop(out);
            self.wbuf.clear();
            self.conn.return_splices(splices);
            return Ok(());
        }
        // Keep what was not sent as plain bytes; the guards go when `splices` drops below.
        let rest = out.rest();
        drop(splices);
        self.wbuf = rest;
        Ok(())
    }

    /// The TLS form of [`Client::flush`]: queued records go out first; then answers are
    /// encrypted (rustls takes up to its buffer limit) and sent, until the socket is full or
    /// nothing is left.
    fn flush_tls(&mut self, metrics: &WorkerMetrics) -> io::Result<()> {
        let Some(tls) = self.tls.as_deref_mut() else {
            return Ok(());
        };
        let shared: &Shared = self.conn.sh;
        let splices = self.conn.take_splices();
        let mut out = Outgoing::new(&self.wbuf, &splices, shared);
        loop {
            let mut blocked = false;
            while tls.conn.wants_write() {
                match tls.conn.write_tls(&mut self.stream) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => metrics.sent(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        blocked = true;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if blocked || out.is_done() {
                break;
            }
            let n = tls.conn.writer().write_vectored(&out.iov())?;
            if n == 0 {
                break;
            }
            out.advance(n);
        }
        if splices.is_empty() {
            // Only the buffer was sent from: drop what went, no copy.
            let sent = out.sent;
            drop(out);
            self.wbuf.advance(sent);
            return Ok(());
        }
        let rest = out.rest();
        drop(splices);
        self.wbuf = rest;
        Ok(())
    }
}

/// Answers on their way out: the send buffer interleaved with object bytes still in the
/// arena (buffer, object, buffer, ..., buffer), and how much of them has gone.
struct Outgoing<'b> {
    parts: SmallVec<[&'b [u8]; PARTS_INLINE]>,
    total: usize,
    sent: usize,
    /// First part not wholly sent, and how much of it was.
    first: usize,
    offset: usize,
}

impl<'b> Outgoing<'b> {
    fn new(wbuf: &'b [u8], splices: &'b [Splice<'_>], shared: &'b Shared) -> Outgoing<'b> {
        let mut parts: SmallVec<[&[u8]; PARTS_INLINE]> =
            SmallVec::with_capacity(splices.len() * 2 + 1);
        let mut at = 0;
        for s in splices {
            parts.push(&wbuf[at..s.at]);
            parts.push(shared.arena.slice(&s.guard, s.base));
            at = s.at;
        }
        parts.push(&wbuf[at..]);
        let total = parts.iter().map(|p| p.len()).sum();
        Outgoing {
            parts,
            total,
            sent: 0,
            first: 0,
            offset: 0,
        }
    }

    fn is_done(&self) -> bool {
        self.sent == self.total
    }

    /// The next writev's worth of what is left.
    fn iov(&self) -> SmallVec<[IoSlice<'b>; PARTS_INLINE]> {
        let end = (self.first + IOV_MAX).min(self.parts.len());
        let mut iov: SmallVec<[IoSlice<'b>; PARTS_INLINE]> =
            SmallVec::with_capacity(end - self.first);
        iov.push(IoSlice::new(&self.parts[self.first][self.offset..]));
        iov.extend(
            self.parts[self.first + 1..end]
                .iter()
                .map(|p| IoSlice::new(p)),
        );
        iov
    }

    fn advance(&mut self, mut n: usize) {
        self.sent += n;
        while n > 0 {
            let left = self.parts[self.first].len() - self.offset;
            if n >= left {
                n -= left;
                self.first += 1;
                self.offset = 0;
            } else {
                self.offset += n;
                n = 0;
            }
        }
        while self.first < self.parts.len() && self.parts[self.first].len() == self.offset {
            self.first += 1;
            self.offset = 0;
        }
    }

    /// What was not sent, copied into a buffer of its own.
    fn rest(self) -> BytesMut {
        let mut rest = BytesMut::with_capacity(self.total - self.sent);
        if self.first < self.parts.len() {
            rest.extend_from_slice(&self.parts[self.first][self.offset..]);
            for p in &self.parts[self.first + 1..] {
                rest.extend_from_slice(p);
            }
        }
        rest
    }
}

/// What a TLS connection's read gave.
enum Received {
    /// This many plaintext bytes appended to the buffer (0: the client closed).
    Plain(usize),
    /// The client speaks the protocol in the clear to a node that accepts only TLS.
    PlainClient,
}

/// Appends what a TLS connection has decrypted to `rbuf`, first reading and decrypting records
/// from the socket when nothing is decrypted yet. `WouldBlock` when the socket is drained.
fn tls_receive(
    tls: &mut Tls,
    stream: &mut TcpStream,
    rbuf: &mut BytesMut,
    metrics: &WorkerMetrics,
) -> io::Result<Received> {
    if !tls.checked_first_byte {
        let mut first = [0u8; 1];
        match stream.peek(&mut first) {
            Ok(0) => return Ok(Received::Plain(0)),
            Ok(_) if first[0] == MAGIC[0] => return Ok(Received::PlainClient),
            Ok(_) => tls.checked_first_byte = true,
            Err(e) => return Err(e),
        }
    }
    loop {
        match tls.conn.reader().fill_buf() {
            Ok(chunk) if !chunk.is_empty() => {
                let n = chunk.len();
                rbuf.extend_from_slice(chunk);
                tls.conn.reader().consume(n);
                return Ok(Received::Plain(n));
            }
            // The client sent close_notify, or closed without it.
            Ok(_) => return Ok(Received::Plain(0)),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Received::Plain(0)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        let n = tls.conn.read_tls(stream)?;
        if n == 0 {
            return Ok(Received::Plain(0));
        }
        metrics.received(n);
        if let Err(e) = tls.conn.process_new_packets() {
            tracing::debug!("TLS refused: {e}");
            metrics.failure(Failure::Tls);
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
    }
}

/// Tells a plain-TCP client, in the clear (it cannot read anything else), that this node
/// accepts only TLS. It sent a hello: the answer takes its op and request id, so the client
/// reports the message as the node's.
fn refuse_plain_client(stream: &mut TcpStream, metrics: &WorkerMetrics) {
    metrics.failure(Failure::TlsRequired);
    let mut head = [0u8; tidepool_proto::HEADER_LEN];
    let n = stream.peek(&mut head).unwrap_or(0);
    let (op, id) = match tidepool_proto::peek_header(&head[..n], u32::MAX) {
        Ok(Some(h)) if Op::try_from(h.op).is_ok() => (h.op, h.id),
        _ => (Op::Hello as u8, 0),
    };
    let mut buf = BytesMut::new();
    let mut w = FrameWriter::begin(&mut buf, op | RESPONSE_BIT, id);
    w.put_u8(ErrorCode::Malformed as u8);
    w.put_str16(
        "this memory node accepts only TLS connections: add tls=1 to the URL \
         (node://tenant:token@host:port?tls=1, with ca=FILE for a private CA)",
    );
    w.finish();
    // A fresh socket's buffer takes these few bytes at once; if not, the client sees the
    // connection close instead.
    if let Ok(n) = stream.write(&buf) {
        metrics.sent(n);
    }
}

/// A worker's event loop: adopts the connections the accept thread hands over and drives
/// every ready one, until the node stops.
fn run(shared: &Shared, index: usize, mut poll: Poll, rx: Receiver<(std::net::TcpStream, u64)>) {
    let metrics = &shared.metrics.workers[index];
    let limit = shared.max_outstanding;
    let mut events = Events::with_capacity(256);
    let mut clients: HashMap<usize, Client<'_>> = HashMap::new();
    let mut again: Vec<usize> = vec![];
    // Until this instant the worker polls without sleeping: a client that sends its next request
    // soon after an answer finds the worker awake, and neither side pays a wake-up.
    let mut spin_until = Instant::now();
    loop {
        let spinning = Instant::now() < spin_until;
        let timeout = (!again.is_empty() || spinning).then_some(Duration::ZERO);
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!("I/O worker cannot poll: {e}");
            break;
        }
        let mut ready: Vec<usize> = std::mem::take(&mut again);
        if !events.is_empty() && !shared.busy_poll.is_zero() {
            spin_until = Instant::now() + shared.busy_poll;
        } else if spinning && events.is_empty() && ready.is_empty() {
            // Nothing yet: give the CPU to anything else that wants it (a process sharing the
            // core runs; alone, the yield returns at once).
            std::thread::yield_now();
        }
        for event in events.iter() {
            if event.token() != WAKE {
                ready.push(event.token().0);
                continue;
            }
            if shared.stopping.load(Ordering::SeqCst) {
                for (_, c) in clients.drain() {
                    close(shared, metrics, c);
                }
                return;
            }
            while let Ok((stream, id)) = rx.try_recv() {
                if let Some(c) = new_client(shared, metrics, poll.registry(), stream, id) {
                    let token = c.token;
                    clients.insert(token.0, c);
                    // Data may have arrived before registration.
                    ready.push(token.0);
                }
            }
        }
        for id in ready {
            let Some(c) = clients.get_mut(&id) else {
                continue;
            };
            match c.drive(poll.registry(), limit, metrics) {
                Drive::Idle => {}
                Drive::Again => {
                    if !again.contains(&id) {
                        again.push(id);
                    }
                }
                Drive::Close => {
                    let mut c = clients.remove(&id).expect("present");
                    let _ = poll.registry().deregister(&mut c.stream);
                    close(shared, metrics, c);
                }
            }
        }
    }
}

/// A connection the accept thread handed over, with its TLS state if the node uses TLS,
/// registered for reading; `None` if it cannot be (it is dropped, and no longer counted).
fn new_client<'a>(
    shared: &'a Shared,
    metrics: &'a WorkerMetrics,
    registry: &Registry,
    stream: std::net::TcpStream,
    id: u64,
) -> Option<Client<'a>> {
    let token = Token(id as usize);
    let mut stream = TcpStream::from_std(stream);
    let tls = match &shared.tls {
        None => None,
        Some(t) => match ServerConnection::new(Arc::clone(&t.config)) {
            Ok(conn) => Some(Box::new(Tls {
                conn,
                checked_first_byte: false,
            })),
            Err(e) => {
                tracing::warn!("cannot start a TLS connection: {e}");
                metrics.failure(Failure::Tls);
                shared.connections.fetch_sub(1, Ordering::Relaxed);
                return None;
            }
        },
    };
    if registry
        .register(&mut stream, token, Interest::READABLE)
        .is_err()
    {
        shared.connections.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
    Some(Client {
        token,
        stream,
        rbuf: BytesMut::with_capacity(READ_RESERVE),
        wbuf: BytesMut::with_capacity(READ_RESERVE),
        conn: Conn::new(shared, id, metrics),
        tls,
        writable_interest: false,
        closing: false,
        unserved: false,
        reported_unsent: 0,
    })
}

/// Closes a connection: its unsent bytes leave the gauge, what its client held is released,
/// and it is no longer counted.
fn close(shared: &Shared, metrics: &WorkerMetrics, mut c: Client<'_>) {
    metrics.unsent_changed(c.reported_unsent, 0);
    c.conn.close();
    shared.connections.fetch_sub(1, Ordering::Relaxed);
}
