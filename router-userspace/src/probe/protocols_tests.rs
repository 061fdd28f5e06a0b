//! The dns, udp, tls and https probes against real servers on loopback, all started here: a UDP
//! echo server, TLS servers (rustls) with certificates made here (valid, expired, for another
//! name), and a dnsmasq with host records of its own. A missing dnsmasq skips its tests loudly,
//! and fails them under `CI=true`.

use std::{
    io::Write as _,
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, date_time_ymd};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, UdpSocket},
};

use crate::config::{Backoff, CheckKind, HealthCheck, TlsOptions};
use crate::probe::check::{Checker, ProbeOutcome};
use crate::probe::test_support::{Guard, closed_port};

const TIMEOUT: Duration = Duration::from_millis(500);
/// The name the test certificates are made for (and the wrong one).
const NAME: &str = "probe.test";
const OTHER: &str = "other.test";

fn check(kind: CheckKind) -> HealthCheck {
    HealthCheck {
        kind,
        interval: Duration::from_secs(1),
        timeout: TIMEOUT,
        unhealthy_threshold: 3,
        healthy_threshold: 2,
        backoff: Backoff {
            factor: 1.0,
            max: Duration::from_secs(1),
        },
    }
}

fn lo() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

async fn probe(kind: CheckKind) -> ProbeOutcome {
    Checker::new(Some(lo()), &check(kind)).probe().await
}

// ---- udp ----

/// Echoes every datagram, prefixed with `echo:`; or, when `silent`, reads and never answers.
async fn udp_server(silent: bool) -> (u16, Guard) {
    let socket = UdpSocket::bind((lo(), 0)).await.unwrap();
    let port = socket.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut buf = vec![0; 2048];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            if !silent {
                let mut reply = b"echo:".to_vec();
                reply.extend_from_slice(&buf[..n]);
                let _ = socket.send_to(&reply, from).await;
            }
        }
    });
    (port, Guard(task))
}

fn udp(port: u16, send: &[u8], expect: Option<&[u8]>) -> CheckKind {
    CheckKind::Udp {
        port,
        send: send.to_vec(),
        expect: expect.map(<[u8]>::to_vec),
    }
}

#[tokio::test]
async fn udp_probe_passes_when_the_reply_holds_the_expected_bytes() {
    let (port, _server) = udp_server(false).await;
    let out = probe(udp(port, b"ping", Some(b"ping"))).await;
    assert!(out.success, "{out:?}");
    assert_eq!(out.detail, "reply of 9 bytes");
    let binary = probe(udp(port, &[0, 1, 0xfe], Some(&[b':', 0, 1, 0xfe]))).await;
    assert!(binary.success, "{binary:?}");
    let any = probe(udp(port, b"x", None)).await;
    assert!(any.success, "{any:?}");
}

#[tokio::test]
async fn udp_probe_fails_when_the_reply_lacks_the_expected_bytes() {
    let (port, _server) = udp_server(false).await;
    let out = probe(udp(port, b"ping", Some(b"pong"))).await;
    assert!(!out.success);
    assert_eq!(out.detail, "reply of 9 bytes lacks the expected bytes");
}

#[tokio::test]
async fn udp_probe_without_a_reply_times_out() {
    let (port, _server) = udp_server(true).await;
    let out = probe(udp(port, b"ping", Some(b"ping"))).await;
    assert!(!out.success);
    assert_eq!(out.detail, "timeout after 500ms");
    assert!(out.latency >= TIMEOUT);
}

#[tokio::test]
async fn udp_probe_over_ipv6_gets_its_reply() {
    let v6 = IpAddr::from(std::net::Ipv6Addr::LOCALHOST);
    let socket = UdpSocket::bind((v6, 0)).await.unwrap();
    let port = socket.local_addr().unwrap().port();
    let _server = Guard(tokio::spawn(async move {
        let mut buf = vec![0; 64];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            let _ = socket.send_to(&buf[..n], from).await;
        }
    }));
    let out = Checker::new(Some(v6), &check(udp(port, b"v6", Some(b"v6"))))
        .probe()
        .await;
    assert!(out.success, "{out:?}");
}

#[tokio::test]
async fn udp_probe_to_a_closed_port_fails_as_refused() {
    // A UDP port that nothing binds: the kernel answers with ICMP port unreachable.
    let port = {
        let s = std::net::UdpSocket::bind((lo(), 0)).unwrap();
        s.local_addr().unwrap().port()
    };
    let out = probe(udp(port, b"ping", None)).await;
    assert!(!out.success);
    assert_eq!(out.detail, "connection refused");
}

// ---- tls and https ----

/// A CA (its PEM in a file) and certificates it signed.
struct Pki {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    valid: (CertificateDer<'static>, Vec<u8>),
    expired: (CertificateDer<'static>, Vec<u8>),
    wrong_name: (CertificateDer<'static>, Vec<u8>),
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "switchyard probe test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |names: &[&str], expired: bool| {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        if expired {
            params.not_before = date_time_ymd(2020, 1, 1);
            params.not_after = date_time_ymd(2021, 1, 1);
        }
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.der().clone(), key.serialize_der())
    };
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::File::create(&ca)
        .unwrap()
        .write_all(ca_cert.pem().as_bytes())
        .unwrap();
    Pki {
        valid: leaf(&[NAME, "127.0.0.1"], false),
        expired: leaf(&[NAME, "127.0.0.1"], true),
        wrong_name: leaf(&[OTHER], false),
        ca,
        _dir: dir,
    }
}

/// A TLS server with `cert`; after a handshake it answers one HTTP request with `200` and
/// keeps the request's head.
struct TlsServer {
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
    _task: Guard,
}

impl TlsServer {
    async fn start(cert: &(CertificateDer<'static>, Vec<u8>)) -> Self {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.1.clone()));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.0.clone()], key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind((lo(), 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut head = Vec::new();
                    let mut buf = [0; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    seen.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&head).into_owned());
                    let reply =
                        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                    let _ = tls.write_all(reply).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Self {
            port,
            requests,
            _task: Guard(task),
        }
    }
}

fn opts(sni: Option<&str>, verify: bool, ca: Option<&PathBuf>) -> TlsOptions {
    TlsOptions {
        sni: sni.map(str::to_owned),
        verify,
        ca: ca.cloned(),
    }
}

fn tls(port: u16, tls: TlsOptions) -> CheckKind {
    CheckKind::Tls { port, tls }
}

#[tokio::test]
async fn tls_probe_of_a_valid_certificate_passes_verified_by_name_or_address() {
    let pki = pki();
    let server = TlsServer::start(&pki.valid).await;
    let by_name = probe(tls(server.port, opts(Some(NAME), true, Some(&pki.ca)))).await;
    assert!(by_name.success, "{by_name:?}");
    assert!(by_name.detail.starts_with("handshake done"), "{by_name:?}");
    let by_address = probe(tls(server.port, opts(None, true, Some(&pki.ca)))).await;
    assert!(by_address.success, "{by_address:?}");
    let unverified = probe(tls(server.port, opts(Some(NAME), false, None))).await;
    assert!(unverified.success, "{unverified:?}");
}

#[tokio::test]
async fn tls_probe_of_an_expired_certificate_fails_only_when_verifying() {
    let pki = pki();
    let server = TlsServer::start(&pki.expired).await;
    let verified = probe(tls(server.port, opts(Some(NAME), true, Some(&pki.ca)))).await;
    assert!(!verified.success);
    assert!(verified.detail.contains("expired"), "{verified:?}");
    let unverified = probe(tls(server.port, opts(Some(NAME), false, None))).await;
    assert!(unverified.success, "{unverified:?}");
}

#[tokio::test]
async fn tls_probe_of_a_certificate_for_another_name_fails_only_when_verifying() {
    let pki = pki();
    let server = TlsServer::start(&pki.wrong_name).await;
    let verified = probe(tls(server.port, opts(Some(NAME), true, Some(&pki.ca)))).await;
    assert!(!verified.success);
    assert!(
        verified.detail.contains("not valid for name"),
        "{verified:?}"
    );
    let by_address = probe(tls(server.port, opts(None, true, Some(&pki.ca)))).await;
    assert!(!by_address.success, "{by_address:?}");
    let unverified = probe(tls(server.port, opts(Some(NAME), false, None))).await;
    assert!(unverified.success, "{unverified:?}");
}

#[tokio::test]
async fn tls_probe_verified_against_the_system_roots_refuses_a_private_ca() {
    let pki = pki();
    let server = TlsServer::start(&pki.valid).await;
    let out = probe(tls(server.port, opts(Some(NAME), true, None))).await;
    assert!(!out.success);
    assert!(out.detail.contains("invalid peer certificate"), "{out:?}");
}

#[tokio::test]
async fn tls_probe_of_a_plain_tcp_server_or_a_closed_port_fails() {
    let pki = pki();
    let listener = TcpListener::bind((lo(), 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let _server = Guard(tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream.write_all(b"SSH-2.0-OpenSSH_9.6\r\n").await;
        }
    }));
    let out = probe(tls(port, opts(Some(NAME), false, None))).await;
    assert!(!out.success, "{out:?}");
    let closed = probe(tls(
        closed_port(lo()).await,
        opts(None, true, Some(&pki.ca)),
    ))
    .await;
    assert_eq!(closed.detail, "connection refused");
}

#[tokio::test]
async fn tls_check_with_an_unreadable_ca_fails_every_probe_with_the_reason() {
    let pki = pki();
    let server = TlsServer::start(&pki.valid).await;
    let missing = PathBuf::from("/nonexistent/ca.pem");
    let out = probe(tls(server.port, opts(Some(NAME), true, Some(&missing)))).await;
    assert!(!out.success);
    assert!(out.detail.contains("/nonexistent/ca.pem"), "{out:?}");
}

fn https(port: u16, tls: TlsOptions) -> CheckKind {
    CheckKind::Https {
        port,
        path: "/healthz".to_owned(),
        expect: vec![200],
        tls,
    }
}

#[tokio::test]
async fn https_probe_gets_the_path_with_the_sni_name_as_host() {
    let pki = pki();
    let server = TlsServer::start(&pki.valid).await;
    let checker = Checker::new(
        Some(lo()),
        &check(https(server.port, opts(Some(NAME), true, Some(&pki.ca)))),
    );
    let url = format!("https://{NAME}:{}/healthz", server.port);
    assert_eq!(checker.url(), Some(url.as_str()));
    let out = checker.probe().await;
    assert!(out.success, "{out:?}");
    assert_eq!(out.detail, "status 200");
    let head = server.requests.lock().unwrap().pop().unwrap();
    assert!(head.starts_with("GET /healthz HTTP/1.1\r\n"), "{head}");
    let host = format!("host: {NAME}:{}\r\n", server.port);
    assert!(head.to_ascii_lowercase().contains(&host), "{head}");
    let by_address = probe(https(server.port, opts(None, true, Some(&pki.ca)))).await;
    assert!(by_address.success, "{by_address:?}");
}

#[tokio::test]
async fn https_probe_of_an_expired_or_misnamed_certificate_fails_only_when_verifying() {
    let pki = pki();
    for cert in [&pki.expired, &pki.wrong_name] {
        let server = TlsServer::start(cert).await;
        let verified = probe(https(server.port, opts(Some(NAME), true, Some(&pki.ca)))).await;
        assert!(!verified.success, "{verified:?}");
        assert!(verified.detail.contains("certificate"), "{verified:?}");
        assert!(server.requests.lock().unwrap().is_empty());
        let unverified = probe(https(server.port, opts(Some(NAME), false, None))).await;
        assert!(unverified.success, "{unverified:?}");
    }
}

// ---- dns ----

/// Whether this is a CI run, where a missing daemon fails the test instead of skipping it.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// A dnsmasq on 127.0.0.1 with a port of its own, answering only from the host and TXT
/// records given here for `*.probe.test` (NXDOMAIN for other names there; no upstream).
struct Dnsmasq {
    child: Child,
    port: u16,
}

const DNS_A: &str = "198.18.0.5";
const DNS_AAAA: &str = "2001:db8::5";

impl Dnsmasq {
    /// `None` (after saying so on stderr) when dnsmasq is not installed, outside CI.
    async fn start(test: &str) -> Option<Self> {
        let Some(binary) = ["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq", "/sbin/dnsmasq"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
        else {
            let skipped = format!("SKIPPED {test}: dnsmasq is not installed (cargo xtask setup)");
            let _ = writeln!(std::io::stderr(), "\n*** {skipped} ***");
            assert!(!in_ci(), "{skipped} — CI=true, so a skip is a failure");
            return None;
        };
        // A port free now; dnsmasq binds it at once (a lost race fails its start below).
        let port = std::net::UdpSocket::bind((lo(), 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(binary)
            .args([
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--pid-file=",
                "--bind-interfaces",
                "--listen-address=127.0.0.1",
                &format!("--port={port}"),
                "--local=/probe.test/",
                &format!("--host-record=www.{NAME},{DNS_A},{DNS_AAAA}"),
                &format!("--txt-record=txt.{NAME},switchyard probe"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsmasq starts");
        let server = Self { child, port };
        // Ready once it answers; a dnsmasq that cannot bind exits.
        for _ in 0..50 {
            if probe(server.a(&[])).await.success {
                return Some(server);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("dnsmasq on port {port} did not answer within 5 s");
    }

    fn query(&self, name: &str, record: &str, expect: &[&str]) -> CheckKind {
        CheckKind::Dns {
            port: self.port,
            query: name.to_owned(),
            record: record.to_owned(),
            expect: expect.iter().map(|e| (*e).to_owned()).collect(),
        }
    }

    fn a(&self, expect: &[&str]) -> CheckKind {
        self.query(&format!("www.{NAME}"), "A", expect)
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.stop();
    }
}

#[tokio::test]
async fn dns_probe_passes_when_the_answer_holds_the_expected_records() {
    let Some(dns) =
        Dnsmasq::start("dns_probe_passes_when_the_answer_holds_the_expected_records").await
    else {
        return;
    };
    let a = probe(dns.a(&[DNS_A])).await;
    assert!(a.success, "{a:?}");
    assert_eq!(a.detail, format!("answer {DNS_A}"));
    let aaaa = probe(dns.query(&format!("www.{NAME}"), "AAAA", &[DNS_AAAA])).await;
    assert!(aaaa.success, "{aaaa:?}");
    let txt = probe(dns.query(&format!("txt.{NAME}"), "TXT", &["switchyard probe"])).await;
    assert!(txt.success, "{txt:?}");
}

#[tokio::test]
async fn dns_probe_fails_on_a_wrong_answer_a_missing_name_or_type() {
    let Some(dns) =
        Dnsmasq::start("dns_probe_fails_on_a_wrong_answer_a_missing_name_or_type").await
    else {
        return;
    };
    let wrong = probe(dns.a(&["198.18.0.9"])).await;
    assert!(!wrong.success);
    assert_eq!(wrong.detail, format!("answer {DNS_A} lacks 198.18.0.9"));
    let nxdomain = probe(dns.query(&format!("nothere.{NAME}"), "A", &[])).await;
    assert!(!nxdomain.success);
    assert_eq!(nxdomain.detail, "answer NXDOMAIN");
    let no_mx = probe(dns.query(&format!("www.{NAME}"), "MX", &[])).await;
    assert!(!no_mx.success, "{no_mx:?}");
}

#[tokio::test]
async fn dns_probe_fails_once_the_server_is_gone() {
    let Some(mut dns) = Dnsmasq::start("dns_probe_fails_once_the_server_is_gone").await else {
        return;
    };
    assert!(probe(dns.a(&[DNS_A])).await.success);
    dns.stop();
    let out = probe(dns.a(&[DNS_A])).await;
    assert!(!out.success);
    assert_eq!(out.detail, "connection refused");
}

#[tokio::test]
async fn dns_probe_of_a_silent_server_times_out() {
    let (port, _server) = udp_server(true).await;
    let out = probe(CheckKind::Dns {
        port,
        query: "www.probe.test".to_owned(),
        record: "A".to_owned(),
        expect: Vec::new(),
    })
    .await;
    assert!(!out.success);
    assert_eq!(out.detail, "timeout after 500ms");
}
