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

#[test]
fn the_node_runs_a_fused_filter_group_aggregate_scan_and_a_gather() {
    use tidepool_proto::scan::{Agg, AggKind, Cmp, Column, ElemType, Filter, Group, Scan};
    let server = node(64 << 20);
    let store = open(&format!("node://scan@{}", server.local_addr())).unwrap();
    // 1000 rows, 64 per line: key = i % 5 (u64), fare = i as f64 / 2 (f64). Line 3 of the
    // fares is never written: zeros.
    let rows = 1000u64;
    let le = 64usize;
    let lines = (rows as usize).div_ceil(le);
    let key = |i: u64| i % 5;
    let fare = |i: u64| if i / 64 == 3 { 0.0 } else { i as f64 / 2.0 };
    for l in 0..lines {
        let r = (l * le) as u64..((l + 1) * le) as u64;
        let k: Vec<u8> = r.clone().flat_map(|i| key(i).to_le_bytes()).collect();
        let f: Vec<u8> = r.flat_map(|i| fare(i).to_le_bytes()).collect();
        let mut items = vec![(1000 + l as u64, &k[..])];
        if l != 3 {
            items.push((2000 + l as u64, &f[..]));
        }
        store.write_many(&items).unwrap();
    }
    let col = |ty, base: u64| Column {
        ty,
        line_elems: le as u32,
        lines: (0..lines as u64).map(|l| base + l).collect(),
    };
    let scan = Scan {
        rows,
        columns: vec![col(ElemType::U64, 1000), col(ElemType::F64, 2000)],
        filter: Some(Filter {
            column: 1,
            cmp: Cmp::Ge,
            value: 100f64.to_bits(),
        }),
        group: Some(Group {
            column: 0,
            groups: 5,
        }),
        aggs: vec![
            Agg {
                column: 1,
                kind: AggKind::Sum,
            },
            Agg {
                column: 1,
                kind: AggKind::Max,
            },
            Agg {
                column: 1,
                kind: AggKind::Count,
            },
        ],
    };
    let node = store.offload().expect("the node computes");
    let got = node.scan(&scan).unwrap();
    for g in 0..5u64 {
        let kept: Vec<f64> = (0..rows)
            .filter(|&i| key(i) == g && fare(i) >= 100.0)
            .map(fare)
            .collect();
        let at = g as usize * 3;
        assert_eq!(
            f64::from_bits(got[at]),
            kept.iter().sum::<f64>(),
            "group {g}"
        );
        assert_eq!(
            f64::from_bits(got[at + 1]),
            kept.iter().cloned().fold(f64::MIN, f64::max)
        );
        assert_eq!(got[at + 2], kept.len() as u64);
    }
    let picked = node
        .gather(&col(ElemType::F64, 2000), &[5, 200, 999])
        .unwrap();
    let want: Vec<u8> = [5, 200, 999]
        .iter()
        .flat_map(|&i| fare(i).to_le_bytes())
        .collect();
    assert_eq!(&picked[..], &want[..]);
    // A scan that cannot run says why, and the connection goes on working.
    let mut bad = scan.clone();
    bad.group = Some(Group {
        column: 1,
        groups: 5,
    });
    let err = node.scan(&bad).unwrap_err().to_string();
    assert!(err.contains("integer column"), "{err}");
    assert!(node.scan(&scan).is_ok());
    // The in-process store does not compute: the caller does.
    assert!(tidepool_store::LocalStore::new().offload().is_none());
    server.shutdown();
}

/// Batches larger than one request may carry (65536 items, 64 MiB) are split: 100,000 pages
/// written, read back, and removed in one call each (a program unmapping a 400 MB array at
/// once removes that many).
#[test]
fn batches_beyond_the_protocols_limits_are_split() {
    let server = node(512 << 20);
    let store = open(&format!("node://big@{}", server.local_addr())).unwrap();
    let n = 100_000u64;
    let pages: Vec<Vec<u8>> = (0..n).map(|i| i.to_le_bytes().repeat(512)).collect();
    let items: Vec<(u64, &[u8])> = pages
        .iter()
        .enumerate()
        .map(|(i, p)| (i as u64, &p[..]))
        .collect();
    store.write_many(&items).unwrap();
    let keys: Vec<u64> = (0..n).collect();
    let back = store.read_many(&keys).unwrap();
    for (i, v) in back.iter().enumerate() {
        assert_eq!(v.as_deref(), Some(&pages[i][..]), "page {i}");
    }
    store.remove_many(&keys).unwrap();
    assert_eq!(store.read(7).unwrap(), None);
    let stats = store.stats().unwrap();
    assert_eq!(stats.objects, Some(0), "{stats:?}");
    server.shutdown();
}
