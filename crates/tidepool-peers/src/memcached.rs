//! memcached on loopback.

use crate::process::{free_port, launch, Launch, Process, TempDir, MEMCACHED, MEMCACHED_PROBE};
use crate::PeerError;
use std::fmt;
use std::fs;
use std::path::Path;
use std::process::Command;

/// One `memcached` on loopback, TCP only, with a 2 MiB item size limit. Killed when dropped.
pub struct Memcached {
    process: Process,
    port: u16,
    dir: TempDir,
}

impl fmt::Debug for Memcached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Memcached")
            .field("addr", &self.addr())
            .field("pid", &self.pid())
            .field("dir", &self.dir.path)
            .finish()
    }
}

impl Memcached {
    /// The largest value (item) the server accepts, as passed to `-I`.
    pub const ITEM_SIZE_LIMIT: usize = 2 << 20;

    /// Starts memcached with `memory_mib` MiB of item memory, two worker threads and a 2 MiB
    /// item size limit.
    pub fn start(memory_mib: u32) -> Result<Memcached, PeerError> {
        Memcached::start_with(memory_mib, 2, Memcached::ITEM_SIZE_LIMIT)
    }

    /// Starts memcached with `memory_mib` MiB of item memory (`-m`), `threads` worker threads
    /// (`-t`) and items of at most `item_max` bytes (`-I`).
    pub fn start_with(
        memory_mib: u32,
        threads: usize,
        item_max: usize,
    ) -> Result<Memcached, PeerError> {
        let dir = TempDir::new("memcached")?;
        let stdio_log = dir.path.join("memcached.log");
        let as_root = running_as_root();
        let command = |binary: &Path, port: u16| {
            let mut cmd = Command::new(binary);
            cmd.args(["-l", "127.0.0.1"])
                .arg("-p")
                .arg(port.to_string())
                .args(["-U", "0"])
                .arg("-m")
                .arg(memory_mib.to_string())
                .arg("-I")
                .arg(format!("{}k", item_max >> 10))
                .arg("-t")
                .arg(threads.to_string());
            // memcached refuses to run as root unless told which user to be.
            if as_root {
                cmd.args(["-u", "root"]);
            }
            cmd
        };
        let (process, port) = launch(&Launch {
            program: MEMCACHED,
            probe: MEMCACHED_PROBE,
            command: &command,
            port: free_port,
            logs: vec![stdio_log.clone()],
            stdio_log,
        })?;
        Ok(Memcached { process, port, dir })
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The store URL for this server, `memcached://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("memcached://{}", self.addr())
    }

    pub fn pid(&self) -> u32 {
        self.process.child.id()
    }
}

/// Whether this process runs as root: `/proc/self` belongs to the process's effective user.
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::testing::{ask, port_is_closed};

    #[test]
    fn memcached_answers_and_goes_away_on_drop() {
        let mc = Memcached::start(64).unwrap();
        let addr = mc.addr();
        assert!(ask(&addr, b"version\r\n").starts_with("VERSION "));
        drop(mc);
        assert!(
            port_is_closed(&addr),
            "memcached still listening on {addr} after drop"
        );
    }
}
