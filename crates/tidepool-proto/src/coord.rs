//! The coordinator protocol: what a soft-memory runtime and `tidepool coord` say to each other
//! over a Unix `SOCK_SEQPACKET` socket, one message per packet. No I/O.
//!
//! ```text
//! offset  size  field
//!      0     2  magic "TC"
//!      2     1  protocol version (1)
//!      3     1  kind (runtime to coordinator: 0x01-0x7f; coordinator to runtime: 0x81-0xff)
//!      4     4  body length in bytes (at most MAX_MESSAGE - 8)
//! ```
//!
//! The runtime opens with [`ToCoord::Hello`], passing its arena's memfd with `SCM_RIGHTS`
//! (so the coordinator can punch holes in it without asking: direct reclamation), and then
//! sends a [`ToCoord::Report`] every heartbeat: its budget, the bytes it holds, hits, misses,
//! reconstruction time and *ghost hits* (misses on objects it dropped as cold, by how many
//! bytes it had dropped since: a miss at distance d would have been a hit with d more bytes),
//! and its closed segments coldest first. The coordinator answers with budgets, and tells the
//! runtime which segments it punched.
//!
//! The decoder trusts no count: every count is checked against the bytes present before
//! anything is allocated.

use thiserror::Error;

pub const MAGIC: [u8; 2] = *b"TC";
/// 2: `Hello` says what kind of program joins (soft memory or paged) and its minimum.
pub const VERSION: u8 = 2;
pub const HEADER_LEN: usize = 8;
/// The largest message either side sends or accepts.
pub const MAX_MESSAGE: usize = 64 << 10;
/// Ghost-hit distance buckets: bucket `k` counts misses on objects dropped while fewer than
/// `2^k` MiB were dropped after them (bucket 0: under 1 MiB), up to 32 GiB.
pub const GHOST_BUCKETS: usize = 16;
/// The most cold segments a report lists (the coordinator punches from the head).
pub const MAX_COLD: usize = 4096;
/// The most segments one `Punched` message names.
pub const MAX_PUNCHED: usize = 4096;
/// Longest application name (bytes of UTF-8).
pub const MAX_NAME: usize = 256;

/// Bytes an object dropped `distance` bytes ago would have needed: its ghost bucket.
pub fn ghost_bucket(distance: u64) -> usize {
    let mib = distance >> 20;
    ((u64::BITS - mib.leading_zeros()) as usize).min(GHOST_BUCKETS - 1)
}

/// The largest distance bucket `k` stands for (its upper bound in bytes).
pub fn ghost_bucket_limit(k: usize) -> u64 {
    (1u64 << k) << 20
}

/// A run of segments in a runtime's arena (first segment, segments in the run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentRun {
    pub first: u32,
    pub len: u32,
}

/// What a runtime has counted since it registered (every counter only grows).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    /// The budget the runtime is keeping to, bytes.
    pub budget: u64,
    /// Bytes its segments hold.
    pub usage: u64,
    pub hits: u64,
    pub misses: u64,
    pub reconstructions: u64,
    /// Time spent reconstructing, nanoseconds.
    pub reconstruct_nanos: u64,
    /// Misses on objects dropped as cold, by distance bucket (see [`GHOST_BUCKETS`]).
    pub ghost_hits: [u64; GHOST_BUCKETS],
    /// Reconstruction time of those misses, nanoseconds, by bucket.
    pub ghost_nanos: [u64; GHOST_BUCKETS],
    /// Bytes of live objects the runtime dropped to make room (it wanted more memory than it
    /// had).
    pub bytes_dropped: u64,
    /// Closed segments (runs), coldest first.
    pub cold: Vec<SegmentRun>,
}

/// What kind of memory a registration's budget is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AppKind {
    /// A soft-memory arena (tidepool-soft): it passes its memfd, misses cost reconstruction.
    #[default]
    Soft,
    /// A program under `tidepool run`: its budget is the pager's local memory, misses are
    /// page faults served from far memory, and its report reads as follows: `usage` resident
    /// bytes, `misses` far fetches, `reconstruct_nanos` the time those fetches took, ghost
    /// hits the fetches of pages evicted within a bucket's bytes, `bytes_dropped` bytes
    /// evicted; it passes no memfd and lists no cold segments.
    Paged,
}

impl AppKind {
    fn byte(self) -> u8 {
        match self {
            AppKind::Soft => 0,
            AppKind::Paged => 1,
        }
    }
}

impl std::fmt::Display for AppKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AppKind::Soft => "soft",
            AppKind::Paged => "paged",
        })
    }
}

/// Runtime to coordinator.
#[derive(Debug, Clone, PartialEq)]
pub enum ToCoord {
    /// The first message; a soft arena's carries its memfd as `SCM_RIGHTS`.
    Hello {
        kind: AppKind,
        pid: u32,
        /// The operator's weight for this application (1.0 by default).
        weight: f64,
        /// Bytes of a segment.
        segment: u32,
        /// The most its budget may be: the arena's address space, or a paged program's
        /// `--max`.
        capacity: u64,
        /// The least its budget should be while the machine has room (0: the coordinator's
        /// floor).
        min: u64,
        /// The budget it starts with.
        budget: u64,
        name: String,
    },
    Report(Box<Report>),
    /// Leaving: the budget can go to others now.
    Bye,
    /// The operator's call: a new weight for application `app`. Accepted from the
    /// coordinator's owner or root, or from the application itself (its own id on its own
    /// connection, or its own process); answered with `Weight` or `Error`.
    SetWeight {
        app: u32,
        weight: f64,
    },
}

/// Coordinator to runtime.
#[derive(Debug, Clone, PartialEq)]
pub enum FromCoord {
    Welcome {
        app: u32,
        budget: u64,
        /// How often to report, milliseconds.
        heartbeat_ms: u32,
    },
    /// Keep to this budget from now on; shrinking means evacuating and giving back segments
    /// now (cooperative reclamation).
    Budget {
        budget: u64,
    },
    /// The coordinator punched holes in these segments (direct reclamation): retire them.
    Punched {
        runs: Vec<SegmentRun>,
    },
    /// The weight changed (the operator's call).
    Weight {
        weight: f64,
    },
    Error {
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("bad magic {0:02x?}: the peer does not speak the tidepool coordinator protocol")]
    BadMagic([u8; 2]),
    #[error("coordinator protocol version {0} is not supported (this build speaks version {VERSION}); run the same tidepool version on both sides")]
    UnsupportedVersion(u8),
    #[error("message of {0} bytes is shorter than its header or than the length it announces")]
    Truncated(usize),
    #[error("message announces {0} bytes, more than the limit of {MAX_MESSAGE}")]
    TooLarge(usize),
    #[error("unknown message kind 0x{0:02x}")]
    UnknownKind(u8),
    #[error("message body ends early while reading {0}")]
    BodyTruncated(&'static str),
    #[error("{0} bytes left over after the message body")]
    Trailing(usize),
    #[error("{what}: {count} is over the limit of {max}")]
    TooMany {
        what: &'static str,
        count: usize,
        max: usize,
    },
    #[error("{0} is not valid UTF-8")]
    BadUtf8(&'static str),
    #[error("weight {0} is not a positive finite number")]
    BadWeight(f64),
    #[error("unknown kind of application {0} (0: soft memory, 1: paged program)")]
    UnknownAppKind(u8),
}

const HELLO: u8 = 0x01;
const REPORT: u8 = 0x02;
const BYE: u8 = 0x03;
const SET_WEIGHT: u8 = 0x04;
const WELCOME: u8 = 0x81;
const BUDGET: u8 = 0x82;
const PUNCHED: u8 = 0x83;
const WEIGHT: u8 = 0x84;
const ERROR: u8 = 0xff;

struct Writer(Vec<u8>);

impl Writer {
    fn new(kind: u8) -> Writer {
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(&MAGIC);
        v.push(VERSION);
        v.push(kind);
        v.extend_from_slice(&[0; 4]);
        Writer(v)
    }
    fn u32(&mut self, x: u32) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn u64(&mut self, x: u64) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn f64(&mut self, x: f64) -> &mut Self {
        self.u64(x.to_bits())
    }
    /// A string, cut to `max` bytes at a character boundary.
    fn str(&mut self, s: &str, max: usize) -> &mut Self {
        let mut end = s.len().min(max);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u32(end as u32);
        self.0.extend_from_slice(&s.as_bytes()[..end]);
        self
    }
    fn runs(&mut self, runs: &[SegmentRun], max: usize) -> &mut Self {
        let runs = &runs[..runs.len().min(max)];
        self.u32(runs.len() as u32);
        for r in runs {
            self.u32(r.first).u32(r.len);
        }
        self
    }
    fn finish(mut self) -> Vec<u8> {
        let body = (self.0.len() - HEADER_LEN) as u32;
        self.0[4..8].copy_from_slice(&body.to_le_bytes());
        self.0
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::BodyTruncated(what));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }
    fn weight(&mut self) -> Result<f64, DecodeError> {
        let w = f64::from_bits(self.u64("weight")?);
        if !(w.is_finite() && w > 0.0) {
            return Err(DecodeError::BadWeight(w));
        }
        Ok(w)
    }
    fn str(&mut self, max: usize, what: &'static str) -> Result<String, DecodeError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(DecodeError::TooMany {
                what,
                count: n,
                max,
            });
        }
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError::BadUtf8(what))
    }
    fn count(&mut self, each: usize, max: usize, what: &'static str) -> Result<usize, DecodeError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(DecodeError::TooMany {
                what,
                count: n,
                max,
            });
        }
        if self.0.len() < n * each {
            return Err(DecodeError::BodyTruncated(what));
        }
        Ok(n)
    }
    fn runs(&mut self, max: usize, what: &'static str) -> Result<Vec<SegmentRun>, DecodeError> {
        let n = self.count(8, max, what)?;
        (0..n)
            .map(|_| {
                Ok(SegmentRun {
                    first: self.u32(what)?,
                    len: self.u32(what)?,
                })
            })
            .collect()
    }
    fn end(self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Trailing(self.0.len()))
        }
    }
}

/// Checks a message's header; its kind and body.
fn open(msg: &[u8]) -> Result<(u8, Reader<'_>), DecodeError> {
    if msg.len() < HEADER_LEN {
        return Err(DecodeError::Truncated(msg.len()));
    }
    if msg[0..2] != MAGIC {
        return Err(DecodeError::BadMagic([msg[0], msg[1]]));
    }
    if msg[2] != VERSION {
        return Err(DecodeError::UnsupportedVersion(msg[2]));
    }
    let len = u32::from_le_bytes(msg[4..8].try_into().expect("4 bytes")) as usize;
    if len > MAX_MESSAGE - HEADER_LEN {
        return Err(DecodeError::TooLarge(len));
    }
    if msg.len() < HEADER_LEN + len {
        return Err(DecodeError::Truncated(msg.len()));
    }
    if msg.len() > HEADER_LEN + len {
        return Err(DecodeError::Trailing(msg.len() - HEADER_LEN - len));
    }
    Ok((msg[3], Reader(&msg[HEADER_LEN..])))
}

impl ToCoord {
    fn kind(&self) -> u8 {
        match self {
            ToCoord::Hello { .. } => HELLO,
            ToCoord::Report(_) => REPORT,
            ToCoord::Bye => BYE,
            ToCoord::SetWeight { .. } => SET_WEIGHT,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(self.kind());
        match self {
            ToCoord::Hello {
                kind,
                pid,
                weight,
                segment,
                capacity,
                min,
                budget,
                name,
            } => {
                w.0.push(kind.byte());
                w.u32(*pid)
                    .f64(*weight)
                    .u32(*segment)
                    .u64(*capacity)
                    .u64(*min)
                    .u64(*budget)
                    .str(name, MAX_NAME);
            }
            ToCoord::Report(r) => {
                w.u64(r.budget)
                    .u64(r.usage)
                    .u64(r.hits)
                    .u64(r.misses)
                    .u64(r.reconstructions)
                    .u64(r.reconstruct_nanos);
                for x in r.ghost_hits.iter().chain(&r.ghost_nanos) {
                    w.u64(*x);
                }
                w.u64(r.bytes_dropped).runs(&r.cold, MAX_COLD);
            }
            ToCoord::Bye => {}
            ToCoord::SetWeight { app, weight } => {
                w.u32(*app).f64(*weight);
            }
        }
        w.finish()
    }

    pub fn decode(msg: &[u8]) -> Result<ToCoord, DecodeError> {
        let (kind, mut r) = open(msg)?;
        let m = match kind {
            HELLO => ToCoord::Hello {
                kind: match r.take(1, "kind")?[0] {
                    0 => AppKind::Soft,
                    1 => AppKind::Paged,
                    k => return Err(DecodeError::UnknownAppKind(k)),
                },
                pid: r.u32("pid")?,
                weight: r.weight()?,
                segment: r.u32("segment size")?,
                capacity: r.u64("capacity")?,
                min: r.u64("minimum")?,
                budget: r.u64("budget")?,
                name: r.str(MAX_NAME, "name")?,
            },
            REPORT => {
                let mut rep = Report {
                    budget: r.u64("budget")?,
                    usage: r.u64("usage")?,
                    hits: r.u64("hits")?,
                    misses: r.u64("misses")?,
                    reconstructions: r.u64("reconstructions")?,
                    reconstruct_nanos: r.u64("reconstruction time")?,
                    ..Default::default()
                };
                for x in rep.ghost_hits.iter_mut() {
                    *x = r.u64("ghost hits")?;
                }
                for x in rep.ghost_nanos.iter_mut() {
                    *x = r.u64("ghost time")?;
                }
                rep.bytes_dropped = r.u64("bytes dropped")?;
                rep.cold = r.runs(MAX_COLD, "cold segments")?;
                ToCoord::Report(Box::new(rep))
            }
            BYE => ToCoord::Bye,
            SET_WEIGHT => ToCoord::SetWeight {
                app: r.u32("app id")?,
                weight: r.weight()?,
            },
            k => return Err(DecodeError::UnknownKind(k)),
        };
        r.end()?;
        Ok(m)
    }
}

impl FromCoord {
    fn kind(&self) -> u8 {
        match self {
            FromCoord::Welcome { .. } => WELCOME,
            FromCoord::Budget { .. } => BUDGET,
            FromCoord::Punched { .. } => PUNCHED,
            FromCoord::Weight { .. } => WEIGHT,
            FromCoord::Error { .. } => ERROR,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(self.kind());
        match self {
            FromCoord::Welcome {
                app,
                budget,
                heartbeat_ms,
            } => {
                w.u32(*app).u64(*budget).u32(*heartbeat_ms);
            }
            FromCoord::Budget { budget } => {
                w.u64(*budget);
            }
            FromCoord::Punched { runs } => {
                w.runs(runs, MAX_PUNCHED);
            }
            FromCoord::Weight { weight } => {
                w.f64(*weight);
            }
            FromCoord::Error { message } => {
                w.str(message, 4096);
            }
        }
        w.finish()
    }

    pub fn decode(msg: &[u8]) -> Result<FromCoord, DecodeError> {
        let (kind, mut r) = open(msg)?;
        let m = match kind {
            WELCOME => FromCoord::Welcome {
                app: r.u32("app id")?,
                budget: r.u64("budget")?,
                heartbeat_ms: r.u32("heartbeat")?,
            },
            BUDGET => FromCoord::Budget {
                budget: r.u64("budget")?,
            },
            PUNCHED => FromCoord::Punched {
                runs: r.runs(MAX_PUNCHED, "punched segments")?,
            },
            WEIGHT => FromCoord::Weight {
                weight: r.weight()?,
            },
            ERROR => FromCoord::Error {
                message: r.str(4096, "error message")?,
            },
            k => return Err(DecodeError::UnknownKind(k)),
        };
        r.end()?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run() -> impl Strategy<Value = SegmentRun> {
        (any::<u32>(), any::<u32>()).prop_map(|(first, len)| SegmentRun { first, len })
    }

    fn to_coord() -> impl Strategy<Value = ToCoord> {
        prop_oneof![
            (
                any::<bool>(),
                any::<u32>(),
                0.001f64..1e6,
                any::<u32>(),
                any::<[u64; 3]>(),
                "[a-z0-9 é]{0,40}"
            )
                .prop_map(
                    |(paged, pid, weight, segment, [capacity, min, budget], name)| {
                        ToCoord::Hello {
                            kind: if paged { AppKind::Paged } else { AppKind::Soft },
                            pid,
                            weight,
                            segment,
                            capacity,
                            min,
                            budget,
                            name,
                        }
                    }
                ),
            (
                proptest::array::uniform8(any::<u64>()),
                proptest::array::uniform16(any::<u64>()),
                proptest::collection::vec(run(), 0..50)
            )
                .prop_map(|(a, g, cold)| ToCoord::Report(Box::new(Report {
                    budget: a[0],
                    usage: a[1],
                    hits: a[2],
                    misses: a[3],
                    reconstructions: a[4],
                    reconstruct_nanos: a[5],
                    ghost_hits: g,
                    ghost_nanos: g.map(|x| x / 3),
                    bytes_dropped: a[6],
                    cold,
                }))),
            Just(ToCoord::Bye),
            (any::<u32>(), 0.001f64..1e6)
                .prop_map(|(app, weight)| ToCoord::SetWeight { app, weight }),
        ]
    }

    fn from_coord() -> impl Strategy<Value = FromCoord> {
        prop_oneof![
            (any::<u32>(), any::<u64>(), any::<u32>()).prop_map(|(app, budget, heartbeat_ms)| {
                FromCoord::Welcome {
                    app,
                    budget,
                    heartbeat_ms,
                }
            }),
            any::<u64>().prop_map(|budget| FromCoord::Budget { budget }),
            proptest::collection::vec(run(), 0..50).prop_map(|runs| FromCoord::Punched { runs }),
            (0.001f64..1e6).prop_map(|weight| FromCoord::Weight { weight }),
            "[ -~]{0,80}".prop_map(|message| FromCoord::Error { message }),
        ]
    }

    proptest! {
        #[test]
        fn runtime_messages_round_trip(m in to_coord()) {
            let bytes = m.encode();
            prop_assert!(bytes.len() <= MAX_MESSAGE);
            prop_assert_eq!(ToCoord::decode(&bytes).unwrap(), m);
        }

        #[test]
        fn coordinator_messages_round_trip(m in from_coord()) {
            prop_assert_eq!(FromCoord::decode(&m.encode()).unwrap(), m);
        }

        #[test]
        fn every_cut_of_a_message_is_an_error_not_a_panic(m in to_coord(), cut in 0usize..200) {
            let bytes = m.encode();
            let cut = cut.min(bytes.len().saturating_sub(1));
            prop_assert!(ToCoord::decode(&bytes[..cut]).is_err());
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = ToCoord::decode(&bytes);
            let _ = FromCoord::decode(&bytes);
        }
    }

    #[test]
    fn a_forged_count_allocates_nothing() {
        let mut m = ToCoord::Report(Box::default()).encode();
        // The cold-segment count is the last field: claim the maximum with no bytes behind it.
        let n = m.len();
        m[n - 4..].copy_from_slice(&(MAX_COLD as u32).to_le_bytes());
        assert_eq!(
            ToCoord::decode(&m),
            Err(DecodeError::BodyTruncated("cold segments"))
        );
        m[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            ToCoord::decode(&m),
            Err(DecodeError::TooMany { .. })
        ));
    }

    #[test]
    fn versions_and_weights_are_checked() {
        let mut m = ToCoord::Bye.encode();
        m[2] = 9;
        assert_eq!(ToCoord::decode(&m), Err(DecodeError::UnsupportedVersion(9)));
        let mut w = FromCoord::Weight { weight: 2.0 }.encode();
        w[8..16].copy_from_slice(&f64::NAN.to_bits().to_le_bytes());
        assert!(matches!(
            FromCoord::decode(&w),
            Err(DecodeError::BadWeight(_))
        ));
    }

    #[test]
    fn ghost_buckets_double() {
        assert_eq!(ghost_bucket(0), 0);
        assert_eq!(ghost_bucket((1 << 20) - 1), 0);
        assert_eq!(ghost_bucket(1 << 20), 1);
        assert_eq!(ghost_bucket(3 << 20), 2);
        assert_eq!(ghost_bucket(u64::MAX), GHOST_BUCKETS - 1);
        for k in 0..GHOST_BUCKETS - 1 {
            assert_eq!(ghost_bucket(ghost_bucket_limit(k) - 1), k);
        }
    }
}
