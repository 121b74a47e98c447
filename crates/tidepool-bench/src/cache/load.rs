//! A memcached load generator (text protocol): many connections from one thread, each with
//! one request in flight (a closed loop, as memtier_benchmark's default is), keys drawn
//! uniformly, every reply checked. A get that misses is followed by a set of the same key, as
//! a look-aside client does after fetching the value from its database.

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Bytes of every value.
pub const VALUE_BYTES: usize = 1024;

/// What to run.
#[derive(Debug, Clone)]
pub struct Spec {
    pub addr: SocketAddr,
    pub conns: usize,
    pub keys: u64,
    /// Share of requests that are gets (the rest are sets).
    pub get_share: f64,
    pub duration: Duration,
    pub seed: u64,
}

/// What a run measured.
#[derive(Debug)]
pub struct Outcome {
    pub ops: u64,
    pub secs: f64,
    /// Per-request latency, nanoseconds.
    pub latency: Histogram<u64>,
    pub gets: u64,
    pub hits: u64,
    /// Requests that got an error reply (memcached's `SERVER_ERROR` and the like).
    pub errors: u64,
}

impl Outcome {
    pub fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.secs
    }
    pub fn hit_ratio(&self) -> f64 {
        if self.gets == 0 {
            0.0
        } else {
            self.hits as f64 / self.gets as f64
        }
    }
}

pub fn key(i: u64) -> String {
    format!("key:{i:010}")
}

/// The value of key `i`: its number, then filler, so a reply for the wrong key is caught.
pub fn value(i: u64) -> Vec<u8> {
    let mut v = format!("{i:016}").into_bytes();
    v.resize(VALUE_BYTES, b'v');
    v
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Get(u64),
    Set(u64),
}

struct Conn {
    stream: TcpStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    wpos: usize,
    inflight: VecDeque<(Op, Instant)>,
}

/// How far a reply at the front of `buf` got: `Some((used, hit, error))` when whole.
fn reply(op: Op, buf: &[u8]) -> Result<Option<(usize, bool, bool)>> {
    let Some(nl) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = &buf[..nl];
    match op {
        Op::Set(_) => Ok(Some((nl + 2, false, line != b"STORED"))),
        Op::Get(i) => {
            if line == b"END" {
                return Ok(Some((nl + 2, false, false)));
            }
            if !line.starts_with(b"VALUE ") {
                return Ok(Some((nl + 2, false, true)));
            }
            let text = std::str::from_utf8(line).context("a VALUE line not in UTF-8")?;
            let len: usize = text
                .split(' ')
                .nth(3)
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("a bad VALUE line: {text:?}"))?;
            let end = nl + 2 + len + 2 + 5;
            if buf.len() < end {
                return Ok(None);
            }
            let data = &buf[nl + 2..nl + 2 + len];
            if &buf[end - 7..end] != b"\r\nEND\r\n" {
                bail!(
                    "a get reply not ending in END: {:?}",
                    String::from_utf8_lossy(&buf[..end])
                );
            }
            if data != value(i).as_slice() {
                bail!("the value of key {i} came back wrong");
            }
            Ok(Some((end, true, false)))
        }
    }
}

fn request(out: &mut Vec<u8>, op: Op) {
    match op {
        Op::Get(i) => {
            out.extend_from_slice(b"get ");
            out.extend_from_slice(key(i).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Op::Set(i) => {
            let _ = write!(out, "set {} 0 0 {VALUE_BYTES}\r\n", key(i));
            out.extend_from_slice(&value(i));
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// Sets every key, `depth` requests in flight on one connection.
pub fn fill(addr: SocketAddr, keys: std::ops::Range<u64>) -> Result<()> {
    let mut s =
        std::net::TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_nodelay(true)?;
    let depth = 64;
    let mut buf = Vec::new();
    let mut replies = Vec::new();
    let mut i = keys.start;
    while i < keys.end {
        let n = depth.min(keys.end - i);
        buf.clear();
        for k in i..i + n {
            request(&mut buf, Op::Set(k));
        }
        s.write_all(&buf)?;
        replies.clear();
        let want = n as usize * b"STORED\r\n".len();
        let mut chunk = [0u8; 4096];
        while replies.len() < want {
            let got = s.read(&mut chunk)?;
            if got == 0 {
                bail!("the server closed the connection while being filled");
            }
            replies.extend_from_slice(&chunk[..got]);
            if replies.windows(5).any(|w| w == b"ERROR") {
                bail!("filling: {}", String::from_utf8_lossy(&replies).trim());
            }
        }
        i += n;
    }
    Ok(())
}

/// Runs the load for `spec.duration`.
pub fn run(spec: &Spec) -> Result<Outcome> {
    let mut poll = Poll::new()?;
    let mut conns = connect_all(spec, &poll)?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(spec.seed);
    let mut latency = Histogram::<u64>::new_with_bounds(1_000, 10_000_000_000, 3)?;
    let (mut ops, mut gets, mut hits, mut errors) = (0u64, 0u64, 0u64, 0u64);
    let mut events = Events::with_capacity(1024);
    let start = Instant::now();
    let end = start + spec.duration;
    let next_op = |rng: &mut rand::rngs::SmallRng| {
        let k = rng.gen_range(0..spec.keys);
        if rng.gen_bool(spec.get_share) {
            Op::Get(k)
        } else {
            Op::Set(k)
        }
    };
    for c in conns.iter_mut() {
        let op = next_op(&mut rng);
        send(c, op)?;
    }
    let mut chunk = vec![0u8; 64 << 10];
    while Instant::now() < end {
        poll.poll(&mut events, Some(Duration::from_millis(100)))?;
        for ev in events.iter() {
            let c = &mut conns[ev.token().0];
            flush(c)?;
            read_available(c, &mut chunk)?;
            let mut used_total = 0;
            while let Some(&(op, at)) = c.inflight.front() {
                let Some((used, hit, error)) = reply(op, &c.rbuf[used_total..])? else {
                    break;
                };
                used_total += used;
                c.inflight.pop_front();
                let now = Instant::now();
                latency.saturating_record(now.duration_since(at).as_nanos() as u64);
                ops += 1;
                errors += error as u64;
                let next = match op {
                    Op::Get(i) => {
                        gets += 1;
                        hits += hit as u64;
                        // Look-aside: a miss is fetched elsewhere and set.
                        if hit || error {
                            next_op(&mut rng)
                        } else {
                            Op::Set(i)
                        }
                    }
                    Op::Set(_) => next_op(&mut rng),
                };
                if now < end {
                    send(c, next)?;
                }
            }
            c.rbuf.drain(..used_total);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(Outcome {
        ops,
        secs,
        latency,
        gets,
        hits,
        errors,
    })
}

/// Opens `spec.conns` connections to the server, registered for readiness with `poll`.
fn connect_all(spec: &Spec, poll: &Poll) -> Result<Vec<Conn>> {
    let mut conns = Vec::new();
    for i in 0..spec.conns {
        let s = std::net::TcpStream::connect(spec.addr)
            .with_context(|| format!("connecting to {}", spec.addr))?;
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        let mut stream = TcpStream::from_std(s);
        poll.registry().register(
            &mut stream,
            Token(i),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        conns.push(Conn {
            stream,
            rbuf: Vec::with_capacity(4096),
            wbuf: Vec::with_capacity(2048),
            wpos: 0,
            inflight: VecDeque::new(),
        });
    }
    Ok(conns)
}

/// Reads everything the connection has into its buffer (through `chunk`).
fn read_available(c: &mut Conn, chunk: &mut [u8]) -> Result<()> {
    loop {
        match c.stream.read(chunk) {
            Ok(0) => bail!("the server closed a connection"),
            Ok(n) => c.rbuf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("reading a reply"),
        }
    }
}

fn send(c: &mut Conn, op: Op) -> Result<()> {
    request(&mut c.wbuf, op);
    c.inflight.push_back((op, Instant::now()));
    flush(c)
}

fn flush(c: &mut Conn) -> Result<()> {
    while c.wpos < c.wbuf.len() {
        match c.stream.write(&c.wbuf[c.wpos..]) {
            Ok(n) => c.wpos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("sending a request"),
        }
    }
    c.wbuf.clear();
    c.wpos = 0;
    Ok(())
}
