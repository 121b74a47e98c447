//! Process life of the servers: SIGTERM and SIGINT stop `tidepool node` and `tidepool coord` in
//! order, with a last line and exit status 0; both start again at once on the same address or
//! socket, and a coordinator killed outright leaves a socket file the next one replaces.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const EXE: &str = env!("CARGO_BIN_EXE_tidepool");

/// Starts `tidepool ARGS` and returns it with its first line of output.
fn start(args: &[&str]) -> (Child, String) {
    let mut child = Command::new(EXE)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("listening"), "{args:?}: {line:?}");
    (child, line)
}

/// Sends `signal` and returns the exit status's code and what the process said on stderr.
fn stop(mut child: Child, signal: &str) -> (Option<i32>, String) {
    let ok = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    (status.code(), err)
}

#[test]
fn a_node_stops_on_sigterm_and_sigint_and_starts_again_on_its_address() {
    let (node, line) = start(&["node", "--listen", "127.0.0.1:0", "--capacity", "64M"]);
    let addr = line
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .unwrap()
        .to_string();
    // A client holding a connection does not keep the node from stopping.
    let _client = std::net::TcpStream::connect(&addr).unwrap();
    let (code, err) = stop(node, "-TERM");
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("SIGTERM") && err.contains("stopped"), "{err}");
    // RUST_LOG=info logs, and a log that is not a terminal carries no colour codes.
    assert!(err.contains("INFO"), "{err}");
    assert!(!err.contains('\x1b'), "{err:?}");
    let (node, _) = start(&["node", "--listen", &addr, "--capacity", "64M"]);
    let (code, err) = stop(node, "-INT");
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("SIGINT"), "{err}");
}

#[test]
fn a_coordinator_stops_on_sigterm_and_its_socket_is_reused() {
    let dir = std::env::temp_dir().join(format!("tp-life-{}", std::process::id()));
    let socket = dir.join("coord.sock");
    let s = socket.to_str().unwrap();
    let (coord, _) = start(&["coord", "--socket", s, "--http", "127.0.0.1:0"]);
    assert!(dir.join("coord.token").exists());
    let (code, err) = stop(coord, "-TERM");
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("stopped"), "{err}");
    assert!(!socket.exists(), "the socket file is left behind");
    assert!(
        !dir.join("coord.token").exists(),
        "the token it made is left behind"
    );
    // Killed outright, it leaves the file; the next one finds nobody answering and replaces it.
    let (coord, _) = start(&["coord", "--socket", s]);
    let (code, _) = stop(coord, "-KILL");
    assert_eq!(code, None);
    assert!(socket.exists());
    let (coord, _) = start(&["coord", "--socket", s]);
    let (code, err) = stop(coord, "-TERM");
    assert_eq!(code, Some(0), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
