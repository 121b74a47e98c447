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

/// A get answered from the arena holds a read guard until its answer is sent; a free of the same
/// object later in the same batch must not wait for it forever.
#[test]
fn get_then_mutate_the_same_object_in_one_batch() {
    use bytes::Bytes;
    use tidepool_proto::{Request, Response};
    use tidepool_store::NodeClient;
    let server = node(16 << 20);
    let c = NodeClient::connect(&server.local_addr().to_string(), "t", "").unwrap();
    let data = Bytes::from(vec![7u8; 8192]);
    let h = c.put(data.clone()).unwrap();
    let h2 = c.put(data.clone()).unwrap();
    let answers = c
        .pipeline(&[
            Request::GetMany {
                handles: vec![h, h2],
            },
            Request::Write {
                handle: h2,
                data: Bytes::from(vec![9u8; 8192]),
            },
            Request::Get { handle: h2 },
            Request::Free { handle: h },
            Request::Take { handle: h2 },
        ])
        .unwrap();
    match &answers[0] {
        Response::DataMany(v) => {
            assert_eq!(v[0].as_ref().unwrap(), &data);
            assert_eq!(v[1].as_ref().unwrap(), &data, "read before the write");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(answers[1], Response::Done);
    assert_eq!(answers[2], Response::Data(Bytes::from(vec![9u8; 8192])));
    assert_eq!(answers[3], Response::Done);
    assert_eq!(answers[4], Response::Data(Bytes::from(vec![9u8; 8192])));
    server.shutdown();
}
