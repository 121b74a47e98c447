//! `tidepool run` end to end: unmodified programs (python3, sh, the tidepool binary itself) with
//! their heap paged over every backend, started for real; the backend lost mid-run; fork (see
//! also `fork.rs`); the budget changed while the program runs.

mod common;

use common::{preload, python3, text, verify_job, NodeProc};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// `tidepool run --local LOCAL --backend BACKEND --stats -- PROGRAM...`, not yet started.
fn tidepool_run(local: &str, backend: &str, program: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tidepool"));
    cmd.args([
        "run",
        "--local",
        local,
        "--backend",
        backend,
        "--stats",
        "--",
    ])
    .args(program)
    .env("TIDEPOOL_PRELOAD", preload());
    cmd
}

/// The pager's statistics line "moved ... resident X of Y MiB": (X, Y).
fn resident_of(stats: &str) -> Option<(f64, f64)> {
    let line = stats.lines().rev().find(|l| l.contains("resident"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|&w| w == "resident")?;
    Some((
        words.get(at + 1)?.parse().ok()?,
        words.get(at + 3)?.parse().ok()?,
    ))
}

const DICT_SCRIPT: &str = r#"
d = {}
for i in range(3_000_000):
    d["key-%d" % i] = "value-%d-%s" % (i, "x" * (i % 17))
print(len(d), sum(len(k) + len(v) for k, v in d.items()))
"#;

#[test]
fn python_dict_of_three_million_strings_matches_native() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let native = Command::new(python3())
        .args(["-c", DICT_SCRIPT])
        .output()
        .unwrap();
    assert!(native.status.success());
    let paged = tidepool_run("256M", "local:", &[python3(), "-c", DICT_SCRIPT])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&paged);
    assert!(paged.status.success(), "{}: {stderr}", paged.status);
    assert_eq!(stdout, String::from_utf8_lossy(&native.stdout));
    // The heap really went far: the dict is well over 256 MiB.
    let read = stderr
        .lines()
        .find(|l| l.starts_with("moved"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|mib| mib.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no statistics: {stderr}"));
    assert!(
        read > 50.0,
        "only {read} MiB came back from far memory: {stderr}"
    );
}

#[test]
fn exit_status_passes_through_and_bad_input_is_refused_before_the_program_runs() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let out = tidepool_run("64M", "local:", &["sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));

    let marker = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ran-anyway");
    let _ = std::fs::remove_file(&marker);
    let touch = format!("touch {}", marker.display());
    let out = tidepool_run("64M", "redis://127.0.0.1:1", &["sh", "-c", &touch])
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("redis://127.0.0.1:1"), "{stderr}");
    assert!(!marker.exists(), "the program ran with an unusable store");

    let out = tidepool_run("64M", "local:", &["/no/such/program"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).1.contains("/no/such/program"));

    let out = tidepool_run("100K", "local:", &["true"]).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out).1.contains("too small"));
}

/// The verification workload inside the tidepool binary (an ordinary Rust program: its heap
/// comes from malloc), 64 MiB over an 8 MiB budget, two threads, every byte checked. Returns
/// its standard output and error.
fn verify_under(backend: &str) -> (String, String) {
    let [sub, job] = verify_job(64 << 20, 3, false);
    let out = tidepool_run("8M", backend, &[env!("CARGO_BIN_EXE_tidepool"), &sub, &job])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "{backend}: {}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains(", 0 wrong words"),
        "{backend}: {stdout}\n{stderr}"
    );
    // Pages went to the backend and came back.
    assert!(
        stderr.contains(&format!(
            "far store {}",
            backend.split("://").next().unwrap()
        )),
        "{backend}: {stderr}"
    );
    let fetched = stderr
        .lines()
        .find(|l| l.starts_with("faults"))
        .and_then(|l| l.split(',').nth(1))
        .and_then(|part| part.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(fetched > 1000, "{backend}: few pages came back: {stderr}");
    // Where a far fetch's time went, by stage: a node's fetches spend it reading the store.
    let line = stderr
        .lines()
        .find(|l| l.starts_with("far fetch"))
        .unwrap_or_else(|| panic!("{backend}: no far-fetch timing: {stderr}"));
    let us_after = |what: &str| -> f64 {
        line.split(what)
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{backend}: no '{what}' in {line}"))
    };
    assert!(us_after("handler time p50") > 0.0, "{line}");
    if backend.starts_with("node://") {
        assert!(us_after("store read p50") > 0.0, "{line}");
        // A part of each fetch's time, so no more than the whole at the median.
        assert!(
            us_after("store read p50") <= us_after("handler time p50"),
            "{line}"
        );
    }
    // What the misses cost the CPUs: the handlers' sleeps and the machine's interrupts.
    let cpu = stderr
        .lines()
        .find(|l| l.starts_with("cpu "))
        .unwrap_or_else(|| panic!("{backend}: no cpu line: {stderr}"));
    assert!(cpu.contains("handlers slept"), "{cpu}");
    assert!(cpu.contains("TLB-shootdown"), "{cpu}");
    (stdout, stderr)
}

#[test]
fn verification_workload_under_the_local_store() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    verify_under("local:");
}

#[test]
fn verification_workload_under_a_memory_node() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let node = NodeProc::start(&["--capacity", "256M"]);
    verify_under(&format!("node://verify@{}", node.addr));
}

#[test]
fn verification_workload_under_a_tls_memory_node() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let certs = tidepool_peers::tls::TestCerts::generate().unwrap();
    let (cert, key) = (certs.cert(), certs.key());
    let node = NodeProc::start(&[
        "--capacity",
        "256M",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    assert!(node.announced.contains("TLS only"), "{}", node.announced);
    let (stdout, stderr) = verify_under(&format!(
        "node://verify:s3cret-token@{}?tls=1&ca={}",
        node.addr,
        certs.ca().display()
    ));
    assert!(
        !stdout.contains("s3cret-token") && !stderr.contains("s3cret-token"),
        "{stderr}"
    );
}

#[test]
fn verification_workload_under_redis() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let redis = tidepool_peers::RedisServer::start().expect("redis-server");
    verify_under(&redis.url());
}

#[test]
fn verification_workload_under_redis_cluster() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let cluster = tidepool_peers::RedisCluster::start(3).expect("redis cluster");
    verify_under(&cluster.url());
}

/// Three masters and three replicas (real redis-server processes): SIGKILL a master while the
/// program pages to the cluster, and the program rides out the failover (its calls retry on a
/// fresh slot map until the replica takes over) and finishes with every byte right. With
/// `wait=1` every write was on the replica before it was acknowledged, so none is lost.
#[test]
fn a_program_rides_out_a_redis_cluster_failover() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let mut cluster =
        tidepool_peers::RedisCluster::start_with_replicas(3, 1, 1000).expect("redis cluster");
    let master = (0..6).find(|&i| cluster.is_master(i)).expect("a master");
    let mut child = start_waiting_worker("2M", &format!("{}?wait=1", cluster.url()), 12 << 20, 6);
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the program ended before the kill"
    );
    cluster.kill(master);
    expect_every_byte(child);
    // Its replica is the master now.
    assert!(
        (0..6)
            .filter(|&i| i != master && cluster.is_master(i))
            .count()
            == 3,
        "no replica took over"
    );
}

#[test]
fn verification_workload_under_memcached() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let memcached = tidepool_peers::Memcached::start(256).expect("memcached");
    verify_under(&memcached.url());
}

/// Starts the verification worker under `tidepool run`, with `wait`: it stops after the first
/// round until a line arrives on its standard input. Returns once it said "filled".
/// Lets a waiting worker go after its far store was lost, and checks that it stopped with
/// the pager's exit status; returns its standard output and error.
fn go_and_expect_a_stop(mut child: Child) -> (String, String) {
    // The pager may find the store gone (writing back the fill) and stop the program before
    // it reads this: a broken pipe here is one of the outcomes under test.
    let _ = child.stdin.as_mut().unwrap().write_all(b"go\n");
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(tidepool_pager::FATAL_EXIT_CODE),
        "{stdout}\n{stderr}"
    );
    (stdout, stderr)
}

/// Waits for a verification worker and expects it to have finished with every byte right;
/// returns its output.
fn expect_every_byte(child: Child) -> (String, String) {
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains(", 0 wrong words"), "{stdout}\n{stderr}");
    (stdout, stderr)
}

fn start_waiting_worker(local: &str, backend: &str, bytes: usize, rounds: u64) -> Child {
    let [sub, job] = verify_job(bytes, rounds, true);
    let mut child = tidepool_run(
        local,
        backend,
        &[env!("CARGO_BIN_EXE_tidepool"), &sub, &job],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "filled", "worker did not start");
    child
}

#[test]
fn losing_the_backend_stops_the_program_with_a_clear_error_never_zeros() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let mut node = NodeProc::start(&["--capacity", "256M"]);
    let backend = format!("node://loss@{}", node.addr);
    let child = start_waiting_worker("4M", &backend, 64 << 20, 1000);
    node.kill();
    let (stdout, stderr) = go_and_expect_a_stop(child);
    assert!(stderr.contains("unreachable"), "{stderr}");
    assert!(
        stderr.contains(&node.addr),
        "the message names the store: {stderr}"
    );
    assert!(
        !stdout.contains("wrong words"),
        "the program went on: {stdout}"
    );
}

/// Three memory nodes keeping each page twice: SIGKILL one while the program runs and it
/// finishes with every byte right; lose two and it stops with exit 70 naming them.
#[test]
fn a_program_outlives_a_killed_memory_node_when_pages_are_kept_twice() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let mut nodes: Vec<NodeProc> = (0..3)
        .map(|_| NodeProc::start(&["--capacity", "256M"]))
        .collect();
    let addrs: Vec<&str> = nodes.iter().map(|n| n.addr.as_str()).collect();
    let backend = format!("node://twice@{}?replicas=2", addrs.join(","));
    let mut child = start_waiting_worker("4M", &backend, 64 << 20, 3);
    let killed = nodes[1].addr.clone();
    nodes[1].kill();
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let (_, stderr) = expect_every_byte(child);
    assert!(
        stderr.contains(&format!("memory node {killed} is down")),
        "{stderr}"
    );
    // The statistics (as `tidepool status` shows them) say which node is down.
    assert!(
        stderr.contains(&format!(
            "store        2 of 3 memory nodes up (replicas=2); down: {killed}"
        )),
        "{stderr}"
    );

    // A second loss leaves pages with no copy: the program stops, never reads zeros.
    let child = start_waiting_worker(
        "4M",
        &backend.replace(&format!("{killed},"), ""),
        64 << 20,
        1000,
    );
    let (a, b) = (nodes[0].addr.clone(), nodes[2].addr.clone());
    nodes[0].kill();
    nodes[2].kill();
    let (stdout, stderr) = go_and_expect_a_stop(child);
    assert!(stderr.contains(&a) && stderr.contains(&b), "{stderr}");
    assert!(
        !stdout.contains("wrong words"),
        "the program went on: {stdout}"
    );
}

/// A seed for the random kills, printed so a failure can be replayed with TIDEPOOL_TEST_SEED.
fn kill_seed() -> u64 {
    let seed = std::env::var("TIDEPOOL_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("random kills: TIDEPOOL_TEST_SEED={seed}");
    seed
}

fn six_nodes() -> (Vec<NodeProc>, String) {
    let nodes: Vec<NodeProc> = (0..6)
        .map(|_| NodeProc::start(&["--capacity", "256M"]))
        .collect();
    let addrs: Vec<&str> = nodes.iter().map(|n| n.addr.as_str()).collect();
    let joined = addrs.join(",");
    (nodes, joined)
}

/// Pages erasure-coded 4+2 over six memory nodes; one or two nodes SIGKILLed at random moments
/// while the program runs, 20 kills in all: every byte comes back right every time.
#[test]
fn a_program_keeps_every_byte_through_twenty_random_node_kills() {
    use rand::{Rng, SeedableRng};
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let mut rng = rand::rngs::StdRng::seed_from_u64(kill_seed());
    let mut kills = 0;
    while kills < 20 {
        let (mut nodes, addrs) = six_nodes();
        let mut child =
            start_waiting_worker("2M", &format!("node://ec@{addrs}?ec=4+2"), 12 << 20, 4);
        child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let mut victims: Vec<usize> = (0..6).collect();
        for _ in 0..rng.gen_range(1..=2) {
            std::thread::sleep(std::time::Duration::from_millis(rng.gen_range(0..400)));
            if child.try_wait().unwrap().is_some() {
                break;
            }
            let v = victims.swap_remove(rng.gen_range(0..victims.len()));
            nodes[v].kill();
            kills += 1;
        }
        expect_every_byte(child);
    }
}

/// Far vectors erasure-coded 4+2: nodes SIGKILLed at random points of a random read-write
/// workload (20 kills in all), and every element matches a local copy after each.
#[test]
fn far_vectors_keep_every_element_through_twenty_random_node_kills() {
    use rand::{Rng, SeedableRng};
    use tidepool_far::{Far, FarVec, Section, SectionConfig, Structure};
    let mut rng = rand::rngs::StdRng::seed_from_u64(kill_seed());
    let mut kills = 0;
    while kills < 20 {
        let (mut nodes, addrs) = six_nodes();
        let far = Far::new(tidepool_store::open(&format!("node://ec@{addrs}?ec=4+2")).unwrap());
        // 1 MiB of elements through a 32 KiB cache: nearly every access goes far.
        let section = Section::new(SectionConfig::new(
            Structure::SetAssociative(2),
            4096,
            32 << 10,
        ))
        .unwrap();
        let len = 128 << 10;
        let v: FarVec<u64> = FarVec::new(&far, &section, len).unwrap();
        let mut shadow = vec![0u64; len];
        let mut victims: Vec<usize> = (0..6).collect();
        let losses = rng.gen_range(1..=2);
        let kill_at: Vec<usize> = (0..losses).map(|_| rng.gen_range(0..3_000)).collect();
        for op in 0..3_000 {
            if kill_at.contains(&op) && victims.len() > 4 {
                let n = victims.swap_remove(rng.gen_range(0..victims.len()));
                nodes[n].kill();
                kills += 1;
            }
            let i = rng.gen_range(0..len);
            if rng.gen_bool(0.5) {
                let x = rng.gen::<u64>();
                v.set(i, x).unwrap();
                shadow[i] = x;
            } else {
                assert_eq!(
                    v.get(i).unwrap(),
                    shadow[i],
                    "element {i} after {kills} kills"
                );
            }
        }
        for (i, want) in shadow.iter().enumerate() {
            assert_eq!(v.get(i).unwrap(), *want, "element {i} after {kills} kills");
        }
    }
}

/// `tidepool add-node` gives a running program's store a node in place of one it lost; the
/// program finishes with every byte right and its statistics count the new node.
#[test]
fn a_node_added_to_a_running_program_takes_the_lost_ones_share() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let (mut nodes, addrs) = six_nodes();
    let mut child = start_waiting_worker("2M", &format!("node://ec@{addrs}?ec=4+2"), 12 << 20, 4);
    let pid = child.id().to_string();
    nodes[3].kill();
    let extra = NodeProc::start(&["--capacity", "256M"]);
    let tidepool = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tidepool"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = tidepool(&["add-node", &pid, &extra.addr]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("memory node {} added", extra.addr)),
        "{stdout}"
    );
    let out = tidepool(&["add-node", &pid, &extra.addr]);
    let (_, stderr) = text(&out);
    assert!(
        !out.status.success() && stderr.contains("already one of"),
        "{stderr}"
    );
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let (_, stderr) = expect_every_byte(child);
    assert!(
        stderr.contains("6 of 7 memory nodes up (ec=4+2)"),
        "{stderr}"
    );
    drop(nodes);
}

/// Three losses where 4+2 survives two: the program stops with exit 70 naming the nodes.
#[test]
fn losing_more_nodes_than_the_code_survives_stops_the_program_naming_them() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let (mut nodes, addrs) = six_nodes();
    let child = start_waiting_worker("4M", &format!("node://ec@{addrs}?ec=4+2"), 32 << 20, 1000);
    let lost: Vec<String> = [0, 2, 4].iter().map(|&i| nodes[i].addr.clone()).collect();
    for i in [0, 2, 4] {
        nodes[i].kill();
    }
    let (stdout, stderr) = go_and_expect_a_stop(child);
    for a in &lost {
        assert!(stderr.contains(a.as_str()), "{a} not named: {stderr}");
    }
    assert!(
        !stdout.contains("wrong words"),
        "the program went on: {stdout}"
    );
}

#[test]
fn resize_while_running_evicts_at_once_and_keeps_every_byte() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let mut child = start_waiting_worker("256M", "local:", 64 << 20, 3);
    let pid = child.id().to_string();
    let tidepool = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tidepool"))
            .args(args)
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "tidepool {args:?}: {stderr}");
        stdout
    };
    let before = resident_of(&tidepool(&["status", &pid])).unwrap();
    assert!(
        before.0 > 60.0,
        "the working set is not local yet: {before:?}"
    );
    // Another user may not resize it (its control socket has no file mode to guard it: the
    // kernel's word on who connected does).
    if let Some(why) = tidepool_sys::probe::Need::Root.missing() {
        eprintln!("skipped the other-user check: it needs {why}");
    } else {
        use std::os::unix::process::CommandExt;
        let out = Command::new(env!("CARGO_BIN_EXE_tidepool"))
            .args(["resize", &pid, "8M"])
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let (_, stderr) = text(&out);
        assert!(
            !out.status.success() && stderr.contains("refused"),
            "{stderr}"
        );
        assert_eq!(resident_of(&tidepool(&["status", &pid])).unwrap().1, 256.0);
    }
    assert!(tidepool(&["resize", &pid, "8M"]).contains("8.0 MiB"));
    // The evictor works in the background: wait until it is done (no time limit here, the
    // test harness has one).
    loop {
        let now = resident_of(&tidepool(&["status", &pid])).unwrap();
        assert_eq!(now.1, 8.0);
        if now.0 <= 8.5 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains(", 0 wrong words"), "{stdout}");
    let (_, budget) = resident_of(&stderr).unwrap();
    assert_eq!(budget, 8.0, "{stderr}");
}

const FORK_SCRIPT: &str = r#"
import os, subprocess, sys
data = ["item-%d-%s" % (i, "y" * (i % 13)) for i in range(1_500_000)]
expected = sum(len(s) for s in data)
# fork + exec, as subprocess does: the usual case, and it must work.
out = subprocess.run(["sh", "-c", "echo child ran"], capture_output=True, text=True)
print(out.stdout.strip(), out.returncode)
# A forked child that reads the parent's data (far pages included) reads it right.
pid = os.fork()
if pid == 0:
    os._exit(0 if sum(len(s) for s in data) == expected else 1)
_, status = os.waitpid(pid, 0)
print("child status", os.waitstatus_to_exitcode(status))
print("parent", sum(len(s) for s in data) == expected)
"#;

#[test]
fn a_forked_python_child_reads_its_parents_data_and_the_parent_is_untouched() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let out = tidepool_run("32M", "local:", &[python3(), "-c", FORK_SCRIPT])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{}: {stdout}\n{stderr}", out.status);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "child ran 0", "{stdout}\n{stderr}");
    assert_eq!(lines[1], "child status 0", "{stdout}\n{stderr}");
    assert_eq!(lines[2], "parent True", "{stdout}\n{stderr}");
}

/// A program the pager cannot serve is refused before it runs, with the reason; with
/// --allow-unpaged it runs (unpaged).
#[test]
fn static_scripts_and_set_user_id_programs_are_refused_unless_allowed() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let src = dir.join("hello.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\nint main(void){puts(\"ran\");return 0;}\n",
    )
    .unwrap();
    let stat = dir.join("hello-static");
    let status = Command::new("cc")
        .args(["-static", "-o"])
        .arg(&stat)
        .arg(&src)
        .status()
        .unwrap();
    assert!(status.success(), "cc -static");
    // A static program itself runs, loaded by `tidepool` (tests/static_programs.rs pages them).
    let out = tidepool_run("64M", "local:", &[stat.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(text(&out).0, "ran\n");
    // A script whose interpreter is static is refused: the kernel would start the interpreter.
    let script = dir.join("hello-script");
    std::fs::write(&script, format!("#!{}\n", stat.display())).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = tidepool_run("64M", "local:", &[script.to_str().unwrap()])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stdout.is_empty(), "it ran: {stdout}");
    assert!(stderr.contains("statically linked"), "{stderr}");
    assert!(stderr.contains("--allow-unpaged"), "{stderr}");

    let mut allowed = Command::new(env!("CARGO_BIN_EXE_tidepool"));
    allowed
        .args(["run", "--local", "64M", "--allow-unpaged", "--"])
        .arg(&script)
        .env("TIDEPOOL_PRELOAD", preload());
    let out = allowed.output().unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(text(&out).0, "ran\n");

    // Set-user-ID for another user: the loader would ignore LD_PRELOAD. (Only root can make
    // one for another user; elsewhere this part has nothing to test.)
    let dynamic = dir.join("hello-suid");
    let status = Command::new("cc")
        .arg("-o")
        .arg(&dynamic)
        .arg(&src)
        .status()
        .unwrap();
    assert!(status.success());
    let owned_by_nobody = Command::new("chown")
        .arg("nobody")
        .arg(&dynamic)
        .status()
        .is_ok_and(|s| s.success());
    if owned_by_nobody {
        std::fs::set_permissions(
            &dynamic,
            std::os::unix::fs::PermissionsExt::from_mode(0o4755),
        )
        .unwrap();
        let out = tidepool_run("64M", "local:", &[dynamic.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(text(&out).1.contains("set-user-ID"), "{:?}", text(&out));
    } else {
        eprintln!("skipped the set-user-ID part: cannot chown a file to nobody (not root)");
    }
}

/// A node that stops answering (SIGSTOP: up, connected, silent) is found by the URL's deadline:
/// the program stops with exit 70 and says why, rather than hang or read zeros.
#[test]
fn a_silent_node_stops_the_program_at_its_deadline() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let mut node = NodeProc::start(&["--capacity", "256M"]);
    let backend = format!("node://deadline@{}?timeout_ms=1500", node.addr);
    // Round 0 fills and checks; round 1, after "go", reads the far pages back.
    let mut child = start_waiting_worker("24M", &backend, 96 << 20, 2);
    let pid = node.pid().to_string();
    let signal = |sig: &str| {
        assert!(Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success());
    };
    signal("-STOP");
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    // Liveness, not speed: a hang would never end, so give up after a minute.
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    signal("-CONT");
    let Some(status) = status else {
        let _ = child.kill();
        panic!("the program hung on a silent node");
    };
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(status.code(), Some(70), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("did not respond within 1.5s"),
        "the message says why: {stderr}"
    );
    assert!(!stdout.contains("wrong words"), "it went on: {stdout}");
    assert!(node.alive());
}

/// The number after `word` in the pager's `follow` line, if the pager followed the program.
fn follow_count(stats: &str, before: &str) -> Option<u64> {
    let line = stats.lines().find(|l| l.starts_with("follow"))?;
    let at = line.find(before)?;
    line[..at].split_whitespace().last()?.parse().ok()
}

/// A single-threaded C program that hops between CPUs every few faults: the pager reads its
/// CPU at each fault (its rseq area) and moves the one reader with it at once, not after the
/// /proc looks every 64 faults (which would move it a few times in the whole run).
#[test]
fn the_one_reader_follows_a_program_hopping_between_cpus_at_its_first_fault() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let cpus = tidepool_sys::online_cpus().min(2);
    if cpus < 2 {
        eprintln!("one CPU: nothing to follow");
        return;
    }
    let hops = common::c_program("hops", &[]);
    let args = ["64", "40", "8", &cpus.to_string()];
    let native = Command::new(&hops).args(args).output().unwrap();
    assert!(native.status.success());
    let mut paged = tidepool_run("16M", "local:?compress=none", &[]);
    paged.arg(&hops).args(args);
    let paged = common::output_within(&mut paged, std::time::Duration::from_secs(120));
    let (stdout, stderr) = text(&paged);
    assert!(paged.status.success(), "{}: {stderr}", paged.status);
    assert_eq!(stdout, String::from_utf8_lossy(&native.stdout), "{stderr}");
    // Following needs the right to leave SCHED_IDLE; without it there is no follow line.
    let Some(moves) = follow_count(&stderr, "times with the program") else {
        return;
    };
    // A busy machine (other tests beside) may make every handler read for a while, and then
    // nobody follows: only a run without fallbacks says how the reader follows.
    let fallbacks = follow_count(&stderr, "times for a reader kept off").unwrap_or(0)
        + follow_count(&stderr, "times for threads faulting").unwrap_or(0)
        + follow_count(&stderr, "times off a busy CPU").unwrap_or(0);
    if fallbacks == 0 {
        assert!(
            moves >= 20,
            "40 hops, the reader moved {moves} times: {stderr}"
        );
    }
}
