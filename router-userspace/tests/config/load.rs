//! What converts: a minimal config with every default applied, health-check defaults, every
//! supported setting, nulls as absent, empty fragments, a byte order mark, the documented
//! example.

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use switchyard::config::{
    Adaptive, Agent, AgentCheck, Backend, Backoff, CheckKind, Config, Conntrack, FlowPolicy,
    Forward, HashMode, HealthCheck, MAX_HOST_PORTS, Pool, Protocol, Service, SplitShare, Target,
    Vip, WhenAllDown, load_files,
};

use crate::{MINIMAL, ip, load};

#[test]
fn minimal_config_loads_with_every_default_applied() {
    let config = load(&[("10-web.yaml", MINIMAL)]);
    assert_eq!(
        config,
        Config {
            agent: Agent {
                api: SocketAddr::from(([127, 0, 0, 1], 9900)),
                api_token_file: None,
                api_open_read: false,
                pin_path: PathBuf::from("/sys/fs/bpf/switchyard"),
                state_dir: PathBuf::from("/var/lib/switchyard"),
            },
            fleet: None,
            conntrack: Conntrack {
                tcp_syn: Duration::from_mins(1),
                tcp_established: Duration::from_mins(15),
                tcp_closing: Duration::from_secs(10),
                udp: Duration::from_mins(1),
                second_chance: Duration::ZERO,
            },
            announce: None,
            hooks: Vec::new(),
            vips: vec![],
            services: vec![Service {
                name: "web".into(),
                vip: ip("198.18.0.10"),
                port: 80,
                protocol: Protocol::Tcp,
                forward: Forward::DsrL2,
                hash: HashMode::FiveTuple,
                to: Target::Pool("dc1".into()),
            }],
            pools: vec![Pool {
                name: "dc1".into(),
                backends: vec![Backend {
                    address: ip("198.18.1.11"),
                    weight: 100,
                }],
                health_check: None,
                when_all_down: WhenAllDown::Drop,
                slow_start: None,
                breaker: None,
                adaptive: None,
                on_backend_down: FlowPolicy::Keep,
            }],
            state: vec![],
            decisions: vec![],
            classes: Vec::new(),
            rules: std::sync::Arc::default(),
        }
    );
}

#[test]
fn health_check_defaults_are_applied() {
    let text = "\
pools:
  - name: a
    backends: [ { address: 198.18.1.11 } ]
    health_check: { tcp: { port: 80 } }
  - name: b
    backends: [ { address: 198.18.1.12 } ]
    health_check: { http: { port: 8080 }, interval: 500ms }
";
    let config = load(&[("p.yaml", text)]);
    let a = config.pools[0].health_check.clone().unwrap();
    assert_eq!(
        a,
        HealthCheck {
            kind: CheckKind::Tcp { port: 80 },
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            unhealthy_threshold: 3,
            healthy_threshold: 2,
            backoff: Backoff {
                factor: 1.0,
                max: Duration::from_secs(1),
            },
        }
    );
    let b = config.pools[1].health_check.clone().unwrap();
    assert_eq!(
        b.kind,
        CheckKind::Http {
            port: 8080,
            path: "/".into(),
            expect: vec![200],
        }
    );
    // The default timeout never exceeds a shorter interval; backoff max defaults to it.
    assert_eq!(b.timeout, Duration::from_millis(500));
    assert_eq!(b.backoff.max, Duration::from_millis(500));
}

#[test]
fn everything_that_is_supported_converts() {
    let text = "\
agent:
  api: '[::1]:9901'
  pin_path: /sys/fs/bpf/sy
services:
  - name: web6
    vip: 2001:db8::10
    port: 443
    protocol: udp
    forward: nat
    hash: source_ip
    to:
      split:
        - { pool: a, weight: 90 }
        - { pool: b, weight: 10 }
pools:
  - name: a
    backends: [ { address: '2001:db8::11', weight: 0 } ]
    when_all_down: pass
    slow_start: 30s
    health_check:
      http: { port: 80, path: /health, expect: [200, 204] }
      interval: 2s
      timeout: 300ms
      unhealthy_threshold: 5
      healthy_threshold: 1
      backoff: { factor: 2, max: 10m }
  - name: b
    backends: [ { address: '2001:db8::12', weight: 65535 } ]
";
    let config = load(&[("all.yaml", text)]);
    assert_eq!(config.agent.api, "[::1]:9901".parse().unwrap());
    assert_eq!(config.agent.pin_path, PathBuf::from("/sys/fs/bpf/sy"));
    let s = &config.services[0];
    assert_eq!(
        (s.protocol, s.forward, s.hash),
        (Protocol::Udp, Forward::Nat, HashMode::SourceIp)
    );
    assert_eq!(
        s.to,
        Target::Split(vec![
            SplitShare {
                pool: "a".into(),
                weight: 90
            },
            SplitShare {
                pool: "b".into(),
                weight: 10
            },
        ])
    );
    let a = &config.pools[0];
    assert_eq!(a.when_all_down, WhenAllDown::Pass);
    assert_eq!(a.slow_start, Some(std::time::Duration::from_secs(30)));
    assert_eq!(config.pools[1].slow_start, None);
    assert_eq!(a.backends[0].weight, 0);
    assert_eq!(config.pools[1].backends[0].weight, 65_535);
    let hc = a.health_check.clone().unwrap();
    assert_eq!(
        hc,
        HealthCheck {
            kind: CheckKind::Http {
                port: 80,
                path: "/health".into(),
                expect: vec![200, 204],
            },
            interval: Duration::from_secs(2),
            timeout: Duration::from_millis(300),
            unhealthy_threshold: 5,
            healthy_threshold: 1,
            backoff: Backoff {
                factor: 2.0,
                max: Duration::from_mins(10),
            },
        }
    );
}

#[test]
fn conntrack_timeouts_convert_and_default_one_by_one() {
    let text = format!(
        "{MINIMAL}conntrack:\n  tcp_syn: 5s\n  tcp_established: 2h\n  tcp_closing: 2s\n  udp: 7d\n  \
         second_chance: 30s\n"
    );
    let config = load(&[("10-web.yaml", &text)]);
    assert_eq!(
        config.conntrack,
        Conntrack {
            tcp_syn: Duration::from_secs(5),
            tcp_established: Duration::from_hours(2),
            tcp_closing: Duration::from_secs(2),
            udp: Duration::from_hours(7 * 24),
            second_chance: Duration::from_secs(30),
        }
    );
    // In ticks of the program's clock (2^20 ns, rounded up), in FLOW_* order.
    assert_eq!(
        config.conntrack.ticks(),
        [
            router_common::ticks(Duration::from_secs(5)),
            router_common::ticks(Duration::from_hours(2)),
            router_common::ticks(Duration::from_secs(2)),
            router_common::ticks(Duration::from_hours(7 * 24)),
        ]
    );
    // A key left out keeps its default; in a file of its own, like `agent`.
    let config = load(&[
        ("00-conntrack.yaml", "conntrack: { udp: 30s }\n"),
        ("10-web.yaml", MINIMAL),
    ]);
    assert_eq!(
        config.conntrack,
        Conntrack {
            udp: Duration::from_secs(30),
            ..Conntrack::default()
        }
    );
    assert_eq!(
        Conntrack::default().ticks(),
        router_common::DEFAULT_TIMEOUT_TICKS
    );
}

#[test]
fn vips_convert_in_file_order_with_their_defaults() {
    let web6 = "services:\n  - { name: web6, vip: \"2001:db8::10\", port: 443, protocol: tcp, \
                forward: nat, to: { pool: dc6 } }\n  - { name: dns, vip: 198.18.0.10, port: 53, \
                protocol: udp, forward: dsr-l2, to: { pool: dc1 } }\npools:\n  - { name: dc6, \
                backends: [ { address: \"2001:db8:1::11\" } ] }\n";
    let text = format!(
        "{MINIMAL}vips:\n  - address: 198.18.0.10\n    echo: false\n    \
         host_ports: [tcp/22, udp/161, tcp/53, udp/80]\n    new_flows_per_second: 5000\n"
    );
    // Entries of several files, in file order; a key left out keeps its default.
    let config = load(&[
        ("10-web.yaml", &text),
        (
            "20-web6.yaml",
            &format!("{web6}vips:\n  - {{ address: \"2001:DB8::0010\", host_ports: ~ }}\n"),
        ),
    ]);
    assert_eq!(
        config.vips,
        [
            Vip {
                address: ip("198.18.0.10"),
                echo: false,
                // The other protocol of a service's port is not the service's.
                host_ports: vec![
                    (Protocol::Tcp, 22),
                    (Protocol::Udp, 161),
                    (Protocol::Tcp, 53),
                    (Protocol::Udp, 80),
                ],
                new_flows_per_second: Some(5000),
            },
            Vip {
                address: ip("2001:db8::10"),
                echo: true,
                host_ports: vec![],
                new_flows_per_second: None,
            },
        ]
    );
    // As many host ports as the data plane has, an empty list, no `vips:` at all.
    let ports: Vec<String> = (1..=MAX_HOST_PORTS)
        .map(|p| format!("tcp/{}", p + 1000))
        .collect();
    let full = format!(
        "{MINIMAL}vips:\n  - {{ address: 198.18.0.10, host_ports: [{}] }}\n",
        ports.join(", ")
    );
    assert_eq!(
        load(&[("x.yaml", &full)]).vips[0].host_ports.len(),
        MAX_HOST_PORTS
    );
    let empty = format!("{MINIMAL}vips: []\n");
    assert!(load(&[("x.yaml", &empty)]).vips.is_empty());
    assert!(load(&[("x.yaml", MINIMAL)]).vips.is_empty());
}

#[test]
fn null_values_read_as_absent() {
    let text = MINIMAL.replace(
        "    to: { pool: dc1 }",
        "    hash: ~\n    to: { pool: dc1 }",
    );
    let config = load(&[("x.yaml", &text)]);
    assert_eq!(config.services[0].hash, HashMode::FiveTuple);
}

#[test]
fn empty_fragments_are_fine() {
    let config = load(&[("a.yaml", ""), ("b.yaml", "# nothing yet\n")]);
    assert_eq!(config.agent, Agent::default());
    assert!(config.services.is_empty() && config.pools.is_empty());
}

#[test]
fn a_byte_order_mark_at_the_start_of_a_file_is_allowed() {
    let config = load(&[("10-web.yaml", &format!("\u{feff}{MINIMAL}"))]);
    assert_eq!(config.services.len(), 1);
}

#[test]
fn documented_example_loads() {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let doc = fs::read_to_string(doc).unwrap();
    let example = doc.split("## Example").nth(1).unwrap();
    let blocks: Vec<(String, String)> = example
        .split("```yaml\n")
        .skip(1)
        .enumerate()
        .map(|(i, b)| {
            (
                format!("{i}.yaml"),
                b.split("```").next().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(blocks.len(), 2);
    let config = load_files(&blocks).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.services.len(), 2);
    assert_eq!(config.pools.len(), 3);
}

#[test]
fn adaptive_weights_convert_with_their_defaults() {
    let text = "\
pools:
  - name: a
    backends: [ { address: 198.18.1.11 } ]
    health_check: { tcp: { port: 80 }, interval: 1s }
    weights:
      adaptive: { alpha: 0.6, beta: 0.2, gamma: 0.2 }
  - name: b
    backends: [ { address: 198.18.1.12 } ]
    health_check: { tcp: { port: 80 }, interval: 1s }
    weights:
      adaptive:
        alpha: 0.5
        beta: 0.2
        gamma: 0.2
        delta: 0.1
        interval: 1s
        smoothing: 0
        max_decrease_per_second: 0.5
        window: 10s
        tolerance: 0
        agent_check: { port: 8500, interval: 500ms }
";
    let config = load(&[("p.yaml", text)]);
    assert_eq!(
        config.pools[0].adaptive,
        Some(Adaptive {
            alpha: 0.6,
            beta: 0.2,
            gamma: 0.2,
            delta: 0.0,
            interval: Duration::from_secs(15),
            smoothing: 0.3,
            max_decrease_per_second: 0.05,
            window: Duration::from_mins(5),
            tolerance: 0.05,
            agent_check: None,
        })
    );
    assert_eq!(
        config.pools[1].adaptive,
        Some(Adaptive {
            alpha: 0.5,
            beta: 0.2,
            gamma: 0.2,
            delta: 0.1,
            interval: Duration::from_secs(1),
            smoothing: 0.0,
            max_decrease_per_second: 0.5,
            window: Duration::from_secs(10),
            tolerance: 0.0,
            agent_check: Some(AgentCheck {
                port: 8500,
                interval: Duration::from_millis(500),
                timeout: Duration::from_millis(500),
            }),
        })
    );
}

#[test]
fn flow_policies_default_to_keep_and_read_each_word() {
    let text = "\
services:
  - { name: web, vip: 198.18.0.10, port: 80, protocol: tcp, forward: dsr-l2, to: { decide: wf } }
pools:
  - { name: a, backends: [ { address: 198.18.1.11 } ] }
  - { name: b, backends: [ { address: 198.18.1.12 } ], on_backend_down: reset }
  - { name: c, backends: [ { address: 198.18.1.13 } ], on_backend_down: migrate }
  - { name: d, backends: [ { address: 198.18.1.14 } ], on_backend_down: keep }
decisions:
  - name: wf
    rules: [ { id: r, when: \"true\", then: { pool: a } } ]
    on_failback: reset
  - name: plain
    rules: [ { id: r, when: \"true\", then: { pool: b } } ]
";
    let config = load(&[("p.yaml", text)]);
    let policies: Vec<FlowPolicy> = config.pools.iter().map(|p| p.on_backend_down).collect();
    assert_eq!(
        policies,
        [
            FlowPolicy::Keep,
            FlowPolicy::Reset,
            FlowPolicy::Migrate,
            FlowPolicy::Keep
        ]
    );
    assert_eq!(config.decisions[0].on_failback, FlowPolicy::Reset);
    assert_eq!(config.decisions[1].on_failback, FlowPolicy::Keep);
}

#[test]
fn hooks_convert_in_file_order_with_their_defaults() {
    use switchyard::config::{Hook, HookEvent, HookTarget};
    let text = "\
hooks:
  - { name: page, command: [/usr/local/bin/page-oncall, --team, lb] }
  - name: audit
    url: http://127.0.0.1:8099/switchyard
    events: [config_rejected, switch]
    timeout: 250ms
";
    let config = load(&[("hooks.yaml", text)]);
    assert_eq!(
        config.hooks,
        [
            Hook {
                name: "page".into(),
                target: HookTarget::Command(vec![
                    "/usr/local/bin/page-oncall".into(),
                    "--team".into(),
                    "lb".into()
                ]),
                events: HookEvent::ALL.to_vec(),
                timeout: Duration::from_secs(5),
            },
            Hook {
                name: "audit".into(),
                target: HookTarget::Url("http://127.0.0.1:8099/switchyard".into()),
                // In the order of the kinds, whatever the order written.
                events: vec![HookEvent::Switch, HookEvent::ConfigRejected],
                timeout: Duration::from_millis(250),
            },
        ]
    );
    assert!(load(&[("x.yaml", MINIMAL)]).hooks.is_empty());
}

#[test]
fn a_canary_ramp_converts_its_steps_to_basis_points() {
    let text = "\
services:
  - { name: web, vip: 198.18.0.10, port: 80, protocol: tcp, forward: dsr-l2, to: { decide: web } }
pools:
  - { name: stable, backends: [ { address: 198.18.1.11 } ] }
  - { name: canary, backends: [ { address: 198.18.2.11 } ] }
decisions:
  - name: web
    rules: [ { id: stable, when: \"true\", then: { pool: stable } } ]
    canary:
      pool: canary
      steps: [0.5%, 5%, 25.25%, 100%]
      hold: 10m
      rollback_when: \"pool.canary.healthy_ratio < 0.9\"
";
    let config = load(&[("canary.yaml", text)]);
    let canary = config.decisions[0].canary.clone().expect("a canary ramp");
    assert_eq!(canary.pool, "canary");
    assert_eq!(canary.steps, [50, 500, 2_525, 10_000]);
    assert_eq!(canary.hold, Duration::from_mins(10));
    assert_eq!(
        canary.rollback_when.as_deref(),
        Some("pool.canary.healthy_ratio < 0.9")
    );
    let engine = config.rules.groups[0]
        .config
        .canary
        .clone()
        .expect("compiled");
    assert_eq!(engine.steps, canary.steps);
    assert!(config.rules.groups[0].rollback.is_some());
}
