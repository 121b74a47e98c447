//! Finding and building the workspace's shared libraries (`libtidepool_malloc.so`,
//! `libtidepool_preload.so`), which cargo builds only on request: `cargo build -p PACKAGE`.
//! The work is `tidepool_peers::libs`'s; these keep the bench's and the CLI's callers on
//! `anyhow`.

use anyhow::Result;
use std::path::{Path, PathBuf};

/// `file` next to this executable, built first under `cargo run`: see
/// [`tidepool_peers::libs::next_to_exe`].
pub fn next_to_exe(package: &str, file: &str) -> Result<PathBuf> {
    Ok(tidepool_peers::libs::next_to_exe(package, file)?)
}

/// `package`'s `file` built in release mode (or its own profile) into `target_dir`, for tests: see
/// [`tidepool_peers::libs::build_into`].
pub fn build_into(
    target_dir: &Path,
    workspace_dir: &Path,
    package: &str,
    file: &str,
) -> Result<PathBuf> {
    Ok(tidepool_peers::libs::build_into(
        target_dir,
        workspace_dir,
        package,
        file,
    )?)
}
