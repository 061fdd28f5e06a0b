//! Test harness: network-namespace topologies, real servers and clients, the nftables
//! baseline, and the privilege guard.
//!
//! - [`bench`] — helpers for the benchmarks in `tests/benches` (docs/performance.md)
//! - [`agent`] — the real `switchyard attach` in the lb namespace, with a config directory
//! - [`bird`] — BIRD 2 in namespaces, and the fleet topology (a router with ECMP over
//!   balancers that announce over BGP)
//! - [`config_text`] — config fragments for the namespace suites
//! - [`etcd`] — a three-member etcd cluster in its own namespace, linked to the balancers, and
//!   the fleet's view of their agents (roles, decision words)
//! - [`addrs`] — the standard topology's names, addresses and ports (with its diagram)
//! - [`netns`] — named namespaces, running commands and closures inside them, and the
//!   [`netns::Topology`] guard that builds the standard topology and tears it down on drop
//! - [`xdp_pass`] — the `XDP_PASS` program the topology attaches to receiving veth ends
//! - [`servers`] — TCP echo, UDP name and HTTP health servers for backend namespaces
//! - [`tmux`] — a terminal program under tmux: its screen read, keys sent
//! - [`client`] — connect from the client namespace and count answers per backend
//! - [`nft`] — the nftables DNAT baseline load balancer
//! - [`privileged`] — skip loudly without root and BPF; fail instead under CI
//! - [`packets`] — crafted frames for the program fixtures, and independent checks of output
//! - [`lab`] — the program under `BPF_PROG_TEST_RUN` with real maps and routes
//! - [`load`] — persistent and short TCP connections under way while a test changes the system

pub mod addrs;
pub mod agent;
pub mod bench;
pub mod bird;
pub mod client;
pub mod config_text;
pub mod etcd;
pub mod lab;
pub mod load;
pub mod netns;
pub mod nft;
pub mod packets;
pub mod privileged;
pub mod servers;
mod setup;
pub mod tmux;
pub mod xdp_pass;
