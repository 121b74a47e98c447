//! What the fuzz target (`fuzz/fuzz_targets/memcached_requests.rs`) runs: arbitrary bytes as
//! a client's input, split into reads where the fuzzer says, through the parser and the
//! executor of a real store, as a connection would take them.

use crate::exec::Session;
use crate::proto::Limits;
use crate::stats::Settings;
use crate::store::Items;
use std::sync::{Arc, OnceLock};
use tidepool_soft::{ArenaConfig, SoftArena};

fn items() -> &'static Items {
    static ITEMS: OnceLock<Items> = OnceLock::new();
    ITEMS.get_or_init(|| {
        let arena: Arc<SoftArena> =
            SoftArena::new(ArenaConfig::default().budget(8 << 20).max_bytes(64 << 20))
                .expect("a soft-memory arena");
        Items::new(&arena, None)
    })
}

/// Feeds `data` to one session; the first byte says where the input is split into reads.
/// Properties: no panic, input used never beyond what was given, and every command line the
/// input finished gets a reply or is quiet by request.
pub fn requests(data: &[u8]) {
    let Some((&split, data)) = data.split_first() else {
        return;
    };
    let limits = Limits::default().item_max(4096).line_max(512);
    let settings = Settings::new(1, limits.item_max, 1);
    let mut session = Session::default();
    let mut buffer: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let step = (split as usize).max(1);
    for read in data.chunks(step) {
        buffer.extend_from_slice(read);
        let used = session.feed(items(), &settings, &limits, &buffer, &mut out, 1 << 20);
        assert!(used <= buffer.len(), "used {used} of {}", buffer.len());
        buffer.drain(..used);
        out.clear();
        if session.closing {
            return;
        }
        // An incomplete command holds at most a line and an item.
        assert!(
            buffer.len() <= limits.line_max + limits.item_max + 2 + step,
            "{} bytes held",
            buffer.len()
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fuzz_target_runs_on_what_clients_send() {
        for input in [
            &b"\x03set k 0 0 3\r\nabc\r\nget k\r\n"[..],
            b"\x01ms k 2 T0\r\nhi\r\nmg k v t\r\nma n N0 J5\r\n",
            b"\x40set k 0 0 9999\r\nxxxx",
            b"\x00",
            b"",
        ] {
            super::requests(input);
        }
    }
}
