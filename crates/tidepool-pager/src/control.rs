//! Memory as a service, operator side: a running program's budget changes live.
//!
//! A pager started for an unmodified program listens on the Unix socket `tidepool-run-PID` in
//! the abstract namespace (no file to clean up; gone when the process is). One request line,
//! one reply:
//!
//! ```text
//! budget 536870912      ->  ok budget 536870912
//! stats                 ->  ok <the statistics report, several lines>
//! ```
//!
//! An abstract socket has no file mode, so anyone on the machine could connect: the kernel's
//! word on who did (`SO_PEERCRED`) decides. Only the program's own user and root are answered.

use crate::Pager;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicI32, Ordering::*};

fn address(pid: u32) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("tidepool-run-{pid}"))
}

/// The listening socket of this process, if it serves one (a forked child closes its copy of
/// the parent's: it would keep the parent's name bound with nobody answering).
static LISTENING: AtomicI32 = AtomicI32::new(-1);

/// Serves control requests for `pager` on a background thread. In a forked child, call it
/// again: the child gets a socket of its own, named by its own process id.
pub fn serve(pager: &Pager, pid: u32) -> io::Result<()> {
    let inherited = LISTENING.swap(-1, AcqRel);
    if inherited >= 0 && crate::in_forked_child() {
        // The parent's listening socket, copied by fork; its thread is not here.
        crate::sys::close_inherited(inherited);
    }
    let listener = UnixListener::bind_addr(&address(pid)?)?;
    LISTENING.store(listener.as_raw_fd(), Release);
    let pager = pager.clone();
    let thread_start = pager.thread_start();
    // A raw thread, for the same reason as the pager's own (see `Config::thread_start`).
    tidepool_sys::spawn_raw("tp-control", move || {
        crate::pager::thread_begins(thread_start);
        for conn in listener.incoming().flatten() {
            let _ = answer(&pager, conn);
        }
    })?;
    Ok(())
}

/// Whether the process at the other end of `conn` runs as this program's user or as root.
fn trusted(conn: &UnixStream) -> bool {
    match rustix::net::sockopt::socket_peercred(conn) {
        Ok(c) => c.uid.is_root() || c.uid == rustix::process::geteuid(),
        Err(_) => false,
    }
}

fn answer(pager: &Pager, conn: UnixStream) -> io::Result<()> {
    let mut line = String::new();
    BufReader::new(&conn).take(4096).read_line(&mut line)?;
    if !trusted(&conn) {
        return (&conn).write_all(
            b"error refused: only this program's user or root may resize it or read its stats\n",
        );
    }
    let mut words = line.split_whitespace();
    let reply = match (words.next(), words.next()) {
        (Some("budget"), Some(n)) => match n.parse::<usize>() {
            Ok(bytes) if bytes >= 1 << 20 => {
                pager.set_local_budget(bytes);
                format!("ok budget {}\n", pager.local_budget())
            }
            _ => "error budget must be a number of bytes, at least 1 MiB\n".to_string(),
        },
        (Some("stats"), None) => format!("ok {}\n", pager.report()),
        (Some("add-node"), Some(addr)) => match pager.add_store_node(addr) {
            Ok(()) => format!("ok added {addr}\n"),
            // One line: the reply is read a line at a time.
            Err(e) => format!("error {}\n", e.to_string().replace('\n', " ")),
        },
        _ => "error unknown request; use 'budget BYTES', 'stats' or 'add-node HOST:PORT'\n"
            .to_string(),
    };
    (&conn).write_all(reply.as_bytes())
}

/// Sends one request to the pager of process `pid`; returns its reply without the leading
/// "ok ", or the pager's error as an error.
pub fn request(pid: u32, line: &str) -> io::Result<String> {
    let mut conn = UnixStream::connect_addr(&address(pid)?).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "no tidepool pager answers for process {pid} ({e}); is it running under `tidepool run`?"
            ),
        )
    })?;
    conn.write_all(format!("{line}\n").as_bytes())?;
    let mut reply = String::new();
    conn.read_to_string(&mut reply)?;
    match reply.strip_prefix("ok ") {
        Some(r) => Ok(r.trim_end().to_string()),
        None => Err(io::Error::other(
            reply.trim_start_matches("error ").trim_end().to_string(),
        )),
    }
}
