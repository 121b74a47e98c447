//! memcached backend: a small client of memcached's meta text protocol (memcached 1.6 or
//! later; see [`protocol`] for the commands).
//!
//! memcached keys are text (printable ASCII, no spaces, at most 250 bytes), so a value lives
//! under `prefix + key as 16 hex digits`.
//!
//! Each call takes a connection of its own from a pool, as the memory-node client does, writes
//! all its commands in one vectored write (values are sent from the caller's buffers, not
//! copied) and then reads the replies, which memcached sends in command order, through one
//! buffer. A batch of N keys thus costs one round trip and a handful of system calls:
//!
//! - `write_many`: one `ms` per item;
//! - `read_many`: one `mg` per key;
//! - `remove_many`: one `md` per key (a missing key is fine);
//! - `take_many`: one `mg` per distinct key, then one `md` per key found, conditional on the
//!   CAS version read: two round trips.
//!
//! Large batches are sent in pieces, so that replies the client has not read yet can never fill
//! the socket buffers while it is still writing: memcached stops reading a connection it cannot
//! write to, and both sides would wait until the timeout. `ms` and `md` are answered in 4 bytes,
//! so [`MAX_COMMANDS`] of them are safe; `mg` is answered with its value, so a piece of `mg`s
//! is at most [`MAX_GET_TEXT`] bytes, which the socket buffers hold whatever the server does.
//!
//! `take_many` is **not atomic**. Because its deletes are conditional, a value written between
//! its read and its delete is never deleted (the take returns the value it read, and the newer
//! one stays), and of two takes racing on one key only the one whose delete lands first returns
//! the value. But if a write lands between two racing takes' reads and their deletes, both
//! return the old value. Tidepool gives each key one owner, so this does not arise in its own
//! use.
//!
//! memcached may evict any value when it runs out of memory; a store on memcached must be sized
//! (`-m`) so that it never does, or reads will find `None` where a value was written.
//!
//! The largest value is the server's item size limit (`-I`, 1 MiB unless set), read at connect
//! time; the item header and key count against it too.

mod conn;
mod protocol;

use crate::{FarStore, ForkAware, Key, StoreError, StoreStats};
use bytes::Bytes;
use conn::{Conn, IO_TIMEOUT};
use parking_lot::Mutex;
use protocol::{Batch, Reply, ReplyError};
use rustc_hash::FxHashMap;
use std::fmt;
use std::io;

const BACKEND: &str = "memcached";
/// Idle connections kept for reuse; more callers than this at once open extra connections,
/// which are closed after their call.
const MAX_IDLE: usize = 32;
/// The most commands sent before their replies are read (see the module docs for why there is
/// a limit at all).
const MAX_COMMANDS: usize = 1024;
/// The most `mg` text sent before the values are read: well under the 16 KiB send buffer plus
/// 128 KiB receive buffer Linux gives a TCP connection by default (~700 keys with the default
/// prefix).
const MAX_GET_TEXT: usize = 32 << 10;
/// memcached's limit on key length.
const MAX_KEY: usize = 250;
/// Hex digits of an encoded key.
const KEY_DIGITS: usize = 16;

/// A [`FarStore`] on one memcached server.
pub struct MemcachedStore {
    addr: String,
    prefix: String,
    /// The server's item size limit (`item_size_max`).
    item_size_max: usize,
    /// Idle connections. Only a connection whose last call read every reply and nothing more
    /// comes back here; any other is closed, so no caller ever reads another's answer.
    pool: Mutex<Vec<Conn>>,
}

impl fmt::Debug for MemcachedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemcachedStore")
            .field("addr", &self.addr)
            .field("prefix", &self.prefix)
            .field("item_size_max", &self.item_size_max)
            .finish_non_exhaustive()
    }
}

impl MemcachedStore {
    /// Connects to the memcached server at `addr` (`host:port`). Values are kept under
    /// `prefix`, by default one unique to this store instance.
    pub fn connect(addr: &str, prefix: Option<String>) -> Result<MemcachedStore, StoreError> {
        let prefix = match prefix {
            Some(p) => {
                check_prefix(&p).map_err(|reason| StoreError::BadUrl {
                    url: format!("memcached://{addr}?prefix={p}"),
                    reason,
                })?;
                p
            }
            None => crate::default_prefix(),
        };
        let connect_error = |source| StoreError::Connect {
            backend: BACKEND,
            addr: addr.to_string(),
            cause: source,
        };
        // Asking for the settings proves the server is there (so a wrong address fails now,
        // not at the first page fault) and tells the item size limit.
        let settings = conn::ask_stats(addr, "stats settings").map_err(connect_error)?;
        let item_size_max = settings
            .get("item_size_max")
            .and_then(|v| v.parse::<usize>().ok())
            .ok_or_else(|| StoreError::Protocol {
                backend: BACKEND,
                detail: format!("{addr} did not report item_size_max in 'stats settings'"),
            })?;
        let store = MemcachedStore {
            addr: addr.to_string(),
            prefix,
            item_size_max,
            pool: Mutex::new(Vec::new()),
        };
        // Check that the server speaks the meta protocol, on the connection the first call
        // will use.
        let mut probe = Batch::new(1);
        probe.no_op();
        store.round_trip("connect", &probe, |replies| match replies.next() {
            Ok(Reply::NoOp) => Ok(()),
            Ok(other) => Err(replies.unexpected(&other, "'MN'")),
            Err(StoreError::Protocol { detail, .. }) => Err(StoreError::Protocol {
                backend: BACKEND,
                detail: format!(
                    "{detail}; Tidepool speaks memcached's meta protocol, which needs memcached \
                     1.6 or later"
                ),
            }),
            Err(e) => Err(e),
        })?;
        Ok(store)
    }

    /// Sends `batch` on a connection of this caller's own (opening one if none is idle) and
    /// reads the replies with `read`, which must read one per command unless it fails.
    ///
    /// The connection goes back to the pool only if the call succeeded, or failed only because
    /// the server refused an oversized value (memcached skips its data and stays in step), and
    /// nothing arrived beyond the replies.
    fn round_trip<R>(
        &self,
        op: &'static str,
        batch: &Batch<'_>,
        read: impl FnOnce(&mut Replies<'_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let idle = self.pool.lock().pop();
        let mut conn = match idle {
            Some(c) => c,
            None => Conn::open(&self.addr).map_err(|source| StoreError::Connect {
                backend: BACKEND,
                addr: self.addr.clone(),
                cause: source,
            })?,
        };
        conn.send(batch).map_err(|e| io_error(&self.addr, op, e))?;
        let mut replies = Replies {
            conn: &mut conn,
            store: self,
            op,
            read: 0,
        };
        let result = read(&mut replies);
        let all_read = replies.read == batch.len();
        debug_assert!(
            all_read || result.is_err(),
            "{op} succeeded without reading every reply"
        );
        if !all_read || !matches!(result, Ok(_) | Err(StoreError::ValueTooLarge { .. })) {
            return result;
        }
        if !conn.drained() {
            return Err(StoreError::Protocol {
                backend: BACKEND,
                detail: format!("{} sent more than the replies to {op}", self.addr),
            });
        }
        let mut pool = self.pool.lock();
        if pool.len() < MAX_IDLE {
            pool.push(conn);
        }
        result
    }

    fn too_large(&self, len: usize) -> StoreError {
        StoreError::ValueTooLarge {
            backend: BACKEND,
            len,
            max: self.item_size_max,
        }
    }

    /// The error for `SERVER_ERROR message` in answer to a command; `value_len` is the length
    /// of the value a refused `ms` carried.
    fn refused(&self, op: &'static str, message: &str, value_len: Option<usize>) -> StoreError {
        let addr = &self.addr;
        if let Some(len) = value_len.filter(|_| message.contains("too large")) {
            self.too_large(len)
        } else if message.contains("out of memory") {
            StoreError::Backend {
                backend: BACKEND,
                message: format!(
                    "{addr} is out of memory during {op}: {message}; give it more (-m)"
                ),
                source: None,
            }
        } else {
            StoreError::Backend {
                backend: BACKEND,
                message: format!("{addr} refused {op}: SERVER_ERROR {message}"),
                source: None,
            }
        }
    }

    /// How many keys one round trip of `mg` may carry: [`MAX_GET_TEXT`] over the length of
    /// one `mg <key> v c\r\n`.
    fn gets_per_round_trip(&self) -> usize {
        let line = "mg ".len() + self.prefix.len() + KEY_DIGITS + " v c\r\n".len();
        (MAX_GET_TEXT / line).clamp(1, MAX_COMMANDS)
    }

    /// Reads the keys (`with_cas` for take), in as few round trips as the limits allow.
    fn get(
        &self,
        op: &'static str,
        keys: &[Key],
        with_cas: bool,
    ) -> Result<Vec<Option<Found>>, StoreError> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(self.gets_per_round_trip()) {
            let mut batch = Batch::new(chunk.len());
            for key in chunk {
                batch.get(&self.prefix, *key, with_cas);
            }
            self.round_trip(op, &batch, |replies| {
                for _ in chunk {
                    match replies.next()? {
                        Reply::Value { data, cas } if cas.is_some() == with_cas => {
                            out.push(Some(Found { data, cas }))
                        }
                        Reply::Miss => out.push(None),
                        Reply::ServerError(m) => return Err(self.refused(op, &m, None)),
                        other => return Err(replies.unexpected(&other, "a value or 'EN'")),
                    }
                }
                Ok(())
            })?;
        }
        Ok(out)
    }
}

/// A value `mg` found, with its CAS version if it was asked for.
struct Found {
    data: Bytes,
    cas: Option<u64>,
}

/// The replies to one batch, read in order from the caller's connection.
struct Replies<'c> {
    conn: &'c mut Conn,
    store: &'c MemcachedStore,
    op: &'static str,
    /// How many have been read.
    read: usize,
}

impl Replies<'_> {
    fn next(&mut self) -> Result<Reply, StoreError> {
        self.read += 1;
        let addr = &self.store.addr;
        self.conn
            .reply(self.store.item_size_max)
            .map_err(|e| match e {
                ReplyError::Io(e) => io_error(addr, self.op, e),
                ReplyError::Malformed(what) => StoreError::Protocol {
                    backend: BACKEND,
                    detail: format!("{addr} answered {} with {what}", self.op),
                },
            })
    }

    fn unexpected(&self, got: &Reply, wanted: &str) -> StoreError {
        StoreError::Protocol {
            backend: BACKEND,
            detail: format!(
                "{} answered {} with {got:?} where {wanted} was expected",
                self.store.addr, self.op
            ),
        }
    }
}

fn io_error(addr: &str, op: &'static str, e: io::Error) -> StoreError {
    let message = match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
            "{addr} did not answer within {} s; is it overloaded or stopped?",
            IO_TIMEOUT.as_secs()
        ),
        _ => format!("{addr}: {e}; is the server still running?"),
    };
    StoreError::Io {
        backend: BACKEND,
        op,
        cause: io::Error::new(e.kind(), message),
    }
}

fn check_prefix(prefix: &str) -> Result<(), String> {
    if let Some(c) = prefix.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "memcached keys must be printable ASCII without spaces, and the prefix contains {c:?}"
        ));
    }
    if prefix.len() + KEY_DIGITS > MAX_KEY {
        return Err(format!(
            "the prefix is {} bytes; memcached keys are at most {MAX_KEY} bytes, so it must be at most {}",
            prefix.len(),
            MAX_KEY - KEY_DIGITS
        ));
    }
    Ok(())
}

impl FarStore for MemcachedStore {
    fn fork_aware(&self) -> Option<&dyn ForkAware> {
        Some(self)
    }

    fn describe(&self) -> String {
        crate::redact(&format!("memcached://{}", self.addr))
    }

    fn write_many(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        // Refuse the whole batch before writing any of it.
        if let Some((_, v)) = items.iter().find(|(_, v)| v.len() > self.item_size_max) {
            return Err(self.too_large(v.len()));
        }
        for chunk in items.chunks(MAX_COMMANDS) {
            let mut batch = Batch::new(chunk.len());
            for (key, value) in chunk {
                batch.set(&self.prefix, *key, value);
            }
            self.round_trip("write", &batch, |replies| {
                // Read every reply even after a refusal, to keep the connection in step.
                let mut refused = None;
                for (_, value) in chunk {
                    match replies.next()? {
                        Reply::Done => {}
                        Reply::ServerError(m) => {
                            refused.get_or_insert_with(|| {
                                self.refused("write", &m, Some(value.len()))
                            });
                        }
                        other => return Err(replies.unexpected(&other, "'HD'")),
                    }
                }
                refused.map_or(Ok(()), Err)
            })?;
        }
        Ok(())
    }

    fn read_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        Ok(self
            .get("read", keys, false)?
            .into_iter()
            .map(|found| found.map(|f| f.data))
            .collect())
    }

    fn take_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        // A key taken twice in one batch yields its value once, as a sequence of takes would:
        // read each distinct key once, and give its value to its first occurrence.
        let mut slot: FxHashMap<Key, usize> = FxHashMap::default();
        let mut distinct = Vec::with_capacity(keys.len());
        for key in keys {
            slot.entry(*key).or_insert_with(|| {
                distinct.push(*key);
                distinct.len() - 1
            });
        }
        let found = self.get("take", &distinct, true)?;
        let mut taken: Vec<Option<Bytes>> = Vec::with_capacity(distinct.len());
        for (keys, found) in distinct
            .chunks(MAX_COMMANDS)
            .zip(found.chunks(MAX_COMMANDS))
        {
            let mut batch = Batch::new(keys.len());
            for (key, f) in keys.iter().zip(found) {
                if let Some(f) = f {
                    batch.delete(&self.prefix, *key, f.cas);
                }
            }
            if batch.len() > 0 {
                self.round_trip("take", &batch, |replies| {
                    for f in found {
                        let Some(Found { data, .. }) = f else {
                            taken.push(None);
                            continue;
                        };
                        match replies.next()? {
                            // Deleted; or written anew since it was read, and the newer
                            // value stays while this take returns the one it read.
                            Reply::Done | Reply::Exists => taken.push(Some(data.clone())),
                            // Taken or removed by someone else since it was read.
                            Reply::NotFound => taken.push(None),
                            Reply::ServerError(m) => return Err(self.refused("take", &m, None)),
                            other => return Err(replies.unexpected(&other, "'HD', 'NF' or 'EX'")),
                        }
                    }
                    Ok(())
                })?;
            } else {
                taken.extend(found.iter().map(|_| None));
            }
        }
        Ok(keys.iter().map(|key| taken[slot[key]].take()).collect())
    }

    fn remove_many(&self, keys: &[Key]) -> Result<(), StoreError> {
        for chunk in keys.chunks(MAX_COMMANDS) {
            let mut batch = Batch::new(chunk.len());
            for key in chunk {
                batch.delete(&self.prefix, *key, None);
            }
            self.round_trip("remove", &batch, |replies| {
                for _ in chunk {
                    match replies.next()? {
                        Reply::Done | Reply::NotFound => {}
                        Reply::ServerError(m) => return Err(self.refused("remove", &m, None)),
                        other => return Err(replies.unexpected(&other, "'HD' or 'NF'")),
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// `far_bytes` is the server's `bytes` (all its items, not only this store's); the
    /// server-wide item count is in `extra` as `server_items`.
    fn stats(&self) -> Result<StoreStats, StoreError> {
        let stats = conn::ask_stats(&self.addr, "stats").map_err(|e| StoreError::Io {
            backend: BACKEND,
            op: "stats",
            cause: io::Error::new(
                e.kind(),
                format!("{}: {e}; is the server still running?", self.addr),
            ),
        })?;
        let number = |name: &str| stats.get(name).and_then(|v| v.trim().parse::<u64>().ok());
        Ok(StoreStats {
            far_bytes: number("bytes"),
            objects: None,
            extra: number("curr_items")
                .map(|n| vec![("server_items".to_string(), n)])
                .unwrap_or_default(),
        })
    }
}

/// Reads memcached replies from `data` until the input ends or one is refused; returns how many
/// were read. Used by the fuzz target: any input must end in an error, never a panic, and no
/// value longer than `max_value` may come back.
pub(crate) fn parse_replies(data: &[u8], max_value: usize) -> usize {
    let mut r = std::io::BufReader::new(data);
    let mut n = 0;
    while let Ok(reply) = protocol::read_reply(&mut r, max_value) {
        if let Reply::Value { data, .. } = &reply {
            assert!(data.len() <= max_value, "a value over the limit came back");
        }
        n += 1;
    }
    n
}

impl ForkAware for MemcachedStore {
    fn after_fork_in_child(&self) {
        // Closing the child's copies of the sockets leaves the parent's connections open.
        self.pool.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn prefixes_must_make_valid_memcached_keys() {
        assert!(check_prefix("tp:123:abc:0:").is_ok());
        assert!(check_prefix("has space").unwrap_err().contains("' '"));
        assert!(check_prefix("tab\t").is_err());
        assert!(check_prefix("é").is_err());
        assert!(check_prefix(&"x".repeat(MAX_KEY - KEY_DIGITS)).is_ok());
        assert!(check_prefix(&"x".repeat(MAX_KEY - KEY_DIGITS + 1))
            .unwrap_err()
            .contains("at most 234"));
    }

    #[test]
    fn round_trips_of_gets_fit_the_socket_buffers() {
        for prefix in [crate::default_prefix(), "x".repeat(MAX_KEY - KEY_DIGITS)] {
            let store = MemcachedStore {
                addr: "unused".into(),
                prefix: prefix.clone(),
                item_size_max: 1 << 20,
                pool: Mutex::new(Vec::new()),
            };
            let n = store.gets_per_round_trip();
            let mut batch = Batch::new(n);
            for key in 0..n as u64 {
                batch.get(&prefix, u64::MAX - key, true);
            }
            assert!(batch.text_len() <= MAX_GET_TEXT, "{n} keys of {prefix}");
            assert!(n >= 100, "only {n} keys per round trip with {prefix}");
        }
    }

    #[test]
    fn an_unreachable_server_fails_at_connect_naming_it() {
        let e = MemcachedStore::connect("127.0.0.1:1", None).unwrap_err();
        assert!(matches!(e, StoreError::Connect { .. }), "{e:?}");
        assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    }

    #[test]
    fn a_bad_prefix_is_refused_before_connecting() {
        let e = MemcachedStore::connect("127.0.0.1:1", Some("a b".into())).unwrap_err();
        assert!(matches!(e, StoreError::BadUrl { .. }), "{e:?}");
    }

    /// A scripted stand-in for memcached on loopback, for replies a real one never sends. It
    /// answers `stats settings` and `mn` itself and every other command line as `answer` says.
    struct FakeServer {
        addr: String,
        connections: Arc<AtomicUsize>,
        commands: Arc<parking_lot::Mutex<Vec<String>>>,
    }

    /// What the fake does about one command.
    enum Act {
        Say(&'static [u8]),
        SayAndClose(&'static [u8]),
    }

    type Answer = dyn Fn(&str) -> Act + Send + Sync;

    impl FakeServer {
        fn start(answer: impl Fn(&str) -> Act + Send + Sync + 'static) -> FakeServer {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let connections = Arc::new(AtomicUsize::new(0));
            let commands = Arc::new(parking_lot::Mutex::new(Vec::new()));
            let answer: Arc<Answer> = Arc::new(answer);
            let (count, log) = (Arc::clone(&connections), Arc::clone(&commands));
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { return };
                    count.fetch_add(1, Ordering::SeqCst);
                    let (answer, log) = (Arc::clone(&answer), Arc::clone(&log));
                    std::thread::spawn(move || serve(stream, &*answer, &log));
                }
            });
            FakeServer {
                addr,
                connections,
                commands,
            }
        }

        fn connections(&self) -> usize {
            self.connections.load(Ordering::SeqCst)
        }

        fn commands(&self) -> Vec<String> {
            self.commands.lock().clone()
        }

        fn open(&self) -> MemcachedStore {
            MemcachedStore::connect(&self.addr, Some("p:".into())).unwrap()
        }
    }

    fn serve(stream: TcpStream, answer: &Answer, log: &parking_lot::Mutex<Vec<String>>) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end().to_string();
            if let Some(len) = line.strip_prefix("ms ").and_then(|r| r.split(' ').nth(1)) {
                let mut data = vec![0; len.parse::<usize>().unwrap() + 2];
                reader.read_exact(&mut data).unwrap();
            }
            let act = match line.as_str() {
                "stats settings" => Act::Say(b"STAT item_size_max 1048576\r\nEND\r\n"),
                "mn" => Act::Say(b"MN\r\n"),
                other => {
                    log.lock().push(other.to_string());
                    answer(other)
                }
            };
            match act {
                Act::Say(bytes) if writer.write_all(bytes).is_ok() => {}
                Act::Say(_) => return,
                Act::SayAndClose(bytes) => {
                    let _ = writer.write_all(bytes);
                    return;
                }
            }
        }
    }

    #[test]
    fn a_malformed_reply_is_an_error_naming_the_server_and_line_not_a_miss() {
        let fake = FakeServer::start(|_| Act::Say(b"STORED\r\n"));
        let store = fake.open();
        let e = store.read(1).unwrap_err();
        assert!(matches!(e, StoreError::Protocol { .. }), "{e:?}");
        let m = e.to_string();
        assert!(
            m.contains("memcached") && m.contains(&fake.addr) && m.contains("'STORED"),
            "{m}"
        );
        // The connection that carried it is not reused.
        let before = fake.connections();
        assert!(store.read(1).is_err());
        assert_eq!(fake.connections(), before + 1);
    }

    #[test]
    fn a_value_cut_short_is_an_io_error_not_short_data() {
        let fake = FakeServer::start(|_| Act::SayAndClose(b"VA 5\r\nab"));
        let store = fake.open();
        let e = store.read(1).unwrap_err();
        assert!(matches!(e, StoreError::Io { .. }), "{e:?}");
        let m = e.to_string();
        assert!(m.contains(&fake.addr) && m.contains("5 bytes"), "{m}");
    }

    #[test]
    fn extra_replies_are_a_protocol_error() {
        let fake = FakeServer::start(|_| Act::Say(b"EN\r\nEN\r\n"));
        let store = fake.open();
        let e = store.read(1).unwrap_err();
        assert!(matches!(e, StoreError::Protocol { .. }), "{e:?}");
        assert!(e.to_string().contains("more than the replies"), "{e}");
    }

    #[test]
    fn a_refused_write_keeps_the_connection_in_step() {
        let fake = FakeServer::start(|line| match line {
            l if l.starts_with("ms p:0000000000000002 ") => {
                Act::Say(b"SERVER_ERROR object too large for cache\r\n")
            }
            l if l.starts_with("ms ") => Act::Say(b"HD\r\n"),
            _ => Act::Say(b"EN\r\n"),
        });
        let store = fake.open();
        let e = store
            .write_many(&[(1, b"a"), (2, b"bbb"), (3, b"c")])
            .unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::ValueTooLarge {
                    len: 3,
                    max: 1048576,
                    ..
                }
            ),
            "{e:?}"
        );
        let before = fake.connections();
        assert_eq!(store.read(1).unwrap(), None);
        assert_eq!(fake.connections(), before, "the connection was not reused");
    }

    #[test]
    fn take_deletes_only_the_version_it_read() {
        let fake = FakeServer::start(|line| match line {
            l if l.starts_with("mg ") => Act::Say(b"VA 2 c5\r\nhi\r\n"),
            "md p:0000000000000001 C5" => Act::Say(b"HD\r\n"),
            // Written anew since the read: this take still took the value it read.
            "md p:0000000000000002 C5" => Act::Say(b"EX\r\n"),
            // Taken by someone else since the read.
            "md p:0000000000000003 C5" => Act::Say(b"NF\r\n"),
            _ => Act::Say(b"ERROR\r\n"),
        });
        let store = fake.open();
        let got = store.take_many(&[1, 2, 3, 1]).unwrap();
        let hi = Some(Bytes::from_static(b"hi"));
        assert_eq!(got, vec![hi.clone(), hi, None, None]);
        assert_eq!(
            fake.commands(),
            [
                "mg p:0000000000000001 v c",
                "mg p:0000000000000002 v c",
                "mg p:0000000000000003 v c",
                "md p:0000000000000001 C5",
                "md p:0000000000000002 C5",
                "md p:0000000000000003 C5",
            ]
        );
    }

    #[test]
    fn a_server_without_meta_commands_is_refused_at_connect() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut writer = stream;
                    let mut line = String::new();
                    while reader.read_line(&mut line).unwrap_or(0) > 0 {
                        let reply: &[u8] = if line.starts_with("stats") {
                            b"STAT item_size_max 1048576\r\nEND\r\n"
                        } else {
                            b"ERROR\r\n"
                        };
                        let _ = writer.write_all(reply);
                        line.clear();
                    }
                });
            }
        });
        let e = MemcachedStore::connect(&addr, None).unwrap_err();
        assert!(matches!(e, StoreError::Protocol { .. }), "{e:?}");
        assert!(e.to_string().contains("1.6 or later"), "{e}");
    }
}
