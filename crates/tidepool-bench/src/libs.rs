//! Finding and building the workspace's shared libraries (`libtidepool_malloc.so`,
//! `libtidepool_preload.so`), which cargo builds only on request: `cargo build -p PACKAGE`.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `file` next to this executable. Under `cargo run` (CARGO set) `package` is built or brought
/// up to date first, so nothing ever runs a stale library.
pub fn next_to_exe(package: &str, file: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("executable has no directory")?;
    let lib = dir.join(file);
    if let Ok(cargo) = std::env::var("CARGO") {
        let profile = if dir.ends_with("release") {
            "--release"
        } else {
            "--profile=dev"
        };
        let status = Command::new(cargo)
            .args(["build", "--quiet", profile, "-p", package])
            .status()
            .with_context(|| format!("running cargo to build {file}"))?;
        if !status.success() {
            bail!("building {file} failed (see cargo's output above)");
        }
    }
    if lib.exists() {
        return Ok(lib);
    }
    bail!(
        "{} not found; build it with `cargo build --release -p {package}`",
        lib.display()
    )
}

/// Builds `package` in release mode into `target_dir` (a directory of its own: a nested cargo
/// in the outer target directory would wait on the outer cargo's lock) and returns the path of
/// its `file`. For tests, which cargo builds without the cdylibs.
pub fn build_into(
    target_dir: &Path,
    workspace_dir: &Path,
    package: &str,
    file: &str,
) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            package,
            "--target-dir",
        ])
        .arg(target_dir)
        .current_dir(workspace_dir)
        .output()
        .with_context(|| format!("running cargo to build {file}"))?;
    if !out.status.success() {
        bail!(
            "building {file} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let lib = target_dir.join("release").join(file);
    if !lib.exists() {
        bail!("{} missing after the build", lib.display());
    }
    Ok(lib)
}
