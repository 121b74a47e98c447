//! The memory-node backend over TLS: a real node on loopback with a certificate made at test
//! time, round trips through the store, and each side of a TLS mismatch failing with a message
//! that says which side expected what (never a hang).

use tidepool_node::{NodeConfig, NodeError, Server, TlsFiles};
use tidepool_peers::tls::TestCerts;
use tidepool_store::{conformance, open, NodeClient};

fn tls_node(certs: &TestCerts) -> Server {
    let cfg = NodeConfig::new("127.0.0.1:0", 64 << 20).tls(TlsFiles {
        cert: certs.cert(),
        key: certs.key(),
    });
    Server::start(cfg).expect("TLS node starts")
}

fn tls_url(server: &Server, certs: &TestCerts) -> String {
    format!(
        "node://web:s3cret-token@{}?tls=1&ca={}",
        server.local_addr(),
        certs.ca().display()
    )
}

#[test]
fn a_tls_node_serves_the_store_and_its_conformance_suite() {
    let certs = TestCerts::generate().unwrap();
    let server = tls_node(&certs);
    let store = open(&tls_url(&server, &certs)).unwrap();
    assert!(store.describe().ends_with("?tls=1"), "{}", store.describe());
    assert!(!format!("{store:?}").contains("s3cret-token"), "{store:?}");
    store.write(1, b"over TLS").unwrap();
    store.write(2, &vec![0xa5; 3 << 20]).unwrap(); // many records, both directions
    assert_eq!(store.read(1).unwrap().as_deref(), Some(&b"over TLS"[..]));
    assert_eq!(store.read(2).unwrap().unwrap().len(), 3 << 20);
    assert!(store.read(2).unwrap().unwrap().iter().all(|&b| b == 0xa5));
    assert_eq!(store.take(1).unwrap().as_deref(), Some(&b"over TLS"[..]));
    assert_eq!(store.read(1).unwrap(), None);
    conformance::run_all(&store);
    server.shutdown();
}

#[test]
fn threads_share_a_tls_client_each_on_a_connection_of_its_own() {
    use bytes::Bytes;
    let certs = TestCerts::generate().unwrap();
    let server = tls_node(&certs);
    let tls = tidepool_store::ClientTls::new(&server.local_addr().to_string(), Some(&certs.ca()))
        .unwrap();
    let client =
        NodeClient::connect_with(&server.local_addr().to_string(), "t", "", Some(tls)).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let client = &client;
            s.spawn(move || {
                for i in 0..200u32 {
                    let data = Bytes::from(vec![t ^ i as u8; 4096]);
                    let h = client.put(data.clone()).unwrap();
                    assert_eq!(client.get(h).unwrap(), data);
                    client.free(h).unwrap();
                }
            });
        }
    });
    server.shutdown();
}

#[test]
fn a_plain_client_at_a_tls_node_is_told_to_use_tls() {
    let certs = TestCerts::generate().unwrap();
    let server = tls_node(&certs);
    let e = open(&format!("node://web:s3cret-token@{}", server.local_addr()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("accepts only TLS") && e.contains("tls=1"), "{e}");
    assert!(!e.contains("s3cret-token"), "{e}");
    assert!(server.metrics_text().contains("kind=\"tls_required\"} 1"));
    server.shutdown();
}

#[test]
fn a_tls_client_at_a_plain_node_is_told_the_node_has_no_tls() {
    let certs = TestCerts::generate().unwrap();
    let server = Server::start(NodeConfig::new("127.0.0.1:0", 16 << 20)).unwrap();
    let e = open(&tls_url(&server, &certs)).unwrap_err().to_string();
    assert!(
        e.contains("does not use TLS") && e.contains("remove tls=1"),
        "{e}"
    );
    assert!(!e.contains("s3cret-token"), "{e}");
    server.shutdown();
}

#[test]
fn a_certificate_from_another_ca_is_refused_naming_the_trusted_file() {
    let certs = TestCerts::generate().unwrap();
    let other = TestCerts::generate().unwrap();
    let server = tls_node(&certs);
    let e = open(&tls_url(&server, &other)).unwrap_err().to_string();
    assert!(
        e.contains("certificate") && e.contains(&other.ca().display().to_string()),
        "{e}"
    );
    // The node counted the refused handshake.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !server.metrics_text().contains("kind=\"tls\"} 1") {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            server.metrics_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    server.shutdown();
}

#[test]
fn bad_certificate_files_are_named() {
    let certs = TestCerts::generate().unwrap();
    let other = TestCerts::generate().unwrap();
    let start = |cert: std::path::PathBuf, key: std::path::PathBuf| {
        let cfg = NodeConfig::new("127.0.0.1:0", 16 << 20).tls(TlsFiles { cert, key });
        Server::start(cfg).unwrap_err()
    };
    let missing = certs.dir().join("missing.pem");
    let e = start(missing.clone(), certs.key());
    assert!(matches!(e, NodeError::Tls { .. }), "{e}");
    assert!(e.to_string().contains("missing.pem"), "{e}");
    // A key where the certificate should be, and the other way round.
    let e = start(certs.key(), certs.key()).to_string();
    assert!(
        e.contains("server.key") && e.contains("no PEM certificate"),
        "{e}"
    );
    let e = start(certs.cert(), certs.cert()).to_string();
    assert!(e.contains("server.pem") && e.contains("private key"), "{e}");
    // A key that is not the certificate's.
    let e = start(certs.cert(), other.key());
    assert!(matches!(e, NodeError::TlsPair { .. }), "{e}");
}
