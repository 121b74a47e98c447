//! Gives the shared library a soname, so that programs linked against it record
//! `libtidepool.so` (found through their rpath or the loader's path), not the path it was
//! linked from.
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libtidepool.so");
    }
}
