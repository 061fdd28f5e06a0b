//! The operator endpoints of the local API (`switchyard ctl …`).
//!
//! | endpoint | body / query | does |
//! |---|---|---|
//! | `GET /state` | | every variable and built-in with its value and source |
//! | `POST /state` | `{"name","value"}` | `state set` (push variables only, typed) |
//! | `POST /override` | `{"group","to","reason","ttl"?,"force"?}` | sets an override |
//! | `DELETE /override/{group}` | | clears it |
//! | `POST /backend/drain` | `{"pool","address","timeout"?}` | drains a backend |
//! | `POST /backend/undrain` | `{"pool","address"}` | ends its drain |
//! | `GET /decisions` | `?group=G` | the audit trail |
//! | `GET /explain/{group}` | | explain |
//! | `POST /what-if` | `{"group","set":["var=value",…]}` | explain on a hypothetical state |
//! | `GET /canary/{group}` | | the group's canary ramp |
//! | `POST /canary/{group}/{op}` | `{"reason"?}` | `pause`, `resume` or `abort` (a reason) |
//!
//! Changes go to the agent's event loop as commands, reads as queries. Errors are
//! `400 {"error": "…"}`; nothing changes.

use std::time::Instant;

use axum::{
    Json,
    extract::{Path, Query, State},
    response::{IntoResponse, Response},
};
use rules::engine::{Action, CanaryOp, OverrideRequest, RampStatus};
use serde::{Deserialize, Serialize};

use super::{Api, answer, bad};
use crate::agent::command::{self, Command, DrainOp};

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
pub async fn get_state(State(api): State<Api>) -> Response {
    match api.query(command::Query::State).await {
        Ok(entries) => Json(entries).into_response(),
        Err(r) => r,
    }
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
pub async fn set_state(State(api): State<Api>, Json(req): Json<SetState>) -> Response {
    let event = Instant::now();
    let r = api
        .ask(|reply| Command::SetState {
            name: req.name,
            value: req.value,
            event,
            reply,
        })
        .await;
    answer(r.map(|r| r.map(|changed| serde_json::json!({ "changed": changed }))))
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
///
/// # Errors
///
/// What is wrong with `text`, in words: neither `pool=` nor `split=` in front, a share of a
/// split without its `:` or its pool, or a weight that is not a `u32` of at least 1.
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
                if w == 0 {
                    return Err("a weight is at least 1, as in the config (leave a pool out to give it none)");
                }
                if p.trim().is_empty() {
                    return Err("a share names its pool: POOL:WEIGHT");
                }
                Ok((p.trim().to_owned(), w))
            })
            .collect::<Result<Vec<_>, &str>>()?;
        return Ok(Action::Split(shares));
    }
    Err(format!("{text:?}: expected pool=NAME or split=A:W,B:W"))
}

async fn override_op(api: &Api, group: String, request: Option<OverrideRequest>) -> Response {
    let event = Instant::now();
    let r = api
        .ask(|reply| Command::Override {
            group,
            request,
            event,
            reply,
        })
        .await;
    answer(r.map(|r| r.map(|p| serde_json::json!({ "switched": p }))))
}

/// `POST /override`.
pub async fn set_override(State(api): State<Api>, Json(req): Json<SetOverride>) -> Response {
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
    override_op(&api, req.group, Some(request)).await
}

/// `DELETE /override/{group}`.
pub async fn clear_override(State(api): State<Api>, Path(group): Path<String>) -> Response {
    override_op(&api, group, None).await
}

/// `GET /canary/{group}`: a group's canary ramp.
#[derive(Debug, Serialize)]
pub struct CanaryView {
    /// The group.
    pub group: String,
    /// The ramp (`state`, `step`, `share`, `next_step_at_us`, …).
    #[serde(flatten)]
    pub ramp: RampStatus,
    /// Seconds until the next step, while ramping.
    pub next_step_in_s: Option<f64>,
    /// What the group publishes (`split=stable:95,canary:5`).
    pub published: Option<String>,
}

/// `GET /canary/{group}`.
pub async fn canary_status(State(api): State<Api>, Path(group): Path<String>) -> Response {
    let r = api
        .query(|reply| command::Query::Canary(group, reply))
        .await;
    answer(r)
}

/// `POST /canary/{group}/{op}` body.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct CanaryRequest {
    /// Why (required for `abort`).
    #[serde(default)]
    pub reason: Option<String>,
}

/// `POST /canary/{group}/{op}`: `pause`, `resume` or `abort`.
pub async fn canary_op(
    State(api): State<Api>,
    Path((group, op)): Path<(String, String)>,
    Json(req): Json<CanaryRequest>,
) -> Response {
    let op = match (op.as_str(), req.reason) {
        ("pause", _) => CanaryOp::Pause,
        ("resume", _) => CanaryOp::Resume,
        ("abort", reason) => CanaryOp::Abort(reason.unwrap_or_default()),
        (other, _) => return bad(format!("{other:?}: expected pause, resume or abort")),
    };
    let event = Instant::now();
    let r = api
        .ask(|reply| Command::Canary {
            group,
            op,
            event,
            reply,
        })
        .await;
    answer(r.map(|r| {
        r.map(|(ramp, switched)| serde_json::json!({ "ramp": ramp, "switched": switched }))
    }))
}

/// `POST /backend/drain` and `POST /backend/undrain` body.
#[derive(Debug, Serialize, Deserialize)]
pub struct DrainRequest {
    /// The pool.
    pub pool: String,
    /// The backend's address.
    pub address: String,
    /// Drain only: after this long (`5m`), its remaining tracked flows are re-selected too.
    #[serde(default)]
    pub timeout: Option<String>,
}

async fn drain_op(api: &Api, req: DrainRequest, drain: bool) -> Response {
    let Ok(address) = req.address.parse() else {
        return bad(format!("{:?} is not an IP address", req.address));
    };
    let op = match (&req.timeout, drain) {
        (None, true) => DrainOp::Drain(None),
        (None, false) => DrainOp::Undrain,
        (Some(t), true) => match humantime::parse_duration(t) {
            Ok(d) => DrainOp::Drain(Some(d)),
            Err(e) => return bad(format!("timeout {t:?}: {e}")),
        },
        (Some(_), false) => return bad("undrain takes no timeout"),
    };
    let r = api
        .ask(|reply| Command::Drain {
            pool: req.pool,
            address,
            op,
            reply,
        })
        .await;
    answer(r.map(|r| r.map(|changed| serde_json::json!({ "changed": changed }))))
}

/// `POST /backend/drain`.
pub async fn drain(State(api): State<Api>, Json(req): Json<DrainRequest>) -> Response {
    drain_op(&api, req, true).await
}

/// `POST /backend/undrain`.
pub async fn undrain(State(api): State<Api>, Json(req): Json<DrainRequest>) -> Response {
    drain_op(&api, req, false).await
}

/// `GET /decisions` query.
#[derive(Debug, Deserialize)]
pub struct DecisionsQuery {
    /// Only this group.
    pub group: Option<String>,
}

/// `GET /decisions`.
pub async fn decisions_log(State(api): State<Api>, Query(q): Query<DecisionsQuery>) -> Response {
    match api
        .query(|reply| command::Query::Decisions(q.group, reply))
        .await
    {
        Ok(records) => Json(records).into_response(),
        Err(r) => r,
    }
}

/// `GET /explain/{group}`.
pub async fn explain(State(api): State<Api>, Path(group): Path<String>) -> Response {
    let r = api
        .query(|reply| command::Query::Explain {
            group,
            sets: Vec::new(),
            reply,
        })
        .await;
    answer(r)
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
pub async fn what_if(State(api): State<Api>, Json(req): Json<WhatIf>) -> Response {
    let mut sets = Vec::new();
    for x in &req.set {
        match x.split_once('=') {
            Some((k, v)) => sets.push((k.trim().to_owned(), v.trim().to_owned())),
            None => return bad(format!("{x:?}: expected var=value")),
        }
    }
    let r = api
        .query(|reply| command::Query::Explain {
            group: req.group,
            sets,
            reply,
        })
        .await;
    answer(r)
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
        assert!(parse_action("split=dc1:0,dc2:100").is_err());
        assert!(parse_action("split=:5,dc2:100").is_err());
    }
}
