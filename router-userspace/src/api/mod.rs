//! The local HTTP API on `agent.api` (loopback): `GET /status` (JSON), `GET /metrics`
//! (Prometheus text format), and the operator endpoints of [`ctl`].

pub mod ctl;
pub mod metrics;
pub mod status;
pub mod versions;

use std::sync::{Arc, Mutex};

use axum::{
    Json, Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::{delete, get, post},
};

use crate::agent::Shared;

type SharedState = Arc<Mutex<Shared>>;

/// Serves the API on `listener` until the task is aborted.
pub async fn serve(listener: tokio::net::TcpListener, shared: SharedState) {
    let registry = {
        let Ok(s) = shared.lock() else { return };
        Arc::new(crate::api::metrics::registry(&s.metrics, shared.clone()))
    };
    let app = Router::new()
        .route("/status", get(status))
        .route("/state", get(ctl::get_state).post(ctl::set_state))
        .route("/override", post(ctl::set_override))
        .route("/override/{group}", delete(ctl::clear_override))
        .route("/decisions", get(ctl::decisions_log))
        .route("/explain/{group}", get(ctl::explain))
        .route("/what-if", post(ctl::what_if))
        .route("/apply", post(versions::apply))
        .route("/rollback/{n}", post(versions::rollback))
        .route("/versions", get(versions::list))
        .route("/versions/{n}", get(versions::show))
        .route("/diff/{a}/{b}", get(versions::diff))
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move { metrics(&registry) }
            }),
        )
        .with_state(shared);
    if let Err(e) = axum::serve(listener, app).await {
        log::error!("local API stopped: {e}");
    }
}

async fn status(State(shared): State<SharedState>) -> impl IntoResponse {
    match shared.lock() {
        Ok(s) => Json(s.status()).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

fn metrics(registry: &prometheus_client::registry::Registry) -> axum::response::Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
