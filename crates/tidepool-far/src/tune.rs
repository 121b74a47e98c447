//! Section configurations, and choosing them from a profile (`tidepool tune`).
//!
//! A [`Config`] names, per site, a section's structure, line size, capacity and prefetch
//! distance; it is TOML:
//!
//! ```toml
//! [site."graph.nodes"]
//! structure = "set-associative"
//! ways = 8
//! line_bytes = 64
//! capacity = 33554432
//! prefetch = 0
//! ```
//!
//! [`tune`] chooses one from a [`Profile`] and a budget of local bytes, as Mira does:
//! streams (mostly forward strides) get a small direct-mapped window of long lines fetched
//! ahead, since more room would not save a miss; the rest of the budget goes, a slice at a
//! time, to the site whose expected fetch time it cuts most, reading each site's miss-ratio
//! curve at every line size and pricing a miss by the line's size (scaled to the fetch time
//! the profile measured). A site given room for its whole vector gets a direct-mapped section
//! of it, which hands the vector out as one plain slice.

use crate::profile::{Profile, SiteProfile, LINE_SIZES};
use crate::{FarError, Section, SectionConfig, Structure};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::rc::Rc;

/// One site's section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteConfig {
    /// `direct`, `set-associative` or `full`.
    pub structure: String,
    /// Ways of a set-associative section.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ways: usize,
    pub line_bytes: usize,
    pub capacity: usize,
    /// Lines fetched past a miss by iterators.
    pub prefetch: usize,
}

fn is_zero(x: &usize) -> bool {
    *x == 0
}

impl SiteConfig {
    fn new(structure: Structure, line_bytes: usize, capacity: usize, prefetch: usize) -> Self {
        let (structure, ways) = match structure {
            Structure::Direct => ("direct", 0),
            Structure::SetAssociative(k) => ("set-associative", k),
            Structure::Full => ("full", 0),
        };
        SiteConfig {
            structure: structure.into(),
            ways,
            line_bytes,
            capacity,
            prefetch,
        }
    }

    pub fn structure(&self) -> Result<Structure, FarError> {
        match self.structure.as_str() {
            "direct" => Ok(Structure::Direct),
            "set-associative" => Ok(Structure::SetAssociative(self.ways)),
            "full" => Ok(Structure::Full),
            s => Err(FarError::Config(format!(
                "unknown section structure '{s}' (direct, set-associative, full)"
            ))),
        }
    }

    /// The section, made.
    pub fn section(&self) -> Result<Rc<Section>, FarError> {
        Section::new(SectionConfig::new(
            self.structure()?,
            self.line_bytes,
            self.capacity,
        ))
    }
}

/// Sections by site.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    #[serde(default)]
    pub site: BTreeMap<String, SiteConfig>,
}

impl Config {
    pub fn from_toml(s: &str) -> Result<Config, FarError> {
        toml::from_str(s).map_err(|e| FarError::Config(format!("section configuration: {e}")))
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a configuration serialises")
    }

    /// What a program gets with no profile: one fully associative section of 4 KiB lines per
    /// site (`(site, bytes)`), the budget split in proportion to the sites' sizes.
    pub fn untuned(sites: &[(&str, u64)], budget: u64) -> Config {
        let total: u64 = sites.iter().map(|s| s.1).sum::<u64>().max(1);
        let site = sites
            .iter()
            .map(|&(name, bytes)| {
                let share = (budget as u128 * bytes as u128 / total as u128) as u64;
                let cap =
                    (share.saturating_sub(table_bytes(bytes, 4096)) / 4096 * 4096).max(2 * 4096);
                (
                    name.to_string(),
                    SiteConfig::new(Structure::Full, 4096, cap as usize, 16),
                )
            })
            .collect();
        Config { site }
    }
}

/// Bytes of a vector's line table: local memory besides its section.
fn table_bytes(bytes: u64, line: u64) -> u64 {
    bytes.div_ceil(line) * 4
}

/// A configuration and why.
#[derive(Debug, Clone)]
pub struct Tuning {
    pub config: Config,
    /// One line per site: what it was found to be and what it got.
    pub notes: Vec<String>,
}

/// Share of strides that must be forward and short for a site to be treated as a stream.
const STREAM: f64 = 0.9;
/// A stream's window: lines of 4 KiB, fetched this many ahead.
const STREAM_LINE: u64 = 4096;
const STREAM_AHEAD: usize = 16;
/// The budget is handed out in this many slices.
const SLICES: u64 = 256;
/// Model of a line fetch before scaling to the measured time: a fixed cost and a cost per
/// byte (nanoseconds).
const FETCH_FIXED: f64 = 200.0;
const FETCH_BYTE: f64 = 0.25;

/// Expected nanoseconds of fetching for `site` in `room` bytes of section, and the line size
/// that gets it; `None` as the line size when the whole vector fits (nothing to fetch after
/// the first time).
fn cost(site: &SiteProfile, room: u64) -> (f64, Option<usize>) {
    let bytes = (site.len * site.elem_bytes) as u64;
    if room >= bytes.div_ceil(STREAM_LINE) * STREAM_LINE + table_bytes(bytes, STREAM_LINE) {
        return (0.0, None);
    }
    let scale = site.miss_nanos().map_or(1.0, |m| {
        m / (FETCH_FIXED + FETCH_BYTE * site.line_bytes as f64)
    });
    let accesses = site.accesses() as f64;
    let mut best = (f64::INFINITY, Some(LINE_SIZES[0]));
    for curve in &site.curves {
        let l = curve.line_bytes as u64;
        let usable = room.saturating_sub(table_bytes(bytes, l));
        let lines = usable / l;
        if lines < 8 {
            continue;
        }
        let per_miss = scale * (FETCH_FIXED + FETCH_BYTE * l as f64);
        let t = accesses * curve.miss_ratio(lines) * per_miss;
        if t < best.0 {
            best = (t, Some(curve.line_bytes));
        }
    }
    best
}

/// Chooses sections for the profile's sites within `budget` bytes (see the module docs).
pub fn tune(profile: &Profile, budget: u64) -> Tuning {
    let mut config = Config::default();
    let mut notes = Vec::new();
    let mut left = budget;
    let mut others = Vec::new();
    for s in &profile.sites {
        match stream(s, budget) {
            Some((site, spent, note)) => {
                left = left.saturating_sub(spent);
                notes.push(note);
                config.site.insert(s.site.clone(), site);
            }
            None => others.push(s),
        }
    }
    let room = share(&others, left);
    for (s, &r) in others.iter().zip(&room) {
        let (site, note) = sized(s, r);
        notes.push(note);
        config.site.insert(s.site.clone(), site);
    }
    Tuning { config, notes }
}

/// A site that streams through more than 64 lines: a direct-mapped section reading ahead,
/// the bytes it takes of the budget, and the note saying so (`None`: not a stream).
fn stream(s: &SiteProfile, budget: u64) -> Option<(SiteConfig, u64, String)> {
    let bytes = (s.len * s.elem_bytes) as u64;
    let seq = s.strides.sequential();
    if seq < STREAM || bytes <= STREAM_LINE * 64 {
        return None;
    }
    let lines = (64u64).min((budget / 8 / STREAM_LINE).max(2 * STREAM_AHEAD as u64 + 2));
    let cap = lines * STREAM_LINE;
    let note = format!(
        "{}: a stream ({:.0}% forward strides): direct-mapped, {} lines of {} B, {} ahead",
        s.site,
        seq * 100.0,
        lines,
        STREAM_LINE,
        STREAM_AHEAD
    );
    let site = SiteConfig::new(
        Structure::Direct,
        STREAM_LINE as usize,
        cap as usize,
        STREAM_AHEAD,
    );
    Some((site, cap + table_bytes(bytes, STREAM_LINE), note))
}

/// Shares `left` bytes among the other sites, a slice at a time, to whoever it saves most.
fn share(others: &[&SiteProfile], left: u64) -> Vec<u64> {
    let slice = (left / SLICES).max(1);
    let mut room = vec![0u64; others.len()];
    let mut spent = 0;
    while spent + slice <= left && !others.is_empty() {
        let gains: Vec<f64> = others
            .iter()
            .zip(&room)
            .map(|(s, &r)| cost(s, r).0 - cost(s, r + slice).0)
            .collect();
        let (i, &g) = gains
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .expect("others is not empty");
        // Nothing saves time any more (every curve is flat): split what is left evenly.
        let i = if g > 0.0 || !g.is_finite() {
            i
        } else {
            room.iter()
                .enumerate()
                .min_by_key(|(_, &r)| r)
                .map(|(i, _)| i)
                .expect("others is not empty")
        };
        room[i] += slice;
        spent += slice;
    }
    room
}

/// The section for a site given `r` bytes, and the note saying why: all of it if it fits,
/// else 8-way with the line size that fetches least.
fn sized(s: &SiteProfile, r: u64) -> (SiteConfig, String) {
    let bytes = (s.len * s.elem_bytes) as u64;
    let seq = s.strides.sequential();
    let (t, line) = cost(s, r);
    match line {
        None => {
            let note = format!(
                "{}: fits in its {} B: direct-mapped, all of it (a plain slice)",
                s.site, r
            );
            let whole = bytes.div_ceil(STREAM_LINE) * STREAM_LINE;
            let site = SiteConfig::new(Structure::Direct, STREAM_LINE as usize, whole as usize, 0);
            (site, note)
        }
        Some(l) => {
            let cap =
                r.saturating_sub(table_bytes(bytes, l as u64)) / (8 * l as u64) * (8 * l as u64);
            let cap = cap.max(8 * l as u64);
            let prefetch = if seq >= 0.5 { 4 } else { 0 };
            let ratio = s
                .curves
                .iter()
                .find(|c| c.line_bytes == l)
                .map_or(1.0, |c| c.miss_ratio(cap / l as u64));
            let note = format!(
                "{}: {:.0}% forward strides, {} accesses: 8-way, {} lines of {} B, \
                 expected miss ratio {:.3} ({:.1} ms of fetching)",
                s.site,
                seq * 100.0,
                s.accesses(),
                cap / l as u64,
                l,
                ratio,
                t / 1e6
            );
            let site = SiteConfig::new(Structure::SetAssociative(8), l, cap as usize, prefetch);
            (site, note)
        }
    }
}
