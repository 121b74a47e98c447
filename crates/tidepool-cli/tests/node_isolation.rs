//! Tenant isolation, quotas, capacity, disconnects and malformed frames, against a real
//! `tidepool node` process.

mod common;

use bytes::Bytes;
use common::{payload, NodeProc};
use std::io::{Read, Write};
use std::time::{Duration, Instant};
use tidepool_proto::{ErrorCode, Handle};
use tidepool_store::{NodeClient, StoreError};

fn tokens_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tokens.toml");
    std::fs::write(
        &path,
        "[[tenant]]\nname = \"alice\"\ntoken = \"a-secret\"\n\n\
         [[tenant]]\nname = \"bob\"\ntoken = \"b-secret\"\n\n\
         [[tenant]]\nname = \"small\"\ntoken = \"s-secret\"\nquota = \"256K\"\n",
    )
    .unwrap();
    path
}

fn code(r: Result<impl std::fmt::Debug, StoreError>) -> ErrorCode {
    match r {
        Err(e) => e
            .node_code()
            .unwrap_or_else(|| panic!("expected a refusal by the node, got {e}")),
        Ok(v) => panic!("expected a refusal, got {v:?}"),
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("tidepool-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn tenants_cannot_touch_each_others_data() {
    let dir = temp_dir("isolation");
    let node = NodeProc::start(&[
        "--capacity",
        "64M",
        "--tokens",
        tokens_file(&dir).to_str().unwrap(),
    ]);
    let alice = NodeClient::connect(&node.addr, "alice", "a-secret").unwrap();
    let bob = NodeClient::connect(&node.addr, "bob", "b-secret").unwrap();
    let secret = payload(1, 4096);
    let h = alice.put(Bytes::from(secret.clone())).unwrap();

    // Bob presents Alice's handle as is: refused for every op.
    assert_eq!(code(bob.get(h)), ErrorCode::InvalidHandle);
    assert_eq!(code(bob.take(h)), ErrorCode::InvalidHandle);
    assert_eq!(
        code(bob.write(h, Bytes::from_static(b"mine now"))),
        ErrorCode::InvalidHandle
    );
    assert_eq!(code(bob.free(h)), ErrorCode::InvalidHandle);
    // Bob forges a handle with his own tenant id pointing at Alice's slot.
    let forged = Handle {
        tenant: bob.info().tenant_id,
        ..h
    };
    assert_eq!(code(bob.get(forged)), ErrorCode::InvalidHandle);
    assert_eq!(code(bob.free(forged)), ErrorCode::InvalidHandle);
    // Arbitrary slots and generations.
    for slot in [0u32, 1, 2, 1000, u32::MAX] {
        let f = Handle {
            slot,
            generation: 7,
            ..forged
        };
        let c = code(bob.get(f));
        assert!(
            matches!(c, ErrorCode::InvalidHandle | ErrorCode::StaleHandle),
            "{c:?}"
        );
    }
    // Batched forms refuse per item.
    let got = bob.get_many(vec![h, forged]).unwrap();
    assert!(
        got.iter().all(|r| r == &Err(ErrorCode::InvalidHandle)),
        "{got:?}"
    );

    // Alice's data is unchanged.
    assert_eq!(alice.get(h).unwrap(), secret);

    // A stale handle: freed, then its slot reused by a new object.
    alice.free(h).unwrap();
    assert_eq!(code(alice.get(h)), ErrorCode::StaleHandle);
    let h2 = alice.put(Bytes::from(payload(2, 4096))).unwrap();
    assert_eq!(code(alice.get(h)), ErrorCode::StaleHandle);
    assert_eq!(
        code(alice.write(h, Bytes::from_static(b"x"))),
        ErrorCode::StaleHandle
    );
    assert_eq!(
        alice.get(h2).unwrap(),
        payload(2, 4096),
        "stale write must not land"
    );

    // Wrong token, unknown tenant: refused at hello.
    for (tenant, token) in [
        ("alice", "b-secret"),
        ("alice", ""),
        ("mallory", "a-secret"),
    ] {
        let e = NodeClient::connect(&node.addr, tenant, token).unwrap_err();
        assert_eq!(e.node_code(), Some(ErrorCode::AuthFailed), "{e}");
        assert!(
            e.to_string().contains("check the tenant name and token"),
            "{e}"
        );
    }
    assert_eq!(alice.get(h2).unwrap(), payload(2, 4096));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn quota_and_capacity_refusals_leave_the_server_up() {
    let dir = temp_dir("quota");
    let mut node = NodeProc::start(&[
        "--capacity",
        "8M",
        "--tokens",
        tokens_file(&dir).to_str().unwrap(),
    ]);
    let small = NodeClient::connect(&node.addr, "small", "s-secret").unwrap();
    let mut held = vec![];
    let err = loop {
        match small.put(Bytes::from(payload(held.len() as u64, 4096))) {
            Ok(h) => held.push(h),
            Err(e) => break e,
        }
        assert!(held.len() <= 64, "quota of 256 KiB not enforced");
    };
    assert_eq!(err.node_code(), Some(ErrorCode::QuotaExceeded), "{err}");
    assert_eq!(held.len(), 64);
    small.free(held.pop().unwrap()).unwrap();
    small
        .put(Bytes::from(payload(99, 4096)))
        .expect("room again after a free");

    // Fill the node itself.
    let alice = NodeClient::connect(&node.addr, "alice", "a-secret").unwrap();
    let mut n = 0;
    let err = loop {
        match alice.put(Bytes::from(payload(n, 64 << 10))) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 200, "capacity of 8 MiB not enforced");
    };
    assert_eq!(err.node_code(), Some(ErrorCode::CapacityExhausted), "{err}");
    assert!(err.to_string().contains("capacity"), "{err}");
    // Still serving everybody.
    assert!(node.alive());
    assert_eq!(small.get(held[0]).unwrap(), payload(0, 4096));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_client_that_goes_away_releases_what_it_held() {
    let node = NodeProc::start(&["--capacity", "64M"]);
    let observer = NodeClient::connect(&node.addr, "shared", "").unwrap();
    let client = NodeClient::connect(&node.addr, "shared", "").unwrap();
    let items: Vec<Bytes> = (0..200).map(|i| Bytes::from(payload(i, 8192))).collect();
    let handles: Vec<Handle> = client
        .put_many(items)
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let objects = |c: &NodeClient| {
        c.stats()
            .unwrap()
            .into_iter()
            .find(|(k, _)| k == "tenant.objects")
            .unwrap()
            .1
    };
    assert_eq!(objects(&observer), 200);
    drop(client); // closes every connection of its session, like a crash would
    let deadline = Instant::now() + Duration::from_secs(10);
    while objects(&observer) != 0 {
        assert!(
            Instant::now() < deadline,
            "objects of a gone client were not released"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its handles are dead, not aliased.
    assert_eq!(code(observer.get(handles[0])), ErrorCode::StaleHandle);
}

#[test]
fn malformed_frames_close_only_the_offending_connection() {
    let mut node = NodeProc::start(&["--capacity", "16M"]);
    let good = NodeClient::connect(&node.addr, "good", "").unwrap();
    let h = good.put(Bytes::from(payload(5, 4096))).unwrap();
    let garbage: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        // Valid magic and version, unknown op.
        &[b'T', b'P', 1, 0x7f, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
        // A body length beyond any limit.
        &[
            b'T', b'P', 1, 0x03, 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 0, 0, 0, 0,
        ],
        // Get with a truncated handle.
        &[
            b'T', b'P', 1, 0x03, 3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3,
        ],
    ];
    for g in garbage {
        let mut s = std::net::TcpStream::connect(&node.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(g).unwrap();
        let mut answer = vec![];
        // The server answers with an error frame, then closes: read to EOF.
        s.read_to_end(&mut answer).unwrap();
        assert!(answer.len() > 17, "no error answer for {g:?}");
        assert_eq!(answer[16], ErrorCode::Malformed as u8, "for {g:?}");
        assert!(node.alive());
        assert_eq!(good.get(h).unwrap(), payload(5, 4096));
    }
}
