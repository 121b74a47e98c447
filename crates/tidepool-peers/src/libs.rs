//! Shared libraries: the peers' (an installed jemalloc, wherever the distribution keeps it) and
//! the workspace's own (`libtidepool_malloc.so`, `libtidepool_preload.so`), which cargo builds
//! only on request (`cargo build -p PACKAGE`), each in its own profile ([`profile_of`]).

use crate::PeerError;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where distributions put shared libraries: Debian and Ubuntu, Fedora and RHEL, then the rest.
const LIBRARY_DIRS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
];

/// An installed shared library by file name (`libjemalloc.so.2`), wherever this distribution
/// keeps it.
pub fn shared_library(file: &str) -> Option<PathBuf> {
    LIBRARY_DIRS
        .iter()
        .map(|d| Path::new(d).join(file))
        .find(|p| p.exists())
}

/// The cargo profile a library package is built in, which is also its directory under the
/// target directory: `malloc` for `tidepool-malloc` (release with `panic = "abort"`, which
/// lets the library leave std and libgcc_s out of every process it is preloaded into), `None`
/// for the rest, which follow the executable's own profile.
pub fn profile_of(package: &str) -> Option<&'static str> {
    (package == "tidepool-malloc").then_some("malloc")
}

/// `file` next to this executable, or, for a package with a profile of its own
/// ([`profile_of`]), in that profile's directory beside the executable's
/// (`target/malloc/` for `target/release/tidepool`) when it is there. Under `cargo run`
/// (CARGO set) `package` is built or brought up to date first, so nothing ever runs a stale
/// library.
pub fn next_to_exe(package: &str, file: &str) -> Result<PathBuf, PeerError> {
    let no_dir = |source| PeerError::NoExeDir {
        file: file.to_string(),
        source,
    };
    let exe = std::env::current_exe().map_err(|e| no_dir(Some(e)))?;
    let dir = exe.parent().ok_or_else(|| no_dir(None))?;
    let own = profile_of(package).and_then(|p| Some(dir.parent()?.join(p).join(file)));
    let lib = match &own {
        Some(own) if own.exists() || std::env::var_os("CARGO").is_some() => own.clone(),
        _ => dir.join(file),
    };
    if let Ok(cargo) = std::env::var("CARGO") {
        let profile = match profile_of(package) {
            Some(own) => format!("--profile={own}"),
            None if dir.ends_with("release") => "--release".to_string(),
            None => "--profile=dev".to_string(),
        };
        let status = Command::new(cargo)
            .args(["build", "--quiet", &profile, "-p", package])
            .status()
            .map_err(|source| PeerError::Cargo {
                file: file.to_string(),
                source,
            })?;
        if !status.success() {
            return Err(PeerError::BuildFailed {
                file: file.to_string(),
                stderr: String::new(),
            });
        }
    }
    if lib.exists() {
        return Ok(lib);
    }
    // Name the place a build would put it: the profile's directory in a cargo target
    // directory (beside its release or debug directory), the executable's own otherwise
    // (an installed layout).
    let expected = own
        .filter(|own| {
            own.parent()
                .and_then(Path::parent)
                .is_some_and(|t| t.join("release").is_dir() || t.join("debug").is_dir())
        })
        .unwrap_or(lib);
    Err(PeerError::LibraryNotFound {
        path: expected,
        package: package.to_string(),
        profile: profile_of(package).unwrap_or("release").to_string(),
    })
}

/// Builds `package` in release mode (or its own profile, [`profile_of`]) into `target_dir` (a
/// directory of its own: a nested cargo in the outer target directory would wait on the outer
/// cargo's lock) and returns the path of its `file`. For tests, which cargo builds without the
/// cdylibs.
pub fn build_into(
    target_dir: &Path,
    workspace_dir: &Path,
    package: &str,
    file: &str,
) -> Result<PathBuf, PeerError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let profile = profile_of(package).unwrap_or("release");
    let out = Command::new(cargo)
        .args([
            "build",
            &format!("--profile={profile}"),
            "--quiet",
            "-p",
            package,
            "--target-dir",
        ])
        .arg(target_dir)
        .current_dir(workspace_dir)
        .output()
        .map_err(|source| PeerError::Cargo {
            file: file.to_string(),
            source,
        })?;
    if !out.status.success() {
        return Err(PeerError::BuildFailed {
            file: file.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let lib = target_dir.join(profile).join(file);
    if !lib.exists() {
        return Err(PeerError::BuiltNothing { path: lib });
    }
    Ok(lib)
}

/// Builds `libtidepool_malloc.so` (profile `malloc`) into `target_dir`, for tests (see
/// [`build_into`]).
pub fn build_malloc_into(target_dir: &Path, workspace_dir: &Path) -> Result<PathBuf, PeerError> {
    build_into(
        target_dir,
        workspace_dir,
        "tidepool-malloc",
        "libtidepool_malloc.so",
    )
}
