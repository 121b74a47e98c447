//! What the command line says to an operator on small things: statistics a store cannot count,
//! and a bad option value, each in words rather than Rust's debug output.

use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_tidepool");

#[test]
fn stats_print_numbers_not_options() {
    let out = Command::new(EXE)
        .args(["stats", "local:"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        !stdout.contains("Some(") && !stdout.contains("None"),
        "{stdout}"
    );
    let far = stdout
        .lines()
        .find(|l| l.starts_with("far_bytes"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(far.split_whitespace().nth(1), Some("0"), "{stdout}");
}

#[test]
fn a_bad_placement_names_every_choice() {
    let out = Command::new(EXE)
        .args(["bench", "pager", "--placement", "bogus"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for choice in ["auto", "split", "shared", "free"] {
        assert!(stderr.contains(choice), "{choice} missing: {stderr}");
    }
}

/// A password or token in a store URL appears in no message, whatever fails.
#[test]
fn secrets_in_store_urls_never_print() {
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Userfaultfd);
    let failing: [&[&str]; 10] = [
        &[
            "run",
            "--local",
            "64M",
            "--backend",
            "node://u:SECRET@127.0.0.1:1",
            "--",
            "true",
        ],
        &[
            "run",
            "--local",
            "64M",
            "--backend",
            "node://u@127.0.0.1:1?token=SECRET",
            "--",
            "true",
        ],
        &[
            "run",
            "--local",
            "64M",
            "--backend",
            "redis://:SECRET@127.0.0.1:1",
            "--",
            "true",
        ],
        &[
            "run",
            "--local",
            "64M",
            "--backend",
            "node://u:SECRET@no-port",
            "--",
            "true",
        ],
        &["stats", "memcached://u:SECRET@127.0.0.1:1"],
        &["demo", "--backend", "redis://:SECRET@127.0.0.1:1"],
        &[
            "stats",
            "redis+cluster://:SECRET@127.0.0.1:1,:SECRET@127.0.0.1:2",
        ],
        &[
            "run",
            "--local",
            "64M",
            "--backend",
            "node://u:SECRET@127.0.0.1:1?tls=1",
            "--",
            "true",
        ],
        &["demo", "--backend", "rediss://:SECRET@127.0.0.1:1/2"],
        &[
            "run",
            "--local",
            "64M",
            "--backend",
            "rediss://:SECRET@127.0.0.1:1?ca=/nonexistent/ca.pem",
            "--",
            "true",
        ],
    ];
    for args in failing {
        let out = Command::new(EXE).args(args).output().unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{args:?} succeeded: {all}");
        assert!(
            !all.contains("SECRET"),
            "{args:?} printed the secret: {all}"
        );
        assert!(all.contains("***"), "{args:?}: {all}");
    }
}

/// A redis-server on a free loopback port, with extra arguments; (process, port).
fn redis(extra: &[&str]) -> (std::process::Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = Command::new("redis-server")
        .args(["--port", &port.to_string()])
        .args(extra)
        .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server (scripts/setup installs it)");
    (server, port)
}

/// `redis://host:port/DB` selects that database; several hosts in a one-server URL are
/// explained.
#[test]
fn a_redis_database_number_is_used() {
    let (mut server, port) = redis(&[]);
    let url = format!("redis://127.0.0.1:{port}/3");
    let mut out = None;
    for _ in 0..50 {
        let o = Command::new(EXE)
            .args(["demo", "--backend", &url, "--size", "4M"])
            .output()
            .unwrap();
        if o.status.success() {
            out = Some(o);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let stats = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "commandstats"])
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    assert!(out.is_some(), "the demo never succeeded against {url}");
    let stats = String::from_utf8_lossy(&stats.stdout);
    assert!(stats.contains("cmdstat_select"), "{stats}");

    let out = Command::new(EXE)
        .args(["stats", "redis://127.0.0.1:1,127.0.0.1:2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("one server") && err.contains("redis+cluster://"),
        "{err}"
    );
}

/// A wrong Redis password is reported as such, not as an unreachable server.
#[test]
fn a_wrong_redis_password_says_so() {
    let (mut server, port) = redis(&["--requirepass", "right-one"]);
    let url = format!("redis://:WRONG-SECRET@127.0.0.1:{port}");
    let mut all = String::new();
    for _ in 0..50 {
        let out = Command::new(EXE).args(["stats", &url]).output().unwrap();
        all = String::from_utf8_lossy(&out.stderr).into_owned();
        if !all.contains("cannot reach") {
            break; // up and answering
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = server.kill();
    let _ = server.wait();
    assert!(all.contains("refused the password"), "{all}");
    assert!(!all.contains("WRONG-SECRET"), "{all}");
}
