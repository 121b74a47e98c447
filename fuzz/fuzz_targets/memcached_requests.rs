//! Feeds arbitrary bytes to `tidepool cache` as a client's input, split into reads where the
//! fuzzer says, through the request parser and the executor of a real store. Properties: no
//! panic, no input used beyond what was given, nothing held beyond a line and an item.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tidepool_cache::fuzzing::requests(data);
});
