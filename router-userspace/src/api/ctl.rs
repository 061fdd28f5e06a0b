//! The operator endpoints of the local API (`switchyard ctl …`), and the state metrics.
//!
//! | endpoint | body / query | does |
//! |---|---|---|
//! | `GET /state` | | every variable and built-in with its value and source |
//! | `POST /state` | `{"name","value"}` | `state set` (push variables only, typed) |
//! | `POST /override` | `{"group","to","reason","ttl"?,"force"?}` | sets an override |
//! | `DELETE /override/{group}` | | clears it |
//! | `GET /decisions` | `?group=G` | the audit trail |
//! | `GET /explain/{group}` | | explain |
//! | `POST /what-if` | `{"group","set":["var=value",…]}` | explain on a hypothetical state |
//!
//! Errors are `400 {"error": "…"}`; nothing changes.

use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use axum::{
    Json,
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use rules::engine::{Action, OverrideRequest};
use serde::{Deserialize, Serialize};

use crate::agent::{Shared, decisions};

type SharedState = Arc<Mutex<Shared>>;

fn bad(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({ "error": e.to_string() })),
    )
        .into_response()
}

fn locked(shared: &SharedState) -> Result<std::sync::MutexGuard<'_, Shared>, StatusCode> {
    shared.lock().map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)
}

/// One variable in `GET /state`.
#[derive(Debug, Serialize, Deserialize)]
pub struct StateEntry {
    /// Name.
    pub name: String,
    /// Value (`unset` when unset).
    pub value: String,
    /// `probe`, `push`, `expr`, `metric` or `built-in`.
    pub source: String,
}

/// `GET /state`.
pub async fn get_state(State(shared): State<SharedState>) -> Response {
    let s = match locked(&shared) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let entries: Vec<StateEntry> = s
        .store
        .values()
        .filter(|(n, _)| !n.starts_with("target."))
        .map(|(n, v)| StateEntry {
            name: n.to_owned(),
            value: v.to_string(),
            source: s.store.source_of(n).to_owned(),
        })
        .collect();
    Json(entries).into_response()
}

/// `POST /state` body.
#[derive(Debug, Serialize, Deserialize)]
pub struct SetState {
    /// Variable.
    pub name: String,
    /// Value as text.
    pub value: String,
}

/// `POST /state`.
pub async fn set_state(State(shared): State<SharedState>, Json(req): Json<SetState>) -> Response {
    let event = Instant::now();
    let mut s = match locked(&shared) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    match s.store.set_push(&req.name, &req.value) {
        Ok(slots) => {
            let cause = format!("state set {}={}", req.name, req.value);
            decisions::changed(&mut s, &slots, false, &cause, event);
            s.wake.notify_one();
            Json(serde_json::json!({ "changed": !slots.is_empty() })).into_response()
        }
        Err(e) => bad(e),
    }
}

/// `POST /override` body.
#[derive(Debug, Serialize, Deserialize)]
pub struct SetOverride {
    /// Group.
    pub group: String,
    /// `pool=NAME` or `split=A:W,B:W`.
    pub to: String,
    /// Why (required).
    pub reason: String,
    /// TTL (`10m`).
    pub ttl: Option<String>,
    /// Override `require`.
    #[serde(default)]
    pub force: bool,
}

/// Parses `pool=dc2` or `split=dc1:95,dc1-canary:5`.
pub fn parse_action(text: &str) -> Result<Action, String> {
    if let Some(p) = text.strip_prefix("pool=") {
        return Ok(Action::pool(p.trim()));
    }
    if let Some(list) = text.strip_prefix("split=") {
        let shares = list
            .split(',')
            .map(|x| {
                let (p, w) = x.split_once(':').ok_or("a share is POOL:WEIGHT")?;
                let w: u32 = w.trim().parse().map_err(|_| "a weight is a whole number")?;
                Ok((p.trim().to_owned(), w))
            })
            .collect::<Result<Vec<_>, &str>>()?;
        return Ok(Action::Split(shares));
    }
    Err(format!("{text:?}: expected pool=NAME or split=A:W,B:W"))
}

fn override_op(s: &mut Shared, group: &str, req: Option<OverrideRequest>, cause: &str) -> Response {
    if let Some(r) = &req {
        let known = |p: &str| s.publisher.pools().contains_key(p);
        if let Some(p) = r.action.live_pools().find(|p| !known(p)) {
            return bad(format!("unknown pool {p:?}"));
        }
    }
    let now = s.started.elapsed();
    let Shared {
        store,
        driver,
        publisher,
        maps,
        metrics,
        wake,
        ..
    } = s;
    match driver.set_override(group, req, store, publisher, maps, now, cause) {
        Ok(p) => {
            decisions::record(metrics, driver, p.as_slice());
            wake.notify_one();
            Json(serde_json::json!({ "switched": p })).into_response()
        }
        Err(e) => bad(e),
    }
}

/// `POST /override`.
pub async fn set_override(
    State(shared): State<SharedState>,
    Json(req): Json<SetOverride>,
) -> Response {
    let action = match parse_action(&req.to) {
        Ok(a) => a,
        Err(e) => return bad(e),
    };
    let mut request = OverrideRequest::new(action, req.reason.clone());
    if let Some(ttl) = &req.ttl {
        match humantime::parse_duration(ttl) {
            Ok(d) => request = request.ttl(d),
            Err(e) => return bad(format!("ttl {ttl:?}: {e}")),
        }
    }
    if req.force {
        request = request.force();
    }
    let mut s = match locked(&shared) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    override_op(&mut s, &req.group, Some(request), "override set")
}

/// `DELETE /override/{group}`.
pub async fn clear_override(
    State(shared): State<SharedState>,
    Path(group): Path<String>,
) -> Response {
    let mut s = match locked(&shared) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    override_op(&mut s, &group, None, "override clear")
}

/// `GET /decisions` query.
#[derive(Debug, Deserialize)]
pub struct DecisionsQuery {
    /// Only this group.
    pub group: Option<String>,
}

/// `GET /decisions`.
pub async fn decisions_log(
    State(shared): State<SharedState>,
    Query(q): Query<DecisionsQuery>,
) -> Response {
    let s = match locked(&shared) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let records: Vec<_> = s
        .driver
        .audit
        .iter()
        .filter(|r| q.group.as_ref().is_none_or(|g| &r.group == g))
        .cloned()
        .collect();
    Json(records).into_response()
}

/// `GET /explain/{group}`.
pub async fn explain(State(shared): State<SharedState>, Path(group): Path<String>) -> Response {
    let s = match locked(&shared) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let now = s.started.elapsed();
    match s.driver.explain(&group, s.store.state(), &s.publisher, now) {
        Ok(e) => Json(e).into_response(),
        Err(e) => bad(e),
    }
}

/// `POST /what-if` body.
#[derive(Debug, Serialize, Deserialize)]
pub struct WhatIf {
    /// Group.
    pub group: String,
    /// `var=value` each.
    pub set: Vec<String>,
}

/// `POST /what-if`.
pub async fn what_if(State(shared): State<SharedState>, Json(req): Json<WhatIf>) -> Response {
    let mut sets = Vec::new();
    for x in &req.set {
        match x.split_once('=') {
            Some((k, v)) => sets.push((k.trim().to_owned(), v.trim().to_owned())),
            None => return bad(format!("{x:?}: expected var=value")),
        }
    }
    let s = match locked(&shared) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let state = match s.store.hypothetical(&sets) {
        Ok(st) => st,
        Err(e) => return bad(e),
    };
    let now = s.started.elapsed();
    match s.driver.explain(&req.group, &state, &s.publisher, now) {
        Ok(e) => Json(e).into_response(),
        Err(e) => bad(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_parse_from_the_cli_form() {
        assert_eq!(parse_action("pool=dc2"), Ok(Action::pool("dc2")));
        assert_eq!(
            parse_action("split=dc1:95,dc1-canary:5"),
            Ok(Action::Split(vec![
                ("dc1".into(), 95),
                ("dc1-canary".into(), 5)
            ]))
        );
        assert!(parse_action("dc2").is_err());
    }
}
