//! Tenants (who may connect, their quota and counters) and sessions (who owns which objects).

use crate::config::TokensFile;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use tidepool_proto::ErrorCode;

/// Per-tenant counters, all monotonic except the gauges at the top.
#[derive(Debug, Default)]
pub struct TenantStats {
    pub objects: AtomicU64,
    pub bytes_live: AtomicU64,
    pub bytes_allocated: AtomicU64,
    pub connections: AtomicU64,
    pub puts: AtomicU64,
    pub gets: AtomicU64,
    pub takes: AtomicU64,
    pub writes: AtomicU64,
    pub frees: AtomicU64,
    pub errors: AtomicU64,
    pub released_on_disconnect: AtomicU64,
}

#[derive(Debug)]
pub struct Tenant {
    pub id: u32,
    pub name: String,
    pub quota: u64,
    pub stats: TenantStats,
    /// The store settings the tenant's connections gave at hello (see `Request::Hello`), and
    /// how many connections gave them; reset when the last of them closes.
    store: parking_lot::Mutex<(String, usize)>,
}

impl Tenant {
    /// Records a connection of a store with these settings; refuses, answering the settings
    /// in use, when the tenant's open connections gave others.
    pub fn join_store(&self, settings: &str) -> Result<(), String> {
        let mut s = self.store.lock();
        if s.1 > 0 && s.0 != settings {
            return Err(s.0.clone());
        }
        if s.1 == 0 {
            s.0 = settings.to_string();
        }
        s.1 += 1;
        Ok(())
    }

    /// A connection that joined with [`Tenant::join_store`] closed.
    pub fn leave_store(&self) {
        let mut s = self.store.lock();
        s.1 = s.1.saturating_sub(1);
    }

    /// Charges `bytes` against the quota, or refuses without charging.
    pub fn charge(&self, bytes: u64) -> Result<(), ErrorCode> {
        let before = self
            .stats
            .bytes_allocated
            .fetch_add(bytes, Ordering::Relaxed);
        if before + bytes > self.quota {
            self.stats
                .bytes_allocated
                .fetch_sub(bytes, Ordering::Relaxed);
            return Err(ErrorCode::QuotaExceeded);
        }
        Ok(())
    }

    pub fn uncharge(&self, bytes: u64) {
        self.stats
            .bytes_allocated
            .fetch_sub(bytes, Ordering::Relaxed);
    }

    pub fn counters(&self) -> Vec<(String, u64)> {
        let s = &self.stats;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("objects", g(&s.objects)),
            ("bytes_live", g(&s.bytes_live)),
            ("bytes_allocated", g(&s.bytes_allocated)),
            ("quota", self.quota),
            ("connections", g(&s.connections)),
            ("puts", g(&s.puts)),
            ("gets", g(&s.gets)),
            ("takes", g(&s.takes)),
            ("writes", g(&s.writes)),
            ("frees", g(&s.frees)),
            ("errors", g(&s.errors)),
            ("released_on_disconnect", g(&s.released_on_disconnect)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// Who may connect.
#[derive(Debug)]
pub struct Tenants {
    tokens: Option<TokensFile>,
    capacity: u64,
    by_name: Mutex<HashMap<String, Arc<Tenant>>>,
    next_id: AtomicU32,
}

/// Compares in constant time (subtle), so timing does not reveal how much of a token matched.
fn same_token(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

impl Tenants {
    pub fn new(tokens: Option<TokensFile>, capacity: u64) -> Tenants {
        Tenants {
            tokens,
            capacity,
            by_name: Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(1),
        }
    }

    pub fn authenticate(&self, name: &str, token: &str) -> Result<Arc<Tenant>, ErrorCode> {
        let quota = match &self.tokens {
            None => self.capacity,
            Some(file) => {
                let spec = file.tenants.get(name).ok_or(ErrorCode::AuthFailed)?;
                if !same_token(&spec.token, token) {
                    return Err(ErrorCode::AuthFailed);
                }
                spec.quota.unwrap_or(self.capacity)
            }
        };
        if name.is_empty() {
            return Err(ErrorCode::AuthFailed);
        }
        let mut map = self.by_name.lock();
        Ok(Arc::clone(map.entry(name.to_string()).or_insert_with(
            || {
                Arc::new(Tenant {
                    id: self.next_id.fetch_add(1, Ordering::Relaxed),
                    name: name.to_string(),
                    quota,
                    stats: TenantStats::default(),
                    store: Default::default(),
                })
            },
        )))
    }

    pub fn all(&self) -> Vec<Arc<Tenant>> {
        let mut v: Vec<_> = self.by_name.lock().values().cloned().collect();
        v.sort_by_key(|t| t.id);
        v
    }
}

/// Objects one session put and may still own: (section, slot, generation).
pub type Owned = (u16, u32, u32);

/// A client's session: one or more connections sharing object ownership.
#[derive(Debug)]
pub struct Session {
    /// Recorded in each object's slot as its owner.
    pub id: u32,
    pub tenant: Arc<Tenant>,
    pub owned: Mutex<OwnedList>,
}

#[derive(Debug, Default)]
pub struct OwnedList {
    pub entries: Vec<Owned>,
    /// Compact when `entries` grows past this.
    pub compact_at: usize,
}

/// (tenant id, client session id) -> (session, open connections).
type SessionMap = HashMap<(u32, u64), (Arc<Session>, usize)>;

#[derive(Debug, Default)]
pub struct Sessions {
    map: Mutex<SessionMap>,
    next_id: AtomicU32,
}

impl Sessions {
    fn fresh(&self, tenant: Arc<Tenant>) -> Arc<Session> {
        Arc::new(Session {
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            tenant,
            owned: Mutex::new(OwnedList {
                entries: vec![],
                compact_at: 4096,
            }),
        })
    }

    /// Joins (or starts) the session `client_id` of `tenant`. Zero: a session of its own.
    pub fn join(&self, tenant: Arc<Tenant>, client_id: u64) -> Arc<Session> {
        if client_id == 0 {
            return self.fresh(tenant);
        }
        let mut map = self.map.lock();
        let entry = map
            .entry((tenant.id, client_id))
            .or_insert_with(|| (self.fresh(Arc::clone(&tenant)), 0));
        entry.1 += 1;
        Arc::clone(&entry.0)
    }

    /// Leaves the session; true when this was its last connection and its objects must go.
    pub fn leave(&self, session: &Session, client_id: u64) -> bool {
        if client_id == 0 {
            return true;
        }
        let mut map = self.map.lock();
        let key = (session.tenant.id, client_id);
        let Some(entry) = map.get_mut(&key) else {
            return true;
        };
        entry.1 -= 1;
        if entry.1 == 0 {
            map.remove(&key);
            true
        } else {
            false
        }
    }
}
