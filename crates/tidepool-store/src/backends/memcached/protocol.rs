//! The part of memcached's meta text protocol this client speaks: building commands and parsing
//! their replies.
//!
//! Commands (one line each, `ms` followed by its data):
//!
//! | command | meaning | replies |
//! |---|---|---|
//! | `mg <key> v` | get | `VA <len>` + data, or `EN` (miss) |
//! | `mg <key> v c` | get with the item's CAS version | `VA <len> c<cas>` + data, or `EN` |
//! | `ms <key> <len>` + data | set, no flags, no expiry | `HD` |
//! | `md <key>` | delete | `HD`, or `NF` (missing) |
//! | `md <key> C<cas>` | delete if still that version | `HD`, `NF`, or `EX` (changed) |
//! | `mn` | no-op | `MN` |
//!
//! Any command may instead be answered `SERVER_ERROR <message>`; memcached then still consumes
//! the data of a refused `ms`, so the connection stays in step. Replies come in command order,
//! one per command, which is what makes pipelining them safe.
//!
//! The parser is strict: a reply must be one of the above, byte for byte, or it is
//! [`ReplyError::Malformed`] naming the line. It never allocates more than the largest value
//! the caller allows, whatever the server sends.

use crate::Key;
use bytes::Bytes;
use std::fmt;
use std::io::{self, BufRead, IoSlice, Read, Write};

/// The longest reply line accepted (values are not lines). Real meta reply lines are under 100
/// bytes; the limit keeps a stream of garbage without newlines from growing a buffer.
pub(super) const MAX_LINE: usize = 1024;
/// How much of an offending line an error message shows.
const SHOWN_LINE: usize = 80;
/// Values at least this long are sent from the caller's buffer instead of being copied into the
/// command text (one `writev` sends both).
const BORROW_MIN: usize = 512;

/// One reply to one meta command.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum Reply {
    /// `VA <len> [c<cas>]` and the value: `mg` found the key.
    Value { data: Bytes, cas: Option<u64> },
    /// `EN`: `mg` found no such key.
    Miss,
    /// `HD`: `ms` stored the value, or `md` deleted the key.
    Done,
    /// `NF`: `md` found no such key.
    NotFound,
    /// `EX`: `md` found the key at another CAS version than the one given.
    Exists,
    /// `MN`: the answer to `mn`.
    NoOp,
    /// `SERVER_ERROR <message>`: the server refused this command (too large, out of memory).
    ServerError(String),
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Value { data, cas } => {
                write!(f, "a value of {} bytes", data.len())?;
                if let Some(cas) = cas {
                    write!(f, " (cas {cas})")?;
                }
                Ok(())
            }
            Reply::Miss => f.write_str("'EN'"),
            Reply::Done => f.write_str("'HD'"),
            Reply::NotFound => f.write_str("'NF'"),
            Reply::Exists => f.write_str("'EX'"),
            Reply::NoOp => f.write_str("'MN'"),
            Reply::ServerError(m) => write!(f, "'SERVER_ERROR {m}'"),
        }
    }
}

/// Why no reply could be read.
#[derive(Debug)]
pub(super) enum ReplyError {
    /// Reading failed, or the connection closed before a whole reply arrived
    /// (`UnexpectedEof`).
    Io(io::Error),
    /// What arrived is not a meta reply; says what, with the line (truncated).
    Malformed(String),
}

impl From<io::Error> for ReplyError {
    fn from(e: io::Error) -> ReplyError {
        ReplyError::Io(e)
    }
}

/// Reads one reply. A value longer than `max_value` bytes is refused before anything is
/// allocated for it: this client never stores one, so the length must be garbage.
pub(super) fn read_reply(r: &mut impl BufRead, max_value: usize) -> Result<Reply, ReplyError> {
    let mut line = Vec::with_capacity(64);
    let n = r
        .by_ref()
        .take(MAX_LINE as u64)
        .read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(ReplyError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        )));
    }
    if line.last() != Some(&b'\n') {
        if line.len() >= MAX_LINE {
            return Err(ReplyError::Malformed(format!(
                "a line longer than {MAX_LINE} bytes starting '{}'",
                shown(&line)
            )));
        }
        return Err(ReplyError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "the server closed the connection in the middle of the reply '{}'",
                shown(&line)
            ),
        )));
    }
    let Some(text) = line.strip_suffix(b"\r\n") else {
        return Err(malformed_line(&line));
    };
    match text {
        b"EN" => Ok(Reply::Miss),
        b"HD" => Ok(Reply::Done),
        b"NF" => Ok(Reply::NotFound),
        b"EX" => Ok(Reply::Exists),
        b"MN" => Ok(Reply::NoOp),
        _ => {
            if let Some(header) = text.strip_prefix(b"VA ") {
                let (len, cas) = parse_value_header(header, max_value)
                    .map_err(|why| ReplyError::Malformed(format!("{why} in '{}'", shown(text))))?;
                let mut data = vec![0; len];
                r.read_exact(&mut data).map_err(|e| truncated(e, len))?;
                let mut end = [0; 2];
                r.read_exact(&mut end).map_err(|e| truncated(e, len))?;
                if &end != b"\r\n" {
                    return Err(ReplyError::Malformed(format!(
                        "a value of {len} bytes not followed by \\r\\n ('{}')",
                        shown(&end)
                    )));
                }
                Ok(Reply::Value {
                    data: Bytes::from(data),
                    cas,
                })
            } else if let Some(message) = text.strip_prefix(b"SERVER_ERROR ") {
                Ok(Reply::ServerError(shown(message)))
            } else if text == b"ERROR" || text.starts_with(b"CLIENT_ERROR") {
                Err(ReplyError::Malformed(format!(
                    "'{}', so it did not understand a command this client sent",
                    shown(text)
                )))
            } else {
                Err(malformed_line(&line))
            }
        }
    }
}

/// Parses `<len> [c<cas>]`, the rest of a `VA` line.
fn parse_value_header(header: &[u8], max_value: usize) -> Result<(usize, Option<u64>), String> {
    let mut tokens = header.split(|&b| b == b' ');
    let len = tokens
        .next()
        .and_then(parse_decimal)
        .ok_or("a value length that is not a number")?;
    let len = usize::try_from(len)
        .ok()
        .filter(|&l| l <= max_value)
        .ok_or_else(|| format!("a value length over the item size limit of {max_value} bytes"))?;
    let mut cas = None;
    for token in tokens {
        match token.split_first() {
            Some((b'c', digits)) if cas.is_none() => {
                cas = Some(parse_decimal(digits).ok_or("a CAS version that is not a number")?);
            }
            _ => return Err(format!("an unexpected flag '{}'", shown(token))),
        }
    }
    Ok((len, cas))
}

/// A decimal number of digits only (no sign, no spaces), as memcached writes them.
fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

fn truncated(e: io::Error, len: usize) -> ReplyError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ReplyError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the server closed the connection in the middle of a value of {len} bytes"),
        ))
    } else {
        ReplyError::Io(e)
    }
}

fn malformed_line(line: &[u8]) -> ReplyError {
    ReplyError::Malformed(format!("the line '{}'", shown(line)))
}

/// A line for a message: lossy UTF-8 with control characters escaped, cut to a readable
/// length.
fn shown(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out: String = text
        .chars()
        .take(SHOWN_LINE)
        .flat_map(char::escape_debug)
        .collect();
    if text.chars().count() > SHOWN_LINE {
        out.push_str("...");
    }
    out
}

/// Commands to send in one write. The command text is built here; values of `ms` commands at
/// least [`BORROW_MIN`] long stay in the caller's buffers and are sent from there by one
/// vectored write, so a batch of pages is never copied.
#[derive(Debug)]
pub(super) struct Batch<'a> {
    text: Vec<u8>,
    /// Each borrowed value with the offset in `text` it is sent before.
    values: Vec<(usize, &'a [u8])>,
    commands: usize,
}

impl<'a> Batch<'a> {
    pub(super) fn new(commands: usize) -> Batch<'a> {
        Batch {
            text: Vec::with_capacity(commands * 64),
            values: Vec::new(),
            commands: 0,
        }
    }

    /// How many commands, hence replies.
    pub(super) fn len(&self) -> usize {
        self.commands
    }

    /// `mg <key> v`, with ` c` when the CAS version is wanted.
    pub(super) fn get(&mut self, prefix: &str, key: Key, with_cas: bool) {
        self.text.extend_from_slice(b"mg ");
        self.key(prefix, key);
        self.text
            .extend_from_slice(if with_cas { b" v c\r\n" } else { b" v\r\n" });
        self.commands += 1;
    }

    /// `ms <key> <len>` and the value.
    pub(super) fn set(&mut self, prefix: &str, key: Key, value: &'a [u8]) {
        self.text.extend_from_slice(b"ms ");
        self.key(prefix, key);
        self.text.push(b' ');
        self.decimal(value.len() as u64);
        self.text.extend_from_slice(b"\r\n");
        if value.len() >= BORROW_MIN {
            self.values.push((self.text.len(), value));
        } else {
            self.text.extend_from_slice(value);
        }
        self.text.extend_from_slice(b"\r\n");
        self.commands += 1;
    }

    /// `md <key>`, with ` C<cas>` to delete only that version.
    pub(super) fn delete(&mut self, prefix: &str, key: Key, cas: Option<u64>) {
        self.text.extend_from_slice(b"md ");
        self.key(prefix, key);
        if let Some(cas) = cas {
            self.text.extend_from_slice(b" C");
            self.decimal(cas);
        }
        self.text.extend_from_slice(b"\r\n");
        self.commands += 1;
    }

    /// `mn`.
    pub(super) fn no_op(&mut self) {
        self.text.extend_from_slice(b"mn\r\n");
        self.commands += 1;
    }

    /// `prefix` followed by the key as 16 hex digits.
    fn key(&mut self, prefix: &str, key: Key) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        self.text.extend_from_slice(prefix.as_bytes());
        self.text
            .extend((0..16).rev().map(|i| HEX[(key >> (i * 4)) as usize & 0xf]));
    }

    fn decimal(&mut self, n: u64) {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        let mut n = n;
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.text.extend_from_slice(&digits[at..]);
    }

    /// Writes the whole batch, as few system calls as the kernel allows.
    pub(super) fn send(&self, mut w: impl Write) -> io::Result<()> {
        let mut slices = Vec::with_capacity(2 * self.values.len() + 1);
        let mut from = 0;
        for &(at, value) in &self.values {
            slices.push(IoSlice::new(&self.text[from..at]));
            slices.push(IoSlice::new(value));
            from = at;
        }
        slices.push(IoSlice::new(&self.text[from..]));
        let mut slices = &mut slices[..];
        // Drops empty slices, so that writing 0 bytes can only mean the peer is gone.
        IoSlice::advance_slices(&mut slices, 0);
        while !slices.is_empty() {
            match w.write_vectored(slices) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut slices, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The length of the command text, borrowed values not included.
    #[cfg(test)]
    pub(super) fn text_len(&self) -> usize {
        self.text.len()
    }

    /// The bytes [`Batch::send`] writes, for tests.
    #[cfg(test)]
    fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.send(&mut out).expect("writing to a Vec cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: usize = 1 << 16;

    fn parse_all(bytes: &[u8], max: usize) -> Vec<Result<Reply, String>> {
        let mut r = bytes;
        let mut out = vec![];
        while !r.is_empty() {
            match read_reply(&mut r, max) {
                Ok(reply) => out.push(Ok(reply)),
                Err(e) => {
                    out.push(Err(format!("{e:?}")));
                    break;
                }
            }
        }
        out
    }

    fn one(bytes: &[u8]) -> Result<Reply, ReplyError> {
        let mut r = bytes;
        let reply = read_reply(&mut r, MAX)?;
        assert!(r.is_empty(), "left over: {r:?}");
        Ok(reply)
    }

    fn malformed(bytes: &[u8]) -> String {
        match one(bytes) {
            Err(ReplyError::Malformed(m)) => m,
            other => panic!("{bytes:?} parsed as {other:?}, not as malformed"),
        }
    }

    fn eof(bytes: &[u8]) {
        match one(bytes) {
            Err(ReplyError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {}
            other => panic!("{bytes:?} parsed as {other:?}, not as a closed connection"),
        }
    }

    #[test]
    fn well_formed_replies() {
        assert_eq!(one(b"EN\r\n").unwrap(), Reply::Miss);
        assert_eq!(one(b"HD\r\n").unwrap(), Reply::Done);
        assert_eq!(one(b"NF\r\n").unwrap(), Reply::NotFound);
        assert_eq!(one(b"EX\r\n").unwrap(), Reply::Exists);
        assert_eq!(one(b"MN\r\n").unwrap(), Reply::NoOp);
        assert_eq!(
            one(b"VA 3\r\nabc\r\n").unwrap(),
            Reply::Value {
                data: Bytes::from_static(b"abc"),
                cas: None
            }
        );
        // Values are binary: line ends inside them are data.
        assert_eq!(
            one(b"VA 6 c42\r\n\r\nVA 1\r\n").unwrap(),
            Reply::Value {
                data: Bytes::from_static(b"\r\nVA 1"),
                cas: Some(42)
            }
        );
        assert_eq!(
            one(b"VA 0\r\n\r\n").unwrap(),
            Reply::Value {
                data: Bytes::new(),
                cas: None
            }
        );
        assert_eq!(
            one(b"SERVER_ERROR object too large for cache\r\n").unwrap(),
            Reply::ServerError("object too large for cache".into())
        );
    }

    #[test]
    fn replies_follow_each_other_without_read_ahead_loss() {
        let stream = b"HD\r\nVA 2 c7\r\nhi\r\nEN\r\nNF\r\nMN\r\n";
        let got: Vec<Reply> = parse_all(stream, MAX)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            got,
            vec![
                Reply::Done,
                Reply::Value {
                    data: Bytes::from_static(b"hi"),
                    cas: Some(7)
                },
                Reply::Miss,
                Reply::NotFound,
                Reply::NoOp
            ]
        );
    }

    #[test]
    fn malformed_replies_name_the_line() {
        assert!(
            malformed(b"STORED\r\n").contains("'STORED"),
            "classic reply"
        );
        assert!(malformed(b"HD\n").contains("HD"), "bare \\n");
        assert!(malformed(b"hd\r\n").contains("hd"));
        assert!(malformed(b"HD \r\n").contains("HD "));
        assert!(malformed(b"VA\r\n").contains("VA"));
        assert!(malformed(b"VA x\r\n").contains("not a number"));
        assert!(malformed(b"VA -1\r\n").contains("not a number"));
        assert!(malformed(b"VA +1\r\n").contains("not a number"));
        assert!(malformed(b"VA  1\r\n").contains("not a number"));
        assert!(malformed(b"VA 99999999999999999999999\r\n").contains("not a number"));
        assert!(malformed(b"VA 70000\r\n").contains("item size limit"));
        assert!(malformed(b"VA 1 f0\r\nx\r\n").contains("'f0'"));
        assert!(malformed(b"VA 1 c\r\nx\r\n").contains("CAS"));
        assert!(malformed(b"VA 1 c1 c2\r\nx\r\n").contains("'c2'"));
        assert!(malformed(b"VA 1\r\nxy\r\n").contains("not followed by"));
        assert!(malformed(b"ERROR\r\n").contains("did not understand"));
        assert!(malformed(b"CLIENT_ERROR bad data chunk\r\n").contains("bad data chunk"));
        // Long garbage is cut short in the message, and never read without limit.
        let long = malformed(&[b'x'; 5000]);
        assert!(long.contains("longer than") && long.len() < 200, "{long}");
        let m = malformed(b"\xff\x00garbage\r\n");
        assert!(m.contains("\\0garbage"), "{m}");
    }

    #[test]
    fn truncated_replies_are_a_closed_connection() {
        eof(b"");
        eof(b"HD");
        eof(b"HD\r");
        eof(b"VA 3\r\n");
        eof(b"VA 3\r\nab");
        eof(b"VA 3\r\nabc");
        eof(b"VA 3\r\nabc\r");
    }

    #[test]
    fn commands_are_encoded_as_memcached_expects() {
        let big = vec![b'x'; BORROW_MIN];
        let mut b = Batch::new(5);
        b.get("p:", 0xab, false);
        b.get("p:", u64::MAX, true);
        b.set("p:", 1, b"hi");
        b.set("p:", 2, &big);
        b.delete("p:", 3, None);
        b.delete("p:", 4, Some(1234567890));
        b.no_op();
        assert_eq!(b.len(), 7);
        let mut want = Vec::new();
        want.extend_from_slice(
            b"mg p:00000000000000ab v\r\nmg p:ffffffffffffffff v c\r\nms p:0000000000000001 2\r\nhi\r\n",
        );
        want.extend_from_slice(format!("ms p:0000000000000002 {BORROW_MIN}\r\n").as_bytes());
        want.extend_from_slice(&big);
        want.extend_from_slice(
            b"\r\nmd p:0000000000000003\r\nmd p:0000000000000004 C1234567890\r\nmn\r\n",
        );
        assert_eq!(
            String::from_utf8(b.to_vec()).unwrap(),
            String::from_utf8(want).unwrap()
        );
        let mut zero = Batch::new(1);
        zero.set("", 0, b"");
        assert_eq!(zero.to_vec(), b"ms 0000000000000000 0\r\n\r\n");
    }

    /// A writer that takes at most a few bytes per call, as a full socket might.
    struct Trickle(Vec<u8>);

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = buf.len().min(3);
            self.0.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn partial_writes_send_everything_in_order() {
        let values: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; BORROW_MIN + i as usize]).collect();
        let mut b = Batch::new(4);
        for (i, v) in values.iter().enumerate() {
            b.set("k", i as u64, v);
        }
        let mut sink = Trickle(Vec::new());
        b.send(&mut sink).unwrap();
        assert_eq!(sink.0, b.to_vec());
    }

    fn reply_strategy() -> impl Strategy<Value = Reply> {
        prop_oneof![
            (
                proptest::collection::vec(any::<u8>(), 0..300),
                any::<Option<u64>>()
            )
                .prop_map(|(data, cas)| Reply::Value {
                    data: Bytes::from(data),
                    cas
                }),
            Just(Reply::Miss),
            Just(Reply::Done),
            Just(Reply::NotFound),
            Just(Reply::Exists),
            Just(Reply::NoOp),
            "[a-z ]{1,40}".prop_map(Reply::ServerError),
        ]
    }

    fn encode(replies: &[Reply]) -> Vec<u8> {
        let mut out = Vec::new();
        for r in replies {
            match r {
                Reply::Value { data, cas } => {
                    out.extend_from_slice(format!("VA {}", data.len()).as_bytes());
                    if let Some(c) = cas {
                        out.extend_from_slice(format!(" c{c}").as_bytes());
                    }
                    out.extend_from_slice(b"\r\n");
                    out.extend_from_slice(data);
                    out.extend_from_slice(b"\r\n");
                }
                Reply::Miss => out.extend_from_slice(b"EN\r\n"),
                Reply::Done => out.extend_from_slice(b"HD\r\n"),
                Reply::NotFound => out.extend_from_slice(b"NF\r\n"),
                Reply::Exists => out.extend_from_slice(b"EX\r\n"),
                Reply::NoOp => out.extend_from_slice(b"MN\r\n"),
                Reply::ServerError(m) => {
                    out.extend_from_slice(format!("SERVER_ERROR {m}\r\n").as_bytes())
                }
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// Garbage never panics, never reads a value past the limit, and ends in an error or
        /// in replies that really are in the bytes.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600), max in 0usize..64) {
            for r in parse_all(&bytes, max).into_iter().flatten() {
                if let Reply::Value { data, .. } = r {
                    prop_assert!(data.len() <= max);
                }
            }
        }

        /// Near-miss garbage: fragments of real replies glued together at random.
        #[test]
        fn fragments_never_panic(parts in proptest::collection::vec(prop_oneof![
            Just(&b"VA "[..]), Just(&b"\r\n"[..]), Just(&b"\n"[..]), Just(&b"\r"[..]),
            Just(&b" c"[..]), Just(&b"12"[..]), Just(&b"0"[..]), Just(&b"HD"[..]),
            Just(&b"EN"[..]), Just(&b"SERVER_ERROR "[..]), Just(&b"x"[..]), Just(&b" "[..]),
        ], 0..40)) {
            let bytes = parts.concat();
            let _ = parse_all(&bytes, 64);
        }

        /// Well-formed replies parse back to themselves.
        #[test]
        fn well_formed_replies_round_trip(replies in proptest::collection::vec(reply_strategy(), 0..20)) {
            let bytes = encode(&replies);
            let mut r = &bytes[..];
            for want in &replies {
                prop_assert_eq!(&read_reply(&mut r, MAX).unwrap(), want);
            }
            prop_assert!(r.is_empty());
        }

        /// Cut short anywhere, a reply stream never yields all its replies: a value is never
        /// returned short, and a missing reply is an error, not a miss.
        #[test]
        fn truncated_streams_fail(replies in proptest::collection::vec(reply_strategy(), 1..10), cut in any::<prop::sample::Index>()) {
            let bytes = encode(&replies);
            let cut = cut.index(bytes.len());
            let mut r = &bytes[..cut];
            let mut failed = false;
            for want in &replies {
                match read_reply(&mut r, MAX) {
                    Ok(got) => prop_assert_eq!(&got, want),
                    Err(ReplyError::Io(e)) => {
                        prop_assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
                        failed = true;
                        break;
                    }
                    Err(ReplyError::Malformed(m)) => {
                        prop_assert!(false, "a truncated stream read as malformed: {}", m);
                    }
                }
            }
            prop_assert!(failed);
        }

        /// One corrupted byte gives an error or replies, never a panic or an oversized value.
        #[test]
        fn corrupted_streams_never_panic(replies in proptest::collection::vec(reply_strategy(), 1..10), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let mut bytes = encode(&replies);
            let at = at.index(bytes.len());
            bytes[at] = byte;
            for r in parse_all(&bytes, 300).into_iter().flatten() {
                if let Reply::Value { data, .. } = r {
                    prop_assert!(data.len() <= 300);
                }
            }
        }
    }
}
