//! `tidepool cache` with clients no one here wrote: pymemcache (every text command),
//! meta-memcache (the meta commands), libmemcached's tools (memccapable's protocol checks,
//! memccp, memccat, memcexist, memctouch, memcrm, memcflush, memcstat, memcping). The
//! Python scripts run against a real memcached too, so what they assert is memcached's
//! behaviour. And the far tier: values soft memory let go come back from a memory node.

mod common;

use common::NodeProc;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use tidepool_bench::cache::load;
use tidepool_bench::job::{AntagonistJob, Job};
use tidepool_peers::Memcached;

const ITEM_MAX: usize = 1 << 20;

fn cache(args: &[&str]) -> NodeProc {
    let mut all = vec!["--no-coord", "--threads", "2"];
    all.extend_from_slice(args);
    NodeProc::start_server("cache", &all)
}

fn port(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap()
}

fn python(script: &str, args: &[&str]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/cache")
        .join(script);
    let out = Command::new("python3")
        .arg(&path)
        .args(args)
        .output()
        .expect("python3 (scripts/setup installs it with pymemcache and meta-memcache)");
    assert!(
        out.status.success(),
        "{script} {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tool(name: &str, args: &[&str]) -> String {
    let out = Command::new(name)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{name} (libmemcached-tools; scripts/setup installs it): {e}"));
    assert!(
        out.status.success(),
        "{name} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn pymemcache_and_meta_memcache_pass_against_memcached_and_the_cache() {
    let memcached = Memcached::start_with(64, 2, ITEM_MAX).expect("memcached");
    // memcached's behaviour needs memcached's fixed memory: under the `auto` budget, stalls
    // elsewhere on the host (another test's memory antagonists) take the cache's budget to
    // its floor, and the values the scripts stored go (CI: a `delete` of a key just set found
    // nothing).
    let ours = cache(&["--item-max", "1M", "--memory", "64M"]);
    let item_max = ITEM_MAX.to_string();
    for p in [memcached.port().to_string(), port(&ours.addr).to_string()] {
        python("pymemcache_all.py", &[&p, &item_max]);
        python("meta_all.py", &[&p]);
    }
}

#[test]
fn libmemcached_tools_work_against_the_cache() {
    let ours = cache(&[]);
    let servers = format!("--servers={}", ours.addr);
    // memccapable's own protocol checks, ASCII protocol.
    let (host, p) = ours.addr.rsplit_once(':').unwrap();
    let capable = tool("memccapable", &["-h", host, "-p", p, "-a"]);
    assert!(capable.contains("All tests passed"), "{capable}");
    // Copy a file in, read it back, check it, touch, remove, flush.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cache-tools");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("payload.bin");
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(&file, &payload).unwrap();
    tool("memccp", &[&servers, file.to_str().unwrap()]);
    let mut cat = Command::new("memccat")
        .args([&servers, "payload.bin"])
        .output()
        .unwrap();
    assert!(cat.status.success());
    // memccat ends what it prints with a newline (against memcached too).
    let mut want = payload.clone();
    want.push(b'\n');
    assert_eq!(std::mem::take(&mut cat.stdout), want);
    tool("memcexist", &[&servers, "payload.bin"]);
    tool("memctouch", &[&servers, "--expire=100", "payload.bin"]);
    let stat = tool("memcstat", &[&servers]);
    assert!(stat.contains("curr_items: 1"), "{stat}");
    tool("memcping", &[&servers]);
    tool("memcrm", &[&servers, "payload.bin"]);
    let gone = Command::new("memcexist")
        .args([&servers, "payload.bin"])
        .status()
        .unwrap();
    assert!(!gone.success(), "memcexist finds a removed key");
    tool("memccp", &[&servers, file.to_str().unwrap()]);
    tool("memcflush", &[&servers]);
    let flushed = Command::new("memccat")
        .args([&servers, "payload.bin"])
        .output()
        .unwrap();
    assert!(!flushed.status.success(), "memccat reads a flushed key");
}

/// Sends `req` and reads until the reply ends with `end`.
fn ask(s: &mut std::net::TcpStream, req: &[u8], end: &[u8]) -> Vec<u8> {
    s.write_all(req).unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 8192];
    while !reply.ends_with(end) {
        let got = s.read(&mut buf).expect("a reply");
        assert!(got > 0, "the cache closed the connection");
        reply.extend_from_slice(&buf[..got]);
    }
    reply
}

fn stat(addr: &str, name: &str) -> u64 {
    tidepool_bench::cache::stat(addr.parse().unwrap(), name).unwrap()
}

#[test]
fn values_soft_memory_let_go_come_back_from_the_far_tier() {
    let node = NodeProc::start(&["--capacity", "256M"]);
    let url = format!("node://cache@{}", node.addr);
    // 8 MiB of soft memory for 40 MiB of values: most of them must go.
    let ours = cache(&["--max", "8M", "--far", &url]);
    // 40 MiB of values.
    let n = 40_000u64;
    load::fill(ours.addr.parse().unwrap(), 0..n).unwrap();
    // The far copies are written behind: wait until they are all there.
    let t = std::time::Instant::now();
    while stat(&ours.addr, "far_writes") < n {
        assert!(
            t.elapsed().as_secs() < 60,
            "far writes: {} of {n}",
            stat(&ours.addr, "far_writes")
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut s = std::net::TcpStream::connect(&ours.addr).unwrap();
    let mut missing = 0;
    for i in 0..n {
        let reply = ask(
            &mut s,
            format!("get {}\r\n", load::key(i)).as_bytes(),
            b"END\r\n",
        );
        if reply == b"END\r\n" {
            missing += 1;
            continue;
        }
        let head = format!("VALUE {} 0 {}\r\n", load::key(i), load::VALUE_BYTES);
        assert!(reply.starts_with(head.as_bytes()), "key {i}");
        assert_eq!(
            &reply[head.len()..head.len() + load::VALUE_BYTES],
            load::value(i).as_slice(),
            "key {i}"
        );
    }
    assert_eq!(missing, 0, "values lost");
    let far_hits = stat(&ours.addr, "far_hits");
    assert!(
        far_hits > n / 2,
        "only {far_hits} of {n} came from the far tier"
    );
    assert_eq!(stat(&ours.addr, "far_errors"), 0);
}

#[test]
fn help_says_what_it_does_and_bad_flags_say_what_to_do() {
    let help = Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .args(["cache", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    for needle in [
        "memcached",
        "soft memory",
        "--far",
        "--max",
        "--memory",
        "--threads",
        "meta commands",
    ] {
        assert!(text.contains(needle), "--help lacks {needle:?}:\n{text}");
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .args(["cache", "--no-coord", "--max", "1M"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("too small"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    for (args, says) in [
        (&["--memory", "1M"][..], "--memory 1.0 MiB is too small"),
        (
            &["--memory", "64M", "--max", "1G"][..],
            "cannot be used with",
        ),
    ] {
        let bad = Command::new(env!("CARGO_BIN_EXE_tidepool"))
            .arg("cache")
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&bad.stderr);
        assert!(
            !bad.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
    }
    let far = Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .args([
            "cache",
            "--no-coord",
            "--listen",
            "127.0.0.1:0",
            "--far",
            "redis://:s3cret@127.0.0.1:1",
        ])
        .output()
        .unwrap();
    assert!(!far.status.success());
    let err = String::from_utf8_lossy(&far.stderr);
    assert!(!err.contains("s3cret"), "the password was printed: {err}");
}

/// In a 512 MiB memory cgroup with no swap, the cache fills 400 MiB, then an antagonist takes
/// 300 MiB: the cache gives memory back instead of being OOM-killed, and serves on.
#[test]
fn under_pressure_the_cache_gives_memory_back_and_is_not_killed() {
    use tidepool_sys::probe::Need;
    tidepool_sys::skip_unless!(Need::Root, Need::CgroupV1Memory);
    let cg = tidepool_bench::coord::Cgroup::create("cache-test", 512 << 20).unwrap();
    // (`cg.command` would run this test binary: name tidepool's.)
    let mut cmd = cg.command_of(
        Path::new(env!("CARGO_BIN_EXE_tidepool")),
        &[
            "cache",
            "--listen",
            "127.0.0.1:0",
            "--no-coord",
            "--reserve",
            "64M",
        ],
    );
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start tidepool cache in the cgroup");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let addr = line.rsplit(' ').next().unwrap().trim().to_string();
    // 400 MiB of values.
    load::fill(addr.parse().unwrap(), 0..400_000).unwrap();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let held_before = stat(&addr, "soft_used_bytes");
    assert!(
        held_before > 256 << 20,
        "the cache grew to only {held_before} bytes"
    );
    let antagonist = cg
        .command_of(
            Path::new(env!("CARGO_BIN_EXE_tidepool")),
            &Job::Antagonist(AntagonistJob {
                bytes: 300 << 20,
                mib_per_s: 0.0,
                delay_s: 0.0,
                hold_s: 2.0,
            })
            .args(),
        )
        .status()
        .unwrap();
    assert!(
        antagonist.success(),
        "the antagonist was killed: {antagonist}"
    );
    assert_eq!(cg.oom_kills(), 0, "the OOM killer ran");
    assert!(child.try_wait().unwrap().is_none(), "the cache died");
    let held_after = stat(&addr, "soft_used_bytes");
    assert!(
        held_after < held_before,
        "soft memory did not give way: {held_before} -> {held_after}"
    );
    // It serves on.
    let reply = ask(
        &mut s,
        b"set after 0 0 2\r\nok\r\nget after\r\n",
        b"END\r\n",
    );
    assert_eq!(reply, b"STORED\r\nVALUE after 0 2\r\nok\r\nEND\r\n");
    let _ = child.kill();
    let _ = child.wait();
}

/// The far tier's memory node dies (SIGKILL): the cache answers every request (what soft
/// memory still holds as hits, the rest as misses), keeps the keys for when a far store is
/// back, and takes new values.
#[test]
fn a_dead_far_node_costs_misses_not_the_cache() {
    far_node_fails(false);
}

/// The same with a node that hangs (SIGSTOP) instead: reads wait out `timeout_ms`, the writer
/// behind waits for nothing the clients see, and no worker blocks on a full queue.
#[test]
fn a_hung_far_node_costs_misses_not_the_cache() {
    far_node_fails(true);
}

fn far_node_fails(hang: bool) {
    let mut node = NodeProc::start(&["--capacity", "256M"]);
    let url = format!("node://cache@{}?timeout_ms=200", node.addr);
    let ours = cache(&["--max", "8M", "--far", &url]);
    let n = 20_000u64;
    load::fill(ours.addr.parse().unwrap(), 0..n).unwrap();
    let t = std::time::Instant::now();
    while stat(&ours.addr, "far_writes") < n && t.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    if hang {
        let stopped = Command::new("kill")
            .args(["-STOP", &node.pid().to_string()])
            .status()
            .unwrap();
        assert!(stopped.success());
    } else {
        node.kill();
    }
    let mut s = std::net::TcpStream::connect(&ours.addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let (mut hits, mut misses) = (0, 0);
    for i in 0..n {
        s.write_all(format!("get {}\r\n", load::key(i)).as_bytes())
            .unwrap();
        let mut reply = Vec::new();
        let mut buf = [0u8; 8192];
        while !reply.ends_with(b"END\r\n") {
            let got = s
                .read(&mut buf)
                .expect("a reply while the far node is down");
            assert!(got > 0, "the cache closed the connection");
            reply.extend_from_slice(&buf[..got]);
        }
        if reply == b"END\r\n" {
            misses += 1;
        } else {
            let head = format!("VALUE {} 0 {}\r\n", load::key(i), load::VALUE_BYTES);
            assert!(reply.starts_with(head.as_bytes()), "key {i}");
            hits += 1;
        }
    }
    assert!(misses > 0, "every value was still local ({hits} hits)");
    assert!(stat(&ours.addr, "far_errors") > 0);
    assert!(
        stat(&ours.addr, "far_unavailable") > 0,
        "every miss waited on the dead node"
    );
    let reply = ask(
        &mut s,
        b"set fresh 0 0 2\r\nok\r\nget fresh\r\n",
        b"END\r\n",
    );
    assert_eq!(reply, b"STORED\r\nVALUE fresh 0 2\r\nok\r\nEND\r\n");
    assert!(
        stat(&ours.addr, "index_keys") > n / 2,
        "keys were dropped with the node"
    );
    // Sets go on with the writer stuck: their far copies are skipped, nothing waits.
    load::fill(ours.addr.parse().unwrap(), n..n + 2_000).unwrap();
    if hang {
        let _ = Command::new("kill")
            .args(["-CONT", &node.pid().to_string()])
            .status();
    }
}
