//! The coordinator's socket: accepting runtimes (hello with their memfd), their reports and
//! answers, and command connections (`tidepool weight`).

use crate::control::apply;
use crate::registry::{clamp_weight, App, Shared, State};
use std::collections::HashSet;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidepool_proto::coord::{AppKind, FromCoord, Report, ToCoord, GHOST_BUCKETS, MAX_MESSAGE};
use tidepool_soft::coord::{Channel, Listener, Peer};

pub(crate) fn accept_loop(shared: Arc<Shared>, listener: Arc<Listener>) {
    loop {
        let ch = match listener.accept() {
            Ok(ch) => ch,
            Err(e) => {
                tracing::warn!("coordinator: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if shared.stop.load(Acquire) {
            return;
        }
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("tp-coord-app".into())
            .spawn(move || serve_app(s, Arc::new(ch)));
        if let Err(e) = spawned {
            tracing::warn!("coordinator: cannot start a thread for an application: {e}");
        }
    }
}

/// One application's connection: registration, then reports until it leaves.
pub(crate) fn serve_app(shared: Arc<Shared>, ch: Arc<Channel>) {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let joining = match hello(&shared, &ch, &mut buf) {
        Ok(Some(joining)) => joining,
        Ok(None) => return,
        Err(why) => {
            tracing::warn!("coordinator: refused an application: {why}");
            let _ = ch.send(&FromCoord::Error { message: why }.encode());
            return;
        }
    };
    let peer = joining.peer;
    let id = register(&shared, &ch, joining);
    let why = follow_reports(&shared, &ch, peer, id, &mut buf);
    let mut s = shared.state.lock();
    if let Some(i) = s.apps.iter().position(|a| a.id == id) {
        let a = s.apps.remove(i); // closes its memfd: its memory goes with the process
        tracing::info!(app = id, name = %a.name, budget = a.budget, "application left: {why}");
        s.epoch_due = true;
    }
}

/// An application that said hello, checked, about to be registered.
struct Joining {
    /// The process as the kernel knows it: a pid in the hello could name anyone.
    peer: Peer,
    kind: AppKind,
    name: String,
    weight: f64,
    segment: u64,
    capacity: u64,
    min: u64,
    memfd: Option<OwnedFd>,
}

/// Reads an application's hello and checks it. `Ok(None)`: nothing to register (the
/// connection failed, or it only sends commands, which are answered here); `Err`: why the
/// application is refused.
fn hello(shared: &Shared, ch: &Channel, buf: &mut [u8]) -> Result<Option<Joining>, String> {
    let peer = ch
        .peer()
        .map_err(|e| format!("its credentials cannot be read: {e}"))?;
    let (msg, memfd) = match ch.recv(buf, Some(Duration::from_secs(5))) {
        Ok(Some((n, fd))) => (ToCoord::decode(&buf[..n]), fd),
        Ok(None) => return Err("no hello within 5 s".into()),
        Err(_) => return Ok(None),
    };
    let (kind, weight, segment, capacity, min, name) = match msg {
        Ok(ToCoord::Hello {
            kind,
            weight,
            segment,
            capacity,
            min,
            name,
            ..
        }) => (kind, weight, segment as u64, capacity, min, name),
        Ok(ToCoord::SetWeight { app, weight }) => {
            serve_commands(shared, ch, peer, app, weight, buf);
            return Ok(None);
        }
        Ok(other) => return Err(format!("expected hello first, got {other:?}")),
        Err(e) => return Err(format!("bad hello: {e}")),
    };
    // A paged program's memory is its pager's to give back; a memfd it sent is closed.
    let memfd = match (kind, memfd) {
        (AppKind::Soft, None) => {
            return Err("the hello carried no memfd (SCM_RIGHTS)".into());
        }
        (AppKind::Soft, Some(fd)) => Some(fd),
        (AppKind::Paged, _) => None,
    };
    if !segment.is_power_of_two() || !(4096..=1 << 30).contains(&segment) {
        return Err(format!(
            "segment size {segment} is not a power of two in 4K-1G"
        ));
    }
    if let Some(Err(e)) = memfd.as_ref().map(rustix::fs::fstat) {
        return Err(format!("the memfd cannot be inspected: {e}"));
    }
    let name = printable_name(&name, peer.pid);
    let weight = clamp_weight(weight, &name);
    Ok(Some(Joining {
        peer,
        kind,
        name,
        weight,
        segment,
        capacity,
        min: min.min(capacity),
        memfd,
    }))
}

/// Registers the application with its first budget, welcomes it, and returns its id.
fn register(shared: &Shared, ch: &Arc<Channel>, j: Joining) -> u32 {
    let (kind, name, weight) = (j.kind, j.name.clone(), j.weight);
    let (pid, uid) = (j.peer.pid, j.peer.uid);
    let id = {
        let mut s = shared.state.lock();
        let id = s.next_id;
        s.next_id += 1;
        let share = first_share(shared, &mut s, &j);
        let mean_utility = if s.apps.is_empty() {
            0.0
        } else {
            s.apps.iter().map(|a| a.utility).sum::<f64>() / s.apps.len() as f64
        };
        let mut app = new_app(j, id, ch.clone(), share, mean_utility);
        app.measure();
        app.send(&FromCoord::Welcome {
            app: id,
            budget: share,
            heartbeat_ms: shared.config.heartbeat.as_millis() as u32,
        });
        s.apps.push(app);
        s.epoch_due = true;
        id
    };
    tracing::info!(app = id, %kind, %name, pid, uid, weight, "application joined");
    id
}

/// A newcomer's first budget: an even share of the pool; the others give it up in
/// proportion to their budgets (so applications that start together start even, as in
/// Midas §7.1).
fn first_share(shared: &Shared, s: &mut State, j: &Joining) -> u64 {
    let n = s.apps.len() as u64 + 1;
    let floor = if j.min > 0 {
        j.min
    } else {
        shared.config.floor
    };
    let share = (s.pool / n / j.segment * j.segment).max(floor.min(s.pool));
    let share = share.min(j.capacity);
    let granted: u64 = s.apps.iter().map(|a| a.budget).sum();
    if granted + share > s.pool && granted > 0 {
        let keep = s.pool.saturating_sub(share) as f64 / granted as f64;
        let cut: Vec<u64> = s
            .apps
            .iter()
            .map(|a| ((a.budget as f64 * keep) as u64 / a.segment * a.segment).max(a.segment))
            .collect();
        apply(s, &cut);
    }
    share
}

/// The registry's entry for a newcomer with id `id` and budget `budget`, its utility the
/// others' mean until its own reports say.
fn new_app(j: Joining, id: u32, chan: Arc<Channel>, budget: u64, utility: f64) -> App {
    let now = Instant::now();
    App {
        id,
        kind: j.kind,
        name: j.name,
        pid: j.peer.pid,
        uid: j.peer.uid,
        weight: j.weight,
        segment: j.segment,
        capacity: j.capacity,
        min: j.min,
        memfd: j.memfd,
        chan,
        budget,
        held: 0,
        report: Report::default(),
        base: Report::default(),
        base_at: now,
        last_report: now,
        joined: now,
        utility,
        demand: false,
        dropped_epoch: None,
        grown_epoch: 0,
        hit_rate: 0.0,
        reads_per_s: 0.0,
        rebuild_share: 0.0,
        miss_nanos: 0.0,
        curve_hits: [0.0; GHOST_BUCKETS],
        curve_nanos: [0.0; GHOST_BUCKETS],
        reach_to: 0,
        near: 0.0,
        held_seen: std::collections::VecDeque::new(),
        clamped_said: false,
        reported: false,
        punched_since_report: HashSet::new(),
        shrink_deadline: None,
        punched_bytes: 0,
    }
}

/// Takes application `id`'s reports and commands until it leaves, and returns why it left.
fn follow_reports(shared: &Shared, ch: &Channel, peer: Peer, id: u32, buf: &mut [u8]) -> String {
    let quiet = shared.config.heartbeat * 50;
    // Messages allowed per second: ten times what its heartbeat asks for, at least 100.
    let allowed = (10_000 / shared.config.heartbeat.as_millis().max(1) as u64).max(100);
    let mut window = (Instant::now(), 0u64);
    loop {
        let n = match ch.recv(buf, Some(quiet)) {
            Ok(Some((n, _))) => n,
            Ok(None) => return format!("no report for {quiet:?}"),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return "it exited".into(),
            Err(e) => return format!("{e}"),
        };
        if window.0.elapsed() >= Duration::from_secs(1) {
            window = (Instant::now(), 0);
        }
        window.1 += 1;
        if window.1 > allowed {
            return format!(
                "it flooded the coordinator (more than {allowed} messages within a second); \
                 dropped"
            );
        }
        match ToCoord::decode(&buf[..n]) {
            Ok(ToCoord::Report(r)) => take_report(shared, id, *r),
            Ok(ToCoord::SetWeight { app, weight }) => {
                let reply = shared.command_set_weight(peer, Some(id), app, weight);
                if app != id {
                    let _ = ch.send(&reply.encode());
                }
            }
            Ok(ToCoord::Bye) => return "it said goodbye".into(),
            Ok(ToCoord::Hello { .. }) => return "a second hello".into(),
            Err(e) => return format!("a bad message: {e}"),
        }
    }
}

/// Keeps application `id`'s latest report.
fn take_report(shared: &Shared, id: u32, r: Report) {
    let mut s = shared.state.lock();
    if let Some(a) = s.apps.iter_mut().find(|a| a.id == id) {
        // Its counters run from its start, not from its joining: the first
        // report is where the coordinator's deltas start.
        if !a.reported {
            a.base = r.clone();
            a.base_at = Instant::now();
            a.reported = true;
        }
        a.report = r;
        a.last_report = Instant::now();
        a.punched_since_report.clear();
    }
}

/// A connection that only sends commands (`tidepool weight`): the first has come; answers it
/// and any that follow within 5 s each.
pub(crate) fn serve_commands(
    shared: &Shared,
    ch: &Channel,
    peer: Peer,
    app: u32,
    weight: f64,
    buf: &mut [u8],
) {
    let mut next = Some((app, weight));
    while let Some((app, weight)) = next.take() {
        let reply = shared.command_set_weight(peer, None, app, weight);
        if ch.send(&reply.encode()).is_err() {
            return;
        }
        if let Ok(Some((n, _))) = ch.recv(buf, Some(Duration::from_secs(5))) {
            if let Ok(ToCoord::SetWeight { app, weight }) = ToCoord::decode(&buf[..n]) {
                next = Some((app, weight));
            }
        }
    }
}

/// A name as shown on the dashboard, in logs and in `tidepool top`: control characters (a
/// terminal's escape sequences, line breaks that would forge log lines) and bidirectional
/// overrides (which reorder what follows) become `?`, and an empty name becomes "pid PID".
pub(crate) fn printable_name(name: &str, pid: u32) -> String {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') {
                '?'
            } else {
                c
            }
        })
        .collect();
    let clean = clean.trim().to_string();
    if clean != name {
        tracing::warn!(
            pid,
            name = %clean,
            "coordinator: an application's name had control characters, bidirectional \
             overrides or blanks around it; they are shown as '?' (blanks dropped)"
        );
    }
    if clean.is_empty() {
        format!("pid {pid}")
    } else {
        clean
    }
}
