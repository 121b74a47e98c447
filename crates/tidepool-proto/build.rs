//! Records the commit the binaries are built from, for `tidepool_build_info` and `--version`.
//! Outside a git checkout (a source tarball) the commit is "unknown".

use std::process::Command;

fn main() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TIDEPOOL_COMMIT={commit}");
    // Build again when HEAD moves (a checkout, or a commit on the current branch).
    // In a worktree HEAD is the worktree's own, and the branches are the repository's (the
    // common directory): naming a path that does not exist would rebuild on every build.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        let common = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]);
        let common = common.unwrap_or(dir);
        for refs in ["refs/heads", "packed-refs"] {
            if std::path::Path::new(&common).join(refs).exists() {
                println!("cargo:rerun-if-changed={common}/{refs}");
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
