//! `GET /metrics` for Prometheus, on a thread of its own (a one-thread tokio runtime), so that
//! a scrape never runs on an I/O worker or an allocator thread.

use crate::shared::Shared;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

/// The running metrics server; [`MetricsServer::stop`] ends it.
#[derive(Debug)]
pub(crate) struct MetricsServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` and serves there until stopped.
    pub fn start(shared: Arc<Shared>, addr: SocketAddr) -> io::Result<MetricsServer> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let bound = listener.local_addr()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let join = std::thread::Builder::new()
            .name("tp-metrics".into())
            .spawn(move || {
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => return tracing::error!("node metrics: {e}"),
                    };
                    let app = Router::new()
                        .route("/metrics", get(metrics))
                        .with_state(shared);
                    let served = axum::serve(listener, app).with_graceful_shutdown(async {
                        let _ = stopped.await;
                    });
                    if let Err(e) = served.await {
                        tracing::error!("node metrics: the HTTP server stopped: {e}");
                    }
                })
            })?;
        Ok(MetricsServer {
            addr: bound,
            stop: Some(stop),
            join: Some(join),
        })
    }

    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::render(&shared),
    )
}
