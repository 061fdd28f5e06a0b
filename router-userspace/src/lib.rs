//! Switchyard's agent: configuration, health checks, Maglev tables, map writes, attach and pin,
//! local API and metrics. The `switchyard` binary (`main.rs`) is a thin CLI over this library.

pub mod agent;
pub mod announce;
pub mod api;
pub mod breaker;
pub mod cli;
pub mod config;
pub mod dataplane;
pub mod decision;
pub mod fleet;
pub mod flows;
pub mod health;
pub mod history;
pub mod hooks;
pub mod maglev;
pub mod nexthop;
pub mod probe;
pub mod publish;
pub mod record;
pub mod service;
pub mod state;
pub mod trace;
pub mod weights;
