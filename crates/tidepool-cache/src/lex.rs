//! The lexical layer of memcached's text protocol, below the requests and the meta flags:
//! its limits, its error lines, tokens and numbers as memcached reads them.

/// The longest key memcached accepts.
pub const KEY_MAX: usize = 250;
/// What an item costs beyond its key and data in memcached's size limit (its item header),
/// so that the largest item either server accepts is about the same.
pub const ITEM_OVERHEAD: usize = 56;

/// Limits a connection's parser works within: [`Limits::default`], then the setters below.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest item (key, data and overhead), memcached's `-I`.
    pub(crate) item_max: usize,
    /// The longest command line without its end; longer, and the connection is closed.
    pub(crate) line_max: usize,
}

impl Limits {
    /// The largest item in bytes, key, data and overhead together: memcached's `-I`
    /// (default 1 MiB).
    pub fn item_max(mut self, bytes: usize) -> Limits {
        self.item_max = bytes;
        self
    }

    /// The longest command line in bytes, without its end; a longer one closes the connection
    /// (default 64 KiB).
    pub fn line_max(mut self, bytes: usize) -> Limits {
        self.line_max = bytes;
        self
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            item_max: 1 << 20,
            line_max: 64 << 10,
        }
    }
}

pub(crate) const ERROR: &str = "ERROR";
pub(crate) const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";
pub(crate) const TOO_LARGE: &str = "SERVER_ERROR object too large for cache";
pub(crate) const BAD_CHUNK: &str = "CLIENT_ERROR bad data chunk";
pub(crate) const BAD_DELTA: &str = "CLIENT_ERROR invalid numeric delta argument";
pub(crate) const BAD_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument";

/// The space-separated tokens of a line (runs of spaces are one separator, as in memcached).
pub(crate) fn tokens(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| b == b' ').filter(|t| !t.is_empty())
}

/// An unsigned decimal, as memcached's `safe_strtoull` takes it (an optional `+`, digits).
pub(crate) fn parse_u64(t: &[u8]) -> Option<u64> {
    let digits = t.strip_prefix(b"+").unwrap_or(t);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// A signed decimal, as memcached's `safe_strtol` takes it.
pub(crate) fn parse_i64(t: &[u8]) -> Option<i64> {
    let (neg, digits) = match t.first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let v: i64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(if neg { -v } else { v })
}

/// The data length of a storage command, as memcached checks it.
pub(crate) fn data_len(t: &[u8]) -> Option<usize> {
    parse_i64(t)
        .filter(|&v| (0..=i32::MAX as i64 - 2).contains(&v))
        .map(|v| v as usize)
}

/// The first `needle` in `hay`.
pub(crate) fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
}
