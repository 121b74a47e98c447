//! The few system calls Tidepool makes by hand, each behind a safe function.
//!
//! [`recv_into`]: socket reads straight into the unused capacity of a receive buffer, so
//! received bytes are neither zero-filled first nor copied afterwards (decoded payloads are
//! slices of this buffer). The standard library offers no stable way to read into
//! uninitialised memory.

use bytes::BytesMut;
use std::io;
use std::os::fd::AsRawFd;

/// Receives at most the buffer's spare capacity; returns the bytes received (0: peer closed).
pub fn recv_into(stream: &impl AsRawFd, buf: &mut BytesMut) -> io::Result<usize> {
    if buf.capacity() == buf.len() {
        buf.reserve(16 << 10);
    }
    let spare = buf.spare_capacity_mut();
    loop {
        // SAFETY: `spare` is writable memory owned by `buf`, valid for `spare.len()` bytes;
        // recv writes at most that many and does not read them.
        let n = unsafe {
            libc::recv(
                stream.as_raw_fd(),
                spare.as_mut_ptr().cast(),
                spare.len(),
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let n = n as usize;
        // SAFETY: recv initialised exactly the first `n` bytes of the spare capacity.
        unsafe { buf.set_len(buf.len() + n) };
        return Ok(n);
    }
}
