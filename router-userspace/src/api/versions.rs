//! The config lifecycle endpoints of the local API (`switchyard ctl apply|versions|diff|rollback`).
//!
//! | endpoint | does |
//! |---|---|
//! | `POST /apply` | applies the config directory now (the same path as the watch) |
//! | `GET /versions` | every recorded version: number, time, hash, source, generation, files |
//! | `GET /versions/{n}` | version `n` with its fragments' text |
//! | `GET /diff/{a}/{b}` | the resource-level diff from version `a` to version `b` |
//! | `POST /rollback/{n}` | applies version `n` as a new version (the files are left alone) |
//!
//! Applies go to the agent's event loop (one apply at a time, one path); errors are
//! `400 {"error": "…"}` with every problem, and nothing changed.

use std::sync::{Arc, Mutex};

use axum::{
    Json,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};

use crate::{
    agent::{
        Shared,
        apply::{Request, What},
    },
    config::{self, Diff},
};

type SharedState = Arc<Mutex<Shared>>;

fn bad(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({ "error": e.to_string() })),
    )
        .into_response()
}

async fn ask(shared: &SharedState, what: What) -> Response {
    let Ok(tx) = shared.lock().map(|s| s.apply_tx.clone()) else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    if tx.send(Request { what, reply }).await.is_err() {
        return bad("the agent is shutting down");
    }
    match answer.await {
        Ok(Ok(outcome)) => Json(outcome).into_response(),
        Ok(Err(e)) => bad(e),
        Err(_) => bad("the agent dropped the request"),
    }
}

/// `POST /apply`.
pub async fn apply(State(shared): State<SharedState>) -> Response {
    ask(&shared, What::Directory).await
}

/// `POST /rollback/{n}`.
pub async fn rollback(State(shared): State<SharedState>, Path(n): Path<u64>) -> Response {
    ask(&shared, What::Rollback(n)).await
}

/// `GET /versions`.
pub async fn list(State(shared): State<SharedState>) -> Response {
    let Ok(s) = shared.lock() else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    match s.history.list() {
        Ok(v) => {
            Json(serde_json::json!({ "running": s.running.version, "versions": v })).into_response()
        }
        Err(e) => bad(e),
    }
}

/// `GET /versions/{n}`.
pub async fn show(State(shared): State<SharedState>, Path(n): Path<u64>) -> Response {
    let Ok(s) = shared.lock() else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    match s.history.get(n) {
        Ok(Some(v)) => Json(v).into_response(),
        Ok(None) => bad(format!("no version {n}")),
        Err(e) => bad(e),
    }
}

/// `GET /diff/{a}/{b}`.
pub async fn diff(State(shared): State<SharedState>, Path((a, b)): Path<(u64, u64)>) -> Response {
    let Ok(s) = shared.lock() else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let config_of = |n: u64| -> Result<config::Config, String> {
        let v = s
            .history
            .get(n)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no version {n}"))?;
        v.fragments()
            .load()
            .map_err(|e| format!("version {n}: {e}"))
    };
    match config_of(a).and_then(|x| config_of(b).map(|y| (x, y))) {
        Ok((x, y)) => {
            let changes: Vec<String> = Diff::between(&x, &y)
                .changes
                .iter()
                .map(ToString::to_string)
                .collect();
            Json(serde_json::json!({ "from": a, "to": b, "changes": changes })).into_response()
        }
        Err(e) => bad(e),
    }
}
