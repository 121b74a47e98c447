//! Feeds arbitrary bytes to the coordinator protocol's decoders: `tidepool coord` decodes what
//! runtimes send, runtimes decode what the coordinator sends. Properties: no panic, no
//! allocation beyond what the message holds, and whatever decodes re-encodes to the same
//! bytes' meaning.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidepool_proto::coord::{FromCoord, ToCoord};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = ToCoord::decode(data) {
        assert_eq!(ToCoord::decode(&m.encode()).expect("re-encoded decodes"), m);
    }
    if let Ok(m) = FromCoord::decode(data) {
        assert_eq!(FromCoord::decode(&m.encode()).expect("re-encoded decodes"), m);
    }
});
