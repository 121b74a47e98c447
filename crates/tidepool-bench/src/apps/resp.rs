//! Just enough of Redis's protocol (RESP) for the apps suite's checks.

use anyhow::{anyhow, bail, Result};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A connection speaking just enough RESP for the checks.
pub(super) struct Resp {
    pub(super) r: BufReader<TcpStream>,
    pub(super) w: std::io::BufWriter<TcpStream>,
}

impl Resp {
    pub(super) fn connect(port: u16) -> Result<Resp> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(600)))?;
        Ok(Resp {
            r: BufReader::new(s.try_clone()?),
            w: std::io::BufWriter::new(s),
        })
    }

    pub(super) fn send(&mut self, parts: &[&[u8]]) -> Result<()> {
        write!(self.w, "*{}\r\n", parts.len())?;
        for p in parts {
            write!(self.w, "${}\r\n", p.len())?;
            self.w.write_all(p)?;
            self.w.write_all(b"\r\n")?;
        }
        Ok(())
    }

    /// One reply: a simple string, integer or error as text, a bulk string as bytes.
    pub(super) fn reply(&mut self) -> Result<Vec<u8>> {
        self.w.flush()?;
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            bail!("redis closed the connection");
        }
        let line = line.trim_end();
        match line.as_bytes().first() {
            Some(b'+') | Some(b':') => Ok(line.as_bytes()[1..].to_vec()),
            Some(b'-') => bail!("redis said {line}"),
            Some(b'$') => {
                let n: i64 = line[1..].parse()?;
                if n < 0 {
                    return Ok(Vec::new());
                }
                let mut v = vec![0; n as usize + 2];
                self.r.read_exact(&mut v)?;
                v.truncate(n as usize);
                Ok(v)
            }
            _ => bail!("redis answered '{line}'"),
        }
    }

    pub(super) fn call(&mut self, parts: &[&[u8]]) -> Result<Vec<u8>> {
        self.send(parts)?;
        self.reply()
    }

    pub(super) fn info_field(&mut self, section: &str, field: &str) -> Result<String> {
        let info = self.call(&[b"INFO", section.as_bytes()])?;
        let info = String::from_utf8_lossy(&info);
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .map(|v| v.trim().to_string())
            .ok_or_else(|| anyhow!("INFO {section} lacks {field}"))
    }
}
