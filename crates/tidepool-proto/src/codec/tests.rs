//! Round trips of every request and response, and refusals of malformed frames.

use super::*;
use proptest::prelude::*;

fn handle() -> impl Strategy<Value = Handle> {
    (
        any::<u32>(),
        any::<u16>(),
        any::<u16>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(tenant, section, epoch, slot, generation)| Handle {
            tenant,
            section,
            epoch,
            slot,
            generation,
        })
}

fn blob() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..300).prop_map(Bytes::from)
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        ("[a-z]{0,20}", ".{0,20}", any::<u64>(), ".{0,20}").prop_map(
            |(tenant, token, session, store)| Request::Hello {
                tenant,
                token,
                session,
                store,
            }
        ),
        blob().prop_map(|data| Request::Put { data }),
        handle().prop_map(|handle| Request::Get { handle }),
        handle().prop_map(|handle| Request::Take { handle }),
        (handle(), blob()).prop_map(|(handle, data)| Request::Write { handle, data }),
        handle().prop_map(|handle| Request::Free { handle }),
        prop::collection::vec(blob(), 0..8).prop_map(|items| Request::PutMany { items }),
        prop::collection::vec(handle(), 0..8).prop_map(|handles| Request::GetMany { handles }),
        prop::collection::vec(handle(), 0..8).prop_map(|handles| Request::TakeMany { handles }),
        prop::collection::vec((handle(), blob()), 0..8)
            .prop_map(|items| Request::WriteMany { items }),
        prop::collection::vec(handle(), 0..8).prop_map(|handles| Request::FreeMany { handles }),
        (
            prop::collection::vec((prop::option::of(handle()), blob()), 0..6),
            prop::collection::vec(handle(), 0..6),
            any::<bool>()
        )
            .prop_map(|(evict, fetch, take)| Request::EvictFetch {
                evict: evict
                    .into_iter()
                    .map(|(handle, data)| EvictItem { handle, data })
                    .collect(),
                fetch,
                take
            }),
        Just(Request::Stats),
        (
            any::<u64>(),
            prop::collection::vec(column(), 0..3),
            any::<Option<(u8, u8, u64)>>(),
            any::<Option<(u8, u32)>>(),
            prop::collection::vec(agg(), 0..4)
        )
            .prop_map(|(rows, columns, filter, group, aggs)| Request::Scan(Scan {
                rows,
                columns,
                filter: filter.map(|(column, c, value)| Filter {
                    column,
                    cmp: Cmp::try_from(c % 6 + 1).unwrap(),
                    value,
                }),
                group: group.map(|(column, groups)| Group { column, groups }),
                aggs,
            })),
        (column(), prop::collection::vec(any::<u64>(), 0..5))
            .prop_map(|(column, indices)| Request::Gather { column, indices }),
    ]
}

fn column() -> impl Strategy<Value = Column<Option<Handle>>> {
    (
        1u8..=6,
        any::<u32>(),
        prop::collection::vec(proptest::option::of(handle()), 0..4),
    )
        .prop_map(|(t, line_elems, lines)| Column {
            ty: ElemType::try_from(t).unwrap(),
            line_elems,
            lines,
        })
}

fn agg() -> impl Strategy<Value = Agg> {
    (any::<u8>(), 1u8..=5, any::<(u64, u64, u32)>()).prop_map(|(column, k, (lo, hi, buckets))| {
        Agg {
            column,
            kind: match k {
                1 => AggKind::Sum,
                2 => AggKind::Min,
                3 => AggKind::Max,
                4 => AggKind::Count,
                _ => AggKind::Histogram { lo, hi, buckets },
            },
        }
    })
}

fn code() -> impl Strategy<Value = ErrorCode> {
    (1u8..=13).prop_map(|c| ErrorCode::try_from(c).unwrap())
}

fn item<T: std::fmt::Debug + Clone>(
    s: impl Strategy<Value = T>,
) -> impl Strategy<Value = ItemResult<T>> {
    prop_oneof![s.prop_map(Ok), code().prop_map(Err)]
}

proptest! {
    #[test]
    fn requests_round_trip_in_a_stream(reqs in prop::collection::vec(request(), 1..6), split in any::<prop::sample::Index>()) {
        let mut wire = BytesMut::new();
        for (i, r) in reqs.iter().enumerate() {
            r.encode(i as u64 * 7, &mut wire);
        }
        // Deliver the stream in two pieces at an arbitrary point: decoding must wait for
        // the rest rather than misread a partial frame.
        let wire = wire.freeze();
        let cut = split.index(wire.len() + 1);
        let mut buf = BytesMut::from(&wire[..cut]);
        let mut got = Vec::new();
        while let Some((id, r)) = decode_request(&mut buf, MAX_BODY).unwrap() {
            got.push((id, r));
        }
        buf.extend_from_slice(&wire[cut..]);
        while let Some((id, r)) = decode_request(&mut buf, MAX_BODY).unwrap() {
            got.push((id, r));
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got.len(), reqs.len());
        for (i, ((id, r), want)) in got.into_iter().zip(reqs).enumerate() {
            prop_assert_eq!(id, i as u64 * 7);
            prop_assert_eq!(r, want);
        }
    }

    #[test]
    fn responses_round_trip(
        handles in prop::collection::vec(item(handle()), 0..6),
        datas in prop::collection::vec(item(blob()), 0..6),
        dones in prop::collection::vec(item(Just(())), 0..6),
        c in code(),
        msg in ".{0,30}",
        id in any::<u64>(),
    ) {
        let cases = vec![
            (Op::PutMany, Response::Handles(handles.clone())),
            (Op::GetMany, Response::DataMany(datas.clone())),
            (Op::FreeMany, Response::DoneMany(dones)),
            (Op::EvictFetch, Response::EvictFetch { evicted: handles, fetched: datas }),
            (Op::Get, Response::Error { code: c, message: msg }),
            (Op::Stats, Response::Stats(vec![("tenant.objects".into(), 3)])),
            (Op::Hello, Response::Hello(HelloInfo { tenant_id: 1, quota: 2, capacity: 3, max_body: 4 })),
            (Op::Write, Response::Done),
            (Op::Scan, Response::Values(vec![1, u64::MAX, 0])),
            (Op::Gather, Response::Data(Bytes::from_static(b"12345678"))),
        ];
        for (op, resp) in cases {
            let mut buf = BytesMut::new();
            resp.encode(op, id, &mut buf);
            let (got_id, got) = decode_response(&mut buf, MAX_BODY).unwrap().unwrap();
            prop_assert_eq!(got_id, id);
            prop_assert_eq!(got, resp);
            prop_assert!(buf.is_empty());
        }
    }

    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut buf = BytesMut::from(&bytes[..]);
        let _ = decode_request(&mut buf, MAX_BODY);
        let mut buf = BytesMut::from(&bytes[..]);
        let _ = decode_response(&mut buf, MAX_BODY);
    }
}

#[test]
fn forged_count_is_refused_before_allocating() {
    let mut buf = BytesMut::new();
    let mut w = FrameWriter::begin(&mut buf, Op::GetMany as u8, 1);
    w.put_u32(60_000); // claims 60k handles, sends none
    w.finish();
    assert_eq!(
        decode_request(&mut buf, MAX_BODY),
        Err(DecodeError::Truncated("batch items"))
    );
}

#[test]
fn oversized_and_foreign_frames_are_refused() {
    let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\n"[..]);
    assert!(matches!(
        decode_request(&mut buf, MAX_BODY),
        Err(DecodeError::BadMagic(_))
    ));
    let mut buf = BytesMut::new();
    Request::Put {
        data: Bytes::from(vec![0u8; 100]),
    }
    .encode(1, &mut buf);
    assert!(matches!(
        decode_request(&mut buf, 50),
        Err(DecodeError::TooLarge { len: 104, max: 50 })
    ));
    let mut buf = BytesMut::new();
    Request::Stats.encode(1, &mut buf);
    buf[2] = 9;
    assert_eq!(
        decode_request(&mut buf, MAX_BODY),
        Err(DecodeError::UnsupportedVersion(9))
    );
    let mut buf = BytesMut::new();
    Request::Stats.encode(1, &mut buf);
    buf[3] = 0x7f;
    assert_eq!(
        decode_request(&mut buf, MAX_BODY),
        Err(DecodeError::UnknownOp(0x7f))
    );
}

#[test]
fn trailing_bytes_are_refused() {
    let mut buf = BytesMut::new();
    let mut w = FrameWriter::begin(&mut buf, Op::Stats as u8, 1);
    w.put_u8(0);
    w.finish();
    assert_eq!(
        decode_request(&mut buf, MAX_BODY),
        Err(DecodeError::Trailing(1))
    );
}
