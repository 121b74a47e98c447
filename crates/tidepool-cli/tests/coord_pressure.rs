//! The coordinator under memory pressure, for real: `tidepool bench coord --quick` parts (b)
//! and (c) in a 1 GiB memory cgroup with no swap (root and the cgroup v1 memory controller
//! needed). A soft-memory application, the coordinator and memory antagonists share the
//! cgroup; one antagonist takes half of it at a moderate rate, another as fast as it can.
//! Nobody may be OOM-killed, the headroom may not stay under the reserve for a second, soft
//! memory must give way and come back, and idle memory that appears must be taken up.

use std::process::Command;
use tidepool_sys::probe::Need;

fn value(report: &serde_json::Value, workload: &str, metric: &str) -> f64 {
    report["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["workload"] == workload && r["metric"] == metric)
        .unwrap_or_else(|| panic!("no {workload} / {metric} in {report}"))["value"]
        .as_f64()
        .unwrap()
}

#[test]
fn soft_memory_gives_way_to_an_antagonist_and_takes_idle_memory_back() {
    tidepool_sys::skip_unless!(Need::Root, Need::CgroupV1Memory);
    let out = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("coord-pressure");
    let run = Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .args(["bench", "coord", "--quick", "--out"])
        .arg(&out)
        .env("TIDEPOOL_BENCH_PARTS", "bc")
        .output()
        .expect("run the coord bench");
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(!text.contains("skipped"), "{text}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("coord.json")).unwrap()).unwrap();
    // (c) pressure.
    assert_eq!(value(&report, "pressure", "OOM kills"), 0.0);
    assert_eq!(value(&report, "pressure", "processes that failed"), 0.0);
    let under = value(&report, "pressure", "longest under reserve");
    assert!(under < 1000.0, "under the reserve for {under} ms");
    let soft = |phase: &str| value(&report, "pressure", &format!("{phase}: soft MiB"));
    assert!(
        soft("moderate, held") < 0.8 * soft("before"),
        "soft memory gave way to the moderate antagonist: {} -> {} MiB",
        soft("before"),
        soft("moderate, held")
    );
    assert!(
        soft("between") > soft("moderate, held"),
        "and came back when it left: {} -> {} MiB",
        soft("moderate, held"),
        soft("between")
    );
    // (b) harvesting.
    assert_eq!(value(&report, "harvest", "OOM kills"), 0.0);
    let held = |phase: &str| value(&report, "harvest", &format!("{phase}: soft MiB"));
    assert!(
        held("none") > held("two balloons") * 1.3,
        "idle memory was harvested: {} -> {} MiB",
        held("two balloons"),
        held("none")
    );
}
