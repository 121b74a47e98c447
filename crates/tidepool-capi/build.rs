//! Gives the shared library a versioned soname (`libtidepool.so.0.1`), so that programs linked
//! against it record that name (found through their rpath or the loader's path), not the path
//! it was linked from, and a later release that changes the ABI does not load under them.
include!("soname.rs");

fn main() {
    link_with_soname("libtidepool");
    println!("cargo:rerun-if-changed=soname.rs");
}
