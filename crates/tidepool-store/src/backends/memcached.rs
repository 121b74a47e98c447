//! memcached backend, on the `memcache` crate's ASCII protocol client.
//!
//! memcached keys are text (printable ASCII, no spaces, at most 250 bytes), so a value lives
//! under `prefix + key as 16 hex digits`.
//!
//! Round trips: `read_many` is one multi-key `gets`; `take_many` is that `gets` followed by a
//! `delete` per key found; `write_many` and `remove_many` are one `set` or `delete` per key,
//! because the crate sends one command at a time and has no pipelined or quiet forms.
//!
//! `take_many` is **not atomic**: between its `gets` and its `delete`s another client may write
//! the key (and that write is then deleted) or take it too (and both get the value). Tidepool
//! gives each key one owner, so this does not arise in its own use.
//!
//! memcached may evict any value when it runs out of memory; a store on memcached must be sized
//! (`-m`) so that it never does, or reads will find `None` where a value was written.
//!
//! The largest value is the server's item size limit (`-I`, 1 MiB unless set), read at connect
//! time; the item header and key count against it too.

use crate::{FarStore, Key, StoreError, StoreStats};
use bytes::Bytes;
use memcache::{ClientError, CommandError, MemcacheError, ServerError};
use parking_lot::RwLock;
use rustc_hash::FxHashSet;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

const BACKEND: &str = "memcached";
/// How long opening a connection (or waiting for a free one) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one read or write on an open connection may block, in seconds (the crate takes it
/// as a URL parameter).
const IO_TIMEOUT_SECS: u32 = 10;
/// Connections per store; callers beyond this many at once wait for a free one.
const MAX_CONNECTIONS: u32 = 32;
/// memcached's limit on key length.
const MAX_KEY: usize = 250;
/// Hex digits of an encoded key.
const KEY_DIGITS: usize = 16;

/// A [`FarStore`] on one memcached server.
pub struct MemcachedStore {
    addr: String,
    url: memcache::Url,
    prefix: String,
    /// The client and its connection pool. Replaced by a fresh one after a connection breaks:
    /// the crate's pool never notices a broken connection and would hand it out again, and a
    /// connection that failed halfway through an answer would give the next caller the rest of
    /// that answer as its own.
    client: RwLock<Arc<memcache::Client>>,
    /// The server's item size limit (`item_size_max`).
    item_size_max: usize,
}

impl fmt::Debug for MemcachedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemcachedStore")
            .field("addr", &self.addr)
            .field("prefix", &self.prefix)
            .field("item_size_max", &self.item_size_max)
            .finish()
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
        // Ask for the settings over a plain connection first: it proves the server is there
        // (so a wrong address fails now, not at the first page fault) and tells the item size
        // limit, which the crate does not expose.
        let settings = ask_stats(addr, "stats settings").map_err(|source| StoreError::Connect {
            backend: BACKEND,
            addr: addr.to_string(),
            source,
        })?;
        let item_size_max = settings
            .get("item_size_max")
            .and_then(|v| v.parse::<usize>().ok())
            .ok_or_else(|| StoreError::Protocol {
                backend: BACKEND,
                detail: format!("{addr} did not report item_size_max in 'stats settings'"),
            })?;
        let url = memcache::Url::parse(&format!(
            "memcache://{addr}?protocol=ascii&timeout={IO_TIMEOUT_SECS}"
        ))
        .map_err(|e| StoreError::BadUrl {
            url: format!("memcached://{addr}"),
            reason: e.to_string(),
        })?;
        let client = new_client(&url).map_err(|e| StoreError::Connect {
            backend: BACKEND,
            addr: addr.to_string(),
            source: io::Error::other(e.to_string()),
        })?;
        Ok(MemcachedStore {
            addr: addr.to_string(),
            url,
            prefix,
            client: RwLock::new(Arc::new(client)),
            item_size_max,
        })
    }

    fn mc_key(&self, key: Key) -> String {
        format!("{}{key:016x}", self.prefix)
    }

    fn client(&self) -> Arc<memcache::Client> {
        Arc::clone(&self.client.read())
    }

    /// Maps a failed call, replacing the connection pool if the failure may have left a
    /// connection out of step with the server.
    fn fail(&self, op: &'static str, used: &Arc<memcache::Client>, e: MemcacheError) -> StoreError {
        let clean_answer = matches!(
            e,
            MemcacheError::CommandError(_) | MemcacheError::ServerError(ServerError::Error(_))
        );
        let no_connection = matches!(e, MemcacheError::PoolError(_));
        if !clean_answer && !no_connection {
            self.replace_pool(used);
        }
        self.map_error(op, e)
    }

    fn replace_pool(&self, broken: &Arc<memcache::Client>) {
        let mut current = self.client.write();
        // Another caller may have replaced it already.
        if !Arc::ptr_eq(&current, broken) {
            return;
        }
        match new_client(&self.url) {
            Ok(fresh) => *current = Arc::new(fresh),
            Err(e) => {
                tracing::warn!(addr = %self.addr, error = %e, "could not build a new memcached connection pool")
            }
        }
    }

    fn map_error(&self, op: &'static str, e: MemcacheError) -> StoreError {
        let addr = &self.addr;
        match e {
            MemcacheError::PoolError(e) => StoreError::Connect {
                backend: BACKEND,
                addr: addr.clone(),
                source: io::Error::other(e.to_string()),
            },
            MemcacheError::IOError(e) => StoreError::Io {
                backend: BACKEND,
                op,
                source: io::Error::new(
                    e.kind(),
                    format!("{addr}: {e}; is the server still running?"),
                ),
            },
            // The crate's ASCII reader reports a closed connection this way.
            MemcacheError::ClientError(ClientError::Error(ref m))
                if m.contains("no line found") =>
            {
                StoreError::Io {
                    backend: BACKEND,
                    op,
                    source: io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("{addr} closed the connection; is the server still running?"),
                    ),
                }
            }
            MemcacheError::CommandError(CommandError::ValueTooLarge) => self.too_large(0),
            MemcacheError::ServerError(ServerError::Error(ref m)) if m.contains("too large") => {
                self.too_large(0)
            }
            MemcacheError::ServerError(ServerError::Error(ref m))
                if m.contains("out of memory") =>
            {
                StoreError::Backend {
                    backend: BACKEND,
                    message: format!(
                        "{addr} is out of memory during {op}: {}; give it more (-m)",
                        m.trim()
                    ),
                    source: Some(Box::new(e)),
                }
            }
            MemcacheError::ServerError(ServerError::BadResponse(_))
            | MemcacheError::ParseError(_) => StoreError::Protocol {
                backend: BACKEND,
                detail: format!("{addr} answered {op} with something unexpected: {e}"),
            },
            e => StoreError::Backend {
                backend: BACKEND,
                message: format!("{addr} answered {op} with an error: {e}"),
                source: Some(Box::new(e)),
            },
        }
    }

    fn too_large(&self, len: usize) -> StoreError {
        StoreError::ValueTooLarge {
            backend: BACKEND,
            len,
            max: self.item_size_max,
        }
    }

    /// `gets` of the distinct keys, as a map from memcached key to value.
    fn get_multi(
        &self,
        op: &'static str,
        mc_keys: &[String],
    ) -> Result<HashMap<String, Vec<u8>>, StoreError> {
        let mut distinct: Vec<&str> = Vec::with_capacity(mc_keys.len());
        let mut seen = FxHashSet::default();
        for k in mc_keys {
            if seen.insert(k.as_str()) {
                distinct.push(k);
            }
        }
        let client = self.client();
        client
            .gets::<Vec<u8>>(&distinct)
            .map_err(|e| self.fail(op, &client, e))
    }
}

/// Builds a client with a connection pool that opens connections on demand and hands them out
/// without a liveness round trip (the crate's default pool would send `version` before every
/// command).
fn new_client(url: &memcache::Url) -> Result<memcache::Client, MemcacheError> {
    let pool = memcache::Pool::builder()
        .max_size(MAX_CONNECTIONS)
        .min_idle(Some(0))
        .test_on_check_out(false)
        .connection_timeout(CONNECT_TIMEOUT)
        .build(memcache::ConnectionManager::new(url.clone()))
        .map_err(MemcacheError::PoolError)?;
    memcache::Client::with_pool(pool)
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

/// Sends `command` (`stats`, `stats settings`) on a fresh connection and returns the `STAT`
/// lines as a map.
fn ask_stats(addr: &str, command: &str) -> io::Result<HashMap<String, String>> {
    let mut last_error = None;
    let mut stream = None;
    for sock in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&sock, CONNECT_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last_error = Some(e),
        }
    }
    let mut stream = match stream {
        Some(s) => s,
        None => {
            return Err(last_error.unwrap_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, "the name resolved to no address")
            }))
        }
    };
    let timeout = Some(Duration::from_secs(IO_TIMEOUT_SECS.into()));
    stream.set_read_timeout(timeout)?;
    stream.set_write_timeout(timeout)?;
    stream.write_all(format!("{command}\r\n").as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut stats = HashMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the server closed the connection before answering '{command}'"),
            ));
        }
        let line = line.trim_end();
        if line == "END" {
            return Ok(stats);
        }
        let mut parts = line.splitn(3, ' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some("STAT"), Some(name), Some(value)) => {
                stats.insert(name.to_string(), value.to_string());
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "unexpected answer to '{command}': {line}; is this a memcached server?"
                    ),
                ))
            }
        }
    }
}

impl FarStore for MemcachedStore {
    fn describe(&self) -> String {
        format!("memcached://{}", self.addr)
    }

    fn write_many(&self, items: &[(Key, &[u8])]) -> Result<(), StoreError> {
        // Refuse the whole batch before writing any of it.
        if let Some((_, v)) = items.iter().find(|(_, v)| v.len() > self.item_size_max) {
            return Err(self.too_large(v.len()));
        }
        let client = self.client();
        for (key, value) in items {
            client.set(&self.mc_key(*key), *value, 0).map_err(|e| {
                match self.fail("write", &client, e) {
                    StoreError::ValueTooLarge { backend, max, .. } => StoreError::ValueTooLarge {
                        backend,
                        len: value.len(),
                        max,
                    },
                    other => other,
                }
            })?;
        }
        Ok(())
    }

    fn read_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mc_keys: Vec<String> = keys.iter().map(|k| self.mc_key(*k)).collect();
        let found: HashMap<String, Bytes> = self
            .get_multi("read", &mc_keys)?
            .into_iter()
            .map(|(k, v)| (k, Bytes::from(v)))
            .collect();
        // Bytes clones share the buffer, so a key asked for twice costs no copy.
        Ok(mc_keys.iter().map(|k| found.get(k).cloned()).collect())
    }

    fn take_many(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mc_keys: Vec<String> = keys.iter().map(|k| self.mc_key(*k)).collect();
        let mut found = self.get_multi("take", &mc_keys)?;
        let client = self.client();
        let mut out = Vec::with_capacity(keys.len());
        for k in &mc_keys {
            // A key taken twice in one batch yields its value once, as a sequence of takes would.
            match found.remove(k) {
                Some(v) => {
                    client
                        .delete(k)
                        .map_err(|e| self.fail("take", &client, e))?;
                    out.push(Some(Bytes::from(v)));
                }
                None => out.push(None),
            }
        }
        Ok(out)
    }

    fn remove_many(&self, keys: &[Key]) -> Result<(), StoreError> {
        let client = self.client();
        let mut seen = FxHashSet::default();
        for key in keys {
            if seen.insert(*key) {
                client
                    .delete(&self.mc_key(*key))
                    .map_err(|e| self.fail("remove", &client, e))?;
            }
        }
        Ok(())
    }

    /// `far_bytes` is the server's `bytes` (all its items, not only this store's); the
    /// server-wide item count is in `extra` as `server_items`.
    fn stats(&self) -> Result<StoreStats, StoreError> {
        let stats = ask_stats(&self.addr, "stats").map_err(|e| StoreError::Io {
            backend: BACKEND,
            op: "stats",
            source: io::Error::new(
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
