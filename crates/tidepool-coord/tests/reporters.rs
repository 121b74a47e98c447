//! Programs that report nonsense, over a real socket: absurd figures are clamped, an absurd
//! weight is clamped, a hostile name is shown as text, a flood of messages and a program that
//! stops reading get it dropped; an honest program beside them keeps being served.

use std::time::{Duration, Instant};
use tidepool_coord::{Config, Coordinator, Policy};
use tidepool_proto::coord::{AppKind, FromCoord, Report, ToCoord, GHOST_BUCKETS, MAX_MESSAGE};
use tidepool_sys::seqpacket::Channel;

const MIB: u64 = 1 << 20;

fn coordinator(name: &str) -> Coordinator {
    Coordinator::start(
        Config::default()
            .socket(std::env::temp_dir().join(format!(
                "tp-coord-reporters-{name}-{}.sock",
                std::process::id()
            )))
            .policy(Policy::Midas)
            .reserve(0)
            .max(256 * MIB)
            .floor(8 * MIB)
            .heartbeat(Duration::from_millis(20))
            .epoch(Duration::from_millis(50)),
    )
    .expect("start a coordinator")
}

/// A paged program's hello, and the welcome's budget.
fn join(coord: &Coordinator, name: &str, weight: f64) -> (Channel, u64) {
    let ch = Channel::connect(coord.socket()).unwrap();
    let hello = ToCoord::Hello {
        kind: AppKind::Paged,
        pid: std::process::id(),
        weight,
        segment: 2 << 20,
        capacity: 1 << 40,
        min: 0,
        budget: 32 * MIB,
        name: name.into(),
    };
    ch.send(&hello.encode()).unwrap();
    let mut buf = vec![0u8; MAX_MESSAGE];
    let (n, _) = ch
        .recv(&mut buf, Some(Duration::from_secs(5)))
        .unwrap()
        .expect("a welcome");
    match FromCoord::decode(&buf[..n]).unwrap() {
        FromCoord::Welcome { budget, .. } => (ch, budget),
        other => panic!("expected a welcome, got {other:?}"),
    }
}

/// Reads whatever the coordinator sent; the last budget, if any.
fn drain(ch: &Channel) -> Option<u64> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut budget = None;
    while let Ok(Some((n, _))) = ch.recv(&mut buf, Some(Duration::ZERO)) {
        if let Ok(FromCoord::Budget { budget: b }) = FromCoord::decode(&buf[..n]) {
            budget = Some(b);
        }
    }
    budget
}

/// A report of a program short of memory: `misses` far faults so far, each `nanos` long, all
/// of them ghost hits within a MiB.
fn report(budget: u64, misses: u64, nanos: u64) -> ToCoord {
    let mut ghost_hits = [0; GHOST_BUCKETS];
    let mut ghost_nanos = [0; GHOST_BUCKETS];
    ghost_hits[0] = misses;
    ghost_nanos[0] = misses.saturating_mul(nanos);
    ToCoord::Report(Box::new(Report {
        budget,
        usage: budget,
        misses,
        reconstructions: misses,
        reconstruct_nanos: misses.saturating_mul(nanos),
        ghost_hits,
        ghost_nanos,
        bytes_dropped: misses * 4096,
        ..Default::default()
    }))
}

#[test]
fn a_liar_is_clamped_and_its_name_and_weight_made_harmless() {
    let coord = coordinator("liar");
    let (honest, mut honest_budget) = join(&coord, "honest", 1.0);
    let (liar, mut liar_budget) = join(&coord, "liar\u{1b}[31m\nforged log line", 1e9);
    let t = Instant::now();
    let mut i = 0u64;
    while t.elapsed() < Duration::from_secs(3) {
        i += 1;
        // The honest program: 1000 faults a second of 50 us.
        honest
            .send(&report(honest_budget, i * 20, 50_000).encode())
            .unwrap();
        // The liar: a billion faults a second, each claimed to take a second.
        liar.send(&report(liar_budget, i * 20_000_000, 1_000_000_000).encode())
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        honest_budget = drain(&honest).unwrap_or(honest_budget);
        liar_budget = drain(&liar).unwrap_or(liar_budget);
        let snap = coord.snapshot();
        let h = snap.apps.iter().find(|a| a.name == "honest").unwrap();
        assert!(
            h.budget >= 8 * MIB,
            "the honest program was starved below the floor: {} MiB",
            h.budget / MIB
        );
    }
    let snap = coord.snapshot();
    let l = snap
        .apps
        .iter()
        .find(|a| a.name.starts_with("liar"))
        .expect("the liar is still registered");
    assert_eq!(
        l.name, "liar?[31m?forged log line",
        "control characters shown as ?"
    );
    assert_eq!(l.weight, 100.0, "the weight is clamped");
    let cpus = tidepool_sys::online_cpus().max(1) as f64;
    assert!(
        l.rebuild_share <= 16.0 * cpus * 1.01,
        "miss time a second is clamped to what the CPUs allow: {}",
        l.rebuild_share
    );
    assert!(l.kind == "paged");
}

#[test]
fn a_flood_or_a_program_that_stops_reading_is_dropped_and_the_others_still_served() {
    let coord = coordinator("flood");
    let (honest, _) = join(&coord, "honest", 1.0);
    let (flooder, _) = join(&coord, "flooder", 1.0);
    // Kept open, never read.
    let (_deaf, _) = join(&coord, "deaf", 1.0);
    let id = |name: &str| {
        coord
            .snapshot()
            .apps
            .iter()
            .find(|a| a.name == name)
            .map(|a| a.id)
    };
    let deaf_id = id("deaf").unwrap();
    // The honest program reports every heartbeat, whatever else happens.
    let mut last = Instant::now();
    let mut keep_alive = || {
        if last.elapsed() >= Duration::from_millis(20) {
            honest.send(&report(32 * MIB, 10, 1000).encode()).unwrap();
            drain(&honest);
            last = Instant::now();
        }
    };
    // A thousand reports at once.
    for i in 0..1000 {
        if flooder.send(&report(32 * MIB, i, 1000).encode()).is_err() {
            break; // already dropped
        }
        keep_alive();
    }
    // Weights changed until the program that never reads has its socket full.
    let mut w = 1.0;
    let t = Instant::now();
    while id("deaf").is_some() && t.elapsed() < Duration::from_secs(10) {
        w = if w == 1.0 { 2.0 } else { 1.0 };
        coord.set_weight(deaf_id, w);
        keep_alive();
    }
    let t = Instant::now();
    while (id("flooder").is_some() || id("deaf").is_some()) && t.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(5));
        keep_alive();
    }
    assert!(id("flooder").is_none(), "the flooder was dropped");
    assert!(
        id("deaf").is_none(),
        "the program that never reads was dropped"
    );
    // The coordinator still serves the honest program: its weight changes and reports land.
    let hid = id("honest").expect("the honest program stays");
    assert!(coord.set_weight(hid, 3.0));
    honest.send(&report(32 * MIB, 10, 1000).encode()).unwrap();
    let t = Instant::now();
    let mut weight_seen = false;
    let mut buf = vec![0u8; MAX_MESSAGE];
    while !weight_seen && t.elapsed() < Duration::from_secs(5) {
        if let Ok(Some((n, _))) = honest.recv(&mut buf, Some(Duration::from_millis(100))) {
            weight_seen = matches!(
                FromCoord::decode(&buf[..n]),
                Ok(FromCoord::Weight { weight }) if weight == 3.0
            );
        }
    }
    assert!(weight_seen, "the honest program heard of its new weight");
}
