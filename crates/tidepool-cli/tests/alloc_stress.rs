//! A short run of the allocator stress (the 10-minute run is `tidepool bench-worker
//! '{"job":"alloc-stress","seconds":600}'`): threads allocating every size range, passing blocks to
//! each other, checking every byte, with libtidepool_malloc.so preloaded into the tidepool binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use tidepool_bench::job::Job;

#[test]
fn stress_under_the_preload_library() {
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("preload-build");
    let lib =
        tidepool_bench::alloc::build_library_into(&target, Path::new(env!("CARGO_MANIFEST_DIR")))
            .expect("libtidepool_malloc.so");
    let out = Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .args(Job::AllocStress { seconds: 5 }.args())
        .env("LD_PRELOAD", &lib)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stress failed ({}): {stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["corrupt_blocks"], 0);
    assert!(
        report["allocator"]
            .as_str()
            .unwrap()
            .contains("libtidepool_malloc"),
        "preload not live: {report}"
    );
    assert!(
        report["allocations"].as_u64().unwrap() > 10_000,
        "too little work: {report}"
    );
}
