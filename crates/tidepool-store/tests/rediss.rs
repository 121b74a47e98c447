//! `rediss://`: the Redis backend over TLS, against a real `redis-server` serving TLS on
//! loopback with certificates made at test time; and each wrong pairing of client and port
//! failing fast with a message that says TLS is or is not expected.

use tidepool_peers::tls::TestCerts;
use tidepool_peers::RedisServer;
use tidepool_store::{conformance, open};

#[test]
fn rediss_passes_the_conformance_suite_with_a_private_ca() {
    let certs = TestCerts::generate().unwrap();
    let redis = RedisServer::start_tls(&certs).expect("start redis-server with TLS");
    let tls_addr = redis.tls_addr().unwrap();
    let url = format!("rediss://{tls_addr}?ca={}", certs.ca().display());
    let store = open(&url).expect("open the rediss store");
    assert_eq!(store.describe(), format!("rediss://{tls_addr}"));
    conformance::run_all(&store);
}

#[test]
fn rediss_with_a_password_and_database_hides_the_password() {
    let certs = TestCerts::generate().unwrap();
    let redis = RedisServer::start_tls(&certs).expect("start redis-server with TLS");
    let tls_addr = redis.tls_addr().unwrap();
    // The server has no password: AUTH with one is refused, and the message must not show it.
    let url = format!(
        "rediss://:s3cret-pw@{tls_addr}/2?ca={}",
        certs.ca().display()
    );
    let e = open(&url).unwrap_err();
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains("s3cret-pw"), "{shown}");
    // Without a password, database 2 over TLS works.
    let url = format!("rediss://{tls_addr}/2?ca={}", certs.ca().display());
    let store = open(&url).unwrap();
    store.write(1, b"db two").unwrap();
    assert_eq!(store.read(1).unwrap().as_deref(), Some(&b"db two"[..]));
}

#[test]
fn rediss_at_a_plain_port_says_the_server_does_not_use_tls() {
    let certs = TestCerts::generate().unwrap();
    let redis = RedisServer::start().expect("start redis-server");
    let url = format!("rediss://{}?ca={}", redis.addr(), certs.ca().display());
    let e = open(&url).unwrap_err().to_string();
    assert!(
        e.contains("does not use TLS") && e.contains("tls-port"),
        "{e}"
    );
}

#[test]
fn a_certificate_from_another_ca_is_refused() {
    let certs = TestCerts::generate().unwrap();
    let other = TestCerts::generate().unwrap();
    let redis = RedisServer::start_tls(&certs).expect("start redis-server with TLS");
    let url = format!(
        "rediss://{}?ca={}",
        redis.tls_addr().unwrap(),
        other.ca().display()
    );
    let e = open(&url).unwrap_err().to_string();
    assert!(
        e.contains("certificate") && e.contains(&other.ca().display().to_string()),
        "{e}"
    );
}

#[test]
fn a_missing_ca_file_is_named() {
    let e = open("rediss://127.0.0.1:1?ca=/nonexistent/tidepool-ca.pem")
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/tidepool-ca.pem"), "{e}");
}

#[test]
fn redis_at_a_tls_port_suggests_rediss() {
    let certs = TestCerts::generate().unwrap();
    let redis = RedisServer::start_tls(&certs).expect("start redis-server with TLS");
    let e = open(&format!("redis://{}", redis.tls_addr().unwrap()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("rediss://"), "{e}");
}

#[test]
fn rediss_cluster_at_plain_ports_says_the_servers_do_not_use_tls() {
    let redis = RedisServer::start().expect("start redis-server");
    let e = open(&format!("rediss+cluster://127.0.0.1:1,{}", redis.addr()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("does not use TLS") && e.contains("redis cluster"),
        "{e}"
    );
}
