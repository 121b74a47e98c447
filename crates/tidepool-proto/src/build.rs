//! What the running binary is: its version and the commit it was built from.

/// The workspace version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The short commit hash the build came from ("unknown" outside a git checkout).
pub const COMMIT: &str = env!("TIDEPOOL_COMMIT");
