//! A client of one node: a pool of connections shared by threads, one session for all of them,
//! and batches sent to several nodes before any answer is read (`InFlight`).

use super::conn::{unexpected, Batch, NodeConn};
use crate::tls::ClientTls;
use crate::StoreError;
use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tidepool_proto::Handle;
use tidepool_proto::HelloInfo;
use tidepool_proto::ItemResult;
use tidepool_proto::Op;
use tidepool_proto::Request;
use tidepool_proto::Response;

/// How a client talks to its node: [`NodeOptions::default`], then the setters below for what
/// differs from the defaults each one names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOptions {
    /// How long each request asks for its answer without sleeping before it sleeps (zero:
    /// sleep at once). Plain TCP only: a TLS connection sleeps at once.
    pub(crate) poll: Duration,
    /// The longest wait to connect, for the node to take a request, or for its answer; past
    /// it the request fails (and `tidepool run` stops the program, exit 70).
    pub(crate) timeout: Duration,
    /// What store the node is one of (`ec=4+2 over h1,...`), said at hello so that the node
    /// refuses a client of the same tenant whose store has other settings; empty for a store
    /// on this node alone.
    pub(crate) store: String,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            poll: DEFAULT_POLL,
            timeout: DEFAULT_TIMEOUT,
            store: String::new(),
        }
    }
}

impl NodeOptions {
    /// How long each request asks for its answer without sleeping before it sleeps (zero:
    /// sleep at once). Plain TCP only: a TLS connection sleeps at once.
    /// Default: [`DEFAULT_POLL`].
    pub fn poll(mut self, value: Duration) -> NodeOptions {
        self.poll = value;
        self
    }

    /// The longest wait to connect, for the node to take a request, or for its answer; past
    /// it the request fails (and `tidepool run` stops the program, exit 70).
    /// Default: 10 s.
    pub fn timeout(mut self, value: Duration) -> NodeOptions {
        self.timeout = value;
        self
    }

    /// What store the node is one of (`ec=4+2 over h1,...`), said at hello so that the node
    /// refuses a client of the same tenant whose store has other settings.
    /// Default: empty, a store on this node alone.
    pub fn store(mut self, value: impl Into<String>) -> NodeOptions {
        self.store = value.into();
        self
    }
}

/// See [`NodeOptions::timeout`]; the URL's `timeout_ms` sets it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request polls for its answer before sleeping, unless the URL's `poll_us` says
/// otherwise. Measured in `tidepool bench pager` (issue 28): with the node on another CPU of
/// this VM, an unpipelined 4 KiB get took 82 us sleeping and 24 us polling; a page miss 85 us
/// and 51 us. An answer later than this costs the poll on top of the wake-up.
pub const DEFAULT_POLL: Duration = Duration::from_micros(100);

/// A client of one memory node, shared by any number of threads. Its Debug form leaves the
/// token out.
pub struct NodeClient {
    pub(super) addr: String,
    pub(super) tenant: String,
    pub(super) token: String,
    pub(super) tls: Option<ClientTls>,
    pub(super) options: NodeOptions,
    pub(super) session: AtomicU64,
    pub(super) info: HelloInfo,
    pub(super) pool: Mutex<Vec<NodeConn>>,
    /// Connections inherited from the process that forked this one: never used, kept open so
    /// that its session (and every earlier one up the line of forks) outlives it.
    pub(super) keepalive: Mutex<Vec<NodeConn>>,
}

impl std::fmt::Debug for NodeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeClient")
            .field("addr", &self.addr)
            .field("tenant", &self.tenant)
            .field("token", &if self.token.is_empty() { "" } else { "***" })
            .field("tls", &self.tls)
            .field("info", &self.info)
            .field("pooled", &self.pool.try_lock().map(|p| p.len()))
            .finish()
    }
}

/// A batch sent by [`NodeClient::send`] whose answers have not been read yet. Dropped
/// unfinished (a caller returning early on another node's error), it still reads its answers:
/// closing the connection instead could end the client's session, and the node frees
/// everything a session put when its last connection closes.
#[derive(Debug)]
pub struct InFlight<'c> {
    client: &'c NodeClient,
    conn: Option<NodeConn>,
    ops: Vec<Op>,
}

impl InFlight<'_> {
    /// Waits for the answers, in request order, and gives the connection back.
    pub fn finish(mut self) -> Result<Vec<Response>, StoreError> {
        self.collect()
    }

    fn collect(&mut self) -> Result<Vec<Response>, StoreError> {
        let mut conn = self.conn.take().expect("answers read once");
        let r = conn.answers(&self.ops);
        self.client.checkin(conn, &r);
        r
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.conn.is_some() {
            let _ = self.collect();
        }
    }
}

impl NodeClient {
    /// Connects and authenticates once, so a wrong address or token fails here.
    pub fn connect(addr: &str, tenant: &str, token: &str) -> Result<NodeClient, StoreError> {
        Self::connect_with(addr, tenant, token, None)
    }

    /// [`NodeClient::connect`], over TLS when `tls` is given (every connection of the pool).
    pub fn connect_with(
        addr: &str,
        tenant: &str,
        token: &str,
        tls: Option<ClientTls>,
    ) -> Result<NodeClient, StoreError> {
        Self::connect_with_options(addr, tenant, token, tls, NodeOptions::default())
    }

    /// [`NodeClient::connect_with`], polling and timing out as `options` say.
    pub fn connect_with_options(
        addr: &str,
        tenant: &str,
        token: &str,
        tls: Option<ClientTls>,
        options: NodeOptions,
    ) -> Result<NodeClient, StoreError> {
        let session = new_session_id();
        let (conn, info) = NodeConn::open(addr, tenant, token, session, tls.as_ref(), &options)?;
        Ok(NodeClient {
            addr: addr.to_string(),
            tenant: tenant.to_string(),
            token: token.to_string(),
            tls,
            options,
            session: AtomicU64::new(session),
            info,
            pool: Mutex::new(vec![conn]),
            keepalive: Mutex::new(Vec::new()),
        })
    }

    /// In a forked child, before anything else: the inherited connections become keep-alives
    /// of the parent's session, and this client starts a session of its own.
    pub fn after_fork_in_child(&self) {
        let inherited = std::mem::take(&mut *self.pool.lock());
        self.keepalive.lock().extend(inherited);
        self.session.store(new_session_id(), Ordering::Relaxed);
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether the connections use TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// What the node said at hello: tenant id, quota, capacity, frame limit.
    pub fn info(&self) -> HelloInfo {
        self.info
    }

    /// Runs `f` on a connection of this thread's own; a connection that failed is dropped,
    /// not returned to the pool.
    pub fn with_conn<R>(
        &self,
        f: impl FnOnce(&mut NodeConn) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let mut conn = self.checkout()?;
        let r = f(&mut conn);
        self.checkin(conn, &r);
        r
    }

    fn checkout(&self) -> Result<NodeConn, StoreError> {
        let pooled = self.pool.lock().pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => {
                let session = self.session.load(Ordering::Relaxed);
                NodeConn::open(
                    &self.addr,
                    &self.tenant,
                    &self.token,
                    session,
                    self.tls.as_ref(),
                    &self.options,
                )?
                .0
            }
        };
        conn.poll_ns = self.options.poll.as_nanos().min(u64::MAX as u128) as u64;
        Ok(conn)
    }

    /// Returns a connection to the pool unless its last use failed on the wire.
    fn checkin<R>(&self, conn: NodeConn, r: &Result<R, StoreError>) {
        if !matches!(r, Err(StoreError::Io { .. } | StoreError::Protocol { .. })) {
            self.pool.lock().push(conn);
        }
    }

    /// Sends a batch on a connection of its own and returns at once; [`InFlight::finish`]
    /// collects the answers. Batches sent this way to several nodes wait out their round
    /// trips together.
    pub fn send(&self, batch: &Batch<'_>) -> Result<InFlight<'_>, StoreError> {
        let mut conn = self.checkout()?;
        // A connection that failed to send is dropped with the error.
        conn.send_batch(batch)?;
        Ok(InFlight {
            client: self,
            conn: Some(conn),
            ops: batch.ops.clone(),
        })
    }

    pub fn call(&self, req: &Request) -> Result<Response, StoreError> {
        self.with_conn(|c| c.call(req))
    }

    pub fn pipeline(&self, reqs: &[Request]) -> Result<Vec<Response>, StoreError> {
        self.with_conn(|c| c.pipeline(reqs))
    }

    /// Sends a batch (see [`Batch`]) and returns its answers in request order.
    pub fn exchange(&self, batch: &Batch<'_>) -> Result<Vec<Response>, StoreError> {
        self.with_conn(|c| c.exchange(batch))
    }

    pub fn put(&self, data: Bytes) -> Result<Handle, StoreError> {
        match self.call(&Request::Put { data })? {
            Response::Handle(h) => Ok(h),
            other => Err(unexpected("put", &other)),
        }
    }

    pub fn get(&self, handle: Handle) -> Result<Bytes, StoreError> {
        match self.call(&Request::Get { handle })? {
            Response::Data(d) => Ok(d),
            other => Err(unexpected("get", &other)),
        }
    }

    pub fn take(&self, handle: Handle) -> Result<Bytes, StoreError> {
        match self.call(&Request::Take { handle })? {
            Response::Data(d) => Ok(d),
            other => Err(unexpected("take", &other)),
        }
    }

    pub fn write(&self, handle: Handle, data: Bytes) -> Result<(), StoreError> {
        match self.call(&Request::Write { handle, data })? {
            Response::Done => Ok(()),
            other => Err(unexpected("write", &other)),
        }
    }

    pub fn free(&self, handle: Handle) -> Result<(), StoreError> {
        match self.call(&Request::Free { handle })? {
            Response::Done => Ok(()),
            other => Err(unexpected("free", &other)),
        }
    }

    pub fn put_many(&self, items: Vec<Bytes>) -> Result<Vec<ItemResult<Handle>>, StoreError> {
        match self.call(&Request::PutMany { items })? {
            Response::Handles(v) => Ok(v),
            other => Err(unexpected("put-many", &other)),
        }
    }

    pub fn get_many(&self, handles: Vec<Handle>) -> Result<Vec<ItemResult<Bytes>>, StoreError> {
        match self.call(&Request::GetMany { handles })? {
            Response::DataMany(v) => Ok(v),
            other => Err(unexpected("get-many", &other)),
        }
    }

    pub fn take_many(&self, handles: Vec<Handle>) -> Result<Vec<ItemResult<Bytes>>, StoreError> {
        match self.call(&Request::TakeMany { handles })? {
            Response::DataMany(v) => Ok(v),
            other => Err(unexpected("take-many", &other)),
        }
    }

    pub fn free_many(&self, handles: Vec<Handle>) -> Result<Vec<ItemResult<()>>, StoreError> {
        match self.call(&Request::FreeMany { handles })? {
            Response::DoneMany(v) => Ok(v),
            other => Err(unexpected("free-many", &other)),
        }
    }

    /// The node's counters for this tenant (`tenant.*`) and for itself (`node.*`).
    pub fn stats(&self) -> Result<Vec<(String, u64)>, StoreError> {
        match self.call(&Request::Stats)? {
            Response::Stats(v) => Ok(v),
            other => Err(unexpected("stats", &other)),
        }
    }
}

/// A fresh non-zero session id (zero asks the node for a session of the connection's own).
pub(super) fn new_session_id() -> u64 {
    loop {
        let s: u64 = rand_u64();
        if s != 0 {
            break s;
        }
    }
}

pub(super) fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS per process; mixing in time and pid keeps clients of
    // one process distinct too.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}
