// Shared by the build scripts of tidepool-capi and tidepool-malloc (`include!`d): the versioned
// soname a shared library of this workspace gets. Before 1.0 a minor release may change the
// ABI (`lib.so.0.MINOR`, as the CMake package's SameMinorVersion says); from 1.0 only a major
// one does (`lib.so.MAJOR`).

/// Links the cdylib with the soname `LIB.so.ABI` on Linux.
fn link_with_soname(lib: &str) {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_default();
    let minor = std::env::var("CARGO_PKG_VERSION_MINOR").unwrap_or_default();
    let abi = if major == "0" {
        format!("0.{minor}")
    } else {
        major
    };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{lib}.so.{abi}");
}
