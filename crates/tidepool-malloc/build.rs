//! Gives the library a versioned soname (`libtidepool_malloc.so.0.1`): a program linked against
//! it (rather than preloading it) records that name, and a later release that changes the ABI
//! does not load under it. The rule is tidepool-capi's, shared.
include!("../tidepool-capi/soname.rs");

fn main() {
    link_with_soname("libtidepool_malloc");
    println!("cargo:rerun-if-changed=../tidepool-capi/soname.rs");
}
