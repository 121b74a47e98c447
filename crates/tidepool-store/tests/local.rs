//! The in-process backend, plain and LZ4-compressed.

use tidepool_store::{conformance, open};

#[test]
fn plain_passes_the_conformance_suite() {
    let store = open("local:").unwrap();
    assert_eq!(store.describe(), "local:");
    conformance::run_all(&store);
}

#[test]
fn compressed_passes_the_conformance_suite() {
    let store = open("local:?compress=lz4").unwrap();
    assert_eq!(store.describe(), "local:?compress=lz4");
    conformance::run_all(&store);
}

#[test]
fn compression_shrinks_compressible_pages() {
    let plain = open("local:").unwrap();
    let lz4 = open("local:?compress=lz4").unwrap();
    let page = vec![7u8; 4096];
    for k in 0..16 {
        plain.write(k, &page).unwrap();
        lz4.write(k, &page).unwrap();
    }
    let p = plain.stats().unwrap().far_bytes.unwrap();
    let c = lz4.stats().unwrap().far_bytes.unwrap();
    assert_eq!(p, 16 * 4096);
    assert!(
        c < p / 4,
        "lz4 store holds {c} bytes for {p} bytes of repeated bytes"
    );
    assert_eq!(lz4.read(3).unwrap().as_deref(), Some(page.as_slice()));
}
