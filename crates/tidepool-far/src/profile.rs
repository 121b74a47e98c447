//! Per-site profiles of far vectors (Mira's profiling run): accesses, misses and their
//! latency, a stride histogram, the read/write mix, and miss-ratio curves from sampled reuse
//! distances at several line sizes, written as JSON for `tidepool tune`.
//!
//! Profiling is for a profiling run: turned on with [`crate::Far::enable_profiling`], it
//! records every access (vectors made before that are not profiled). A site is where a
//! vector was made (`file:line`, from `#[track_caller]`) or the name given to
//! [`crate::FarVec::named`]. Profiles of a site's vectors are merged when they are dropped.
//!
//! Reuse distances are those of an LRU stack over lines, sampled SHARDS-style: only lines
//! whose hash falls under the sampling rate are followed, and their distances scaled back up,
//! so a profile costs memory in proportion to the sample, not the vector.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// Line sizes the miss-ratio curves are computed for.
pub const LINE_SIZES: [usize; 4] = [64, 256, 1024, 4096];
/// Lines followed per curve at most: the sampling rate is chosen to keep to it.
const FOLLOWED: u64 = 1 << 16;
/// Sampled accesses per curve at most; later ones are not followed.
const MAX_STEPS: usize = 1 << 22;
/// Spans of more lines than this (a whole vector as one slice) count as accesses but are not
/// followed line by line.
const MAX_SPAN: usize = 4096;
/// Log2 buckets of reuse distance (in lines).
const BUCKETS: usize = 48;

/// How far apart consecutive accesses were, in elements.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Strides {
    /// The same element again.
    pub repeat: u64,
    /// The next element.
    pub next: u64,
    /// Forward, within 4 KiB.
    pub near_forward: u64,
    /// Backward, within 4 KiB.
    pub near_backward: u64,
    /// Farther.
    pub far: u64,
}

impl Strides {
    pub fn total(&self) -> u64 {
        self.repeat + self.next + self.near_forward + self.near_backward + self.far
    }

    /// Share of accesses that moved forward by at most 4 KiB (or stayed): a stream.
    pub fn sequential(&self) -> f64 {
        let t = self.total();
        if t == 0 {
            return 0.0;
        }
        (self.repeat + self.next + self.near_forward) as f64 / t as f64
    }
}

/// A miss-ratio curve for one line size: LRU reuse distances of sampled accesses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    pub line_bytes: usize,
    /// One line in `rate` is followed.
    pub rate: u64,
    /// Accesses to followed lines.
    pub accesses: u64,
    /// First accesses to a followed line (misses at any size).
    pub cold: u64,
    /// `distances[0]`: reuses with no other line between; `distances[b]`, b >= 1: reuses with
    /// `[2^(b-1), 2^b)` other lines between (scaled by the rate).
    pub distances: Vec<u64>,
}

impl Curve {
    /// Estimated miss ratio of a fully associative LRU cache of `lines` lines.
    pub fn miss_ratio(&self, lines: u64) -> f64 {
        if self.accesses == 0 {
            return 0.0;
        }
        // A reuse at distance d hits iff d < lines; buckets straddling `lines` count in part.
        let mut misses = self.cold as f64;
        for (b, &n) in self.distances.iter().enumerate() {
            let (lo, hi) = if b == 0 {
                (0.0, 1.0)
            } else {
                ((1u64 << (b - 1)) as f64, (1u64 << b) as f64)
            };
            let l = lines as f64;
            let miss_share = if l <= lo {
                1.0
            } else if l >= hi {
                0.0
            } else {
                (hi - l) / (hi - lo)
            };
            misses += n as f64 * miss_share;
        }
        misses / self.accesses as f64
    }
}

/// One allocation site's profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteProfile {
    pub site: String,
    pub elem_bytes: usize,
    /// Elements of the largest vector made here.
    pub len: usize,
    pub reads: u64,
    pub writes: u64,
    /// Lines this site's vectors fetched, in how many round trips, taking how long.
    pub misses: u64,
    pub fetches: u64,
    pub fetch_nanos: u64,
    /// Line size of the sections the profile ran with (what `misses` are lines of).
    pub line_bytes: usize,
    pub strides: Strides,
    pub curves: Vec<Curve>,
}

impl SiteProfile {
    pub fn accesses(&self) -> u64 {
        self.reads + self.writes
    }

    /// Measured nanoseconds per line fetched, if any were.
    pub fn miss_nanos(&self) -> Option<f64> {
        (self.misses > 0).then(|| self.fetch_nanos as f64 / self.misses as f64)
    }

    fn merge(&mut self, o: SiteProfile) {
        self.len = self.len.max(o.len);
        self.reads += o.reads;
        self.writes += o.writes;
        self.misses += o.misses;
        self.fetches += o.fetches;
        self.fetch_nanos += o.fetch_nanos;
        let s = &mut self.strides;
        s.repeat += o.strides.repeat;
        s.next += o.strides.next;
        s.near_forward += o.strides.near_forward;
        s.near_backward += o.strides.near_backward;
        s.far += o.strides.far;
        for (a, b) in self.curves.iter_mut().zip(o.curves) {
            a.accesses += b.accesses;
            a.cold += b.cold;
            for (x, y) in a.distances.iter_mut().zip(b.distances) {
                *x += y;
            }
        }
    }
}

/// A profiling run's sites, as `tidepool tune` reads them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub sites: Vec<SiteProfile>,
}

impl Profile {
    pub(crate) fn add(&mut self, p: SiteProfile) {
        match self.sites.iter_mut().find(|s| s.site == p.site) {
            Some(s) => s.merge(p),
            None => self.sites.push(p),
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a profile serialises")
    }

    pub fn from_json(s: &str) -> Result<Profile, serde_json::Error> {
        serde_json::from_str(s)
    }
}

/// Counts of live entries over time steps, for the number of distinct lines touched since a
/// given step (a Fenwick tree).
#[derive(Debug)]
struct Fenwick(Vec<u32>);

impl Fenwick {
    fn add(&mut self, i: usize, v: i32) {
        let mut i = i + 1;
        while i <= self.0.len() {
            self.0[i - 1] = self.0[i - 1].wrapping_add_signed(v);
            i += i & i.wrapping_neg();
        }
    }

    /// Sum of entries `[0, i)`.
    fn prefix(&self, i: usize) -> u64 {
        let (mut i, mut s) = (i, 0u64);
        while i > 0 {
            s += self.0[i - 1] as u64;
            i -= i & i.wrapping_neg();
        }
        s
    }
}

/// Reuse distances at one line size.
#[derive(Debug)]
struct Reuse {
    shift: u32,
    rate: u64,
    /// Sampled accesses so far (the time).
    step: usize,
    last: FxHashMap<u64, usize>,
    /// The last followed line: an access to it again is a reuse at distance 0 and takes no
    /// time step (a scan through a line costs one step, not one per element).
    prev: Option<u64>,
    live: Fenwick,
    curve: Curve,
}

impl Reuse {
    fn new(line_bytes: usize, lines: u64) -> Reuse {
        let rate = lines.div_ceil(FOLLOWED).next_power_of_two();
        Reuse {
            shift: line_bytes.trailing_zeros(),
            rate,
            step: 0,
            last: FxHashMap::default(),
            prev: None,
            live: Fenwick(Vec::new()),
            curve: Curve {
                line_bytes,
                rate,
                accesses: 0,
                cold: 0,
                distances: vec![0; BUCKETS],
            },
        }
    }

    fn followed(&self, line: u64) -> bool {
        // A multiplicative hash: lines a stride apart still sample evenly.
        self.rate == 1 || (line.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40).is_multiple_of(self.rate)
    }

    fn touch(&mut self, line: u64) {
        if !self.followed(line) {
            return;
        }
        if self.prev == Some(line) {
            self.curve.accesses += 1;
            self.curve.distances[0] += 1;
            return;
        }
        if self.step == MAX_STEPS {
            return;
        }
        self.prev = Some(line);
        self.curve.accesses += 1;
        if self.live.0.len() <= self.step {
            let n = (self.live.0.len() * 2).clamp(1024, MAX_STEPS);
            // Rebuilt from the live entries: a Fenwick tree cannot grow in place.
            let mut f = Fenwick(vec![0; n]);
            for &t in self.last.values() {
                f.add(t, 1);
            }
            self.live = f;
        }
        let now = self.step;
        self.step += 1;
        match self.last.insert(line, now) {
            None => self.curve.cold += 1,
            Some(then) => {
                let between = self.live.prefix(now) - self.live.prefix(then + 1);
                let d = between * self.rate;
                let b = if d == 0 {
                    0
                } else {
                    (64 - d.leading_zeros() as usize).min(BUCKETS - 1)
                };
                self.curve.distances[b] += 1;
                self.live.add(then, -1);
            }
        }
        self.live.add(now, 1);
    }
}

/// What a profiled vector records (see the module docs).
#[derive(Debug)]
pub(crate) struct Recorder {
    p: SiteProfile,
    last: Option<usize>,
    reuse: Vec<Reuse>,
}

impl Recorder {
    pub(crate) fn new(site: String, elem_bytes: usize, len: usize, line_bytes: usize) -> Recorder {
        let bytes = (len * elem_bytes) as u64;
        Recorder {
            p: SiteProfile {
                site,
                elem_bytes,
                len,
                reads: 0,
                writes: 0,
                misses: 0,
                fetches: 0,
                fetch_nanos: 0,
                line_bytes,
                strides: Strides::default(),
                curves: Vec::new(),
            },
            last: None,
            reuse: LINE_SIZES
                .iter()
                .map(|&l| Reuse::new(l, bytes.div_ceil(l as u64)))
                .collect(),
        }
    }

    /// Elements `[first, first + n)` accessed, for writing or not.
    pub(crate) fn access(&mut self, first: usize, n: usize, write: bool) {
        if n == 0 {
            return;
        }
        if write {
            self.p.writes += n as u64;
        } else {
            self.p.reads += n as u64;
        }
        let e = self.p.elem_bytes;
        let s = &mut self.p.strides;
        match self.last {
            None => {}
            Some(l) if l == first => s.repeat += 1,
            Some(l) if l + 1 == first => s.next += 1,
            Some(l) if first > l && (first - l) * e <= 4096 => s.near_forward += 1,
            Some(l) if first < l && (l - first) * e <= 4096 => s.near_backward += 1,
            Some(_) => s.far += 1,
        }
        // The rest of a span moves one element at a time.
        s.next += n as u64 - 1;
        self.last = Some(first + n - 1);
        let (lo, hi) = ((first * e) as u64, ((first + n) * e - 1) as u64);
        for r in &mut self.reuse {
            let (a, b) = (lo >> r.shift, hi >> r.shift);
            if b - a >= MAX_SPAN as u64 {
                continue;
            }
            for line in a..=b {
                r.touch(line);
            }
        }
    }

    pub(crate) fn fetched(&mut self, lines: u64, nanos: u64) {
        self.p.misses += lines;
        self.p.fetches += 1;
        self.p.fetch_nanos += nanos;
    }

    pub(crate) fn finish(self) -> SiteProfile {
        let mut p = self.p;
        p.curves = self.reuse.into_iter().map(|r| r.curve).collect();
        p
    }
}
