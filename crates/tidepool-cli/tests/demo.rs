//! `tidepool demo`, the README's first command: every store moves its data intact, and soft
//! memory gives every value back right after segments are revoked behind its back.

use std::process::Command;

#[test]
fn the_demo_verifies_everything() {
    let out = Command::new(env!("CARGO_BIN_EXE_tidepool"))
        .args(["demo", "--size", "32M"])
        .output()
        .expect("run tidepool demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.matches("every byte verified").count(), 2, "{stdout}");
    let soft = stdout
        .lines()
        .find(|l| l.contains("revoked behind its back"))
        .unwrap_or_else(|| panic!("no soft-memory line in:\n{stdout}"));
    assert!(soft.contains("every one right"), "{soft}");
    // Some values survived in soft memory and some were rebuilt.
    let count = |word: &str| -> u64 {
        let before = &soft[..soft.find(word).expect(word)];
        before.split_whitespace().last().unwrap().parse().unwrap()
    };
    assert!(count("from soft memory") > 0, "{soft}");
    assert!(count("rebuilt") > 0, "{soft}");
}
