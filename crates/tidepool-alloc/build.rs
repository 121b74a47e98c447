//! Compiles the C shim: the per-thread arena table lives in an initial-exec TLS variable, which
//! stable Rust cannot declare (its TLS model in a shared object is general-dynamic, a call into
//! `__tls_get_addr` on every malloc).

fn main() {
    println!("cargo:rerun-if-changed=shim/thread_table.c");
    println!("cargo:rerun-if-changed=src/table_bytes.rs");
    let table_bytes = include!("src/table_bytes.rs");
    cc::Build::new()
        .file("shim/thread_table.c")
        .define("TP_THREAD_TABLE_BYTES", table_bytes.to_string().as_str())
        .opt_level(2)
        .pic(true)
        .flag("-ftls-model=initial-exec")
        .warnings_into_errors(true)
        .compile("tidepool_alloc_shim");
}
