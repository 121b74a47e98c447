//! Feeds arbitrary bytes to the frame decoders the node (requests) and every client
//! (responses) run on network input. Properties: no panic, no unbounded allocation (the
//! decoder checks counts against received bytes), and anything that decodes re-encodes to
//! frames that decode to the same value.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tidepool_proto::{decode_request, decode_response, Op, MAX_BODY, RESPONSE_BIT};

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    while let Ok(Some((id, req))) = decode_request(&mut buf, MAX_BODY) {
        let mut again = BytesMut::new();
        req.encode(id, &mut again);
        let (id2, req2) = decode_request(&mut again, MAX_BODY)
            .expect("re-encoded request decodes")
            .expect("whole");
        assert_eq!((id, &req), (id2, &req2));
        assert!(again.is_empty());
    }
    let mut buf = BytesMut::from(data);
    loop {
        let op = buf.get(3).copied().unwrap_or(0) & !RESPONSE_BIT;
        match decode_response(&mut buf, MAX_BODY) {
            Ok(Some((id, resp))) => {
                let op = Op::try_from(op).expect("decoded responses have known ops");
                let mut again = BytesMut::new();
                resp.encode(op, id, &mut again);
                let (id2, resp2) = decode_response(&mut again, MAX_BODY)
                    .expect("re-encoded response decodes")
                    .expect("whole");
                assert_eq!((id, &resp), (id2, &resp2));
            }
            _ => break,
        }
    }
});
