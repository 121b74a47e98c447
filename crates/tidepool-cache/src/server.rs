//! The network side: an acceptor thread hands each connection to one of N worker threads,
//! each an event loop (mio, edge-triggered) over its connections, as memcached's libevent
//! workers are. A connection reads what the socket has, runs every whole command in its
//! buffer, and writes the replies in one go; a client that stalls mid-command holds only its
//! own buffer, and one that stops reading replies stops being read (its replies wait, up to a
//! bound) until it drains them.

use crate::exec::Session;
use crate::proto::Limits;
use crate::stats::Settings;
use crate::store::Items;
use crossbeam_channel::{Receiver, Sender};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const WAKE: Token = Token(usize::MAX);
/// A connection's first read buffer; it grows to hold one whole command.
const READ_INITIAL: usize = 16 << 10;
/// Reads a connection gets before the others of its worker have their turn (memcached's
/// `reqs_per_event`, by reads): a client pipelining without pause cannot starve the rest.
const READS_PER_TURN: usize = 16;
/// A worker busy this long without sleeping in epoll yields the CPU once. With more workers
/// than CPUs (memcached's default of 4 threads on a 2-CPU machine), a worker whose
/// connections always have work otherwise holds its CPU for a whole scheduler slice (4 ms on
/// a 250 Hz kernel) while the requests of the worker beside it wait: that was the p99.
const YIELD_AFTER_US: u64 = 500;
/// A poll that took longer than this slept.
const SLEPT: std::time::Duration = std::time::Duration::from_micros(20);
/// Replies waiting beyond this stop the reading of more commands until they are sent.
const WRITE_HIGH: usize = 1 << 20;

/// How the server listens: [`ServerConfig::default`], then the setters below for what differs
/// from the defaults each one names. The defaults are `tidepool cache`'s (and memcached's): 4
/// worker threads, items up to 1 MiB, 1024 connections.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Worker threads serving connections (memcached's -t).
    pub(crate) threads: usize,
    /// What a connection's parser accepts (the largest item, the longest line).
    pub(crate) limits: Limits,
    /// Most simultaneous connections (memcached's -c); more are refused with an error line.
    pub(crate) max_connections: usize,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            threads: 4,
            limits: Limits::default(),
            max_connections: 1024,
        }
    }
}

impl ServerConfig {
    /// Worker threads serving connections (memcached's -t; zero counts as one).
    /// Default: 4.
    pub fn threads(mut self, value: usize) -> ServerConfig {
        self.threads = value;
        self
    }

    /// What a connection's parser accepts (the largest item, the longest line).
    /// Default: [`Limits::default`], items up to 1 MiB and lines up to 64 KiB.
    pub fn limits(mut self, value: Limits) -> ServerConfig {
        self.limits = value;
        self
    }

    /// Most simultaneous connections (memcached's -c); more are refused with an error line.
    /// Default: 1024.
    pub fn max_connections(mut self, value: usize) -> ServerConfig {
        self.max_connections = value;
        self
    }
}

/// A running server; stopped when dropped.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    wakers: Vec<Arc<Waker>>,
    threads: Vec<JoinHandle<()>>,
}

struct Conn {
    stream: TcpStream,
    rbuf: Vec<u8>,
    /// Unparsed input is `rbuf[rstart..rend]`.
    rstart: usize,
    rend: usize,
    wbuf: Vec<u8>,
    wpos: usize,
    /// Input to discard and whether to close once the replies are out.
    session: Session,
}

/// What one worker shares with the rest of the server.
struct Shared {
    items: Arc<Items>,
    settings: Settings,
    limits: Limits,
    stop: Arc<AtomicBool>,
}

impl Server {
    /// Listens on `listener` and serves `items` until dropped.
    pub fn start(
        listener: TcpListener,
        items: Arc<Items>,
        settings: Settings,
        config: &ServerConfig,
    ) -> io::Result<Server> {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut wakers = Vec::new();
        let mut senders = Vec::new();
        let mut threads = Vec::new();
        for i in 0..config.threads.max(1) {
            let poll = Poll::new()?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
            let (tx, rx) = crossbeam_channel::unbounded();
            let shared = Shared {
                items: items.clone(),
                settings: settings.clone(),
                limits: config.limits,
                stop: stop.clone(),
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("tp-cache-{i}"))
                    .spawn(move || worker(poll, rx, shared))?,
            );
            wakers.push(waker);
            senders.push(tx);
        }
        let acceptor = Acceptor {
            listener,
            senders,
            wakers: wakers.clone(),
            stop: stop.clone(),
            counters: items.counters.clone(),
            max_connections: config.max_connections as u64,
        };
        threads.push(
            std::thread::Builder::new()
                .name("tp-cache-accept".into())
                .spawn(move || acceptor.run())?,
        );
        Ok(Server {
            addr,
            stop,
            wakers,
            threads,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        for w in &self.wakers {
            let _ = w.wake();
        }
        // The acceptor sleeps in accept(): a connection wakes it to see the stop.
        let _ = std::net::TcpStream::connect(self.addr);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct Acceptor {
    listener: TcpListener,
    senders: Vec<Sender<std::net::TcpStream>>,
    wakers: Vec<Arc<Waker>>,
    stop: Arc<AtomicBool>,
    counters: Arc<crate::stats::Counters>,
    max_connections: u64,
}

impl Acceptor {
    fn run(self) {
        let mut next = 0;
        loop {
            let accepted = self.listener.accept();
            if self.stop.load(Relaxed) {
                return;
            }
            let mut stream = match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of descriptors and the like: wait a little rather than spin.
                    tracing::warn!("tidepool cache: accept failed: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
            };
            if self.counters.curr_connections.load(Relaxed) >= self.max_connections {
                self.counters.rejected_connections.fetch_add(1, Relaxed);
                let _ = stream.write_all(b"SERVER_ERROR Too many open connections\r\n");
                continue;
            }
            self.counters.curr_connections.fetch_add(1, Relaxed);
            self.counters.total_connections.fetch_add(1, Relaxed);
            let _ = stream.set_nodelay(true);
            if stream.set_nonblocking(true).is_err() {
                self.counters.curr_connections.fetch_sub(1, Relaxed);
                continue;
            }
            let i = next % self.senders.len();
            next += 1;
            if self.senders[i].send(stream).is_ok() {
                let _ = self.wakers[i].wake();
            }
        }
    }
}

fn worker(mut poll: Poll, rx: Receiver<std::net::TcpStream>, shared: Shared) {
    let mut events = Events::with_capacity(256);
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let yield_after = std::time::Duration::from_micros(YIELD_AFTER_US);
    let mut busy_since = std::time::Instant::now();
    // Connections that used up their turn with input perhaps still waiting.
    let mut again: Vec<usize> = Vec::new();
    loop {
        let asked = std::time::Instant::now();
        let wait = if again.is_empty() {
            None
        } else {
            Some(Duration::ZERO)
        };
        let polled = poll.poll(&mut events, wait);
        if asked.elapsed() > SLEPT {
            busy_since = std::time::Instant::now();
        }
        if let Err(e) = polled {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!("tidepool cache: poll failed: {e}");
            return;
        }
        for ev in events.iter() {
            if ev.token() == WAKE {
                if shared.stop.load(Relaxed) {
                    return;
                }
                for s in rx.try_iter() {
                    let i = free.pop().unwrap_or_else(|| {
                        conns.push(None);
                        conns.len() - 1
                    });
                    let mut stream = TcpStream::from_std(s);
                    if poll
                        .registry()
                        .register(
                            &mut stream,
                            Token(i),
                            Interest::READABLE | Interest::WRITABLE,
                        )
                        .is_err()
                    {
                        free.push(i);
                        shared.items.counters.curr_connections.fetch_sub(1, Relaxed);
                        continue;
                    }
                    let c = Conn {
                        stream,
                        rbuf: Vec::new(),
                        rstart: 0,
                        rend: 0,
                        wbuf: Vec::new(),
                        wpos: 0,
                        session: Session::default(),
                    };
                    conns[i] = Some(c);
                    // Data may have come before the registration.
                    take_turn(&mut poll, &mut conns, &mut free, &mut again, i, &shared);
                }
                continue;
            }
            take_turn(
                &mut poll,
                &mut conns,
                &mut free,
                &mut again,
                ev.token().0,
                &shared,
            );
        }
        for i in std::mem::take(&mut again) {
            take_turn(&mut poll, &mut conns, &mut free, &mut again, i, &shared);
        }
        // A worker that has not slept for a while lets another run (see `YIELD_AFTER`).
        if busy_since.elapsed() > yield_after {
            std::thread::yield_now();
            busy_since = std::time::Instant::now();
        }
    }
}

/// What a turn of a connection left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// Waiting for the socket (data to read, or room to write).
    Wait,
    /// Its share used up with input perhaps still in the socket: another turn soon.
    More,
    /// Done: closed by the peer, by `quit`, or broken.
    Closed,
}

/// Gives connection `i` a turn: closed ones leave, ones with more to do come again.
fn take_turn(
    poll: &mut Poll,
    conns: &mut [Option<Conn>],
    free: &mut Vec<usize>,
    again: &mut Vec<usize>,
    i: usize,
    shared: &Shared,
) {
    let Some(Some(c)) = conns.get_mut(i) else {
        return;
    };
    match c.drive(shared) {
        Turn::Wait => {}
        Turn::More => {
            if !again.contains(&i) {
                again.push(i);
            }
        }
        Turn::Closed => {
            let mut c = conns[i].take().expect("checked above");
            let _ = poll.registry().deregister(&mut c.stream);
            free.push(i);
            shared.items.counters.curr_connections.fetch_sub(1, Relaxed);
        }
    }
}

impl Conn {
    /// Reads, runs and writes until the socket would block or the turn is used up.
    fn drive(&mut self, shared: &Shared) -> Turn {
        let counters = &shared.items.counters;
        let (mut read, mut written) = (0u64, 0u64);
        // A read that got less than it had room for emptied the socket: more data will come
        // with an event of its own (epoll reports every arrival). Reading again only to hear
        // EAGAIN would cost a system call a request.
        let mut drained = false;
        let mut reads = 0;
        let turn = loop {
            // Replies first.
            match self.flush(&mut written) {
                Ok(true) => {}
                Ok(false) => break Turn::Wait, // wait for the socket to drain
                Err(_) => break Turn::Closed,
            }
            if self.session.closing {
                break Turn::Closed;
            }
            if self.run(shared) {
                continue; // replies to send
            }
            if drained {
                break Turn::Wait;
            }
            if reads == READS_PER_TURN {
                break Turn::More;
            }
            if self.rbuf.len() - self.rend < 4096 {
                self.make_room(shared.limits);
            }
            let room = self.rbuf.len() - self.rend;
            match self.stream.read(&mut self.rbuf[self.rend..]) {
                Ok(0) => break Turn::Closed,
                Ok(n) => {
                    self.rend += n;
                    read += n as u64;
                    reads += 1;
                    drained = n < room;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Turn::Wait,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break Turn::Closed,
            }
        };
        if read > 0 {
            counters.bytes_read.fetch_add(read, Relaxed);
        }
        if written > 0 {
            counters.bytes_written.fetch_add(written, Relaxed);
        }
        // An idle connection gives its big buffers back.
        if self.rstart == self.rend && self.rbuf.len() > READ_INITIAL {
            self.rbuf = Vec::new();
            self.rstart = 0;
            self.rend = 0;
        }
        turn
    }

    /// Room to read into: the unparsed input moved to the front, the buffer grown if a
    /// command needs more than it holds.
    fn make_room(&mut self, limits: Limits) {
        if self.rstart > 0 {
            self.rbuf.copy_within(self.rstart..self.rend, 0);
            self.rend -= self.rstart;
            self.rstart = 0;
        }
        if self.rbuf.len() - self.rend < 4096 {
            let cap = limits.item_max + limits.line_max + 4096;
            let grown = (self.rbuf.len() * 2).clamp(READ_INITIAL, cap.max(READ_INITIAL));
            self.rbuf.resize(grown.max(self.rend + 4096), 0);
        }
    }

    /// Writes what replies wait; `Ok(true)` when all are out.
    fn flush(&mut self, written: &mut u64) -> io::Result<bool> {
        while self.wpos < self.wbuf.len() {
            match self.stream.write(&self.wbuf[self.wpos..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.wpos += n;
                    *written += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.wbuf.clear();
        self.wpos = 0;
        if self.wbuf.capacity() > WRITE_HIGH * 4 {
            self.wbuf = Vec::new();
        }
        Ok(true)
    }

    /// Runs the whole commands in the buffer; whether there are replies to send.
    fn run(&mut self, shared: &Shared) -> bool {
        let used = self.session.feed(
            &shared.items,
            &shared.settings,
            &shared.limits,
            &self.rbuf[self.rstart..self.rend],
            &mut self.wbuf,
            WRITE_HIGH,
        );
        self.rstart += used;
        if self.rstart == self.rend {
            self.rstart = 0;
            self.rend = 0;
        }
        !self.wbuf.is_empty() || self.session.closing
    }
}
