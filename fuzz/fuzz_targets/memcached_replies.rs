//! Feeds arbitrary bytes to the memcached reply parser, as a hostile or broken server would send
//! them. Properties: no panic, no allocation driven by a forged length, no value over the limit.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A small limit, so forged lengths are easy for the fuzzer to exceed.
    tidepool_store::fuzzing::memcached_replies(data, 4096);
});
