//! The pager suite's systems: the program under `tidepool run` (far store in process, on a
//! memory node, or erasure-coded over six), in a memory cgroup swapping to zram, or native;
//! and the servers they need, started once for the suite.

use crate::harness::{on_any_cpu, Ctx, System};
use crate::meter::{FarGauge, Gauge, Watch};
use crate::node::{NodeProcess, NODE_BUSY_POLL_US};
use crate::zram::Zram;
use anyhow::Result;
use std::path::PathBuf;
use std::process::Command;

/// Where the program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pager {
    /// `tidepool run` as a user types it: the default store, pages compressed in process.
    TidepoolDefault,
    /// Under `tidepool run`, far store in process, pages kept whole: the pager alone.
    TidepoolLocal,
    /// Under `tidepool run`, on a `tidepool node` process.
    TidepoolNode,
    /// Under `tidepool run`, erasure-coded 4+2 over six node processes.
    TidepoolNodeEc,
    /// In a memory cgroup limited to the same local size, swapping to zram.
    LinuxZram,
    /// Everything local (at 100% only).
    Native,
}

impl System for Pager {
    fn name(&self) -> &'static str {
        match self {
            Pager::TidepoolDefault => "tidepool-default",
            Pager::TidepoolLocal => "tidepool-local",
            Pager::TidepoolNode => "tidepool-node",
            Pager::TidepoolNodeEc => "tidepool-node-x6-ec4+2",
            Pager::LinuxZram => "linux-zram",
            Pager::Native => "native",
        }
    }
}

/// The servers behind the systems, and how to run a program under each.
pub(super) struct Runner {
    exe: PathBuf,
    preload: PathBuf,
    node: NodeProcess,
    /// The erasure-coded store's nodes, kept running.
    _ec_nodes: Vec<NodeProcess>,
    ec_url: String,
    zram: Option<Zram>,
}

impl Runner {
    /// Starts the memory node and the six nodes of the erasure-coded store, where servers go.
    pub(super) fn start(ctx: &mut Ctx, wss: u64) -> Result<Runner> {
        let preload = crate::libs::next_to_exe("tidepool-preload", "libtidepool_preload.so")?;
        // The node has a CPU of its own (as on another machine), so it polls for requests
        // rather than sleeping between them (`--busy-poll-us`): a cross-CPU wake-up costs this
        // VM tens of microseconds, more than serving the page.
        let poll = NODE_BUSY_POLL_US.to_string();
        let node = NodeProcess::start_with(&format!("{}", wss * 3), &["--busy-poll-us", &poll])?;
        ctx.opts.placement.pin_server(node.pid())?;
        ctx.note(format!(
            "tidepool-node: the node polls {NODE_BUSY_POLL_US} us for requests before it sleeps; \
             its clients poll {} us for answers",
            tidepool_store::NODE_DEFAULT_POLL.as_micros()
        ));
        // The erasure-coded store: six nodes started the same way, each page in four data
        // pieces and two parity pieces, one per node.
        let ec_nodes = (0..6)
            .map(|_| NodeProcess::start_with(&format!("{wss}"), &["--busy-poll-us", &poll]))
            .collect::<Result<Vec<_>>>()?;
        for n in &ec_nodes {
            ctx.opts.placement.pin_server(n.pid())?;
        }
        let ec_url = format!(
            "node://bench@{}?ec=4+2",
            ec_nodes
                .iter()
                .map(|n| n.addr.as_str())
                .collect::<Vec<_>>()
                .join(",")
        );
        Ok(Runner {
            exe: std::env::current_exe()?,
            preload,
            node,
            _ec_nodes: ec_nodes,
            ec_url,
            zram: None,
        })
    }

    /// The memory node's URL for client `user`.
    pub(super) fn node_url(&self, user: &str) -> String {
        format!("node://{user}@{}", self.node.addr)
    }

    /// Sets up swap to zram of `disksize` bytes; without it (no root, no zram) linux-zram is
    /// left out, with a note.
    pub(super) fn start_zram(&mut self, ctx: &mut Ctx, disksize: u64) {
        match Zram::start(disksize) {
            Ok(z) => self.zram = Some(z),
            Err(e) => ctx.note(format!("linux-zram skipped: {e:#}")),
        }
    }

    /// The systems that can run, in the report's order.
    pub(super) fn systems(&self) -> Vec<Pager> {
        let mut systems = vec![
            Pager::TidepoolDefault,
            Pager::TidepoolLocal,
            Pager::TidepoolNode,
            Pager::TidepoolNodeEc,
        ];
        if self.zram.is_some() {
            systems.push(Pager::LinuxZram);
        }
        systems.push(Pager::Native);
        systems
    }

    /// A command that runs its arguments under `system` with `local` bytes of local memory: on
    /// any CPU, except node-backed runs, which stay off the nodes' CPU (see [`on_any_cpu`]).
    pub(super) fn command(&self, system: Pager, local: u64) -> Result<Command> {
        let backend = match system {
            Pager::Native => return Ok(on_any_cpu(&Command::new("env"))),
            Pager::LinuxZram => {
                return Ok(on_any_cpu(
                    &self
                        .zram
                        .as_ref()
                        .expect("listed only if started")
                        .command(local)?,
                ))
            }
            Pager::TidepoolNode => Some(self.node_url("bench")),
            Pager::TidepoolNodeEc => Some(self.ec_url.clone()),
            Pager::TidepoolLocal => Some("local:?compress=none".into()),
            Pager::TidepoolDefault => None,
        };
        let mut c = Command::new(&self.exe);
        c.args(["run", "--local", &local.to_string()]);
        if let Some(b) = backend {
            c.args(["--backend", &b]);
        }
        c.arg("--").env("TIDEPOOL_PRELOAD", &self.preload);
        Ok(match system {
            Pager::TidepoolNode | Pager::TidepoolNodeEc => c,
            _ => on_any_cpu(&c),
        })
    }

    /// Starts following the bytes `system` holds for program `pid`: on this machine, and on
    /// the memory nodes.
    pub(super) fn watch(&self, system: Pager, pid: u32) -> Watch {
        let gauge = match (system, &self.zram) {
            (Pager::LinuxZram, Some(z)) => z.gauge(),
            _ => Gauge::Processes,
        };
        let far = match system {
            Pager::TidepoolNode => Some(self.node_url("bench")),
            Pager::TidepoolNodeEc => Some(self.ec_url.clone()),
            _ => None,
        }
        .map(|url| FarGauge { url });
        Watch::start(pid, &gauge, far.as_ref())
    }
}
