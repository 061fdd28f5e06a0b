//! The whole system in network namespaces: the real `switchyard attach` in the lb namespace,
//! real TCP/UDP servers in backend namespaces, real clients in the client namespace.

use std::time::Duration;

use anyhow::{Result, ensure};
use router_tests::{
    addrs::{backend_v4, backend_v6, vip_v4, vip_v6},
    agent::{Agent, unique_pin_path},
    client,
    netns::Topology,
    privileged, servers,
};

fn config(weights: [u32; 3], check: &str) -> String {
    let pin = unique_pin_path();
    let b4: Vec<String> = (1..=3)
        .map(|i| {
            format!(
                "      - {{ address: {}, weight: {} }}",
                backend_v4(i),
                weights[i - 1]
            )
        })
        .collect();
    let b6: Vec<String> = (1..=3)
        .map(|i| format!("      - {{ address: {} }}", backend_v6(i)))
        .collect();
    format!(
        "agent:\n  pin_path: {pin}\nservices:\n  - {{ name: web, vip: 198.18.0.10, port: 80, protocol: tcp, forward: dsr-l2, to: {{ pool: web }} }}\n  - {{ name: web6, vip: \"2001:db8::10\", port: 80, protocol: tcp, forward: dsr-l2, to: {{ pool: web6 }} }}\n  - {{ name: dns, vip: 198.18.0.10, port: 80, protocol: udp, forward: nat, to: {{ pool: web }} }}\npools:\n  - name: web\n    backends:\n{}\n    health_check: {check}\n  - name: web6\n    backends:\n{}\n",
        b4.join("\n"),
        b6.join("\n")
    )
}

#[test]
fn smoke() -> Result<()> {
    if privileged::require_root_and_bpf("smoke").is_err() {
        return Ok(());
    }
    let topo = Topology::builder().backends(3).build()?;
    let _servers = servers::start_all(&topo)?;
    let agent = Agent::start(
        &topo,
        &[(
            "10-web.yaml",
            config(
                [100, 100, 100],
                "{ tcp: { port: 80 }, interval: 200ms, timeout: 100ms }",
            ),
        )],
    )?;
    let tally = client::tcp_tally(topo.client(), vip_v4(80), 300)?;
    println!("v4 {tally:?}");
    let tally6 = client::tcp_tally(topo.client(), vip_v6(80), 60)?;
    println!("v6 {tally6:?}");
    let u = client::udp_tally(topo.client(), vip_v4(80), 60)?;
    println!("udp {u:?}");
    println!(
        "{}",
        agent.cli(&["status", "--config-dir", &agent.dir().display().to_string()])?
    );
    ensure!(tally.len() == 3);
    let _ = Duration::ZERO;
    Ok(())
}
