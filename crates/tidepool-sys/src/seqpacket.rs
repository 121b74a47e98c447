//! Unix `SOCK_SEQPACKET` sockets: one message per packet, a file descriptor passed with
//! `SCM_RIGHTS`, the peer's credentials from the kernel (`SO_PEERCRED`). The transport of the
//! coordinator protocol (`tidepool_proto::coord`), used by soft-memory runtimes, paged programs
//! and `tidepool coord`.

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketType,
};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One end of a coordinator connection: a Unix `SOCK_SEQPACKET` socket, one message per packet.
#[derive(Debug)]
pub struct Channel {
    fd: OwnedFd,
}

impl Channel {
    /// Two connected ends, close-on-exec (clear it on one to hand it to a program).
    pub fn pair() -> io::Result<(Channel, Channel)> {
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        Ok((Channel { fd: a }, Channel { fd: b }))
    }

    /// An end received from elsewhere (inherited by a program, say).
    pub fn from_fd(fd: OwnedFd) -> Channel {
        Channel { fd }
    }

    /// The socket itself.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Connects to the coordinator listening at `path`.
    pub fn connect(path: &Path) -> io::Result<Channel> {
        let fd = socket()?;
        rustix::net::connect(&fd, &SocketAddrUnix::new(path)?)?;
        Ok(Channel { fd })
    }

    /// Sends one message.
    pub fn send(&self, msg: &[u8]) -> io::Result<()> {
        rustix::net::send(&self.fd, msg, SendFlags::NOSIGNAL)?;
        Ok(())
    }

    /// Sends one message if the socket has room for it now; `WouldBlock` if the peer has left
    /// that many unread (a server must not wait on a client that stopped reading).
    pub fn send_now(&self, msg: &[u8]) -> io::Result<()> {
        rustix::net::send(&self.fd, msg, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)?;
        Ok(())
    }

    /// Ends the connection both ways: a thread waiting in [`Channel::recv`] sees it closed.
    pub fn shut_down(&self) {
        let _ = rustix::net::shutdown(&self.fd, rustix::net::Shutdown::Both);
    }

    /// Sends one message with a file descriptor attached.
    pub fn send_with_fd(&self, msg: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let fds = [fd];
        control.push(SendAncillaryMessage::ScmRights(&fds));
        rustix::net::sendmsg(
            &self.fd,
            &[io::IoSlice::new(msg)],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
        Ok(())
    }

    /// Waits up to `timeout` (forever with `None`) for one message into `buf`: its length and
    /// the file descriptor that came with it. `Ok(None)` on timeout; `UnexpectedEof` once the
    /// peer has closed.
    pub fn recv(
        &self,
        buf: &mut [u8],
        timeout: Option<Duration>,
    ) -> io::Result<Option<(usize, Option<OwnedFd>)>> {
        if let Some(t) = timeout {
            let mut fds = [rustix::event::PollFd::new(
                &self.fd,
                rustix::event::PollFlags::IN,
            )];
            let ts = rustix::event::Timespec {
                tv_sec: t.as_secs() as i64,
                tv_nsec: t.subsec_nanos() as i64,
            };
            loop {
                match rustix::event::poll(&mut fds, Some(&ts)) {
                    Ok(0) => return Ok(None),
                    Ok(_) => break,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = loop {
            match rustix::net::recvmsg(
                &self.fd,
                &mut [io::IoSliceMut::new(buf)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Err(rustix::io::Errno::INTR) => continue,
                r => break r?,
            }
        };
        let mut passed = None;
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = m {
                for fd in fds {
                    passed.get_or_insert(fd); // any beyond the first are closed
                }
            }
        }
        if got.bytes == 0 && passed.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the other side closed the connection",
            ));
        }
        if got.flags.contains(rustix::net::ReturnFlags::TRUNC) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a message longer than {} bytes", buf.len()),
            ));
        }
        Ok(Some((got.bytes, passed)))
    }
}

impl Channel {
    /// Waits until `due` for one message into `buf`: its length, or `None` once `due` has
    /// passed (a file descriptor sent with it is closed).
    pub fn recv_until(&self, buf: &mut [u8], due: std::time::Instant) -> io::Result<Option<usize>> {
        let left = due.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        Ok(self.recv(buf, Some(left))?.map(|(n, _)| n))
    }
}

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Who connected: the kernel's word for it (`SO_PEERCRED`), not the peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Channel {
    /// The process at the other end, as the kernel recorded it when it connected.
    pub fn peer(&self) -> io::Result<Peer> {
        let c = rustix::net::sockopt::socket_peercred(&self.fd)?;
        Ok(Peer {
            pid: c.pid.as_raw_nonzero().get() as u32,
            uid: c.uid.as_raw(),
            gid: c.gid.as_raw(),
        })
    }
}

/// The coordinator's listening socket; the socket file goes when it is dropped.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    path: PathBuf,
}

impl Listener {
    /// Listens at `path`, a socket only its owner may connect to (mode 0600), or also members
    /// of `group` (0660). A socket file nobody answers on is a leftover and is replaced; one
    /// that answers belongs to a coordinator that is running, and is an error.
    pub fn bind(path: &Path, group: Option<u32>) -> io::Result<Listener> {
        use rustix::fs::{Gid, Mode};
        if path.exists() {
            if Channel::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "a coordinator is already listening at {}; stop it, or pass another --socket",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let fd = socket()?;
        // The file bind creates takes the socket's mode: set it first, so that there is no
        // moment in which others could connect.
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o600))?;
        rustix::net::bind(&fd, &SocketAddrUnix::new(path)?)?;
        if let Some(gid) = group {
            rustix::fs::chown(path, None, Some(Gid::from_raw(gid)))?;
        }
        let mode = if group.is_some() { 0o660 } else { 0o600 };
        rustix::fs::chmod(path, Mode::from_raw_mode(mode))?;
        rustix::net::listen(&fd, 64)?;
        Ok(Listener {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Waits for the next runtime to connect.
    pub fn accept(&self) -> io::Result<Channel> {
        loop {
            match rustix::net::accept_with(&self.fd, rustix::net::SocketFlags::CLOEXEC) {
                Ok(fd) => return Ok(Channel { fd }),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A fresh Unix `SOCK_SEQPACKET` socket, closed on exec.
fn socket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?)
}
