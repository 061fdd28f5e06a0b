//! The backends' servers: the health endpoint answers 200, then 503, then refuses when killed.

use std::net::SocketAddr;

use router_tests::addrs::{HEALTH_PORT, TCP_ECHO_PORT, backend_return_v4, backend_return_v6};
use router_tests::client::{self, Tally};
use router_tests::privileged::require_root_and_bpf;
use router_tests::servers::BackendServers;

use super::{addr, topology};

#[test]
fn health_endpoint_answers_200_then_503_then_refuses_when_killed() {
    if require_root_and_bpf("health_endpoint_answers_200_then_503_then_refuses_when_killed")
        .is_err()
    {
        return;
    }
    let topo = topology(1);
    let mut b1 = BackendServers::start_standard(&topo, 1).unwrap();
    let v4 = addr(backend_return_v4(1), HEALTH_PORT);
    let v6 = addr(backend_return_v6(1), HEALTH_PORT);
    let status = |a: SocketAddr, path: &'static str| {
        topo.client()
            .run(move || client::http_status(a, path))
            .unwrap()
    };
    assert_eq!(status(v4, "/health").unwrap(), 200);
    assert_eq!(status(v6, "/health").unwrap(), 200);
    assert_eq!(status(v4, "/other").unwrap(), 404);
    b1.set_healthy(false);
    assert_eq!(status(v4, "/health").unwrap(), 503);
    b1.set_healthy(true);
    assert_eq!(status(v6, "/health").unwrap(), 200);
    b1.kill_health();
    let err = status(v4, "/health").unwrap_err();
    let refused = err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
    });
    assert!(refused, "expected connection refused, got {err:#}");
    // The echo server still runs.
    let tally =
        client::tcp_tally(topo.client(), addr(backend_return_v4(1), TCP_ECHO_PORT), 1).unwrap();
    assert_eq!(tally, Tally::from([("b1".to_owned(), 1)]));
}
