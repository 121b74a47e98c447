//! Bad input and bad clients leave the server up and everyone else served: malformed lines,
//! items too large, a client that sends half a command and stalls, one that never reads its
//! replies, one that pipelines without pause, and a thousand idle connections.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;
use tidepool_cache::{Items, Limits, Server, ServerConfig, Settings};
use tidepool_soft::{ArenaConfig, SoftArena};

fn start(max_connections: usize) -> Server {
    let arena = SoftArena::new(ArenaConfig::default().budget(64 << 20).max_bytes(1 << 30)).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    Server::start(
        listener,
        Arc::new(Items::new(&arena, None)),
        Settings::new(2, 1 << 20, max_connections),
        &ServerConfig::default()
            .threads(2)
            .limits(Limits::default())
            .max_connections(max_connections),
    )
    .unwrap()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Reads until the reply ends with `end`.
fn read_until(s: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    while !out.ends_with(end) {
        let n = s.read(&mut buf).expect("a reply in time");
        assert!(n > 0, "closed; got {:?}", String::from_utf8_lossy(&out));
        out.extend_from_slice(&buf[..n]);
    }
    out
}

/// A set and a get on a fresh connection work.
fn served(addr: SocketAddr, key: &str) {
    let mut s = connect(addr);
    s.write_all(format!("set {key} 1 0 5\r\nhello\r\nget {key}\r\n").as_bytes())
        .unwrap();
    let got = read_until(&mut s, b"END\r\n");
    assert_eq!(
        got,
        format!("STORED\r\nVALUE {key} 1 5\r\nhello\r\nEND\r\n").as_bytes()
    );
}

#[test]
fn malformed_lines_get_errors_and_the_connection_goes_on() {
    let server = start(64);
    let mut s = connect(server.addr());
    let garbage: &[&[u8]] = &[
        b"\x00\x01\x02\xff\r\n",
        b"set\r\n",
        b"set k\r\n",
        b"set k 0 0 notanumber\r\n",
        b"get \xff\xfe\r\n",
        b"incr k 1 2 3 4 5\r\n",
        b"mg k \x01\r\n",
        b"ms k 99999999999999999999\r\n",
        b"   \r\n",
    ];
    for g in garbage {
        s.write_all(g).unwrap();
        s.write_all(b"mn\r\n").unwrap();
        let reply = read_until(&mut s, b"MN\r\n");
        assert!(
            reply.starts_with(b"ERROR")
                || reply.starts_with(b"CLIENT_ERROR")
                || reply.starts_with(b"END"),
            "{g:?} -> {:?}",
            String::from_utf8_lossy(&reply)
        );
    }
    s.write_all(b"set k 0 0 1\r\nx\r\nget k\r\n").unwrap();
    assert_eq!(
        read_until(&mut s, b"END\r\n"),
        b"STORED\r\nVALUE k 0 1\r\nx\r\nEND\r\n"
    );
    served(server.addr(), "other");
}

#[test]
fn an_item_too_large_is_refused_its_data_skipped_and_nothing_else_lost() {
    let server = start(64);
    let mut s = connect(server.addr());
    s.write_all(b"set keep 0 0 4\r\nkeep\r\n").unwrap();
    read_until(&mut s, b"STORED\r\n");
    let n = 3 << 20;
    let mut req = format!("set big 0 0 {n}\r\n").into_bytes();
    req.extend(std::iter::repeat_n(b'x', n));
    req.extend_from_slice(b"\r\nget big keep\r\n");
    s.write_all(&req).unwrap();
    let reply = read_until(&mut s, b"END\r\n");
    assert_eq!(
        reply,
        b"SERVER_ERROR object too large for cache\r\nVALUE keep 0 4\r\nkeep\r\nEND\r\n"
    );
}

#[test]
fn a_client_that_stalls_mid_command_holds_up_no_one() {
    let server = start(64);
    let mut staller = connect(server.addr());
    staller.write_all(b"set slow 0 0 10\r\nabc").unwrap();
    let mut half_line = connect(server.addr());
    half_line.write_all(b"get sl").unwrap();
    // Everyone else is served meanwhile.
    for i in 0..20 {
        served(server.addr(), &format!("k{i}"));
    }
    // The staller finishes later and is served too.
    staller.write_all(b"defghij\r\n").unwrap();
    assert_eq!(read_until(&mut staller, b"\r\n"), b"STORED\r\n");
    half_line.write_all(b"ow\r\n").unwrap();
    assert_eq!(
        read_until(&mut half_line, b"END\r\n"),
        b"VALUE slow 0 10\r\nabcdefghij\r\nEND\r\n"
    );
}

#[test]
fn a_client_that_never_reads_its_replies_holds_up_no_one() {
    let server = start(64);
    let mut s = connect(server.addr());
    let value = vec![b'v'; 100_000];
    s.write_all(b"set fat 0 0 100000\r\n").unwrap();
    s.write_all(&value).unwrap();
    s.write_all(b"\r\n").unwrap();
    read_until(&mut s, b"STORED\r\n");
    // Ask for 100 MB of replies and never read them.
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let gets = b"get fat fat fat fat fat fat fat fat fat fat\r\n".repeat(100);
    let _ = s.write_all(&gets);
    for i in 0..20 {
        served(server.addr(), &format!("k{i}"));
    }
    drop(s);
    served(server.addr(), "after");
}

#[test]
fn a_client_pipelining_without_pause_holds_up_no_one() {
    let server = start(64);
    served(server.addr(), "warm");
    // Several blasters, so that each worker has one: sets of 64 KiB as fast as the socket
    // takes them (so there is always more to read), replies read and thrown away, until told
    // to stop.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let blasters: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            let addr = server.addr();
            std::thread::spawn(move || {
                let mut w = connect(addr);
                let mut r = w.try_clone().unwrap();
                let reader = std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while matches!(r.read(&mut buf), Ok(n) if n > 0) {}
                });
                let mut burst = b"set blast 0 0 65536 noreply\r\n".to_vec();
                burst.extend(std::iter::repeat_n(b'b', 65536));
                burst.extend_from_slice(b"\r\n");
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if w.write_all(&burst).is_err() {
                        break;
                    }
                }
                let _ = w.shutdown(std::net::Shutdown::Write);
                let _ = reader.join();
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..20 {
        served(server.addr(), &format!("k{i}"));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for b in blasters {
        let _ = b.join();
    }
}

#[test]
fn a_thousand_idle_connections_leave_the_rest_served() {
    // Two descriptors a connection in this process (the client's and the server's).
    let (_, hard) = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .map(|m| (0, m))
        .unwrap_or((0, u64::MAX));
    let want = 4096u64.min(hard);
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(want),
            maximum: Some(hard),
        },
    );
    assert!(
        want >= 2200,
        "needs 2200 file descriptors, the hard limit is {hard}"
    );
    let server = start(2000);
    let idle: Vec<TcpStream> = (0..1000).map(|_| connect(server.addr())).collect();
    // Some of them said half a word.
    for s in idle.iter().step_by(10) {
        (&*s).write_all(b"ge").unwrap();
    }
    for i in 0..20 {
        served(server.addr(), &format!("k{i}"));
    }
    let mut s = connect(server.addr());
    s.write_all(b"stats\r\n").unwrap();
    let stats = String::from_utf8(read_until(&mut s, b"END\r\n")).unwrap();
    let conns: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("STAT curr_connections ")?.parse().ok())
        .unwrap();
    assert!(conns >= 1001, "curr_connections {conns}");
    drop(idle);
    served(server.addr(), "after");
}

#[test]
fn connections_past_the_limit_are_refused_with_a_reason() {
    let server = start(4);
    let held: Vec<TcpStream> = (0..4).map(|_| connect(server.addr())).collect();
    // The acceptor counts a connection once a worker has it: give them a moment.
    served_later(&held);
    let mut extra = connect(server.addr());
    let mut buf = Vec::new();
    extra.read_to_end(&mut buf).unwrap();
    assert_eq!(buf, b"SERVER_ERROR Too many open connections\r\n");
    drop(held);
}

/// Each held connection answers a `version` (so the server has counted it).
fn served_later(held: &[TcpStream]) {
    for s in held {
        let mut s = s;
        s.write_all(b"version\r\n").unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"VERSION "));
    }
}
