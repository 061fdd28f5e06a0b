//! The `dns`, `udp`, `tls` and `https` probes of pools' health checks and of state probes: what
//! converts into the model, with their defaults. (Their refused values are cases of
//! [`crate::invalid`].)

use std::net::IpAddr;

use switchyard::config::{CheckKind, TlsOptions, load_files, model::StateSource};

fn load(text: &str) -> switchyard::config::Config {
    load_files(&[("x.yaml".into(), text.into())]).unwrap_or_else(|e| panic!("{e}"))
}

fn pool_check(check: &str) -> CheckKind {
    let text = format!(
        "pools: [ {{ name: p, backends: [ {{ address: 198.18.3.11 }} ], health_check: {check} }} ]\n"
    );
    let cfg = load(&text);
    cfg.pools[0]
        .health_check
        .as_ref()
        .expect("health check")
        .kind
        .clone()
}

#[test]
fn pools_health_checks_of_dns_udp_tls_and_https_convert_with_their_defaults() {
    assert_eq!(
        pool_check("{ dns: { query: www.example.org, record: aaaa, expect: [\"2001:DB8::5\"] } }"),
        CheckKind::Dns {
            port: 53,
            query: "www.example.org".into(),
            record: "AAAA".into(),
            expect: vec!["2001:db8::5".into()],
        }
    );
    assert_eq!(
        pool_check("{ dns: { port: 5353, query: example.org } }"),
        CheckKind::Dns {
            port: 5353,
            query: "example.org".into(),
            record: "A".into(),
            expect: vec![],
        }
    );
    assert_eq!(
        pool_check("{ udp: { port: 7, send: ping, expect: pong } }"),
        CheckKind::Udp {
            port: 7,
            send: b"ping".to_vec(),
            expect: Some(b"pong".to_vec()),
        }
    );
    assert_eq!(
        pool_check("{ udp: { port: 123, send_hex: \"e3 00 04\", expect_hex: \"24\" } }"),
        CheckKind::Udp {
            port: 123,
            send: vec![0xe3, 0, 4],
            expect: Some(vec![0x24]),
        }
    );
    assert_eq!(
        pool_check("{ tls: { port: 443, sni: api.example.org } }"),
        CheckKind::Tls {
            port: 443,
            tls: TlsOptions {
                sni: Some("api.example.org".into()),
                verify: true,
                ca: None,
            },
        }
    );
    assert_eq!(
        pool_check("{ https: { verify: false, ca: /etc/switchyard/ca.pem } }"),
        CheckKind::Https {
            port: 443,
            path: "/".into(),
            expect: vec![200],
            tls: TlsOptions {
                sni: None,
                verify: false,
                ca: Some("/etc/switchyard/ca.pem".into()),
            },
        }
    );
}

#[test]
fn state_probes_of_dns_udp_tls_and_https_name_their_address() {
    let text = "\
state:
  resolver: { probe: { dns: { address: 198.18.1.53, query: example.org, expect: [198.18.0.5] } } }
  ntp: { probe: { udp: { address: \"[2001:db8::123]:123\", send_hex: e3 } } }
  edge: { probe: { tls: { address: \"198.18.1.44:8443\", sni: edge.example.org, ca: /etc/ca.pem } } }
  api: { probe: { http: \"https://198.18.1.45/health\", sni: api.example.org, expect: [200, 204] } }
";
    let cfg = load(text);
    let probe = |name: &str| {
        let var = cfg.state.iter().find(|v| v.name == name).expect(name);
        match &var.source {
            StateSource::Probe(p) => (p.address, p.check.kind.clone()),
            other => panic!("{other:?}"),
        }
    };
    let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
    let (address, kind) = probe("resolver");
    assert_eq!(address, ip("198.18.1.53"));
    assert!(matches!(kind, CheckKind::Dns { port: 53, .. }), "{kind:?}");
    let (address, kind) = probe("ntp");
    assert_eq!(address, ip("2001:db8::123"));
    assert_eq!(
        kind,
        CheckKind::Udp {
            port: 123,
            send: vec![0xe3],
            expect: None
        }
    );
    let (address, kind) = probe("edge");
    assert_eq!(address, ip("198.18.1.44"));
    assert!(
        matches!(kind, CheckKind::Tls { port: 8443, .. }),
        "{kind:?}"
    );
    let (address, kind) = probe("api");
    assert_eq!(address, ip("198.18.1.45"));
    assert_eq!(
        kind,
        CheckKind::Https {
            port: 443,
            path: "/health".into(),
            expect: vec![200, 204],
            tls: TlsOptions {
                sni: Some("api.example.org".into()),
                verify: true,
                ca: None,
            },
        }
    );
}
