//! The systems of the store suite's key-value workloads: a memory node (alone, replicated three
//! ways, erasure-coded over six), Redis and memcached, each started as a server process and
//! reached through the store URL a Tidepool user would give.

use crate::harness::wanted;
use crate::harness::{Ctx, System};
use crate::node::NodeProcess;
use anyhow::{bail, Result};
use std::sync::Arc;
use tidepool_store::FarStore;

/// Which server a system is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StoreKind {
    Node,
    NodeX3R2,
    NodeX6Ec,
    Redis,
    Memcached,
}

/// A started server: its pids, the store URL to reach it, and what keeps it running.
pub(super) type Started = (Vec<u32>, String, Box<dyn std::any::Any>);

impl StoreKind {
    /// Every system, in the report's order.
    pub(super) const ALL: [StoreKind; 5] = [
        StoreKind::Node,
        StoreKind::NodeX3R2,
        StoreKind::NodeX6Ec,
        StoreKind::Redis,
        StoreKind::Memcached,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            StoreKind::Node => "tidepool-node",
            StoreKind::NodeX3R2 => "tidepool-node-x3-r2",
            StoreKind::NodeX6Ec => "tidepool-node-x6-ec4+2",
            StoreKind::Redis => "redis",
            StoreKind::Memcached => "memcached",
        }
    }

    fn start(self) -> Result<Started> {
        Ok(match self {
            StoreKind::Node => {
                let n = NodeProcess::start("2G")?;
                (
                    vec![n.pid()],
                    format!("node://bench@{}", n.addr),
                    Box::new(n),
                )
            }
            StoreKind::NodeX3R2 => start_nodes(3, "replicas=2")?,
            StoreKind::NodeX6Ec => start_nodes(6, "ec=4+2")?,
            StoreKind::Redis => {
                let r = tidepool_peers::RedisServer::start()?;
                (vec![r.pid()], format!("redis://{}", r.addr()), Box::new(r))
            }
            StoreKind::Memcached => {
                let m = tidepool_peers::Memcached::start(1024)?;
                (
                    vec![m.pid()],
                    format!("memcached://{}", m.addr()),
                    Box::new(m),
                )
            }
        })
    }
}

/// A running system: its store client and the servers behind it.
pub(super) struct StoreSystem {
    pub(super) kind: StoreKind,
    pub(super) store: Arc<dyn FarStore>,
    /// The server processes, for pinning and their CPU time.
    pids: Vec<u32>,
    _server: Box<dyn std::any::Any>,
}

impl std::fmt::Debug for StoreSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSystem")
            .field("kind", &self.kind)
            .field("pids", &self.pids)
            .finish()
    }
}

impl System for StoreSystem {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn server_pids(&self) -> Vec<u32> {
        self.pids.clone()
    }
}

impl StoreSystem {
    /// CPU seconds its servers have used so far, if all can tell.
    pub(super) fn cpu_seconds(&self) -> Option<f64> {
        self.pids.iter().map(|&p| cpu_seconds(p)).sum()
    }
}

/// Starts every system `TIDEPOOL_BENCH_SYSTEMS` allows, noting those that cannot start.
pub(super) fn start(ctx: &mut Ctx) -> Result<Vec<StoreSystem>> {
    let mut systems = vec![];
    for kind in StoreKind::ALL {
        let name = kind.name();
        ctx.step(format!("starting {name}"));
        if wanted(name) {
            let started = kind.start().and_then(|(pids, url, server)| {
                let s = StoreSystem {
                    kind,
                    store: tidepool_store::open(&url)?,
                    pids,
                    _server: server,
                };
                for &p in &s.pids {
                    ctx.opts.placement.pin_server(p)?;
                }
                Ok(s)
            });
            match started {
                Ok(s) => systems.push(s),
                Err(e) => ctx.note(format!("{name} could not start: {e:#}")),
            }
        }
        ctx.advance();
    }
    if systems.is_empty() {
        bail!("no system could be started");
    }
    Ok(systems)
}

/// Memory nodes started together for one store over all of them.
pub(super) fn start_nodes(n: usize, query: &str) -> Result<Started> {
    let nodes = (0..n)
        .map(|_| NodeProcess::start("2G"))
        .collect::<Result<Vec<_>>>()?;
    let addrs: Vec<&str> = nodes.iter().map(|n| n.addr.as_str()).collect();
    Ok((
        nodes.iter().map(NodeProcess::pid).collect(),
        format!("node://bench@{}?{query}", addrs.join(",")),
        Box::new(nodes),
    ))
}

/// CPU seconds (user + system) process `pid` has used so far.
pub(crate) fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // USER_HZ is 100 on Linux.
    Some(ticks / 100.0)
}
