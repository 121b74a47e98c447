//! `/metrics` over real HTTP from an in-process node, and a shutdown that does not wait for a
//! scraper's idle keep-alive connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use tidepool_node::{NodeConfig, Server};

/// One `GET path` on a kept-alive connection: status line, headers, body.
fn get(conn: &mut BufReader<TcpStream>, path: &str) -> (String, Vec<String>, String) {
    write!(
        conn.get_mut(),
        "GET {path} HTTP/1.1\r\nHost: node\r\nConnection: keep-alive\r\n\r\n"
    )
    .unwrap();
    let mut status = String::new();
    conn.read_line(&mut status).unwrap();
    let mut headers = vec![];
    let mut length = 0;
    loop {
        let mut h = String::new();
        conn.read_line(&mut h).unwrap();
        let h = h.trim_end().to_string();
        if h.is_empty() {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
        headers.push(h);
    }
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).unwrap();
    (status, headers, String::from_utf8(body).unwrap())
}

#[test]
fn metrics_are_served_and_shutdown_does_not_wait_for_idle_scrapers() {
    let cfg = NodeConfig::new("127.0.0.1:0", 16 << 20)
        .metrics("127.0.0.1:0".parse().unwrap())
        .io_threads(2);
    let server = Server::start(cfg).unwrap();
    let addr = server.metrics_addr().expect("metrics address");
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut conn = BufReader::new(stream);
    let (status, headers, body) = get(&mut conn, "/metrics");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(
        headers
            .iter()
            .any(|h| h.to_ascii_lowercase().contains("openmetrics-text")),
        "{headers:?}"
    );
    assert!(
        body.contains("# TYPE tidepool_node_requests counter"),
        "{body}"
    );
    assert!(body.contains("tidepool_node_connections 0"), "{body}");
    assert!(
        body.contains("tidepool_node_max_outstanding_bytes 4194304"),
        "{body}"
    );
    assert_eq!(body, server.metrics_text());
    let (status, _, _) = get(&mut conn, "/elsewhere");
    assert!(status.starts_with("HTTP/1.1 404"), "{status}");
    // The connection stays open, idle: shutdown must still return.
    server.shutdown();
    assert!(TcpStream::connect(addr).is_err(), "metrics still served");
}
