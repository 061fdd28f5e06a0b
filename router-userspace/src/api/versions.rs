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
//! Applies go to the agent's event loop (one apply at a time, one path); the history is read
//! on its own thread. Errors are `400 {"error": "…"}` with every problem, and nothing changed.

use axum::{
    Json,
    extract::{Path, State},
    response::{IntoResponse, Response},
};

use super::{Api, answer, bad};
use crate::agent::command::Command;

/// `POST /apply`.
pub async fn apply(State(api): State<Api>) -> Response {
    let r = api
        .ask(|reply| Command::ApplyDirectory {
            source: "ctl apply",
            only_if_changed: false,
            reply: Some(reply),
        })
        .await;
    answer(r)
}

/// `POST /rollback/{n}`.
pub async fn rollback(State(api): State<Api>, Path(n): Path<u64>) -> Response {
    let fragments = match api.recorder.get(n).await {
        Ok(Some(v)) => v.fragments(),
        Ok(None) => {
            return bad(format!(
                "no version {n} in the history (`switchyard ctl versions` lists them)"
            ));
        }
        Err(e) => return bad(format!("history: {e}")),
    };
    let r = api
        .ask(|reply| Command::Apply {
            fragments,
            source: format!("rollback to {n}"),
            reply,
        })
        .await;
    answer(r)
}

/// `GET /versions`.
pub async fn list(State(api): State<Api>) -> Response {
    let versions = match api.recorder.list().await {
        Ok(v) => v,
        Err(e) => return bad(e),
    };
    match api.query(crate::agent::command::Query::Running).await {
        Ok(running) => {
            Json(serde_json::json!({ "running": running, "versions": versions })).into_response()
        }
        Err(r) => r,
    }
}

/// `GET /versions/{n}`.
pub async fn show(State(api): State<Api>, Path(n): Path<u64>) -> Response {
    match api.recorder.get(n).await {
        Ok(Some(v)) => Json(v).into_response(),
        Ok(None) => bad(format!("no version {n}")),
        Err(e) => bad(e),
    }
}

/// `GET /diff/{a}/{b}`.
pub async fn diff(State(api): State<Api>, Path((a, b)): Path<(u64, u64)>) -> Response {
    match api.recorder.diff(a, b).await {
        Ok(changes) => {
            Json(serde_json::json!({ "from": a, "to": b, "changes": changes })).into_response()
        }
        Err(e) => bad(e),
    }
}
