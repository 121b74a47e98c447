//! Connections to memcached: opening one, sending a batch of commands on it, reading the
//! replies back through a buffer.

use super::protocol::{self, Batch, Reply, ReplyError};
use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long opening a connection may take.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one read or write on an open connection may block.
pub(super) const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Room for the replies to a batch of 16 pages, so that they are read in a few system calls.
const READ_BUFFER: usize = 80 << 10;

/// One connection, used by one caller at a time for a whole call.
#[derive(Debug)]
pub(super) struct Conn {
    /// The stream, written through [`BufReader::get_ref`]: writes are never buffered, since a
    /// batch goes out in one vectored write.
    reader: BufReader<TcpStream>,
}

impl Conn {
    pub(super) fn open(addr: &str) -> io::Result<Conn> {
        Ok(Conn {
            reader: BufReader::with_capacity(READ_BUFFER, connect(addr)?),
        })
    }

    pub(super) fn send(&mut self, batch: &Batch<'_>) -> io::Result<()> {
        batch.send(self.reader.get_ref())
    }

    pub(super) fn reply(&mut self, max_value: usize) -> Result<Reply, ReplyError> {
        protocol::read_reply(&mut self.reader, max_value)
    }

    /// Whether nothing has arrived beyond the replies read so far. After the last reply to a
    /// batch, anything more means the connection is out of step with the server.
    pub(super) fn drained(&self) -> bool {
        self.reader.buffer().is_empty()
    }
}

/// Opens a TCP connection to `addr` (`host:port`), trying each address it resolves to, with
/// Nagle's algorithm off (every batch is one write, and it should leave at once) and the I/O
/// timeouts set.
pub(super) fn connect(addr: &str) -> io::Result<TcpStream> {
    let mut last_error = None;
    for sock in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&sock, CONNECT_TIMEOUT) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                stream.set_read_timeout(Some(IO_TIMEOUT))?;
                stream.set_write_timeout(Some(IO_TIMEOUT))?;
                return Ok(stream);
            }
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, "the name resolved to no address")
    }))
}

/// Sends `command` (`stats`, `stats settings`) on a fresh connection and returns the `STAT`
/// lines as a map.
pub(super) fn ask_stats(addr: &str, command: &str) -> io::Result<HashMap<String, String>> {
    let mut stream = connect(addr)?;
    stream.write_all(format!("{command}\r\n").as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut stats = HashMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the server closed the connection before answering '{command}'"),
            ));
        }
        let line = line.trim_end();
        if line == "END" {
            return Ok(stats);
        }
        let mut parts = line.splitn(3, ' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some("STAT"), Some(name), Some(value)) => {
                stats.insert(name.to_string(), value.to_string());
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "unexpected answer to '{command}': {line}; is this a memcached server?"
                    ),
                ))
            }
        }
    }
}
