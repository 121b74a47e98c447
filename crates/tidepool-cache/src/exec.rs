//! Runs one request on the items and writes memcached's reply.

use crate::meta::{key_token, MetaFlags};
use crate::proto::{parse, Limits, Mode, Parsed, Request};
use crate::stats::{self, Settings};
use crate::store::{Arith, ArithError, Deleted, Items, StoreMode, Stored, View};
use std::io::Write;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use tidepool_soft::SoftError;

/// What the connection does after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Close,
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Relaxed);
}

fn line(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.extend_from_slice(b"\r\n");
}

const OUT_OF_MEMORY: &str = "SERVER_ERROR out of memory storing object";

/// A connection's protocol state between reads.
#[derive(Debug, Default)]
pub struct Session {
    /// Input still to discard (the data of an item too large).
    pub swallow: usize,
    /// Close once the replies are out (`quit`, a line too long).
    pub closing: bool,
}

impl Session {
    /// Runs the whole commands at the front of `input`, appending their replies to `out`
    /// until it holds `out_limit` bytes; returns how much of `input` was used (the rest is
    /// an incomplete command, or waits for `out` to drain).
    pub fn feed(
        &mut self,
        items: &Items,
        settings: &Settings,
        limits: &Limits,
        input: &[u8],
        out: &mut Vec<u8>,
        out_limit: usize,
    ) -> usize {
        let mut at = 0;
        while out.len() < out_limit && !self.closing {
            if self.swallow > 0 {
                let n = self.swallow.min(input.len() - at);
                self.swallow -= n;
                at += n;
                if self.swallow > 0 {
                    break;
                }
            }
            if at == input.len() {
                break;
            }
            match parse(&input[at..], limits) {
                Parsed::Incomplete => break,
                Parsed::Request { req, used } => {
                    at += used;
                    if execute(items, settings, req, out) == Flow::Close {
                        self.closing = true;
                    }
                }
                Parsed::Error {
                    reply,
                    used,
                    swallow,
                    close,
                } => {
                    out.extend_from_slice(reply.as_bytes());
                    out.extend_from_slice(b"\r\n");
                    at += used;
                    self.swallow = swallow;
                    self.closing |= close;
                }
            }
        }
        at
    }
}

/// Runs `req`, appending its reply to `out`.
pub fn execute(items: &Items, settings: &Settings, req: Request<'_>, out: &mut Vec<u8>) -> Flow {
    let c = &items.counters;
    match req {
        Request::Get { keys, cas, touch } => get(items, keys, cas, touch, out),
        Request::Store {
            mode,
            key,
            flags,
            exptime,
            data,
            noreply,
        } => {
            bump(&c.cmd_set);
            let (m, cas) = match mode {
                Mode::Set => (StoreMode::Set, None),
                Mode::Add => (StoreMode::Add, None),
                Mode::Replace => (StoreMode::Replace, None),
                Mode::Append => (StoreMode::Append, None),
                Mode::Prepend => (StoreMode::Prepend, None),
                Mode::Cas(u) => (StoreMode::Set, Some(u)),
            };
            let r = items.store(m, key, flags, exptime, data, cas);
            store_reply(items, cas.is_some(), r, noreply, out);
        }
        Request::Delete { key, noreply } => {
            let hit = items.delete(key, None) == Deleted::Deleted;
            bump(if hit {
                &c.delete_hits
            } else {
                &c.delete_misses
            });
            if !noreply {
                line(out, if hit { "DELETED" } else { "NOT_FOUND" });
            }
        }
        Request::Arith {
            key,
            incr,
            delta,
            noreply,
        } => arith(items, key, incr, delta, noreply, out),
        Request::Touch {
            key,
            exptime,
            noreply,
        } => {
            bump(&c.cmd_touch);
            let hit = items.touch(key, exptime);
            bump(if hit { &c.touch_hits } else { &c.touch_misses });
            if !noreply {
                line(out, if hit { "TOUCHED" } else { "NOT_FOUND" });
            }
        }
        Request::FlushAll { delay, noreply } => {
            bump(&c.cmd_flush);
            items.flush(delay);
            if !noreply {
                line(out, "OK");
            }
        }
        Request::Stats(arg) => stats_reply(items, settings, arg, out),
        Request::Version => line(out, &format!("VERSION {}", crate::VERSION)),
        Request::Verbosity { noreply } => {
            if !noreply {
                line(out, "OK");
            }
        }
        Request::Quit => return Flow::Close,
        Request::MetaNoop => line(out, "MN"),
        Request::MetaGet { key, flags } => meta_get(items, &key, &flags, out),
        Request::MetaSet { key, data, flags } => meta_set(items, &key, data, &flags, out),
        Request::MetaDelete { key, flags } => meta_delete(items, &key, &flags, out),
        Request::MetaArith { key, flags } => meta_arith(items, &key, &flags, out),
    }
    Flow::Continue
}

/// `get` and its kin: a `VALUE` block per hit, then `END`.
fn get(items: &Items, keys: &[u8], cas: bool, touch: Option<i64>, out: &mut Vec<u8>) {
    let c = &items.counters;
    for key in Request::keys(keys) {
        bump(&c.cmd_get);
        if touch.is_some() {
            bump(&c.cmd_touch);
        }
        let hit = items.get(key, true, touch, out, |v, out| {
            out.extend_from_slice(b"VALUE ");
            out.extend_from_slice(key);
            let _ = write!(out, " {} {}", v.flags, v.len);
            if cas {
                let _ = write!(out, " {}", v.cas);
            }
            out.extend_from_slice(b"\r\n");
        });
        if hit.is_some() {
            out.extend_from_slice(b"\r\n");
            bump(&c.get_hits);
            if touch.is_some() {
                bump(&c.touch_hits);
            }
        } else {
            bump(&c.get_misses);
            if touch.is_some() {
                bump(&c.touch_misses);
            }
        }
    }
    out.extend_from_slice(b"END\r\n");
}

/// Counts a storage command's outcome and replies to it (`cas`: it was a `cas` command).
fn store_reply(
    items: &Items,
    cas: bool,
    r: Result<Stored, SoftError>,
    noreply: bool,
    out: &mut Vec<u8>,
) {
    let c = &items.counters;
    if cas {
        match r {
            Ok(Stored::Stored(_)) => bump(&c.cas_hits),
            Ok(Stored::Exists) => bump(&c.cas_badval),
            Ok(Stored::NotFound) => bump(&c.cas_misses),
            _ => {}
        }
    }
    let reply = match r {
        Ok(Stored::Stored(_)) => "STORED",
        Ok(Stored::NotStored) => "NOT_STORED",
        Ok(Stored::Exists) => "EXISTS",
        Ok(Stored::NotFound) => "NOT_FOUND",
        Err(_) => {
            bump(&c.out_of_memory);
            OUT_OF_MEMORY
        }
    };
    // Errors are sent even under noreply.
    if !noreply || r.is_err() {
        line(out, reply);
    }
}

/// `incr`/`decr`: the new value, counted as a hit or a miss.
fn arith(items: &Items, key: &[u8], incr: bool, delta: u64, noreply: bool, out: &mut Vec<u8>) {
    let c = &items.counters;
    let r = items.arith(key, &Arith::by(incr, delta));
    let (hits, misses) = if incr {
        (&c.incr_hits, &c.incr_misses)
    } else {
        (&c.decr_hits, &c.decr_misses)
    };
    let reply = match r {
        Ok((n, _)) => {
            bump(hits);
            n.to_string()
        }
        Err(ArithError::NotFound) => {
            bump(misses);
            "NOT_FOUND".into()
        }
        Err(ArithError::NonNumeric) => {
            "CLIENT_ERROR cannot increment or decrement non-numeric value".into()
        }
        Err(ArithError::Exists) => "EXISTS".into(),
        Err(ArithError::Memory) => OUT_OF_MEMORY.into(),
    };
    if !noreply || matches!(r, Err(ArithError::NonNumeric | ArithError::Memory)) {
        line(out, &reply);
    }
}

/// `stats [group]`: the group's `STAT` lines, then `END`; `stats reset` zeroes the counters.
fn stats_reply(items: &Items, settings: &Settings, arg: Option<&[u8]>, out: &mut Vec<u8>) {
    let pairs = match arg {
        None => stats::general(items, settings),
        Some(b"settings") => stats::settings(settings),
        Some(b"reset") => {
            stats::reset(&items.counters);
            line(out, "RESET");
            return;
        }
        // memcached's other groups describe its slab allocator, which this server
        // does not have: empty.
        Some(b"items" | b"slabs" | b"sizes" | b"conns" | b"extstore") => Vec::new(),
        Some(_) => {
            line(out, "ERROR");
            return;
        }
    };
    for (k, v) in pairs {
        let _ = write!(out, "STAT {k} {v}\r\n");
    }
    out.extend_from_slice(b"END\r\n");
}

/// `md`: deletes the item (with `x`, only its value) and replies `HD`, `NF` or `EX`.
fn meta_delete(items: &Items, key: &[u8], flags: &MetaFlags<'_>, out: &mut Vec<u8>) {
    let c = &items.counters;
    let r = if flags.has(b'x') {
        // Drops the value but keeps the item: an empty value, flags cleared.
        match items.store(StoreMode::Replace, key, 0, 0, b"", flags.compare_cas) {
            Ok(Stored::Stored(_)) => Deleted::Deleted,
            Ok(Stored::Exists) => Deleted::Exists,
            _ => Deleted::NotFound,
        }
    } else {
        items.delete(key, flags.compare_cas)
    };
    let code = match r {
        Deleted::Deleted => {
            bump(&c.delete_hits);
            "HD"
        }
        Deleted::NotFound => {
            bump(&c.delete_misses);
            "NF"
        }
        Deleted::Exists => "EX",
    };
    if !(flags.quiet() && code == "HD") {
        meta_line(out, code, None, key, flags);
    }
}

/// A meta reply line: the code, then the flags asked for in their order (`v` only for the
/// ones with a view: hits).
fn meta_line(out: &mut Vec<u8>, code: &str, view: Option<&View>, key: &[u8], f: &MetaFlags<'_>) {
    out.extend_from_slice(code.as_bytes());
    for &flag in &f.returns {
        match (flag, view) {
            (b'O', _) => {
                out.extend_from_slice(b" O");
                out.extend_from_slice(f.opaque.unwrap_or_default());
            }
            (b'k', _) => {
                out.extend_from_slice(b" k");
                out.extend_from_slice(&key_token(key, f));
            }
            (b'c', Some(v)) => {
                let _ = write!(out, " c{}", v.cas);
            }
            (b'f', Some(v)) => {
                let _ = write!(out, " f{}", v.flags);
            }
            (b'h', Some(v)) => {
                let _ = write!(out, " h{}", v.fetched as u8);
            }
            (b'l', Some(v)) => {
                let _ = write!(out, " l{}", v.idle);
            }
            (b's', Some(v)) => {
                let _ = write!(out, " s{}", v.len);
            }
            (b't', Some(v)) => {
                let _ = write!(out, " t{}", v.ttl);
            }
            _ => {}
        }
    }
    if f.has(b'b') && f.returns.contains(&b'k') {
        out.extend_from_slice(b" b");
    }
    out.extend_from_slice(b"\r\n");
}

fn meta_get(items: &Items, key: &[u8], f: &MetaFlags<'_>, out: &mut Vec<u8>) {
    let c = &items.counters;
    bump(&c.cmd_get);
    let value = f.has(b'v');
    let hit = items.get(key, value, f.ttl, out, |v, out| {
        // A TTL given with T is the one reported.
        let mut v = *v;
        if let Some(t) = f.ttl {
            v.ttl = if t == 0 { -1 } else { t.max(0) };
        }
        if value {
            let _ = write!(out, "VA {}", v.len);
            meta_line(out, "", Some(&v), key, f);
        } else {
            meta_line(out, "HD", Some(&v), key, f);
        }
    });
    match hit {
        Some(_) => {
            bump(&c.get_hits);
            if value {
                out.extend_from_slice(b"\r\n");
            }
        }
        None => {
            bump(&c.get_misses);
            if !f.quiet() {
                meta_line(out, "EN", None, key, f);
            }
        }
    }
}

fn meta_set(items: &Items, key: &[u8], data: &[u8], f: &MetaFlags<'_>, out: &mut Vec<u8>) {
    let c = &items.counters;
    bump(&c.cmd_set);
    let mode = match f.mode.unwrap_or(b'S') {
        b'E' | b'e' => StoreMode::Add,
        b'A' | b'a' => StoreMode::Append,
        b'P' | b'p' => StoreMode::Prepend,
        b'R' | b'r' => StoreMode::Replace,
        _ => StoreMode::Set,
    };
    let r = items.store(
        mode,
        key,
        f.client_flags.unwrap_or(0),
        f.ttl.unwrap_or(0),
        data,
        f.compare_cas,
    );
    let (code, cas) = match r {
        Ok(Stored::Stored(cas)) => ("HD", cas),
        Ok(Stored::NotStored) => ("NS", 0),
        Ok(Stored::Exists) => ("EX", 0),
        Ok(Stored::NotFound) => ("NF", 0),
        Err(_) => {
            bump(&c.out_of_memory);
            line(out, OUT_OF_MEMORY);
            return;
        }
    };
    if f.quiet() && code == "HD" {
        return;
    }
    let view = View {
        flags: 0,
        cas,
        len: data.len(),
        ttl: -1,
        idle: 0,
        fetched: false,
    };
    meta_line(out, code, Some(&view), key, f);
}

fn meta_arith(items: &Items, key: &[u8], f: &MetaFlags<'_>, out: &mut Vec<u8>) {
    let c = &items.counters;
    let incr = !matches!(f.mode, Some(b'D' | b'd' | b'-'));
    let create = f.vivify.map(|ttl| (f.initial.unwrap_or(0), ttl));
    let r = items.arith(
        key,
        &Arith {
            incr,
            delta: f.delta.unwrap_or(1),
            cas: f.compare_cas,
            create,
            ttl: f.ttl,
        },
    );
    let (hits, misses) = if incr {
        (&c.incr_hits, &c.incr_misses)
    } else {
        (&c.decr_hits, &c.decr_misses)
    };
    match r {
        Ok((n, view)) => {
            bump(hits);
            if f.quiet() {
                return;
            }
            if f.has(b'v') {
                let text = n.to_string();
                let _ = write!(out, "VA {}", text.len());
                meta_line(out, "", Some(&view), key, f);
                out.extend_from_slice(text.as_bytes());
                out.extend_from_slice(b"\r\n");
            } else {
                meta_line(out, "HD", Some(&view), key, f);
            }
        }
        Err(ArithError::NotFound) => {
            bump(misses);
            meta_line(out, "NF", None, key, f);
        }
        Err(ArithError::Exists) => meta_line(out, "EX", None, key, f),
        Err(ArithError::NonNumeric) => line(
            out,
            "CLIENT_ERROR cannot increment or decrement non-numeric value",
        ),
        Err(ArithError::Memory) => line(out, OUT_OF_MEMORY),
    }
}
