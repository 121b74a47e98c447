//! The memory-node backend against a real node listening on loopback.

use std::sync::Arc;
use tidepool_node::{NodeConfig, Server};
use tidepool_store::{conformance, open, FarStore, StoreError};

fn node(capacity: u64) -> Server {
    Server::start(NodeConfig::new("127.0.0.1:0", capacity)).expect("node starts")
}

#[test]
fn node_backend_passes_conformance() {
    let server = node(256 << 20);
    let store = open(&format!("node://conformance@{}", server.local_addr())).unwrap();
    conformance::run_all(&store);
    server.shutdown();
}

#[test]
fn unreachable_node_is_an_error_naming_the_address() {
    let server = node(16 << 20);
    let addr = server.local_addr();
    let store: Arc<dyn FarStore> = open(&format!("node://t@{addr}")).unwrap();
    store.write(1, b"precious").unwrap();
    server.shutdown();
    let err = store
        .read(1)
        .expect_err("a read from a stopped node must fail, not read None");
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    let err = open(&format!("node://t@{addr}")).unwrap_err().to_string();
    assert!(err.contains(&addr.to_string()), "{err}");
}
