//! The coordinator against real runtimes over a real socket: a cooperative arena follows its
//! budget down by itself; a runtime that does not has holes punched in its coldest segments
//! once its grace period is over; a runtime that leaves frees its budget.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};
use tidepool_coord::{Config, Coordinator, Policy};
use tidepool_proto::coord::{AppKind, FromCoord, Report, SegmentRun, ToCoord, MAX_MESSAGE};
use tidepool_soft::coord::{Channel, CoordConfig};
use tidepool_soft::{ArenaConfig, SoftArena, SoftRuntime, SoftVec, SEGMENT};

const MIB: u64 = 1 << 20;

fn socket(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("tp-coord-test-{name}-{}.sock", std::process::id()))
}

fn coordinator(name: &str, max: u64, grace: Duration) -> Coordinator {
    Coordinator::start(
        Config::default()
            .socket(socket(name))
            .policy(Policy::Midas)
            .reserve(0)
            .max(max)
            .floor(2 * SEGMENT as u64)
            .grace(grace)
            .heartbeat(Duration::from_millis(20))
            .epoch(Duration::from_millis(50)),
    )
    .expect("start a coordinator")
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_stubborn_runtime_has_its_coldest_segments_punched() {
    let coord = coordinator("stubborn", 32 * MIB, Duration::from_millis(200));
    let segments = 32u32;
    let bytes = segments as u64 * SEGMENT as u64;
    let fd = rustix::fs::memfd_create("stubborn", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, bytes).unwrap();
    rustix::fs::fallocate(&fd, rustix::fs::FallocateFlags::empty(), 0, bytes).unwrap();
    let held = || rustix::fs::fstat(&fd).unwrap().st_blocks as u64 * 512;
    assert_eq!(held(), bytes);
    let ch = Channel::connect(coord.socket()).unwrap();
    let hello = ToCoord::Hello {
        kind: AppKind::Soft,
        pid: std::process::id(),
        weight: 1.0,
        segment: SEGMENT as u32,
        capacity: bytes,
        min: 0,
        budget: bytes,
        name: "stubborn".into(),
    };
    ch.send_with_fd(&hello.encode(), fd.as_fd()).unwrap();
    let mut buf = vec![0u8; MAX_MESSAGE];
    let (n, _) = ch
        .recv(&mut buf, Some(Duration::from_secs(5)))
        .unwrap()
        .unwrap();
    let FromCoord::Welcome { budget, .. } = FromCoord::decode(&buf[..n]).unwrap() else {
        panic!("no welcome");
    };
    assert!(budget <= 32 * MIB, "budget {budget} within the pool");
    // Coldest first: the odd segments, then the even ones.
    let cold: Vec<SegmentRun> = (0..segments)
        .filter(|s| s % 2 == 1)
        .chain((0..segments).filter(|s| s % 2 == 0))
        .map(|first| SegmentRun { first, len: 1 })
        .collect();
    let mut punched = Vec::new();
    let t = Instant::now();
    let mut budget = budget;
    while t.elapsed() < Duration::from_secs(10) {
        let report = Report {
            budget: bytes, // it claims to keep everything, and does
            usage: bytes,
            cold: cold.clone(),
            ..Default::default()
        };
        ch.send(&ToCoord::Report(Box::new(report)).encode())
            .unwrap();
        while let Some((n, _)) = ch.recv(&mut buf, Some(Duration::from_millis(20))).unwrap() {
            match FromCoord::decode(&buf[..n]).unwrap() {
                FromCoord::Punched { runs } => punched.extend(runs),
                FromCoord::Budget { budget: b } => budget = b,
                _ => {}
            }
        }
        if held() <= budget + 2 * SEGMENT as u64 && !punched.is_empty() {
            break;
        }
    }
    assert!(
        held() <= budget + 2 * SEGMENT as u64,
        "held {} MiB against a budget of {} MiB",
        held() / MIB,
        budget / MIB
    );
    assert!(!punched.is_empty(), "the coordinator said what it punched");
    assert!(
        punched.iter().all(|r| r.first % 2 == 1),
        "only the coldest (odd) segments were needed: {punched:?}"
    );
    let snap = coord.snapshot();
    assert_eq!(snap.apps.len(), 1);
    assert!(snap.apps[0].punched_bytes >= bytes - budget - 2 * SEGMENT as u64);
}

#[test]
fn a_soft_arena_follows_its_budget_down_by_itself_and_frees_it_when_it_leaves() {
    // A long grace: a debug build under load must not lose the race to direct reclamation.
    let coord = coordinator("coop", 64 * MIB, Duration::from_secs(5));
    let arena = SoftRuntime::new(
        SoftArena::new(
            ArenaConfig::default()
                .budget(8 * MIB as usize)
                .max_bytes(1 << 30),
        )
        .unwrap(),
    );
    arena.start_evacuator(0.05, 0.1).unwrap();
    let link = arena
        .join_coordinator(CoordConfig::new(coord.socket()).name("coop").weight(1.0))
        .unwrap();
    wait_for("registration", || link.connected());
    wait_for("the welcome's budget", || arena.budget() as u64 == 64 * MIB);
    let values: SoftVec<[u8; 4096]> = SoftVec::new(&arena, 30_000, |i| [i as u8; 4096]);
    for round in 0..3 {
        for i in 0..30_000 {
            assert_eq!(values.get(i)[0], i as u8, "round {round}");
        }
    }
    let full = arena.usage() as u64;
    assert!(
        full > 48 * MIB,
        "soft memory filled its budget: {} MiB",
        full / MIB
    );
    coord.set_max(24 * MIB);
    wait_for("the cut budget", || arena.budget() as u64 <= 24 * MIB);
    wait_for("usage to follow", || {
        arena.usage() as u64 <= 24 * MIB + 2 * SEGMENT as u64
    });
    // Every value still reads right (hits or rebuilds).
    for i in 0..30_000 {
        assert_eq!(values.get(i)[0], i as u8);
    }
    let snap = coord.snapshot();
    assert_eq!(snap.apps.len(), 1);
    assert_eq!(
        snap.apps[0].punched_bytes, 0,
        "a cooperative runtime gives memory back itself"
    );
    assert!(link.reports() > 0);
    drop(values);
    drop(arena);
    wait_for("the arena's departure", || coord.snapshot().apps.is_empty());
    assert_eq!(coord.snapshot().granted, 0);
}
