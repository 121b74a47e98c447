//! Declares the `loom` cfg (the loom build of the core; see src/sync.rs).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
