//! `GET /metrics` for Prometheus, on a thread of its own (a one-thread tokio runtime), so that
//! a scrape never runs on an I/O worker or an allocator thread. The node serves its own; other
//! servers (`tidepool cache`) serve theirs with it, each with its own rendering.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

/// What renders the metrics, in OpenMetrics text, at each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The running metrics server; [`MetricsServer::stop`] (or dropping it) ends it.
#[derive(Debug)]
pub struct MetricsServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` and serves `render`'s text at `/metrics` there until stopped.
    pub fn start(render: Render, addr: SocketAddr) -> io::Result<MetricsServer> {
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
                        Err(e) => return tracing::error!("metrics: {e}"),
                    };
                    let app = Router::new()
                        .route("/metrics", get(metrics))
                        .with_state(render);
                    let served = axum::serve(listener, app).with_graceful_shutdown(async {
                        let _ = stopped.await;
                    });
                    if let Err(e) = served.await {
                        tracing::error!("metrics: the HTTP server stopped: {e}");
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

async fn metrics(State(render): State<Render>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        render(),
    )
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop();
    }
}
