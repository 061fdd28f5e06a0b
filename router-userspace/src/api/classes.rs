//! `GET /classes`: the client classes, their prefixes and their new flows by side
//! (`switchyard ctl classes`).

use axum::{extract::State, response::Response};
use serde::{Deserialize, Serialize};

use super::{Api, answer};
use crate::agent::command::Query;

/// The client classes of the running config and the program's counts of their new flows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassesView {
    /// Each class by id (`none`, id 0, first: clients of no class, the actions' `default`).
    pub classes: Vec<ClassView>,
    /// New flows whose class came from a live `CLIENT_ANSWERS` entry (no configured prefix):
    /// a classifier's answer, or the program's class-0 placeholder for a client it reported
    /// and that is not answered yet.
    pub answered: u64,
    /// New flows whose client had neither a configured prefix nor a live answer (the
    /// program's `CLASS_STAT_UNKNOWN`).
    pub unknown: u64,
}

/// One client class.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassView {
    /// Its name (`none` for id 0).
    pub name: String,
    /// Its id in the maps (1..=15; 0: no class).
    pub id: u32,
    /// Its configured prefixes.
    pub prefixes: usize,
    /// Its precedence (`None`: not declared).
    pub precedence: Option<u32>,
    /// New flows sent to pool A and pool B of the class's word, since the program was loaded,
    /// each with the pool's name when every group that acts per class has the same one there
    /// (else `A` or `B`).
    pub sides: [(String, u64); 2],
}

/// `GET /classes`.
pub async fn list(State(api): State<Api>) -> Response {
    answer(api.query(Query::Classes).await)
}
