//! A record of a run's demand faults, in the order the pager served them, for `tidepool
//! tune` to search section policies against offline (`replay.rs`), as Mira searches its
//! cache configurations against a profile instead of running the program once per guess.
//!
//! Recording is off unless asked for ([`crate::Pager::trace_faults`]): then every demand
//! fault appends one word (which region, which page, its section, whether it was a far read
//! or a first touch) to a buffer of fixed size, lock-free; faults past its end are counted
//! and not kept. A run writes the buffer with its section names ([`FaultTrace::write_to`]).

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// The bits of a page index in a recorded word.
const PAGE_BITS: u32 = 40;
/// The bits of a region's id; larger ids share the last value.
const REGION_BITS: u32 = 16;
const FAR_BIT: u64 = 1 << 63;

/// The first line of a trace file (version 2 names its number of sections).
const MAGIC: &str = "tidepool fault trace 2";

/// The most faults a recorder keeps (a word each: 512 MiB); a larger capacity asked for is
/// this.
pub const CAPACITY_MAX: usize = 1 << 26;

/// One demand fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TracedFault {
    /// The page was in far memory (a read from the store); otherwise it was touched for the
    /// first time (a zero page).
    pub far: bool,
    /// The section's index ([`crate::SectionStats::index`]).
    pub section: u8,
    /// The region's id (regions past the 65,535th share one).
    pub region: u16,
    /// The page's index in its region.
    pub page: u64,
}

impl TracedFault {
    /// A fault on page `page` of region `region`, in section `section`.
    pub fn new(far: bool, section: u8, region: u16, page: u64) -> TracedFault {
        TracedFault {
            far,
            section,
            region,
            page,
        }
    }

    fn encode(self) -> u64 {
        (if self.far { FAR_BIT } else { 0 })
            | ((self.section as u64 & 0x7f) << (PAGE_BITS + REGION_BITS))
            | ((self.region as u64) << PAGE_BITS)
            | (self.page & ((1 << PAGE_BITS) - 1))
    }

    fn decode(w: u64) -> TracedFault {
        TracedFault {
            far: w & FAR_BIT != 0,
            section: ((w >> (PAGE_BITS + REGION_BITS)) & 0x7f) as u8,
            region: ((w >> PAGE_BITS) & ((1 << REGION_BITS) - 1)) as u16,
            page: w & ((1 << PAGE_BITS) - 1),
        }
    }
}

/// The buffer faults are recorded into while a pager runs.
#[derive(Debug)]
pub(crate) struct Recorder {
    words: Box<[AtomicU64]>,
    next: AtomicUsize,
}

impl Recorder {
    pub(crate) fn new(capacity: usize) -> Recorder {
        Recorder {
            words: (0..capacity.min(CAPACITY_MAX))
                .map(|_| AtomicU64::new(0))
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Appends one fault (dropped once the buffer is full: the count still grows).
    #[inline]
    pub(crate) fn record(&self, far: bool, section: u8, region: u32, page: usize) {
        let i = self.next.fetch_add(1, Relaxed);
        if let Some(w) = self.words.get(i) {
            let f = TracedFault {
                far,
                section,
                region: region.min(u16::MAX as u32) as u16,
                page: page as u64,
            };
            // Zero marks a slot not written yet: region ids start at 1, so no fault's word is
            // zero.
            w.store(f.encode(), Relaxed);
        }
    }

    /// What was recorded so far, with `sections` naming the sections by index. A slot a
    /// thread claimed but had not written yet when the snapshot was taken (the program's
    /// threads still fault while it exits) counts as dropped.
    pub(crate) fn snapshot(&self, sections: Vec<String>) -> FaultTrace {
        let seen = self.next.load(Relaxed);
        let kept = seen.min(self.words.len());
        let faults: Vec<TracedFault> = self.words[..kept]
            .iter()
            .map(|w| w.load(Relaxed))
            .filter(|&w| w != 0)
            .map(TracedFault::decode)
            .collect();
        FaultTrace {
            sections,
            dropped: (seen - faults.len()) as u64,
            faults,
        }
    }
}

/// The header line at the start of `rest`, which then starts after it.
fn take_line<'a>(rest: &mut &'a [u8]) -> Result<&'a str, &'static str> {
    let bytes: &'a [u8] = rest;
    let end = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("its header ends early")?;
    *rest = &bytes[end + 1..];
    std::str::from_utf8(&bytes[..end]).map_err(|_| "its header is not text")
}

/// A run's recorded demand faults.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FaultTrace {
    /// Section names by index.
    pub sections: Vec<String>,
    /// The faults, in the order they were served.
    pub faults: Vec<TracedFault>,
    /// Faults that came after the buffer was full.
    pub dropped: u64,
}

/// Why a trace file cannot be read: it cannot be opened or read, or it is not a fault trace.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {why}")]
pub struct TraceError {
    pub path: String,
    pub why: String,
}

impl FaultTrace {
    /// The name of `pid`'s trace in a sections directory (beside its `sections-PID.toml`).
    pub fn file_name(pid: u32) -> String {
        format!("faults-{pid}.trace")
    }

    /// Writes the trace to `path`, readable by its owner only: a text header (the format's
    /// name, the dropped count, the number of sections, their names one a line), a blank
    /// line, then one little-endian word a fault.
    pub fn write_to(&self, path: &Path) -> io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        let mut out = io::BufWriter::new(file);
        writeln!(out, "{MAGIC}")?;
        writeln!(out, "dropped {}", self.dropped)?;
        writeln!(out, "sections {}", self.sections.len())?;
        for name in &self.sections {
            let name = name.replace(['\n', '\r'], " ");
            writeln!(out, "{}", if name.is_empty() { "-" } else { &name })?;
        }
        writeln!(out)?;
        for f in &self.faults {
            out.write_all(&f.encode().to_le_bytes())?;
        }
        out.flush()
    }

    /// Reads a trace [`FaultTrace::write_to`] wrote.
    pub fn read(path: &Path) -> Result<FaultTrace, TraceError> {
        let shown = path.display().to_string();
        let bad = |why: String| TraceError {
            path: shown.clone(),
            why: format!("not a fault trace: {why}"),
        };
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| TraceError {
                path: shown.clone(),
                why: format!("cannot read it: {e}"),
            })?;
        let mut rest = &bytes[..];
        let mut line = || take_line(&mut rest).map_err(|why| bad(why.into()));
        if line()? != MAGIC {
            return Err(bad(format!("its first line is not {MAGIC:?}")));
        }
        let count = |l: &str, key: &str| -> Result<u64, TraceError> {
            l.strip_prefix(key)
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| bad(format!("no {key}line")))
        };
        let dropped = count(line()?, "dropped ")?;
        let n = count(line()?, "sections ")?;
        if n > crate::SECTIONS_MAX as u64 {
            return Err(bad(format!(
                "{n} sections, more than a pager has ({})",
                crate::SECTIONS_MAX
            )));
        }
        let sections = (0..n)
            .map(|_| line().map(str::to_string))
            .collect::<Result<Vec<_>, _>>()?;
        if !line()?.is_empty() {
            return Err(bad(format!("more than the {n} section names it announced")));
        }
        if rest.len() % 8 != 0 {
            return Err(bad(format!(
                "{} bytes of faults, not a whole number of words",
                rest.len()
            )));
        }
        let faults: Vec<TracedFault> = rest
            .chunks_exact(8)
            .map(|c| TracedFault::decode(u64::from_le_bytes(c.try_into().expect("8 bytes"))))
            .collect();
        if let Some(f) = faults.iter().find(|f| f.section as u64 >= n) {
            return Err(bad(format!(
                "a fault in section {}, which it does not name",
                f.section
            )));
        }
        Ok(FaultTrace {
            sections,
            faults,
            dropped,
        })
    }

    /// The name of section `index` (`rest` if the trace does not name it).
    pub fn section_name(&self, index: u8) -> &str {
        self.sections
            .get(index as usize)
            .map_or("rest", String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_reads_back_what_was_recorded() {
        let r = Recorder::new(3);
        r.record(true, 5, 2, 123_456);
        r.record(false, 127, 70_000, (1 << 39) + 7);
        r.record(true, 0, 0, 1);
        r.record(true, 1, 1, 1);
        let mut names: Vec<String> = (0..128).map(|i| format!("s{i}")).collect();
        names[1] = "heap 16B".into();
        names[2] = String::new();
        let t = r.snapshot(names);
        assert_eq!(t.dropped, 1);
        assert_eq!(
            t.faults,
            vec![
                TracedFault {
                    far: true,
                    section: 5,
                    region: 2,
                    page: 123_456
                },
                TracedFault {
                    far: false,
                    section: 127,
                    region: u16::MAX,
                    page: (1 << 39) + 7
                },
                TracedFault {
                    far: true,
                    section: 0,
                    region: 0,
                    page: 1
                },
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FaultTrace::file_name(1));
        t.write_to(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let back = FaultTrace::read(&path).unwrap();
        assert_eq!((&back.faults, back.dropped), (&t.faults, 1));
        assert_eq!(back.section_name(1), "heap 16B");
        // An empty name is written as "-", not as the blank line that ends the header.
        assert_eq!(back.section_name(2), "-");
        assert_eq!(back.section_name(127), "s127");
        assert_eq!(FaultTrace::default().section_name(9), "rest");
    }

    #[test]
    fn a_slot_claimed_but_not_written_counts_as_dropped() {
        let r = Recorder::new(4);
        r.record(true, 1, 1, 7);
        // A thread that claimed the next slot and has not stored its word yet.
        r.next.fetch_add(1, Relaxed);
        let t = r.snapshot(vec!["rest".into(), "heap".into()]);
        assert_eq!((t.faults.len(), t.dropped), (1, 1));
    }

    #[test]
    fn a_file_that_is_not_a_trace_is_refused_with_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.trace");
        std::fs::write(&path, "hello\n\n").unwrap();
        let e = FaultTrace::read(&path).unwrap_err().to_string();
        assert!(e.contains("first line"), "{e}");
        let head = format!("{MAGIC}\ndropped 0\nsections 1\nrest\n\n");
        std::fs::write(&path, format!("{head}1234567")).unwrap();
        let e = FaultTrace::read(&path).unwrap_err().to_string();
        assert!(e.contains("whole number"), "{e}");
        // A fault in section 1 of a trace that names one section.
        let word = TracedFault::new(true, 1, 1, 5).encode().to_le_bytes();
        std::fs::write(&path, [head.as_bytes(), &word].concat()).unwrap();
        let e = FaultTrace::read(&path).unwrap_err().to_string();
        assert!(e.contains("does not name"), "{e}");
        std::fs::write(&path, format!("{MAGIC}\ndropped 0\nrest\n\n")).unwrap();
        let e = FaultTrace::read(&path).unwrap_err().to_string();
        assert!(e.contains("no sections line"), "{e}");
        std::fs::write(&path, format!("{MAGIC}\ndropped 0\nsections 2\nrest\n\n")).unwrap();
        let e = FaultTrace::read(&path).unwrap_err().to_string();
        assert!(e.contains("ends early"), "{e}");
        std::fs::write(&path, "no header at all").unwrap();
        let e = FaultTrace::read(&path).unwrap_err().to_string();
        assert!(e.contains("ends early"), "{e}");
        let e = FaultTrace::read(&dir.path().join("none"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read it"), "{e}");
    }
}
