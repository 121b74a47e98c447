//! memcached's text protocol, requests only: one command line (and its data block) at a time
//! from a connection's buffer, into a [`Request`] that borrows from it. No I/O and no state, so
//! the fuzz target drives it directly. Errors are memcached 1.6's own reply lines, found by
//! sending each case to a real memcached (the `differential` test keeps them so).

use crate::lex::{
    data_len, memchr, parse_i64, parse_u64, tokens, BAD_CHUNK, BAD_DELTA, BAD_EXPTIME, BAD_FORMAT,
    ERROR, TOO_LARGE,
};
pub use crate::lex::{Limits, ITEM_OVERHEAD, KEY_MAX};
use crate::meta::{self, MetaFlags};
use std::borrow::Cow;

/// The storage commands of the text protocol, and the meta set's modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    /// `cas`: set if the item's CAS unique is this one.
    Cas(u64),
}

/// One request, borrowing keys and data from the buffer it was parsed from.
#[derive(Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get`, `gets`, `gat`, `gats`: the keys (checked, space separated), whether to return CAS
    /// uniques, and the new expiry of `gat`/`gats`.
    Get {
        keys: &'a [u8],
        cas: bool,
        touch: Option<i64>,
    },
    Store {
        mode: Mode,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        data: &'a [u8],
        noreply: bool,
    },
    Delete {
        key: &'a [u8],
        noreply: bool,
    },
    Arith {
        key: &'a [u8],
        incr: bool,
        delta: u64,
        noreply: bool,
    },
    Touch {
        key: &'a [u8],
        exptime: i64,
        noreply: bool,
    },
    FlushAll {
        delay: i64,
        noreply: bool,
    },
    Stats(Option<&'a [u8]>),
    Version,
    Verbosity {
        noreply: bool,
    },
    Quit,
    MetaGet {
        key: Cow<'a, [u8]>,
        flags: MetaFlags<'a>,
    },
    MetaSet {
        key: Cow<'a, [u8]>,
        data: &'a [u8],
        flags: MetaFlags<'a>,
    },
    MetaDelete {
        key: Cow<'a, [u8]>,
        flags: MetaFlags<'a>,
    },
    MetaArith {
        key: Cow<'a, [u8]>,
        flags: MetaFlags<'a>,
    },
    MetaNoop,
}

impl Request<'_> {
    /// The keys of a `get` family request.
    pub fn keys(keys: &[u8]) -> impl Iterator<Item = &[u8]> {
        tokens(keys)
    }
}

/// What the parser made of the front of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// Not a whole command yet: read more.
    Incomplete,
    /// A request, and how many bytes of the buffer it took.
    Request { req: Request<'a>, used: usize },
    /// An error reply line (without its `\r\n`) for a command that took `used` bytes; the
    /// connection then discards `swallow` more bytes (an item too large: its data), and is
    /// closed after the reply if `close`.
    Error {
        reply: Cow<'static, str>,
        used: usize,
        swallow: usize,
        close: bool,
    },
}

const DELETE_USAGE: &str = "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]";

fn error(reply: &'static str, used: usize) -> Parsed<'static> {
    Parsed::Error {
        reply: Cow::Borrowed(reply),
        used,
        swallow: 0,
        close: false,
    }
}

fn key_ok(k: &[u8]) -> bool {
    !k.is_empty() && k.len() <= KEY_MAX
}

/// Parses the command at the front of `buf`.
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Parsed<'a> {
    let Some(nl) = memchr(b'\n', buf) else {
        if buf.len() > limits.line_max {
            return Parsed::Error {
                reply: Cow::Borrowed("CLIENT_ERROR line too long"),
                used: buf.len(),
                swallow: 0,
                close: true,
            };
        }
        return Parsed::Incomplete;
    };
    let used = nl + 1;
    let line = buf[..nl].strip_suffix(b"\r").unwrap_or(&buf[..nl]);
    let mut it = tokens(line);
    let Some(cmd) = it.next() else {
        return error(ERROR, used);
    };
    let args: Vec<&[u8]> = it.collect();
    let rest = &buf[used..];
    match cmd {
        b"get" | b"gets" => get(&args, line, cmd.len(), cmd == b"gets", None, used),
        b"gat" | b"gats" => gat(&args, line, cmd == b"gats", used),
        b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => {
            storage(cmd, &args, used, rest, limits)
        }
        b"delete" => delete(&args, used),
        b"incr" | b"decr" => arith(&args, cmd == b"incr", used),
        b"touch" => touch(&args, used),
        b"flush_all" => flush_all(&args, used),
        b"stats" => request(Request::Stats(args.first().copied()), used),
        b"version" => request(Request::Version, used),
        b"verbosity" => match args.len() {
            1 | 2 => request(
                Request::Verbosity {
                    noreply: noreply(args.last()),
                },
                used,
            ),
            _ => error(ERROR, used),
        },
        b"quit" => request(Request::Quit, used),
        b"mn" => request(Request::MetaNoop, used),
        b"mg" | b"md" | b"ma" => meta_keyed(cmd, &args, used),
        b"ms" => meta_set(&args, used, rest, limits),
        _ => error(ERROR, used),
    }
}

/// `gat`/`gats <exptime> <key>*`: a get that also sets the keys' expiry.
fn gat<'a>(args: &[&'a [u8]], line: &'a [u8], cas: bool, used: usize) -> Parsed<'a> {
    let Some(t) = args.first() else {
        return error(ERROR, used);
    };
    let Some(exptime) = parse_i64(t) else {
        return error(BAD_EXPTIME, used);
    };
    // The keys follow the command and the expiry.
    let at = offset_of(line, args.get(1).copied()).unwrap_or(line.len());
    get(&args[1..], line, at, cas, Some(exptime), used)
}

/// `incr`/`decr <key> <delta> [noreply]`.
fn arith<'a>(args: &[&'a [u8]], incr: bool, used: usize) -> Parsed<'a> {
    if !(2..=3).contains(&args.len()) {
        return error(ERROR, used);
    }
    if !key_ok(args[0]) {
        return error(BAD_FORMAT, used);
    }
    let Some(delta) = parse_u64(args[1]) else {
        return error(BAD_DELTA, used);
    };
    request(
        Request::Arith {
            key: args[0],
            incr,
            delta,
            noreply: noreply(args.get(2)),
        },
        used,
    )
}

/// `touch <key> <exptime> [noreply]`.
fn touch<'a>(args: &[&'a [u8]], used: usize) -> Parsed<'a> {
    if !(2..=3).contains(&args.len()) {
        return error(ERROR, used);
    }
    if !key_ok(args[0]) {
        return error(BAD_FORMAT, used);
    }
    let Some(exptime) = parse_i64(args[1]) else {
        return error(BAD_EXPTIME, used);
    };
    request(
        Request::Touch {
            key: args[0],
            exptime,
            noreply: noreply(args.get(2)),
        },
        used,
    )
}

/// `flush_all [delay] [noreply]`.
fn flush_all<'a>(args: &[&'a [u8]], used: usize) -> Parsed<'a> {
    let (delay, nr) = match args {
        [] => (Some(0), false),
        [a] if *a == b"noreply" => (Some(0), true),
        [a] => (parse_i64(a), false),
        [a, b] => (parse_i64(a), noreply(Some(b))),
        _ => return error(ERROR, used),
    };
    match delay {
        Some(delay) => request(Request::FlushAll { delay, noreply: nr }, used),
        None => error(BAD_EXPTIME, used),
    }
}

fn request(req: Request<'_>, used: usize) -> Parsed<'_> {
    Parsed::Request { req, used }
}

fn noreply(t: Option<&&[u8]>) -> bool {
    t.is_some_and(|t| *t == b"noreply")
}

/// Where token `t` (a subslice of `line`) starts in it.
fn offset_of(line: &[u8], t: Option<&[u8]>) -> Option<usize> {
    t.map(|t| t.as_ptr() as usize - line.as_ptr() as usize)
}

fn get<'a>(
    keys: &[&'a [u8]],
    line: &'a [u8],
    from: usize,
    cas: bool,
    touch: Option<i64>,
    used: usize,
) -> Parsed<'a> {
    if keys.is_empty() {
        // `get` alone is not a command; `gat 10` alone is a get of nothing.
        return if touch.is_some() {
            request(
                Request::Get {
                    keys: &[],
                    cas,
                    touch,
                },
                used,
            )
        } else {
            error(ERROR, used)
        };
    }
    if keys.iter().any(|k| k.len() > KEY_MAX) {
        return error(BAD_FORMAT, used);
    }
    request(
        Request::Get {
            keys: &line[from..],
            cas,
            touch,
        },
        used,
    )
}

/// The data block of `len` bytes after a storage command line: `Ok(Some((data, used)))` when
/// it is all there and ends in `\r\n`, `Ok(None)` when more must be read, `Err(used)` when
/// it does not end so (the reply is [`bad_chunk`]).
pub(crate) fn data_block(
    rest: &[u8],
    len: usize,
    used: usize,
) -> Result<Option<(&[u8], usize)>, usize> {
    if rest.len() < len + 2 {
        return Ok(None);
    }
    if &rest[len..len + 2] != b"\r\n" {
        return Err(used + len + 2);
    }
    Ok(Some((&rest[..len], used + len + 2)))
}

/// The reply to a data block that does not end in `\r\n`, which took `used` bytes.
pub(crate) fn bad_chunk(used: usize) -> Parsed<'static> {
    error(BAD_CHUNK, used)
}

/// The reply to an item too large to store: the error now, its data discarded as it comes.
pub(crate) fn too_large(used: usize, len: usize) -> Parsed<'static> {
    Parsed::Error {
        reply: Cow::Borrowed(TOO_LARGE),
        used,
        swallow: len + 2,
        close: false,
    }
}

fn storage<'a>(
    cmd: &[u8],
    args: &[&'a [u8]],
    used: usize,
    rest: &'a [u8],
    limits: &Limits,
) -> Parsed<'a> {
    let is_cas = cmd == b"cas";
    let fixed = if is_cas { 5 } else { 4 };
    if args.len() != fixed && args.len() != fixed + 1 {
        return error(ERROR, used);
    }
    let key = args[0];
    if !key_ok(key) {
        return error(BAD_FORMAT, used);
    }
    let (Some(flags), Some(exptime), Some(len)) =
        (parse_u64(args[1]), parse_i64(args[2]), data_len(args[3]))
    else {
        return error(BAD_FORMAT, used);
    };
    let mode = match cmd {
        b"set" => Mode::Set,
        b"add" => Mode::Add,
        b"replace" => Mode::Replace,
        b"append" => Mode::Append,
        b"prepend" => Mode::Prepend,
        _ => match parse_u64(args[4]) {
            Some(c) => Mode::Cas(c),
            None => return error(BAD_FORMAT, used),
        },
    };
    if key.len() + len + ITEM_OVERHEAD > limits.item_max {
        return too_large(used, len);
    }
    match data_block(rest, len, used) {
        Err(used) => bad_chunk(used),
        Ok(None) => Parsed::Incomplete,
        Ok(Some((data, used))) => request(
            Request::Store {
                mode,
                key,
                // memcached keeps the low 32 bits of a larger number.
                flags: flags as u32,
                exptime,
                data,
                noreply: noreply(args.get(fixed)),
            },
            used,
        ),
    }
}

fn delete<'a>(args: &[&'a [u8]], used: usize) -> Parsed<'a> {
    let Some(&key) = args.first() else {
        return error(ERROR, used);
    };
    if args.len() > 3 {
        return error(ERROR, used);
    }
    if !key_ok(key) {
        return error(BAD_FORMAT, used);
    }
    // `delete <key> [0] [noreply]`: a hold time other than 0 is a thing of the past.
    let ok = match &args[1..] {
        [] => true,
        [a] => *a == b"0" || *a == b"noreply",
        [a, b] => *a == b"0" && *b == b"noreply",
        _ => false,
    };
    if !ok {
        return error(DELETE_USAGE, used);
    }
    request(
        Request::Delete {
            key,
            noreply: args.last().is_some_and(|t| *t == b"noreply"),
        },
        used,
    )
}

// ---- meta commands ----------------------------------------------------------------------

fn meta_error(reply: &'static str, used: usize, swallow: usize) -> Parsed<'static> {
    Parsed::Error {
        reply: Cow::Borrowed(reply),
        used,
        swallow,
        close: false,
    }
}

/// `mg`, `md`, `ma`: a key, then flags.
fn meta_keyed<'a>(cmd: &[u8], args: &[&'a [u8]], used: usize) -> Parsed<'a> {
    let Some((&raw, rest)) = args.split_first() else {
        return meta_error(ERROR, used, 0);
    };
    if raw.len() > KEY_MAX {
        return meta_error(BAD_FORMAT, used, 0);
    }
    let flags = match meta::parse_flags(cmd, rest) {
        Ok(f) => f,
        Err(e) => return meta_error(e, used, 0),
    };
    let key = match meta::decode_key(raw, &flags) {
        Ok(k) => k,
        Err(e) => return meta_error(e, used, 0),
    };
    let req = match cmd {
        b"mg" => Request::MetaGet { key, flags },
        b"md" => Request::MetaDelete { key, flags },
        _ => Request::MetaArith { key, flags },
    };
    Parsed::Request { req, used }
}

/// `ms <key> <datalen> <flags>*`, then the data block.
fn meta_set<'a>(args: &[&'a [u8]], used: usize, rest: &'a [u8], limits: &Limits) -> Parsed<'a> {
    let [raw, len, flag_args @ ..] = args else {
        return meta_error(if args.is_empty() { ERROR } else { BAD_FORMAT }, used, 0);
    };
    if raw.len() > KEY_MAX {
        return meta_error(BAD_FORMAT, used, 0);
    }
    let Some(len) = data_len(len) else {
        return meta_error(BAD_FORMAT, used, 0);
    };
    if raw.len() + len + ITEM_OVERHEAD > limits.item_max {
        return too_large(used, len);
    }
    // From here the data block belongs to this command: an error discards it.
    let parsed =
        meta::parse_flags(b"ms", flag_args).and_then(|f| meta::decode_key(raw, &f).map(|k| (k, f)));
    match data_block(rest, len, used) {
        Ok(None) => Parsed::Incomplete,
        Err(used) => bad_chunk(used),
        Ok(Some((data, used))) => match parsed {
            Ok((key, flags)) => Parsed::Request {
                req: Request::MetaSet { key, data, flags },
                used,
            },
            Err(e) => meta_error(e, used, 0),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(buf: &[u8]) -> Request<'_> {
        match parse(buf, &Limits::default()) {
            Parsed::Request { req, used } => {
                assert_eq!(used, buf.len(), "all of {buf:?} used");
                req
            }
            other => panic!("{buf:?}: {other:?}"),
        }
    }

    fn err(buf: &[u8]) -> (String, usize, usize) {
        match parse(buf, &Limits::default()) {
            Parsed::Error {
                reply,
                used,
                swallow,
                ..
            } => (reply.into_owned(), used, swallow),
            other => panic!("{buf:?}: {other:?}"),
        }
    }

    #[test]
    fn a_set_waits_for_its_data_and_takes_it_whole() {
        let l = Limits::default();
        assert_eq!(parse(b"set k 5 0 3", &l), Parsed::Incomplete);
        assert_eq!(parse(b"set k 5 0 3\r\nab", &l), Parsed::Incomplete);
        assert_eq!(parse(b"set k 5 0 3\r\nabc\r", &l), Parsed::Incomplete);
        assert_eq!(
            req(b"set k 5 0 3 noreply\r\nabc\r\n"),
            Request::Store {
                mode: Mode::Set,
                key: b"k",
                flags: 5,
                exptime: 0,
                data: b"abc",
                noreply: true
            }
        );
        // A bare \n ends a line too; runs of spaces are one.
        assert!(matches!(
            req(b"cas  k 0 0 1 77\nx\r\n"),
            Request::Store {
                mode: Mode::Cas(77),
                ..
            }
        ));
    }

    #[test]
    fn bad_lines_get_memcacheds_replies() {
        assert_eq!(err(b"bogus\r\n").0, "ERROR");
        assert_eq!(err(b"\r\n").0, "ERROR");
        assert_eq!(err(b"get\r\n").0, "ERROR");
        assert_eq!(err(b"set k 0 0 1 2 3\r\nx\r\n"), ("ERROR".into(), 17, 0));
        assert_eq!(err(b"set k -1 0 1\r\nx\r\n").0, BAD_FORMAT);
        assert_eq!(err(b"set k 0 0 -1\r\n").0, BAD_FORMAT);
        assert_eq!(err(b"cas k 0 0 1 abc\r\nx\r\n").0, BAD_FORMAT);
        let long = format!("get {}\r\n", "k".repeat(251));
        assert_eq!(err(long.as_bytes()).0, BAD_FORMAT);
        assert_eq!(err(b"set k 0 0 3\r\nabcd\r\n"), (BAD_CHUNK.into(), 18, 0));
        assert_eq!(err(b"incr k abc\r\n").0, BAD_DELTA);
        assert_eq!(err(b"decr k -1\r\n").0, BAD_DELTA);
        assert_eq!(err(b"touch k x\r\n").0, BAD_EXPTIME);
        assert_eq!(err(b"delete k 5\r\n").0, DELETE_USAGE);
        assert_eq!(err(b"flush_all x\r\n").0, BAD_EXPTIME);
    }

    #[test]
    fn an_item_too_large_is_refused_and_its_data_swallowed() {
        let (reply, used, swallow) = err(b"set k 0 0 2000000\r\n");
        assert_eq!((reply.as_str(), used, swallow), (TOO_LARGE, 19, 2_000_002));
    }

    #[test]
    fn a_line_with_no_end_is_cut_off_at_the_limit() {
        let l = Limits::default().line_max(16);
        assert_eq!(parse(b"get aaaaaaaa", &l), Parsed::Incomplete);
        assert!(matches!(
            parse(b"get aaaaaaaaaaaaaaaaaaaa", &l),
            Parsed::Error { close: true, .. }
        ));
    }

    #[test]
    fn gets_and_gats_keep_their_keys_in_order() {
        let Request::Get { keys, cas, touch } = req(b"gats 100  a bb\r\n") else {
            panic!()
        };
        assert!(cas);
        assert_eq!(touch, Some(100));
        assert_eq!(
            Request::keys(keys).collect::<Vec<_>>(),
            [&b"a"[..], &b"bb"[..]]
        );
        assert!(matches!(req(b"gat 10\r\n"), Request::Get { keys: b"", .. }));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_to_something_and_use_no_more_than_given(
            buf in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)
        ) {
            match parse(&buf, &Limits::default()) {
                Parsed::Incomplete => {}
                Parsed::Request { used, .. } | Parsed::Error { used, .. } => {
                    proptest::prop_assert!(used > 0 && used <= buf.len())
                }
            }
        }
    }
}

#[cfg(test)]
mod meta_tests {
    use super::{parse, Limits, Parsed, Request};

    fn reply(buf: &[u8]) -> String {
        match parse(buf, &Limits::default()) {
            Parsed::Error { reply, .. } => reply.into_owned(),
            other => panic!("{buf:?}: {other:?}"),
        }
    }

    #[test]
    fn flags_come_back_in_the_order_given() {
        let Parsed::Request {
            req: Request::MetaGet { key, flags },
            ..
        } = parse(b"mg k s v f t c k Oabc\r\n", &Limits::default())
        else {
            panic!()
        };
        assert_eq!(&*key, b"k");
        assert_eq!(flags.returns, b"sftckO");
        assert_eq!(flags.opaque, Some(&b"abc"[..]));
        assert!(flags.has(b'v') && !flags.quiet());
    }

    #[test]
    fn bad_flags_get_memcacheds_replies() {
        assert_eq!(reply(b"mg\r\n"), "ERROR");
        assert_eq!(reply(b"mg k zz\r\n"), "CLIENT_ERROR invalid flag");
        assert_eq!(reply(b"mg k v v\r\n"), "CLIENT_ERROR duplicate flag");
        assert_eq!(reply(b"ms k\r\n"), "CLIENT_ERROR bad command line format");
        assert_eq!(
            reply(b"ms k 2 MX\r\nhi\r\n"),
            "CLIENT_ERROR invalid mode for ms M token"
        );
        assert_eq!(
            reply(b"ma n MX\r\n"),
            "CLIENT_ERROR invalid mode for ma M token"
        );
        assert_eq!(
            reply(b"ma n Dabc\r\n"),
            "CLIENT_ERROR invalid or duplicate flag"
        );
        assert_eq!(reply(b"mg !!! b v\r\n"), "CLIENT_ERROR error decoding key");
    }

    #[test]
    fn a_meta_set_with_a_bad_flag_swallows_its_data() {
        match parse(b"ms k 2 S3\r\nhi\r\nmn\r\n", &Limits::default()) {
            Parsed::Error { used, .. } => assert_eq!(used, 15),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_base64_key_is_decoded() {
        let Parsed::Request {
            req: Request::MetaGet { key, .. },
            ..
        } = parse(b"mg Zm9v b v\r\n", &Limits::default())
        else {
            panic!()
        };
        assert_eq!(&*key, b"foo");
    }
}
