//! Operating a memory node: `tidepool node --metrics` serves Prometheus text with the counts of
//! what clients did, and `--max-outstanding` bounds what a client that never reads its answers
//! can make the node hold, while other clients are served.

mod common;

use bytes::{Bytes, BytesMut};
use common::NodeProc;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tidepool_proto::{decode_response, Request, Response, MAX_BODY};
use tidepool_store::NodeClient;

fn scrape(node: &NodeProc) -> String {
    let resp = ureq::get(&node.metrics_url()).call().expect("GET /metrics");
    assert!(
        resp.content_type().contains("openmetrics-text"),
        "{}",
        resp.content_type()
    );
    resp.into_string().unwrap()
}

/// The value of the sample `series` (name and labels exactly as rendered).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().expect("a number"))
}

fn must(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
}

/// Every line is a comment or `name{labels} value` on one line, every counter's samples end in
/// `_total`, and the text ends with `# EOF`.
fn check_exposition(text: &str) {
    assert!(text.ends_with("# EOF\n"), "{text}");
    let mut counters = vec![];
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            if kind == "counter" {
                counters.push(name.to_string());
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line:?}"));
        value
            .parse::<f64>()
            .unwrap_or_else(|_| panic!("value of {line:?}"));
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line:?}"
        );
        if series.contains('{') {
            assert!(series.ends_with('}'), "{line:?}");
        }
        if let Some(c) = counters.iter().find(|c| name.starts_with(c.as_str())) {
            assert_eq!(name, format!("{c}_total"), "{line:?}");
        }
    }
    assert!(!counters.is_empty());
}

#[test]
fn metrics_count_what_clients_did() {
    let dir = std::env::temp_dir().join(format!("tp-node-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens.toml");
    // A tenant name with a double quote and a newline: label values must be escaped.
    std::fs::write(
        &tokens,
        "[[tenant]]\nname = \"we\\\"b\\nx\"\ntoken = \"s3cret\"\nquota = \"8M\"\n",
    )
    .unwrap();
    let node = NodeProc::start(&[
        "--capacity",
        "64M",
        "--tokens",
        tokens.to_str().unwrap(),
        "--metrics",
        "127.0.0.1:0",
    ]);
    let tenant = "we\"b\nx";
    assert!(NodeClient::connect(&node.addr, tenant, "wrong").is_err());
    let c = NodeClient::connect(&node.addr, tenant, "s3cret").unwrap();
    let data = Bytes::from(vec![7u8; 4096]);
    let handles: Vec<_> = (0..3).map(|_| c.put(data.clone()).unwrap()).collect();
    for h in handles.iter().chain(&handles[..2]) {
        assert_eq!(c.get(*h).unwrap(), data);
    }
    c.free(handles[0]).unwrap();
    assert!(
        c.get(handles[0]).is_err(),
        "a freed object's handle is stale"
    );

    // The refused connection's close reaches the node in its own time.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = scrape(&node);
        if must(&text, "tidepool_node_connections") == 1.0 {
            break text;
        }
        assert!(Instant::now() < deadline, "{text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    check_exposition(&text);
    for (series, want) in [
        (r#"tidepool_node_requests_total{op="hello"}"#, 2.0),
        (r#"tidepool_node_requests_total{op="put"}"#, 3.0),
        (r#"tidepool_node_requests_total{op="get"}"#, 6.0),
        (r#"tidepool_node_requests_total{op="free"}"#, 1.0),
        (r#"tidepool_node_requests_total{op="get_many"}"#, 0.0),
        (r#"tidepool_node_errors_total{kind="auth_failed"}"#, 1.0),
        (r#"tidepool_node_errors_total{kind="stale_handle"}"#, 1.0),
        ("tidepool_node_auth_failures_total", 1.0),
        ("tidepool_node_connections_accepted_total", 2.0),
        ("tidepool_node_connections", 1.0),
        ("tidepool_node_request_duration_seconds_count", 12.0),
        (
            r#"tidepool_node_request_duration_seconds_bucket{le="+Inf"}"#,
            12.0,
        ),
        (
            r#"tidepool_node_tenant_stored_bytes{tenant="we\"b\nx"}"#,
            8192.0,
        ),
        (
            r#"tidepool_node_tenant_quota_bytes{tenant="we\"b\nx"}"#,
            (8 << 20) as f64,
        ),
        (r#"tidepool_node_tenant_objects{tenant="we\"b\nx"}"#, 2.0),
    ] {
        assert_eq!(must(&text, series), want, "{series} in:\n{text}");
    }
    // Requests went over the wire both ways, more than their payloads.
    assert!(must(&text, "tidepool_node_received_bytes_total") > 3.0 * 4096.0);
    assert!(must(&text, "tidepool_node_sent_bytes_total") > 5.0 * 4096.0);
    // Buckets are cumulative, from 5 us to 100 ms.
    let first = must(
        &text,
        r#"tidepool_node_request_duration_seconds_bucket{le="0.000005"}"#,
    );
    let last = must(
        &text,
        r#"tidepool_node_request_duration_seconds_bucket{le="0.1"}"#,
    );
    assert!(first <= last && last <= 12.0, "{text}");
    assert!(must(&text, "tidepool_node_request_duration_seconds_sum") > 0.0);
    let build = format!(
        r#"tidepool_build_info{{version="{}",commit="{}"}}"#,
        tidepool_proto::build::VERSION,
        tidepool_proto::build::COMMIT
    );
    assert_eq!(must(&text, &build), 1.0, "{text}");
    assert!(!text.contains("s3cret"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hello, then a 4 KiB put on a raw connection: the handle of the object.
fn raw_client(addr: &str) -> (TcpStream, tidepool_proto::Handle) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = BytesMut::new();
    Request::Hello {
        tenant: "slow".into(),
        token: String::new(),
        session: 0,
        store: String::new(),
    }
    .encode(0, &mut out);
    Request::Put {
        data: Bytes::from(vec![1u8; 4096]),
    }
    .encode(1, &mut out);
    s.write_all(&out).unwrap();
    let mut inbuf = BytesMut::new();
    let mut answers = vec![];
    while answers.len() < 2 {
        if let Some((_, r)) = decode_response(&mut inbuf, MAX_BODY).unwrap() {
            answers.push(r);
            continue;
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "the node closed the connection");
        inbuf.extend_from_slice(&chunk[..n]);
    }
    match answers.pop() {
        Some(Response::Handle(h)) => (s, h),
        other => panic!("put answered {other:?}"),
    }
}

#[test]
fn a_client_that_never_reads_is_held_to_max_outstanding_and_others_are_served() {
    const CAP: f64 = (256 << 10) as f64;
    const GETS: usize = 40_000; // 160 MiB of answers
                                // One I/O thread: the stuck connection and the healthy one share a worker.
    let node = NodeProc::start(&[
        "--capacity",
        "64M",
        "--io-threads",
        "1",
        "--max-outstanding",
        "256K",
        "--metrics",
        "127.0.0.1:0",
    ]);
    let (stuck, handle) = raw_client(&node.addr);
    let mut writer = stuck.try_clone().unwrap();
    writer
        .set_write_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let sender = std::thread::spawn(move || {
        let mut frames = BytesMut::new();
        for i in 0..GETS {
            Request::Get { handle }.encode(2 + i as u64, &mut frames);
        }
        // Blocks once the node stops reading, then times out: nobody reads the answers.
        let _ = writer.write_all(&frames);
    });

    let gets = |text: &str| must(text, r#"tidepool_node_requests_total{op="get"}"#);
    // Wait until the node has stopped serving the stuck client (bounded: 20 s).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = -1.0;
    let mut steady_since = Instant::now();
    let text = loop {
        let text = scrape(&node);
        let now = gets(&text);
        if now != last {
            last = now;
            steady_since = Instant::now();
        } else if steady_since.elapsed() > Duration::from_millis(500) {
            break text;
        }
        assert!(Instant::now() < deadline, "gets never stopped: {now}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let unsent = must(&text, "tidepool_node_unsent_bytes");
    // Serving stopped because the answers reached the cap, and at most one answer past it.
    assert!(unsent >= CAP, "stopped before the cap: {unsent}\n{text}");
    assert!(
        unsent <= CAP + 4096.0 + 64.0,
        "held {unsent} bytes for a client that does not read"
    );
    assert!(last < GETS as f64 / 2.0, "served {last} of {GETS} gets");
    assert_eq!(
        must(&text, "tidepool_node_max_outstanding_bytes"),
        CAP,
        "{text}"
    );

    // Another client on the same worker is served meanwhile.
    let healthy = NodeClient::connect(&node.addr, "healthy", "").unwrap();
    let data = Bytes::from(vec![9u8; 4096]);
    for _ in 0..100 {
        let h = healthy.put(data.clone()).unwrap();
        assert_eq!(healthy.get(h).unwrap(), data);
    }
    let text = scrape(&node);
    assert_eq!(gets(&text), last + 100.0, "{text}");
    assert!(must(&text, "tidepool_node_unsent_bytes") <= CAP + 4096.0 + 64.0);

    // The stuck client goes: what it held goes with it.
    drop(stuck);
    sender.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while must(&scrape(&node), "tidepool_node_unsent_bytes") != 0.0 {
        assert!(Instant::now() < deadline, "unsent bytes never went");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_too_small_max_outstanding_is_refused() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .args([
            "node",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "16M",
            "--max-outstanding",
            "1K",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--max-outstanding"), "{stderr}");
}
