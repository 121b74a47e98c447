//! The operator's surface over HTTP: the dashboard (`/`), the state as JSON (`/api/state`),
//! its history (`/api/history`), Prometheus metrics (`/metrics`), and changes: weights
//! (`POST /api/apps/{id}/weight` with `{"weight": 2.0}`) and the limit (`POST /api/max` with
//! `{"bytes": N}`), each with `Authorization: Bearer TOKEN` (the token file beside the socket).
//!
//! Application names come from the applications, so the page treats them as text only, and
//! every response carries a Content-Security-Policy that allows no script but the page's own
//! files: a name that slipped into HTML still could not run.

use crate::registry::Shared;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

/// Binds `addr` and serves on a thread of its own; the bound address.
pub(crate) fn serve(shared: Arc<Shared>, addr: SocketAddr) -> io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("tp-coord-http".into())
        .spawn(move || {
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => return tracing::error!("coordinator: HTTP: {e}"),
                };
                if let Err(e) = axum::serve(listener, router(shared)).await {
                    tracing::error!("coordinator: HTTP server stopped: {e}");
                }
            })
        })?;
    Ok(bound)
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/vendor/dygraph.min.js", get(dygraph_js))
        .route("/vendor/dygraph.min.css", get(dygraph_css))
        .route("/api/state", get(state))
        .route("/api/history", get(history))
        .route("/api/apps/{id}/weight", post(weight))
        .route("/api/max", post(max))
        .route("/metrics", get(metrics))
        .route("/app.js", get(app_js))
        .route("/app.css", get(app_css))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(shared)
}

/// Scripts and styles from this server only, no inline script, no plugins, no framing, data
/// fetched from this server only. (Inline styles stay allowed: the chart library sets them.)
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                   img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

async fn security_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    res
}

async fn app_js() -> Response {
    static_file(
        "text/javascript; charset=utf-8",
        include_str!("../web/app.js"),
    )
}

async fn app_css() -> Response {
    static_file("text/css; charset=utf-8", include_str!("../web/app.css"))
}

async fn dashboard() -> Html<&'static str> {
    Html(include_str!("../web/index.html"))
}

/// One of the page's own files, with its type.
fn static_file(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn dygraph_js() -> Response {
    static_file(
        "text/javascript; charset=utf-8",
        include_str!("../web/vendor/dygraph.min.js"),
    )
}

async fn dygraph_css() -> Response {
    static_file(
        "text/css; charset=utf-8",
        include_str!("../web/vendor/dygraph.min.css"),
    )
}

async fn state(State(s): State<Arc<Shared>>) -> Json<crate::Snapshot> {
    Json(s.snapshot())
}

async fn history(State(s): State<Arc<Shared>>) -> Json<Vec<crate::Sample>> {
    Json(s.state.lock().history.iter().cloned().collect())
}

/// Changes need the token: the answer to send instead when it is missing or wrong.
fn refusal(s: &crate::Shared, headers: &HeaderMap) -> Option<Response> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if crate::access::bearer_matches(given, &s.token) {
        return None;
    }
    tracing::warn!("coordinator: refused a change over HTTP without the right token");
    Some(
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "changes need the coordinator's token: send \"Authorization: Bearer TOKEN\" with the \
         token from its token file (`tidepool coord` prints where it is)\n",
        )
            .into_response(),
    )
}

#[derive(serde::Deserialize)]
struct WeightBody {
    weight: f64,
}

async fn weight(
    State(s): State<Arc<Shared>>,
    Path(id): Path<u32>,
    headers: HeaderMap,
    Json(body): Json<WeightBody>,
) -> Response {
    if let Some(r) = refusal(&s, &headers) {
        return r;
    }
    if !(body.weight.is_finite() && body.weight > 0.0) {
        return (
            StatusCode::BAD_REQUEST,
            "weight must be a positive number\n",
        )
            .into_response();
    }
    if s.set_weight(id, body.weight) {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::NOT_FOUND, format!("no application {id}\n")).into_response()
    }
}

#[derive(serde::Deserialize)]
struct MaxBody {
    bytes: u64,
}

/// The operator resizes the memory soft memory may take in all.
async fn max(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<MaxBody>,
) -> Response {
    if let Some(r) = refusal(&s, &headers) {
        return r;
    }
    s.state.lock().max = body.bytes;
    tracing::info!(bytes = body.bytes, "soft memory limited");
    (StatusCode::OK, "ok\n").into_response()
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::render(&s.snapshot(), &s.latencies),
    )
        .into_response()
}
