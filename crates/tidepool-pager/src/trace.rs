//! A debugging aid, compiled only with the `trace` feature: a global ring of page events
//! (state-word locks and unlocks, every UFFDIO_MOVE and UFFDIO_COPY call), read back per page
//! when a test finds a wrong byte. It is how the unrequested moves that
//! `Inner::adopt_moved` repairs were found: a page's own events showed no call that could have
//! moved it. Run the frames verification test with `--features trace` to use it.

use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::OnceLock;

const ENTRIES: usize = 1 << 22;

const NAMES: &[&str] = &[
    "lock",
    "unlock",
    "move_in",
    "move_in_err",
    "move_out",
    "move_out_err",
    "refill_zero",
    "wrong",
    "mv_call",
    "copy_call",
    "adopt",
    "chk_in",
    "chk_out",
];

#[derive(Default)]
struct Entry {
    seq: AtomicU64,
    /// page << 32 | event << 16 | thread
    what: AtomicU64,
    arg: AtomicU64,
}

static NEXT: AtomicU64 = AtomicU64::new(1);
static THREADS: AtomicU64 = AtomicU64::new(1);
static LOG: OnceLock<Box<[Entry]>> = OnceLock::new();

thread_local! {
    static THREAD: u64 = THREADS.fetch_add(1, Relaxed) & 0xffff;
}

fn entries() -> &'static [Entry] {
    LOG.get_or_init(|| (0..ENTRIES).map(|_| Entry::default()).collect())
}

fn code(name: &str) -> u64 {
    NAMES
        .iter()
        .position(|n| *n == name)
        .expect("a known event") as u64
}

/// Logs `event` for `page`.
pub fn event(page: usize, event: &'static str, arg: u64) {
    let seq = NEXT.fetch_add(1, Relaxed);
    let e = &entries()[seq as usize % ENTRIES];
    let thread = THREAD.with(|t| *t);
    e.what
        .store((page as u64) << 32 | code(event) << 16 | thread, Relaxed);
    e.arg.store(arg, Relaxed);
    e.seq.store(seq, Release);
}

/// The logged entries matching `keep`, oldest first, as (seq, what, arg).
fn select(keep: impl Fn(u64, u64) -> bool) -> Vec<(u64, u64, u64)> {
    let mut rows: Vec<_> = entries()
        .iter()
        .filter_map(|e| {
            let seq = e.seq.load(Acquire);
            let (what, arg) = (e.what.load(Relaxed), e.arg.load(Relaxed));
            (seq != 0 && keep(what, arg)).then_some((seq, what, arg))
        })
        .collect();
    rows.sort_unstable();
    rows
}

/// Every logged event of `page`, oldest first.
pub fn dump_page(page: usize) -> String {
    select(|what, _| (what >> 32) as usize == page)
        .into_iter()
        .map(|(seq, what, arg)| {
            let name = NAMES[((what >> 16) & 0xffff) as usize];
            format!("{seq:>9} t{:<5} {name:<12} {arg:#x}\n", what & 0xffff)
        })
        .collect()
}

/// Every logged move or copy call whose range touches pages `[lo, hi)`, oldest first.
pub fn dump_calls(lo: usize, hi: usize) -> String {
    let calls = [code("mv_call"), code("copy_call")];
    select(|what, arg| {
        let (first, len) = ((what >> 32) as usize, ((arg >> 32) & 0xffff) as usize);
        calls.contains(&((what >> 16) & 0xffff)) && first < hi && first + len > lo
    })
    .into_iter()
    .map(|(seq, what, arg)| {
        format!(
            "{seq:>9} t{:<5} {:<10} first {} len {} {} done {} err {}\n",
            what & 0xffff,
            NAMES[((what >> 16) & 0xffff) as usize],
            what >> 32,
            (arg >> 32) & 0xffff,
            if arg >> 63 != 0 { "out" } else { "in" },
            (arg >> 8) & 0xffffff,
            arg & 0xff
        )
    })
    .collect()
}

/// Logs a UFFDIO_MOVE call of `asked` pages from `first` (`into_region`: from the shadow into
/// the region; else out of it) that moved `bytes`, and checks that the moved pages are where
/// they should be.
pub fn move_call(
    base: usize,
    shadow: usize,
    first: usize,
    asked: usize,
    bytes: usize,
    err: &Option<std::io::Error>,
    into_region: bool,
) {
    let done = bytes / 4096;
    event(
        first,
        "mv_call",
        call_arg(!into_region, asked, done, err.as_ref()),
    );
    check_moved(base, shadow, first, done, into_region);
}

/// The argument of a `mv_call` or `copy_call` event.
pub fn call_arg(out: bool, pages: usize, done: usize, err: Option<&std::io::Error>) -> u64 {
    (out as u64) << 63
        | (pages as u64) << 32
        | (done as u64) << 8
        | err.and_then(|e| e.raw_os_error()).unwrap_or(0) as u64 & 0xff
}

/// Logs every page of `[first, first + pages)` that a move just reported moved but that the
/// page tables do not show where it went.
pub fn check_moved(base: usize, shadow: usize, first: usize, pages: usize, into_region: bool) {
    for p in first..first + pages {
        let r = crate::sys::is_mapped(base + p * 4096);
        let s = crate::sys::is_mapped(shadow + p * 4096);
        if (r, s) != (into_region, !into_region) {
            event(
                p,
                if into_region { "chk_in" } else { "chk_out" },
                (r as u64) << 1 | s as u64,
            );
            eprintln!("trace: page {p} right after a move: region {r}, shadow {s}");
        }
    }
}

/// The /proc/self/pagemap entry and residency of `addr`'s page, for a report.
pub fn page_report(addr: usize) -> String {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 8];
    let entry = std::fs::File::open("/proc/self/pagemap")
        .and_then(|f| f.read_exact_at(&mut buf, (addr / 4096 * 8) as u64))
        .map(|_| u64::from_le_bytes(buf));
    format!(
        "{addr:#x}: pagemap {:?} (bit 63 present, 62 swap, 57 uffd-wp, 56 exclusive), mapped {}",
        entry.map(|e| format!("{e:#018x}")),
        crate::sys::is_mapped(addr)
    )
}
