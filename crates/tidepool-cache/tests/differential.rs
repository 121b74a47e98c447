//! The same commands to a real memcached and to the cache, and the same replies back: every
//! command of the text protocol and the meta commands, their limits and their errors. CAS
//! uniques differ between servers and are compared as "some number".

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;
use tidepool_cache::{Items, Limits, Server, ServerConfig, Settings};
use tidepool_peers::Memcached;
use tidepool_soft::{ArenaConfig, SoftArena};

/// Each case runs on a fresh connection: its requests, one after the other.
const CASES: &[&[&str]] = &[
    &[
        "set a 5 0 3\r\nabc\r\n",
        "get a b\r\n",
        "gets a\r\n",
        "get  a \r\n",
    ],
    &[
        "set a 5 0 3\r\nabcd\r\n",
        "get a\r\n",
        "bogus\r\n",
        "GET a\r\n",
        "\r\n",
    ],
    &["set b 0 0 3\r\nabcXY", "get b\r\n"],
    &[
        "set a 5 0 -1\r\n",
        "set a x 0 3\r\nabc\r\n",
        "set k -1 0 1\r\nx\r\n",
    ],
    &[
        "set k 0 abc 1\r\nx\r\n",
        "set k 0 0 1 2 3\r\nx\r\n",
        "set k 0 0 1 foo\r\nx\r\n",
        "get k\r\n",
    ],
    &[
        "set k 4294967295 0 1\r\nx\r\n",
        "gets k\r\n",
        "set k 4294967296 0 1\r\nx\r\n",
        "get k\r\n",
    ],
    &["set k 0 -1 1\r\nx\r\n", "get k\r\n"],
    &["set a 5 0 3 noreply\r\nxyz\r\nget a\r\n"],
    &[
        "set a 0 0 1\r\nq\r\n",
        "add a 0 0 1\r\nq\r\n",
        "add new 0 0 1\r\nn\r\n",
        "replace zz 0 0 1\r\nq\r\n",
        "replace a 0 0 2\r\nqq\r\n",
    ],
    &[
        "set a 7 0 3\r\nxyz\r\n",
        "append a 0 0 2\r\n12\r\n",
        "prepend a 0 0 2\r\n00\r\n",
        "get a\r\n",
        "append zz 0 0 1\r\nx\r\n",
    ],
    &[
        "set a 0 0 1\r\nx\r\n",
        "cas a 0 0 1 999\r\nz\r\n",
        "cas zz 0 0 1 999\r\nz\r\n",
        "cas k 0 0 1\r\nx\r\n",
        "cas k 0 0 1 abc\r\nx\r\n",
    ],
    &[
        "set a 0 0 1\r\nx\r\n",
        "delete a\r\n",
        "delete a\r\n",
        "delete a 0\r\n",
        "delete a 5\r\n",
        "delete a noreply\r\n",
        "delete\r\n",
    ],
    &[
        "set n 0 0 2\r\n10\r\n",
        "incr n 5\r\n",
        "decr n 100\r\n",
        "incr n abc\r\n",
        "incr zz 1\r\n",
        "incr\r\n",
        "incr n\r\n",
        "decr n -1\r\n",
    ],
    &[
        "set s 0 0 3\r\nabc\r\n",
        "incr s 1\r\n",
        "set e 0 0 0\r\n\r\n",
        "get e\r\n",
        "incr e 1\r\n",
    ],
    &[
        "set n 0 0 1\r\n0\r\n",
        "incr n 18446744073709551615\r\n",
        "incr n 18446744073709551616\r\n",
        "incr n 1\r\n",
        "get n\r\n",
    ],
    &[
        "set n 0 0 3\r\n 12\r\n",
        "incr n 1\r\n",
        "set n 0 0 3\r\n12 \r\n",
        "incr n 1\r\n",
        "set n 0 0 2\r\n99\r\n",
        "incr n 1\r\n",
        "get n\r\n",
    ],
    &[
        "set n 0 0 3\r\n100\r\n",
        "decr n 1\r\n",
        "get n\r\n",
        "incr n 1 noreply\r\n",
        "get n\r\n",
    ],
    &[
        "set t 0 0 1\r\nx\r\n",
        "touch t 100\r\n",
        "touch zz 100\r\n",
        "touch t\r\n",
        "touch t abc\r\n",
        "touch t -1\r\n",
        "get t\r\n",
    ],
    &[
        "set t 3 0 1\r\nx\r\n",
        "gat 100 t zz\r\n",
        "gats 100 t\r\n",
        "gat\r\n",
        "gat 10\r\n",
        "gat abc t\r\n",
        "gat -1 t\r\n",
        "get t\r\n",
    ],
    &[
        "get\r\n",
        "set\r\n",
        "verbosity 1\r\n",
        "verbosity 1 noreply\r\n",
        "mn\r\n",
    ],
    &[
        "set f 0 0 1\r\nx\r\n",
        "flush_all\r\n",
        "get f\r\n",
        "flush_all 0\r\n",
        "flush_all noreply\r\n",
        "flush_all x\r\n",
        "mn\r\n",
    ],
    &[
        "set a\x01b 0 0 1\r\nx\r\n",
        "get a\x01b\r\n",
        "set  sp  0  0  1 \r\nx\r\n",
        "get sp\r\n",
        "set cr 0 0 1\nx\r\n",
        "get cr\n",
    ],
    &["stats reset\r\n", "stats bogus\r\n"],
    // Meta commands.
    &[
        "set k 9 0 1\r\nx\r\n",
        "mg k v\r\n",
        "mg k s v f t k\r\n",
        "mg k\r\n",
        "mg k Oabc v\r\n",
        "mg k q\r\n",
        "mg k q v\r\n",
        "mg k q k Oxx\r\n",
    ],
    &[
        "mg zz v\r\n",
        "mg zz v q\r\nmn\r\n",
        "mg zz k Oxx\r\n",
        "mg zz k Oxx q\r\nmn\r\n",
        "mg\r\n",
        "mg k zz\r\n",
        "mg k v v\r\n",
        "mg k Tabc\r\n",
    ],
    &[
        "set k 0 0 1\r\nx\r\n",
        "mg k T100 t\r\n",
        "mg k t v\r\n",
        "mg k h l\r\n",
        "mg k h\r\n",
    ],
    &[
        "ms k 2\r\nhi\r\n",
        "mg k v f\r\n",
        "ms k 2 T0 F7\r\nhi\r\n",
        "mg k v f\r\n",
        "ms k 2 q\r\nhi\r\nmn\r\n",
        "ms k 1 k Oab\r\ny\r\n",
    ],
    &[
        "ms k 2 MX\r\nhi\r\n",
        "ms k 2 ME\r\nhi\r\n",
        "ms k2 2 MR\r\nhi\r\n",
        "ms k 2 C1\r\nhi\r\n",
        "ms k 1 C1 q\r\ny\r\nmn\r\n",
    ],
    &[
        "ms k abc\r\nhi\r\n",
        "ms k\r\n",
        "ms k 2 S3\r\nhi\r\n",
        "ms k 1 Fabc\r\ny\r\n",
        "ms\r\n",
        "mn\r\n",
    ],
    &[
        "ms k 1 T-1\r\ny\r\n",
        "mg k v\r\n",
        "ms k 3\r\nabc\r\n",
        "ms k 3 MA\r\ndef\r\n",
        "ms k 1 MP\r\n<\r\n",
        "mg k v\r\n",
    ],
    &[
        "set k 0 0 1\r\nx\r\n",
        "md k\r\n",
        "md k\r\n",
        "md k q\r\nmn\r\n",
        "md zz q\r\nmn\r\n",
        "md k k Oq\r\n",
    ],
    &[
        "ma zz\r\n",
        "ma zz q\r\nmn\r\n",
        "ma n N0 J5 v\r\n",
        "ma n v\r\n",
        "ma n MD D10 v\r\n",
        "ma n D3 t v\r\n",
        "ma n q v\r\nmn\r\n",
        "ma n k Oz t\r\n",
    ],
    &[
        "ma n MX\r\n",
        "ma n Dabc\r\n",
        "set s 0 0 1\r\nx\r\n",
        "ma s\r\n",
    ],
    &[
        "ms Zm9v 1 b\r\nq\r\n",
        "mg Zm9v b v\r\n",
        "mg foo v\r\n",
        "mg !!! b v\r\n",
    ],
];

fn limits() -> Limits {
    Limits::default().item_max(Memcached::ITEM_SIZE_LIMIT)
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// Sends `req` and reads the reply: up to the `MN` a trailing `mn` brings (or the close).
fn exchange(s: &mut TcpStream, req: &[u8]) -> Vec<u8> {
    s.write_all(req).unwrap();
    s.write_all(b"mn\r\n").unwrap();
    let noops = count(req, b"mn\r\n") + 1;
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    while count(&out, b"MN\r\n") < noops {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => panic!("reading the reply to {req:?}: {e} (so far {out:?})"),
        }
    }
    out
}

/// CAS uniques as `#`: in `gets`/`gats` value lines and in meta `c` tokens.
fn normalise(reply: &[u8]) -> String {
    let text = String::from_utf8_lossy(reply);
    let mut out = Vec::new();
    for line in text.split("\r\n") {
        let words: Vec<String> = line
            .split(' ')
            .enumerate()
            .map(|(i, w)| {
                let numeric_after = |p: &str| {
                    w.strip_prefix(p)
                        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                };
                if line.starts_with("VALUE ") && i == 4 {
                    "#".into()
                } else if i > 0 && numeric_after("c") && !line.starts_with("VALUE") {
                    "c#".into()
                } else {
                    w.to_string()
                }
            })
            .collect();
        out.push(words.join(" "));
    }
    out.join("\r\n")
}

fn run(addr: &str, case: &[&str]) -> Vec<String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    case.iter()
        .map(|req| normalise(&exchange(&mut s, req.as_bytes())))
        .collect()
}

#[test]
fn every_command_answers_as_memcached_does() {
    let memcached = Memcached::start(64).expect("memcached (scripts/setup installs it)");
    let arena = SoftArena::new(ArenaConfig::default().budget(64 << 20).max_bytes(1 << 30)).unwrap();
    let items = Arc::new(Items::new(&arena, None));
    let settings = Settings::new(2, Memcached::ITEM_SIZE_LIMIT, 64);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(
        listener,
        items,
        settings,
        &ServerConfig::default()
            .threads(2)
            .limits(limits())
            .max_connections(64),
    )
    .unwrap();
    let ours = server.addr().to_string();
    let mut differ = Vec::new();
    for case in CASES {
        // Each case starts from an empty cache on both.
        run(&memcached.addr(), &["flush_all\r\n"]);
        run(&ours, &["flush_all\r\n"]);
        let want = run(&memcached.addr(), case);
        let got = run(&ours, case);
        for ((req, w), g) in case.iter().zip(&want).zip(&got) {
            if w != g {
                differ.push(format!("{req:?}\n  memcached: {w:?}\n  ours:      {g:?}"));
            }
        }
    }
    assert!(differ.is_empty(), "replies differ:\n{}", differ.join("\n"));
}

#[test]
fn items_too_large_are_refused_as_memcached_refuses_them() {
    let memcached = Memcached::start(64).expect("memcached (scripts/setup installs it)");
    let arena = SoftArena::new(ArenaConfig::default()).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = Server::start(
        listener,
        Arc::new(Items::new(&arena, None)),
        Settings::new(1, Memcached::ITEM_SIZE_LIMIT, 64),
        &ServerConfig::default()
            .threads(1)
            .limits(limits())
            .max_connections(64),
    )
    .unwrap();
    let big = |n: usize| {
        let mut r = format!("set big 0 0 {n}\r\n").into_bytes();
        r.extend(std::iter::repeat_n(b'x', n));
        r.extend_from_slice(b"\r\nget big\r\n");
        r
    };
    for n in [
        Memcached::ITEM_SIZE_LIMIT + 1,
        2 * Memcached::ITEM_SIZE_LIMIT,
        1_000_000,
    ] {
        let mut a = TcpStream::connect(memcached.addr()).unwrap();
        let mut b = TcpStream::connect(server.addr()).unwrap();
        let want = normalise(&exchange(&mut a, &big(n)));
        let got = normalise(&exchange(&mut b, &big(n)));
        let head = |s: &str| s.chars().take(60).collect::<String>();
        assert_eq!(head(&got), head(&want), "an item of {n} bytes");
    }
}
