//! Gives the shared library a versioned soname, so that programs linked against it record
//! `libtidepool.so.0.1` (found through their rpath or the loader's path), not the path it was
//! linked from, and a later release that changes the ABI does not load under them. Before 1.0
//! a minor release may change the ABI (`0.MINOR`); from 1.0 only a major one does.
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_default();
        let minor = std::env::var("CARGO_PKG_VERSION_MINOR").unwrap_or_default();
        let abi = if major == "0" {
            format!("0.{minor}")
        } else {
            major
        };
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libtidepool.so.{abi}");
    }
}
