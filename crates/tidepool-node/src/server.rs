//! The listening server: accepts connections, hands each to one of the event-loop I/O workers
//! (`io.rs`), and owns the shared state.

use crate::arena::Arena;
use crate::config::{NodeConfig, MIN_MAX_OUTSTANDING};
use crate::counters::NodeMetrics;
use crate::http::MetricsServer;
use crate::io::WorkerHandle;
use crate::section::{Section, SectionRequest};
use crate::shared::Shared;
use crate::spans::PAGE;
use crate::tenants::{Sessions, Tenants};
use crate::tls::TlsServer;
use crate::NodeError;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use tidepool_proto::{ErrorCode, FrameWriter, Op, RESPONSE_BIT};

/// Send buffer asked for each connection (the kernel doubles it, up to net.core.wmem_max).
const SEND_BUFFER: usize = 2 << 20;

/// A running memory node. Dropping it does not stop it; call [`Server::shutdown`].
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
    allocators: Vec<JoinHandle<()>>,
    workers: Arc<Vec<WorkerHandle>>,
    metrics: Option<MetricsServer>,
}

impl Server {
    /// Maps the capacity, starts the section allocators and begins accepting connections.
    pub fn start(cfg: NodeConfig) -> Result<Server, NodeError> {
        let sections = cfg.sections.max(1);
        if cfg.max_outstanding < MIN_MAX_OUTSTANDING {
            return Err(NodeError::MaxOutstandingTooSmall {
                given: cfg.max_outstanding,
                min: MIN_MAX_OUTSTANDING,
            });
        }
        // Bad certificate files are reported before anything is mapped or bound.
        let tls = cfg.tls.as_ref().map(TlsServer::load).transpose()?;
        let section_len = (cfg.capacity / sections as u64) / PAGE * PAGE;
        if section_len == 0 {
            return Err(NodeError::CapacityTooSmall {
                capacity: cfg.capacity,
                sections,
            });
        }
        let arena = Arena::new((section_len * sections as u64) as usize).map_err(|source| {
            NodeError::Map {
                capacity: cfg.capacity,
                source,
            }
        })?;
        let (listener, addr) = bind(&cfg.listen)?;
        let (secs, allocators) = start_sections(sections, section_len)?;
        let capacity = section_len * sections as u64;
        let io_threads = cfg.io_threads.max(1);
        let shared = Arc::new(Shared {
            arena,
            sections: secs,
            tenants: Tenants::new(cfg.tokens, capacity),
            sessions: Sessions::default(),
            epoch: rand::random(),
            capacity,
            max_body: cfg.max_body,
            busy_poll: cfg.busy_poll,
            max_connections: cfg.max_connections,
            max_outstanding: cfg.max_outstanding,
            tls,
            connections: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            metrics: NodeMetrics::new(io_threads),
        });
        let metrics = cfg
            .metrics
            .map(|addr| start_metrics(&shared, addr))
            .transpose()?;
        let workers = Arc::new(
            (0..io_threads)
                .map(|i| WorkerHandle::spawn(Arc::clone(&shared), i))
                .collect::<Result<Vec<_>, _>>()
                .map_err(NodeError::Thread)?,
        );
        let accept = spawn_accept(listener, &shared, &workers)?;
        tracing::info!(%addr, capacity, sections, "memory node listening");
        Ok(Server {
            shared,
            addr,
            accept: Some(accept),
            allocators,
            workers,
            metrics,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where `/metrics` is served, if it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|m| m.addr)
    }

    /// Whether connections must use TLS.
    pub fn uses_tls(&self) -> bool {
        self.shared.tls.is_some()
    }

    /// The metrics as `/metrics` serves them (OpenMetrics text).
    pub fn metrics_text(&self) -> String {
        crate::metrics::render(&self.shared)
    }

    pub fn capacity(&self) -> u64 {
        self.shared.capacity
    }

    /// Memory sections served, each with its own allocator thread.
    pub fn sections(&self) -> usize {
        self.shared.sections.len()
    }

    /// The node's counters and every tenant's, as `stats` reports them.
    pub fn counters(&self) -> Vec<(String, u64)> {
        let mut v = self.shared.node_counters();
        for t in self.shared.tenants.all() {
            for (k, val) in t.counters() {
                v.push((format!("tenant.{}.{k}", t.name), val));
            }
        }
        v
    }

    /// Blocks until the server stops accepting (it never does on its own).
    pub fn wait(mut self) {
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
    }

    /// Closes every connection (releasing what their clients held), stops the allocators and
    /// joins every thread.
    pub fn shutdown(mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Some(m) = &mut self.metrics {
            m.stop();
        }
        // Wake the accept loop.
        let _ = TcpStream::connect(self.addr);
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        for w in self.workers.iter() {
            w.wake();
        }
        if let Some(workers) = Arc::get_mut(&mut self.workers) {
            for w in workers.iter_mut() {
                w.join();
            }
        }
        for s in &self.shared.sections {
            let _ = s.requests.send(SectionRequest::Shutdown);
        }
        for a in self.allocators.drain(..) {
            let _ = a.join();
        }
    }
}

/// Binds the listening socket, and says which address it got.
fn bind(listen: &str) -> Result<(TcpListener, SocketAddr), NodeError> {
    let listener = TcpListener::bind(listen).map_err(|source| NodeError::Listen {
        addr: listen.to_string(),
        source,
    })?;
    let addr = listener.local_addr().map_err(|source| NodeError::Listen {
        addr: listen.to_string(),
        source,
    })?;
    Ok((listener, addr))
}

/// The sections of the arena, and their allocator threads.
type SectionThreads = (Vec<Arc<Section>>, Vec<JoinHandle<()>>);

/// The arena's sections, `section_len` bytes each, with an allocator thread apiece.
fn start_sections(sections: usize, section_len: u64) -> Result<SectionThreads, NodeError> {
    let mut secs = vec![];
    let mut allocators = vec![];
    for i in 0..sections {
        let (s, rx) = Section::new(i as u16, i as u64 * section_len, section_len);
        allocators.push(s.spawn_allocator(rx).map_err(NodeError::Thread)?);
        secs.push(s);
    }
    Ok((secs, allocators))
}

/// Serves `/metrics` at `addr`.
fn start_metrics(shared: &Arc<Shared>, addr: SocketAddr) -> Result<MetricsServer, NodeError> {
    let shared = Arc::clone(shared);
    MetricsServer::start(Arc::new(move || crate::metrics::render(&shared)), addr)
        .map_err(|source| NodeError::Metrics { addr, source })
}

/// The thread that accepts connections and hands them to the I/O workers.
fn spawn_accept(
    listener: TcpListener,
    shared: &Arc<Shared>,
    workers: &Arc<Vec<WorkerHandle>>,
) -> Result<JoinHandle<()>, NodeError> {
    let shared = Arc::clone(shared);
    let workers = Arc::clone(workers);
    std::thread::Builder::new()
        .name("tp-accept".into())
        .spawn(move || accept_loop(listener, shared, workers))
        .map_err(NodeError::Thread)
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>, workers: Arc<Vec<WorkerHandle>>) {
    let mut next_id: u64 = 1;
    for stream in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors, or a connection reset before accept: keep serving.
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        shared.metrics.accepted.fetch_add(1, Ordering::Relaxed);
        if shared.connections.load(Ordering::Relaxed) >= shared.max_connections {
            shared.metrics.refused_busy.fetch_add(1, Ordering::Relaxed);
            let mut buf = bytes::BytesMut::new();
            let mut w = FrameWriter::begin(&mut buf, Op::Hello as u8 | RESPONSE_BIT, 0);
            w.put_u8(ErrorCode::Busy as u8);
            w.put_str16("connection limit reached; try again later");
            w.finish();
            let _ = stream.write_all(&buf);
            continue;
        }
        if stream
            .set_nodelay(true)
            .and_then(|()| stream.set_nonblocking(true))
            .is_err()
        {
            continue;
        }
        // Room for a whole batch answer (128 pages and more) in one writev, so the answer is not
        // split across wake-ups with its tail copied out of the arena in between.
        if let Err(e) = tidepool_sys::set_send_buffer(&stream, SEND_BUFFER) {
            tracing::debug!("cannot enlarge a send buffer: {e}");
        }
        let id = next_id;
        next_id += 1;
        shared.connections.fetch_add(1, Ordering::Relaxed);
        let worker = &workers[id as usize % workers.len()];
        if let Err(e) = worker.adopt(stream, id) {
            tracing::warn!("cannot hand a connection to an I/O worker: {e}");
            shared.connections.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
