//! `GET /weights/{pool}`: a pool's adaptive weights, backend by backend (`switchyard ctl
//! weights POOL`).

use std::net::IpAddr;

use axum::{
    extract::{Path, State},
    response::Response,
};

use super::{Api, answer};
use crate::{agent::command::Query, weights::AgentState};

/// One pool's adaptive weights.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PoolWeightsView {
    /// The pool.
    pub pool: String,
    /// Seconds between computations.
    pub interval_s: f64,
    /// Seconds since the last computation (or since the pool took adaptive weights).
    pub computed_s_ago: f64,
    /// Its backends, in configuration order.
    pub backends: Vec<BackendWeightsView>,
}

/// One backend's adaptive weight and what it was computed from.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BackendWeightsView {
    /// Address.
    pub address: IpAddr,
    /// The configured weight.
    pub base: u32,
    /// Passed / all probes within the window (1 without probes).
    pub pass_rate: f64,
    /// p99 of the passed probes' round-trip times within the window, ms.
    pub rtt_p99_ms: Option<f64>,
    /// The pool's fastest p99 over this one's.
    pub latency_score: f64,
    /// The agent's last answer, if any was read.
    pub agent_answer: Option<String>,
    /// Why the last agent-check failed, until one succeeds.
    pub agent_error: Option<String>,
    /// The agent's `NN%` as a share (`None`: none said yet, counted as 1).
    pub agent_score: Option<f64>,
    /// `ready`, `drain` or `maint`, and `down`, as the agent last said.
    pub agent_state: String,
    /// `W` of the last computation.
    pub computed: f64,
    /// The weight the pool's table is to give it (adaptive weight, rounded; 0 out of it).
    pub target: u32,
    /// The weight the live table holds (`None`: not in it: down, drained, or weight 0);
    /// below `target` during a slow start.
    pub effective: Option<u32>,
    /// Seconds since `target` last changed (`None`: never).
    pub changed_s_ago: Option<f64>,
}

/// How an agent's state reads.
#[must_use]
pub fn agent_state(a: &AgentState) -> String {
    if a.down {
        format!("{}, down", a.admin)
    } else {
        a.admin.to_string()
    }
}

/// `GET /weights/{pool}`.
pub async fn get(State(api): State<Api>, Path(pool): Path<String>) -> Response {
    answer(api.query(|reply| Query::Weights(pool, reply)).await)
}
