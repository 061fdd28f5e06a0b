//! The whole system in network namespaces: the real `switchyard attach` in the lb namespace,
//! real TCP/UDP servers in the backend namespaces, real clients in the client namespace —
//! balancing, health checks (a backend's first check included), an operator's drain, slow start, adaptive weights,
//! state-driven failover, hitless operation under load, hosts configured as an operator
//! configures real ones, and `switchyard top` under a real terminal.

mod adaptive_weights;
mod announce_interface;
mod backend_down;
mod balance;
mod breaker;
mod canary;
mod classes;
mod drain;
mod failover;
mod first_check;
mod fleet;
mod fleet_bgp;
mod fleet_etcd;
mod fleet_full;
mod flow_state;
mod flows;
mod health;
mod hitless;
mod hooks;
mod probes;
mod real_hosts;
mod remote_api;
mod service;
mod slow_start;
mod tables;
mod top;
mod vip;
