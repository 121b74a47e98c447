//! What the coordinator shows of itself: the dashboard's, `tidepool top`'s and /metrics' view
//! of every application and of the pool, and one sample of history per epoch.

use crate::policy::Policy;
use serde::{Deserialize, Serialize};

/// One application as the dashboard shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AppSnapshot {
    pub id: u32,
    /// "soft" (a soft-memory arena) or "paged" (a program under `tidepool run`).
    pub kind: String,
    pub name: String,
    pub pid: u32,
    /// The user it runs as.
    pub uid: u32,
    pub weight: f64,
    pub budget: u64,
    /// Its registration's bounds on the budget (`min` 0: the coordinator's floor).
    pub min: u64,
    pub max: u64,
    /// Bytes it holds: its memfd's (soft), or its resident pages, at most its resident set
    /// (paged).
    pub held: u64,
    pub hits: u64,
    pub misses: u64,
    /// Objects rebuilt, and the time that took, since it joined.
    pub reconstructions: u64,
    pub reconstruction_seconds: f64,
    /// Over the last epoch.
    pub hit_rate: f64,
    /// Reads per second over the last epoch.
    pub reads_per_s: f64,
    /// Share of time spent on misses over the last epoch (reconstruction or far faults,
    /// seconds per second).
    pub rebuild_share: f64,
    /// Mean time of one miss over the last epoch, microseconds.
    pub miss_us: f64,
    /// Its curve, from ghost hits: with `extra_mib` more, the misses per second left and the
    /// miss time per second saved.
    pub curve: Vec<CurvePoint>,
    /// Marginal utility: what a MiB more would save per second (reconstruction ms for
    /// midas, hits for hitrate).
    pub utility_per_mib: f64,
    pub punched_bytes: u64,
    pub seconds: f64,
}

/// One point of an application's miss curve.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct CurvePoint {
    pub extra_mib: u64,
    pub misses_per_s: f64,
    pub saved_ms_per_s: f64,
}

/// The coordinator's state as the dashboard and `tidepool top` show it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub seconds: f64,
    pub policy: Policy,
    pub reserve: u64,
    pub mem_available: u64,
    /// The least headroom of MemAvailable and the coordinator's memory cgroups.
    pub headroom: u64,
    /// Idle memory for soft memory: headroom + what soft memory holds − reserve.
    pub pool: u64,
    pub granted: u64,
    pub held: u64,
    /// Share of the last 100 ms some task stalled on memory (PSI).
    pub pressure: f64,
    /// Time some task on the host stalled on memory since boot (PSI's total), seconds.
    pub memory_stall_seconds: f64,
    /// Longest time the headroom stayed under the reserve, milliseconds.
    pub longest_below_reserve_ms: f64,
    pub punched_bytes: u64,
    pub apps: Vec<AppSnapshot>,
}

/// One epoch of history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    pub seconds: f64,
    pub pool: u64,
    pub headroom: u64,
    pub held: u64,
    /// (id, budget, held, utility per MiB, hit rate) per application.
    pub apps: Vec<(u32, u64, u64, f64, f64)>,
}
