//! Memory nodes for the suites: `tidepool node` processes on loopback, killed when dropped.

use anyhow::{anyhow, Context, Result};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// How long the suite's node keeps polling after a request (`tidepool node --busy-poll-us`).
pub const NODE_BUSY_POLL_US: u64 = 200;

/// A `tidepool node` child process.
#[derive(Debug)]
pub struct NodeProcess {
    child: Child,
    pub addr: String,
}

/// The `tidepool` binary to start nodes and workers from: this executable unless
/// `TIDEPOOL_BIN` says otherwise.
pub(crate) fn tidepool_bin() -> Result<PathBuf> {
    match std::env::var_os("TIDEPOOL_BIN") {
        Some(p) => Ok(PathBuf::from(p)),
        None => std::env::current_exe().context("cannot find the tidepool executable"),
    }
}

impl NodeProcess {
    pub fn start(capacity: &str) -> Result<NodeProcess> {
        Self::start_with(capacity, &[])
    }

    /// A node with more options (`--busy-poll-us 200`, ...).
    pub fn start_with(capacity: &str, args: &[&str]) -> Result<NodeProcess> {
        let bin = tidepool_bin()?;
        let mut child = Command::new(&bin)
            .args(["node", "--listen", "127.0.0.1:0", "--capacity", capacity])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start {} node", bin.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .context("reading the node's address")?;
        let addr = line
            .split_whitespace()
            .find(|w| w.starts_with("127.0.0.1:"))
            .ok_or_else(|| anyhow!("the node did not say where it listens: '{}'", line.trim()))?
            .to_string();
        Ok(NodeProcess { child, addr })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
