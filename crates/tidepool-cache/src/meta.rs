//! The flags of memcached's meta commands (`mg`, `ms`, `md`, `ma`), parsed once into
//! [`MetaFlags`], with memcached 1.6's replies to flags it does not know or sees twice; the
//! commands themselves are parsed in [`crate::proto`].

use crate::lex::{parse_i64, parse_u64, BAD_FORMAT, KEY_MAX};
use base64::Engine;
use std::borrow::Cow;

/// The flags of one meta command.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MetaFlags<'a> {
    /// Every flag given, a bit per letter (`A`-`Z` then `a`-`z`).
    seen: u64,
    /// Flags that ask for something back, in the order given (memcached answers in it).
    pub returns: Vec<u8>,
    /// `O`: copied back as is.
    pub opaque: Option<&'a [u8]>,
    /// `C`: the CAS unique to compare.
    pub compare_cas: Option<u64>,
    /// `F`: client flags to set.
    pub client_flags: Option<u32>,
    /// `T`: a new TTL.
    pub ttl: Option<i64>,
    /// `N`: create on miss with this TTL (`ma`).
    pub vivify: Option<i64>,
    /// `J`: the initial value of an item `ma` creates.
    pub initial: Option<u64>,
    /// `D`: the delta of `ma`.
    pub delta: Option<u64>,
    /// `M`: the mode letter.
    pub mode: Option<u8>,
}

fn bit(flag: u8) -> Option<u64> {
    match flag {
        b'A'..=b'Z' => Some(1 << (flag - b'A')),
        b'a'..=b'z' => Some(1 << (26 + flag - b'a')),
        _ => None,
    }
}

impl MetaFlags<'_> {
    /// Whether `flag` was given.
    pub fn has(&self, flag: u8) -> bool {
        bit(flag).is_some_and(|b| self.seen & b != 0)
    }

    /// `q`: success replies are not sent.
    pub fn quiet(&self) -> bool {
        self.has(b'q')
    }
}

/// The flags each command takes (`P` and `L` are taken by all and ignored, as proxy hints).
fn allowed(cmd: &[u8]) -> &'static [u8] {
    match cmd {
        b"mg" => b"bcfhklOqstuvTNREPL",
        b"ms" => b"bcCFIkOqTMEPL",
        b"md" => b"bCIkOqTxEPL",
        _ => b"bCNJDTMqtcvkOEPL",
    }
}

/// Flags whose letter is followed by a token.
fn takes_token(flag: u8) -> bool {
    b"OCFTNJDMERPL".contains(&flag)
}

/// Flags answered by a token in the reply.
fn returned(cmd: &[u8], flag: u8) -> bool {
    match cmd {
        b"mg" => b"cfhklOst".contains(&flag),
        b"ms" | b"md" => b"ckO".contains(&flag),
        _ => b"ctkO".contains(&flag),
    }
}

pub(crate) fn parse_flags<'a>(
    cmd: &[u8],
    args: &[&'a [u8]],
) -> Result<MetaFlags<'a>, &'static str> {
    let mut f = MetaFlags::default();
    let ok = allowed(cmd);
    for t in args {
        let flag = t[0];
        let token = &t[1..];
        let b = bit(flag).ok_or("CLIENT_ERROR invalid flag")?;
        if !ok.contains(&flag) {
            return Err("CLIENT_ERROR invalid flag");
        }
        if f.seen & b != 0 {
            return Err("CLIENT_ERROR duplicate flag");
        }
        f.seen |= b;
        if !takes_token(flag) && !token.is_empty() {
            return Err("CLIENT_ERROR invalid flag");
        }
        let bad = match cmd {
            b"ma" => "CLIENT_ERROR invalid or duplicate flag",
            b"ms" => BAD_FORMAT,
            _ => "CLIENT_ERROR bad token in command line format",
        };
        match flag {
            b'O' => f.opaque = Some(token),
            b'C' => f.compare_cas = Some(parse_u64(token).ok_or(bad)?),
            b'F' => f.client_flags = Some(parse_u64(token).ok_or(bad)? as u32),
            b'T' => f.ttl = Some(parse_i64(token).ok_or(bad)?),
            b'N' => f.vivify = Some(parse_i64(token).ok_or(bad)?),
            b'J' => f.initial = Some(parse_u64(token).ok_or(bad)?),
            b'D' => f.delta = Some(parse_u64(token).ok_or(bad)?),
            b'M' => f.mode = Some(*token.first().ok_or(bad)?),
            _ => {}
        }
        if returned(cmd, flag) {
            f.returns.push(flag);
        }
    }
    if let Some(m) = f.mode {
        let modes: &[u8] = if cmd == b"ms" {
            b"EAPRSeaprs"
        } else {
            b"I+D-id"
        };
        if cmd != b"md" && !modes.contains(&m) {
            return Err(if cmd == b"ms" {
                "CLIENT_ERROR invalid mode for ms M token"
            } else {
                "CLIENT_ERROR invalid mode for ma M token"
            });
        }
    }
    Ok(f)
}

/// The key of a meta command, base64-decoded under `b`.
pub(crate) fn decode_key<'a>(
    raw: &'a [u8],
    flags: &MetaFlags<'_>,
) -> Result<Cow<'a, [u8]>, &'static str> {
    if raw.len() > KEY_MAX {
        return Err(BAD_FORMAT);
    }
    if !flags.has(b'b') {
        return Ok(Cow::Borrowed(raw));
    }
    match base64::engine::general_purpose::STANDARD.decode(raw) {
        Ok(k) if !k.is_empty() && k.len() <= KEY_MAX => Ok(Cow::Owned(k)),
        _ => Err("CLIENT_ERROR error decoding key"),
    }
}

/// The key as a reply's `k` token: as given (base64 again under `b`).
pub fn key_token(key: &[u8], flags: &MetaFlags<'_>) -> Cow<'static, [u8]> {
    if flags.has(b'b') {
        Cow::Owned(
            base64::engine::general_purpose::STANDARD
                .encode(key)
                .into_bytes(),
        )
    } else {
        Cow::Owned(key.to_vec())
    }
}
