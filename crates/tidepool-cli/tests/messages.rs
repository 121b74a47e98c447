//! What the command line says to an operator on small things: statistics a store cannot count,
//! and a bad option value, each in words rather than Rust's debug output.

use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_tidepool");

#[test]
fn stats_print_numbers_not_options() {
    let out = Command::new(EXE)
        .args(["stats", "local:"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        !stdout.contains("Some(") && !stdout.contains("None"),
        "{stdout}"
    );
    let far = stdout
        .lines()
        .find(|l| l.starts_with("far_bytes"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(far.split_whitespace().nth(1), Some("0"), "{stdout}");
}

#[test]
fn a_bad_placement_names_every_choice() {
    let out = Command::new(EXE)
        .args(["bench", "pager", "--placement", "bogus"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for choice in ["auto", "split", "shared", "free"] {
        assert!(stderr.contains(choice), "{choice} missing: {stderr}");
    }
}
