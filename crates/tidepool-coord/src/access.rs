//! Who may reach the coordinator and change what.
//!
//! - The socket is mode 0600 (0660 with a group) in a directory of mode 0700 (0750): only the
//!   owner (and root, and the group when one is given) can join or send commands.
//! - Over the socket, the kernel says who connected (`SO_PEERCRED`). A user may change the
//!   registrations its own processes made; any other's only as the coordinator's owner or root.
//! - Over HTTP, reading is open (bind loopback), changing weights or the limit needs the bearer
//!   token kept in a 0600 file beside the socket.

use rand::RngCore;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use subtle::ConstantTimeEq;
use tidepool_soft::coord::Peer;

/// The directory `path` will be created in, made private: created 0700 (0750 and owned by
/// `group` with one) when it is missing; when it is the coordinator's own (`managed`), it must
/// belong to this user and is set to that mode. A directory the operator named is left as it is.
pub(crate) fn prepare_dir(socket: &Path, group: Option<u32>, managed: bool) -> io::Result<()> {
    let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    let mode = if group.is_some() { 0o750 } else { 0o700 };
    let created = if dir.exists() {
        false
    } else {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        true
    };
    if !(created || managed) {
        return Ok(());
    }
    let md = std::fs::metadata(dir)?;
    let me = rustix::process::geteuid().as_raw();
    if md.uid() != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} belongs to uid {}, not to you (uid {me}): its owner could read or replace \
                 the coordinator's socket; remove it, or pass --socket elsewhere",
                dir.display(),
                md.uid()
            ),
        ));
    }
    if let Some(gid) = group {
        rustix::fs::chown(dir, None, Some(rustix::fs::Gid::from_raw(gid)))?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

/// Where the token for `socket` is kept unless told otherwise: beside it, `.token` for `.sock`.
pub fn default_token_file(socket: &Path) -> PathBuf {
    socket.with_extension("token")
}

/// The HTTP token: read from `path` if it exists (it must be this user's, readable by no one
/// else), else made (32 random bytes, hex) and written there with mode 0600; whether it was
/// made.
pub(crate) fn load_or_create_token(path: &Path) -> io::Result<(String, bool)> {
    match std::fs::metadata(path) {
        Ok(md) => {
            let me = rustix::process::geteuid().as_raw();
            if md.uid() != me || md.mode() & 0o077 != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "the token file {} must belong to you and be readable by no one else \
                         (it is uid {}, mode {:o}): chown it and chmod 600 it, or remove it to \
                         have a new token made",
                        path.display(),
                        md.uid(),
                        md.mode() & 0o777
                    ),
                ));
            }
            let token = std::fs::read_to_string(path)?.trim().to_string();
            if token.len() < 16 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the token in {} is shorter than 16 characters; put a longer one there, \
                         or remove the file to have one made",
                        path.display()
                    ),
                ));
            }
            Ok((token, false))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 32];
            rand::rngs::OsRng.fill_bytes(&mut bytes);
            let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)?;
            f.write_all(format!("{token}\n").as_bytes())?;
            Ok((token, true))
        }
        Err(e) => Err(e),
    }
}

/// Whether an `Authorization` header carries `token`, compared in constant time.
pub(crate) fn bearer_matches(header: Option<&str>, token: &str) -> bool {
    let Some(given) = header.and_then(|h| h.strip_prefix("Bearer ")) else {
        return false;
    };
    given.trim().as_bytes().ct_eq(token.as_bytes()).into()
}

/// Whether `peer` may change the registration of an application that runs as `app_uid`
/// (`own`: the request came on that application's own connection). A user's registrations are
/// its own; the coordinator's owner and root may change anyone's.
pub(crate) fn may_change(peer: Peer, coordinator_uid: u32, app_uid: u32, own: bool) -> bool {
    own || peer.uid == 0 || peer.uid == coordinator_uid || peer.uid == app_uid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_made_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coord.token");
        let (t, made) = load_or_create_token(&path).unwrap();
        assert!(made);
        assert_eq!(t.len(), 64);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(load_or_create_token(&path).unwrap(), (t, false));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_or_create_token(&path).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
    }

    #[test]
    fn only_the_right_bearer_passes() {
        let t = "0123456789abcdef0123";
        assert!(bearer_matches(Some("Bearer 0123456789abcdef0123"), t));
        assert!(!bearer_matches(Some("Bearer 0123456789abcdef012"), t));
        assert!(!bearer_matches(Some("Basic 0123456789abcdef0123"), t));
        assert!(!bearer_matches(None, t));
    }

    #[test]
    fn others_change_only_their_own_applications() {
        let stranger = Peer {
            pid: 50,
            uid: 1000,
            gid: 1000,
        };
        assert!(!may_change(stranger, 7, 60, false));
        assert!(may_change(stranger, 7, 1000, false));
        assert!(may_change(stranger, 7, 60, true));
        assert!(may_change(Peer { uid: 7, ..stranger }, 7, 60, false));
        assert!(may_change(Peer { uid: 0, ..stranger }, 7, 60, false));
    }

    #[test]
    fn a_directory_of_someone_else_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("sub/coord.sock");
        prepare_dir(&sock, None, true).unwrap();
        let md = std::fs::metadata(dir.path().join("sub")).unwrap();
        assert_eq!(md.mode() & 0o777, 0o700);
        if rustix::process::geteuid().is_root() {
            rustix::fs::chown(
                dir.path().join("sub"),
                Some(rustix::fs::Uid::from_raw(65534)),
                None,
            )
            .unwrap();
            let e = prepare_dir(&sock, None, true).unwrap_err().to_string();
            assert!(e.contains("not to you"), "{e}");
        }
    }
}
