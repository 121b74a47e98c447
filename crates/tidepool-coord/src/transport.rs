//! The coordinator's socket: accepting runtimes (hello with their memfd), their reports and
//! answers, and command connections (`tidepool weight`).

use crate::control::apply;
use crate::registry::{clamp_weight, App, Shared};
use std::collections::HashSet;
use std::io;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidepool_proto::coord::{AppKind, FromCoord, Report, ToCoord, GHOST_BUCKETS, MAX_MESSAGE};
use tidepool_soft::coord::{Channel, Listener};

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
    let refuse = |why: String| {
        tracing::warn!("coordinator: refused an application: {why}");
        let _ = ch.send(&FromCoord::Error { message: why }.encode());
    };
    let peer = match ch.peer() {
        Ok(p) => p,
        Err(e) => return refuse(format!("its credentials cannot be read: {e}")),
    };
    let (msg, memfd) = match ch.recv(&mut buf, Some(Duration::from_secs(5))) {
        Ok(Some((n, fd))) => (ToCoord::decode(&buf[..n]), fd),
        Ok(None) => return refuse("no hello within 5 s".into()),
        Err(_) => return,
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
            return serve_commands(&shared, &ch, peer, app, weight, &mut buf)
        }
        Ok(other) => return refuse(format!("expected hello first, got {other:?}")),
        Err(e) => return refuse(format!("bad hello: {e}")),
    };
    // The process as the kernel knows it: a pid in the hello could name anyone.
    let (pid, uid) = (peer.pid, peer.uid);
    // A paged program's memory is its pager's to give back; a memfd it sent is closed.
    let memfd = match (kind, memfd) {
        (AppKind::Soft, None) => {
            return refuse("the hello carried no memfd (SCM_RIGHTS)".into());
        }
        (AppKind::Soft, Some(fd)) => Some(fd),
        (AppKind::Paged, _) => None,
    };
    if !segment.is_power_of_two() || !(4096..=1 << 30).contains(&segment) {
        return refuse(format!(
            "segment size {segment} is not a power of two in 4K-1G"
        ));
    }
    if let Some(Err(e)) = memfd.as_ref().map(rustix::fs::fstat) {
        return refuse(format!("the memfd cannot be inspected: {e}"));
    }
    let name = printable_name(&name, pid);
    let weight = clamp_weight(weight, &name);
    let min = min.min(capacity);
    let id = {
        let mut s = shared.state.lock();
        let id = s.next_id;
        s.next_id += 1;
        // An even share of the pool; the others give it up in proportion to their budgets
        // (so applications that start together start even, as in Midas §7.1).
        let n = s.apps.len() as u64 + 1;
        let floor = if min > 0 { min } else { shared.config.floor };
        let share = (s.pool / n / segment * segment).max(floor.min(s.pool));
        let share = share.min(capacity);
        let granted: u64 = s.apps.iter().map(|a| a.budget).sum();
        if granted + share > s.pool && granted > 0 {
            let keep = s.pool.saturating_sub(share) as f64 / granted as f64;
            let cut: Vec<u64> = s
                .apps
                .iter()
                .map(|a| ((a.budget as f64 * keep) as u64 / a.segment * a.segment).max(a.segment))
                .collect();
            apply(&mut s, &cut);
        }
        let mean_utility = if s.apps.is_empty() {
            0.0
        } else {
            s.apps.iter().map(|a| a.utility).sum::<f64>() / s.apps.len() as f64
        };
        let now = Instant::now();
        let mut app = App {
            id,
            kind,
            name: name.clone(),
            pid,
            uid,
            weight,
            segment,
            capacity,
            min,
            memfd,
            chan: ch.clone(),
            budget: share,
            held: 0,
            report: Report::default(),
            base: Report::default(),
            base_at: now,
            last_report: now,
            joined: now,
            utility: mean_utility,
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
        };
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
    let quiet = shared.config.heartbeat * 50;
    // Messages allowed per second: ten times what its heartbeat asks for, at least 100.
    let allowed = (10_000 / shared.config.heartbeat.as_millis().max(1) as u64).max(100);
    let mut window = (Instant::now(), 0u64);
    let why = loop {
        let n = match ch.recv(&mut buf, Some(quiet)) {
            Ok(Some((n, _))) => n,
            Ok(None) => break format!("no report for {quiet:?}"),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break "it exited".into(),
            Err(e) => break format!("{e}"),
        };
        if window.0.elapsed() >= Duration::from_secs(1) {
            window = (Instant::now(), 0);
        }
        window.1 += 1;
        if window.1 > allowed {
            break format!(
                "it flooded the coordinator (more than {allowed} messages within a second); \
                 dropped"
            );
        }
        match ToCoord::decode(&buf[..n]) {
            Ok(ToCoord::Report(r)) => {
                let mut s = shared.state.lock();
                if let Some(a) = s.apps.iter_mut().find(|a| a.id == id) {
                    // Its counters run from its start, not from its joining: the first
                    // report is where the coordinator's deltas start.
                    if !a.reported {
                        a.base = (*r).clone();
                        a.base_at = Instant::now();
                        a.reported = true;
                    }
                    a.report = *r;
                    a.last_report = Instant::now();
                    a.punched_since_report.clear();
                }
            }
            Ok(ToCoord::SetWeight { app, weight }) => {
                let reply = shared.command_set_weight(peer, Some(id), app, weight);
                if app != id {
                    let _ = ch.send(&reply.encode());
                }
            }
            Ok(ToCoord::Bye) => break "it said goodbye".into(),
            Ok(ToCoord::Hello { .. }) => break "a second hello".into(),
            Err(e) => break format!("a bad message: {e}"),
        }
    };
    let mut s = shared.state.lock();
    if let Some(i) = s.apps.iter().position(|a| a.id == id) {
        let a = s.apps.remove(i); // closes its memfd: its memory goes with the process
        tracing::info!(app = id, name = %a.name, budget = a.budget, "application left: {why}");
        s.epoch_due = true;
    }
}

/// A connection that only sends commands (`tidepool weight`): the first has come; answers it
/// and any that follow within 5 s each.
pub(crate) fn serve_commands(
    shared: &Shared,
    ch: &Channel,
    peer: tidepool_soft::coord::Peer,
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
