//! Event-loop I/O workers. Each worker serves many connections from one epoll loop (mio): it
//! reads every ready connection until the socket is drained, serves all the frames that came,
//! and answers each connection with one write. On small VMs a wake-up costs more than a 4 KiB
//! request, so one wake-up must serve everything that is ready rather than one connection's
//! batch (as a thread per connection would).

use crate::conn::Conn;
use crate::server::Shared;
use bytes::{Buf, BytesMut};
use crossbeam_channel::{Receiver, Sender};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use std::collections::HashMap;
use std::io::{self, IoSlice, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const WAKE: Token = Token(usize::MAX);
const READ_RESERVE: usize = 128 << 10;
/// Stop reading a connection whose unsent answers exceed this, until it drains (a client that
/// sends but does not read cannot make the node buffer without bound).
const HIGH_WATER: usize = 4 << 20;
/// Reads per connection per turn before the others get theirs.
const READ_BUDGET: usize = 16;
/// The most buffers one writev takes (Linux's IOV_MAX).
const IOV_MAX: usize = 1024;

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
            .spawn(move || run(&shared, poll, rx))?;
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

struct Client<'a> {
    token: Token,
    stream: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    conn: Conn<'a>,
    writable_interest: bool,
    /// A malformed frame was answered; close once the answer is out.
    closing: bool,
}

enum Drive {
    Idle,
    /// Read budget used up with data possibly left: drive again soon.
    Again,
    Close,
}

impl Client<'_> {
    fn drive(&mut self, registry: &Registry) -> Drive {
        if self.flush().is_err() {
            return Drive::Close;
        }
        let mut outcome = Drive::Idle;
        let mut reads = 0;
        while !self.closing && self.wbuf.len() + self.conn.spliced_bytes() < HIGH_WATER {
            if reads == READ_BUDGET {
                outcome = Drive::Again;
                break;
            }
            if self.rbuf.capacity() - self.rbuf.len() < READ_RESERVE / 2 {
                self.rbuf.reserve(READ_RESERVE);
            }
            match tidepool_sys::recv_into(&self.stream, &mut self.rbuf) {
                Ok(0) => return Drive::Close,
                Ok(_) => {
                    reads += 1;
                    if self.conn.on_bytes(&mut self.rbuf, &mut self.wbuf).is_err() {
                        self.closing = true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Drive::Close,
            }
        }
        if self.flush().is_err() || (self.closing && self.wbuf.is_empty()) {
            return Drive::Close;
        }
        let want_write = !self.wbuf.is_empty();
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
        outcome
    }

    /// Sends as much of the pending answers as the socket takes now. Object bytes still in the
    /// arena go out in the same writev; whatever the socket does not take now is copied out
    /// and its guards released, so no guard outlives this call.
    fn flush(&mut self) -> io::Result<()> {
        if !self.conn.splices.is_empty() {
            return self.flush_spliced();
        }
        while !self.wbuf.is_empty() {
            match self.stream.write(&self.wbuf) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.wbuf.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Client<'_> {
    fn flush_spliced(&mut self) -> io::Result<()> {
        let shared: &Shared = self.conn.sh;
        let arena = &shared.arena;
        let splices = std::mem::take(&mut self.conn.splices);
        // The output in order: buffer, object, buffer, object, ..., buffer.
        let mut parts: Vec<&[u8]> = Vec::with_capacity(splices.len() * 2 + 1);
        let mut at = 0;
        for s in &splices {
            parts.push(&self.wbuf[at..s.at]);
            parts.push(arena.slice(&s.guard, s.base));
            at = s.at;
        }
        parts.push(&self.wbuf[at..]);
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut sent = 0;
        let mut first = 0; // first part not wholly sent
        let mut offset = 0; // bytes of parts[first] already sent
        while sent < total {
            let end = (first + IOV_MAX).min(parts.len());
            let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(end - first);
            iov.push(IoSlice::new(&parts[first][offset..]));
            iov.extend(parts[first + 1..end].iter().map(|p| IoSlice::new(p)));
            match self.stream.write_vectored(&iov) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(mut n) => {
                    sent += n;
                    while n > 0 {
                        let left = parts[first].len() - offset;
                        if n >= left {
                            n -= left;
                            first += 1;
                            offset = 0;
                        } else {
                            offset += n;
                            n = 0;
                        }
                    }
                    while first < parts.len() && parts[first].len() == offset {
                        first += 1;
                        offset = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        // Keep what was not sent as plain bytes; the guards go when `splices` drops below.
        let mut rest = BytesMut::with_capacity(total - sent);
        if first < parts.len() {
            rest.extend_from_slice(&parts[first][offset..]);
            for p in &parts[first + 1..] {
                rest.extend_from_slice(p);
            }
        }
        drop(parts);
        drop(splices);
        self.wbuf = rest;
        Ok(())
    }
}

fn run(shared: &Shared, mut poll: Poll, rx: Receiver<(std::net::TcpStream, u64)>) {
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
        }
        for event in events.iter() {
            if event.token() == WAKE {
                if shared.stopping.load(Ordering::SeqCst) {
                    for (_, mut c) in clients.drain() {
                        c.conn.close();
                        shared.connections.fetch_sub(1, Ordering::Relaxed);
                    }
                    return;
                }
                while let Ok((stream, id)) = rx.try_recv() {
                    let token = Token(id as usize);
                    let mut stream = TcpStream::from_std(stream);
                    if poll
                        .registry()
                        .register(&mut stream, token, Interest::READABLE)
                        .is_err()
                    {
                        shared.connections.fetch_sub(1, Ordering::Relaxed);
                        continue;
                    }
                    clients.insert(
                        token.0,
                        Client {
                            token,
                            stream,
                            rbuf: BytesMut::with_capacity(READ_RESERVE),
                            wbuf: BytesMut::with_capacity(READ_RESERVE),
                            conn: Conn::new(shared, id),
                            writable_interest: false,
                            closing: false,
                        },
                    );
                    // Data may have arrived before registration.
                    ready.push(token.0);
                }
            } else {
                ready.push(event.token().0);
            }
        }
        for id in ready {
            let Some(c) = clients.get_mut(&id) else {
                continue;
            };
            match c.drive(poll.registry()) {
                Drive::Idle => {}
                Drive::Again => {
                    if !again.contains(&id) {
                        again.push(id);
                    }
                }
                Drive::Close => {
                    let mut c = clients.remove(&id).expect("present");
                    let _ = poll.registry().deregister(&mut c.stream);
                    c.conn.close();
                    shared.connections.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }
}
