//! The committed header matches what cbindgen makes of the crate now: a stale header fails
//! the test command. `TIDEPOOL_WRITE_HEADER=1 cargo test -p tidepool-capi --test header`
//! rewrites it.

use std::path::Path;

#[test]
fn the_committed_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads the crate")
        .write(&mut fresh);
    let path = dir.join("include/tidepool.h");
    if std::env::var_os("TIDEPOOL_WRITE_HEADER").is_some() {
        std::fs::write(&path, &fresh).expect("writing the header");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "{} is stale: run `TIDEPOOL_WRITE_HEADER=1 cargo test -p tidepool-capi --test header` \
         and commit the result",
        path.display()
    );
}
