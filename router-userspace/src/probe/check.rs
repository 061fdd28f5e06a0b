//! One health probe against one backend: a TCP connect, an HTTP/1.1 `GET` (plain or over TLS)
//! judged by its status code, a program's exit status, a DNS query, a UDP exchange or a TLS
//! handshake (`protocols.rs`), each bounded by the check's timeout.
//!
//! A [`Checker`] is prepared once per backend (URL parsed, HTTP client built) and run once per
//! probe. Every probe opens a fresh connection (no keep-alive pool), so a probe tests that the
//! backend accepts new connections, as the data plane's new flows need. HTTP probes go straight
//! to the backend: proxy settings from the environment are ignored, redirects are not followed
//! (a `3xx` is judged against `expect` like any status) and nothing is retried.

use std::{
    error::Error as StdError,
    io,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use tokio::{net::TcpStream, time::Instant};

use super::protocols;
use crate::config::{CheckKind, HealthCheck, TlsOptions};

/// The result of one probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeOutcome {
    /// Whether the probe passed.
    pub success: bool,
    /// Wall-clock time from the start of the probe to its result (close to the timeout when it
    /// timed out).
    pub latency: Duration,
    /// What happened, for logs and `status`: `"connected"`, `"status 200"`, `"status 503"`,
    /// `"connection refused"`, `"timeout after 300ms"`, `"answer 198.18.0.5"`,
    /// `"answer NXDOMAIN"`, `"reply of 9 bytes"`, `"handshake done (TLSv1_3)"`, or another
    /// error's text (a refused certificate: `"invalid peer certificate: …"`).
    pub detail: String,
}

/// A probe of one backend, prepared once and run any number of times.
#[derive(Clone, Debug)]
pub struct Checker {
    timeout: Duration,
    kind: Prepared,
}

#[derive(Clone, Debug)]
enum Prepared {
    Tcp(SocketAddr),
    Http {
        client: reqwest::Client,
        url: reqwest::Url,
        expect: Vec<u16>,
    },
    /// Run a program (no shell) and wait for its exit status.
    Exec(Vec<String>),
    /// Ask a DNS server.
    Dns(SocketAddr, protocols::DnsQuestion),
    /// Send a UDP datagram and judge the reply.
    Udp {
        addr: SocketAddr,
        send: Vec<u8>,
        expect: Option<Vec<u8>>,
    },
    /// A TLS handshake.
    Tls {
        addr: SocketAddr,
        name: rustls::pki_types::ServerName<'static>,
        config: std::sync::Arc<rustls::ClientConfig>,
    },
    /// The check cannot be run (a path that makes no URL, a client that cannot be built): every
    /// probe fails with this text. Config validation should make this unreachable.
    Broken(String),
}

impl Checker {
    /// Prepares `check` against the backend at `address`.
    ///
    /// Never fails: a check that cannot be run yields a checker whose every probe fails with the
    /// reason in [`ProbeOutcome::detail`].
    #[must_use]
    pub fn new(address: Option<IpAddr>, check: &HealthCheck) -> Self {
        // Validation gives every tcp and http check an address, and allows `{address}` only
        // in the commands of pools' checks, which have one.
        let at = |port: u16| SocketAddr::new(address.unwrap_or(Ipv4Addr::UNSPECIFIED.into()), port);
        let kind = match &check.kind {
            CheckKind::Tcp { port } => Prepared::Tcp(at(*port)),
            CheckKind::Http { port, path, expect } => prepare_http(at(*port), path, expect),
            CheckKind::Exec { command } => match address {
                Some(address) => {
                    let text = address.to_string();
                    Prepared::Exec(
                        command
                            .iter()
                            .map(|a| a.replace("{address}", &text))
                            .collect(),
                    )
                }
                None => Prepared::Exec(command.clone()),
            },
            CheckKind::Dns {
                port,
                query,
                record,
                expect,
            } => match protocols::DnsQuestion::new(query, record, expect) {
                Ok(question) => Prepared::Dns(at(*port), question),
                Err(reason) => Prepared::Broken(reason),
            },
            CheckKind::Udp { port, send, expect } => Prepared::Udp {
                addr: at(*port),
                send: send.clone(),
                expect: expect.clone(),
            },
            CheckKind::Tls { port, tls } => prepare_tls(at(*port), tls),
            CheckKind::Https {
                port,
                path,
                expect,
                tls,
            } => prepare_https(at(*port), path, expect, tls),
        };
        Self {
            timeout: check.timeout,
            kind,
        }
    }

    /// The URL an HTTP check requests (`http://[::1]:8080/healthz`); `None` for other checks.
    #[must_use]
    pub fn url(&self) -> Option<&str> {
        match &self.kind {
            Prepared::Http { url, .. } => Some(url.as_str()),
            _ => None,
        }
    }

    /// Runs one probe; it takes at most about the check's timeout.
    pub async fn probe(&self) -> ProbeOutcome {
        match &self.kind {
            Prepared::Tcp(addr) => tcp(*addr, self.timeout).await,
            Prepared::Http {
                client,
                url,
                expect,
            } => http(client, url, expect, self.timeout).await,
            Prepared::Exec(argv) => exec(argv, self.timeout).await,
            Prepared::Dns(addr, question) => protocols::dns(*addr, question, self.timeout).await,
            Prepared::Udp { addr, send, expect } => {
                protocols::udp(*addr, send, expect.as_deref(), self.timeout).await
            }
            Prepared::Tls { addr, name, config } => {
                protocols::tls(*addr, name, config, self.timeout).await
            }
            Prepared::Broken(reason) => ProbeOutcome {
                success: false,
                latency: Duration::ZERO,
                detail: reason.clone(),
            },
        }
    }
}

fn prepare_http(addr: SocketAddr, path: &str, expect: &[u16]) -> Prepared {
    // Without the slash, `@host/` would turn the backend address into URL user info.
    if !path.starts_with('/') {
        return Prepared::Broken(format!(
            "health check path {path:?} does not start with '/'"
        ));
    }
    // SocketAddr's Display brackets IPv6 addresses: `[::1]:8080`.
    let text = format!("http://{addr}{path}");
    let url = match reqwest::Url::parse(&text) {
        Ok(url) => url,
        Err(e) => return Prepared::Broken(format!("invalid health check URL {text:?}: {e}")),
    };
    let client = client_builder().build();
    match client {
        Ok(client) => Prepared::Http {
            client,
            url,
            expect: expect.to_vec(),
        },
        Err(e) => Prepared::Broken(format!("cannot build HTTP client: {}", describe(&e))),
    }
}

fn prepare_tls(addr: SocketAddr, tls: &TlsOptions) -> Prepared {
    let prepared = protocols::client_config(tls).and_then(|config| {
        let name = protocols::server_name(tls, addr)?;
        Ok((config, name))
    });
    match prepared {
        Ok((config, name)) => Prepared::Tls {
            addr,
            name,
            config: std::sync::Arc::new(config),
        },
        Err(reason) => Prepared::Broken(reason),
    }
}

/// An HTTP client over TLS: rustls (ring) configured as for a `tls` check. With `sni`, the URL
/// names the host by it (so the request's `Host` and the TLS name are the same) and the client
/// resolves it to the backend's address.
fn prepare_https(addr: SocketAddr, path: &str, expect: &[u16], tls: &TlsOptions) -> Prepared {
    if !path.starts_with('/') {
        return Prepared::Broken(format!(
            "health check path {path:?} does not start with '/'"
        ));
    }
    let config = match protocols::client_config(tls) {
        Ok(config) => config,
        Err(reason) => return Prepared::Broken(reason),
    };
    let text = match &tls.sni {
        Some(sni) => format!("https://{sni}:{}{path}", addr.port()),
        None => format!("https://{addr}{path}"),
    };
    let url = match reqwest::Url::parse(&text) {
        Ok(url) => url,
        Err(e) => return Prepared::Broken(format!("invalid health check URL {text:?}: {e}")),
    };
    let mut builder = client_builder().tls_backend_preconfigured(config);
    if let Some(sni) = &tls.sni {
        builder = builder.resolve(sni, addr);
    }
    match builder.build() {
        Ok(client) => Prepared::Http {
            client,
            url,
            expect: expect.to_vec(),
        },
        Err(e) => Prepared::Broken(format!("cannot build HTTP client: {}", describe(&e))),
    }
}

/// The settings every probe's HTTP client shares: no proxy, redirect, retry or kept connection.
fn client_builder() -> reqwest::ClientBuilder {
    protocols::install_crypto_provider();
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .retry(reqwest::retry::never())
        .pool_max_idle_per_host(0)
        .user_agent(concat!("switchyard-probe/", env!("CARGO_PKG_VERSION")))
}

/// Runs `argv` (no shell, stdin/stdout/stderr to /dev/null); success is exit status 0 within
/// `timeout`, as keepalived's `MISC_CHECK`. A program still running at the timeout is killed.
pub async fn exec(argv: &[String], timeout: Duration) -> ProbeOutcome {
    let start = Instant::now();
    let Some((program, arguments)) = argv.split_first() else {
        return outcome(false, Duration::ZERO, "empty command".to_owned());
    };
    let child = tokio::process::Command::new(program)
        .args(arguments)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return outcome(false, start.elapsed(), format!("cannot run {program}: {e}")),
    };
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) if status.success() => outcome(true, start.elapsed(), "exit 0".to_owned()),
        Ok(Ok(status)) => outcome(false, start.elapsed(), format!("{status}")),
        Ok(Err(e)) => outcome(
            false,
            start.elapsed(),
            format!("waiting for {program}: {e}"),
        ),
        Err(_) => outcome(false, start.elapsed(), timed_out(timeout)),
    }
}

/// Probes `addr` with a TCP connect; success is an established connection, closed at once.
pub async fn tcp(addr: SocketAddr, timeout: Duration) -> ProbeOutcome {
    let start = Instant::now();
    let result = tokio::time::timeout(timeout, TcpStream::connect(addr)).await;
    let latency = start.elapsed();
    match result {
        Ok(Ok(_stream)) => outcome(true, latency, "connected".to_owned()),
        Ok(Err(e)) => outcome(false, latency, describe_io(&e)),
        Err(_) => outcome(false, latency, timed_out(timeout)),
    }
}

/// Probes `url` with `GET` through `client`; success is a response status in `expect`. Only
/// the status line and headers are awaited; the body is not read.
pub async fn http(
    client: &reqwest::Client,
    url: &reqwest::Url,
    expect: &[u16],
    timeout: Duration,
) -> ProbeOutcome {
    let start = Instant::now();
    let request = client
        .get(url.clone())
        .header(reqwest::header::CONNECTION, "close")
        .send();
    let result = tokio::time::timeout(timeout, request).await;
    let latency = start.elapsed();
    match result {
        Ok(Ok(response)) => {
            let status = response.status().as_u16();
            outcome(
                expect.contains(&status),
                latency,
                format!("status {status}"),
            )
        }
        Ok(Err(e)) => outcome(false, latency, describe(&e)),
        Err(_) => outcome(false, latency, timed_out(timeout)),
    }
}

pub(super) fn outcome(success: bool, latency: Duration, detail: String) -> ProbeOutcome {
    ProbeOutcome {
        success,
        latency,
        detail,
    }
}

pub(super) fn timed_out(timeout: Duration) -> String {
    format!("timeout after {}ms", timeout.as_millis())
}

/// Short text for an I/O error: the common connect failures by name, others as the OS says.
pub(super) fn describe_io(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
        io::ErrorKind::ConnectionReset => "connection reset".to_owned(),
        io::ErrorKind::ConnectionAborted => "connection aborted".to_owned(),
        io::ErrorKind::HostUnreachable => "host unreachable".to_owned(),
        io::ErrorKind::NetworkUnreachable => "network unreachable".to_owned(),
        io::ErrorKind::TimedOut => "connect timed out".to_owned(),
        _ => e.to_string(),
    }
}

/// Short text for an HTTP client error: the first I/O error in its source chain, else the
/// innermost cause (reqwest's own text only names the URL).
fn describe(e: &(dyn StdError + 'static)) -> String {
    let mut current: &(dyn StdError + 'static) = e;
    loop {
        if let Some(io) = current.downcast_ref::<io::Error>() {
            return describe_io(io);
        }
        match current.source() {
            Some(next) => current = next,
            None => return current.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Backoff;
    use crate::probe::test_support::{HttpServer, closed_port, silent_server};
    use tokio::net::{TcpListener, TcpSocket};

    const TIMEOUT: Duration = Duration::from_millis(300);
    /// Allowance over the timeout for scheduling on a loaded 2-core machine.
    const MARGIN: Duration = Duration::from_millis(400);

    fn health_check(kind: CheckKind) -> HealthCheck {
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

    fn http_check(port: u16, path: &str, expect: &[u16]) -> HealthCheck {
        health_check(CheckKind::Http {
            port,
            path: path.to_owned(),
            expect: expect.to_vec(),
        })
    }

    async fn probe(address: IpAddr, check: HealthCheck) -> ProbeOutcome {
        Checker::new(Some(address), &check).probe().await
    }

    fn v4() -> IpAddr {
        IpAddr::from([127, 0, 0, 1])
    }

    fn v6() -> IpAddr {
        IpAddr::from(std::net::Ipv6Addr::LOCALHOST)
    }

    #[tokio::test]
    async fn tcp_probe_to_a_listening_port_succeeds() {
        let listener = TcpListener::bind((v4(), 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let out = probe(v4(), health_check(CheckKind::Tcp { port })).await;
        assert!(out.success, "{out:?}");
        assert_eq!(out.detail, "connected");
        assert!(out.latency < TIMEOUT);
    }

    #[tokio::test]
    async fn tcp_probe_to_a_listening_ipv6_port_succeeds() {
        let listener = TcpListener::bind((v6(), 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let out = probe(v6(), health_check(CheckKind::Tcp { port })).await;
        assert!(out.success, "{out:?}");
    }

    #[tokio::test]
    async fn tcp_probe_to_a_closed_port_fails_as_refused() {
        let port = closed_port(v4()).await;
        let out = probe(v4(), health_check(CheckKind::Tcp { port })).await;
        assert!(!out.success);
        assert_eq!(out.detail, "connection refused");
        assert!(out.latency < TIMEOUT);
    }

    #[tokio::test]
    async fn tcp_probe_to_a_full_accept_queue_times_out() {
        // Linux drops SYNs to a listener whose accept queue is full, so connects hang.
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind((v4(), 0).into()).unwrap();
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut held = Vec::new();
        for _ in 0..16 {
            match tokio::time::timeout(Duration::from_millis(100), TcpStream::connect(addr)).await {
                Ok(stream) => held.push(stream.unwrap()),
                Err(_) => break,
            }
        }
        let start = Instant::now();
        let out = tcp(addr, TIMEOUT).await;
        assert!(!out.success);
        assert_eq!(out.detail, "timeout after 300ms");
        assert!(out.latency >= TIMEOUT);
        assert!(start.elapsed() < TIMEOUT + MARGIN, "{:?}", start.elapsed());
    }

    #[tokio::test]
    async fn http_probe_with_status_200_succeeds_and_sends_get_path() {
        let server = HttpServer::start(v4(), 200).await;
        let out = probe(v4(), http_check(server.port(), "/healthz?full=1", &[200])).await;
        assert!(out.success, "{out:?}");
        assert_eq!(out.detail, "status 200");
        let head = server.requests().pop().unwrap();
        assert!(
            head.starts_with("GET /healthz?full=1 HTTP/1.1\r\n"),
            "{head}"
        );
        let host = format!("host: 127.0.0.1:{}\r\n", server.port());
        assert!(head.to_ascii_lowercase().contains(&host), "{head}");
    }

    #[tokio::test]
    async fn http_probe_with_status_503_fails() {
        let server = HttpServer::start(v4(), 503).await;
        let out = probe(v4(), http_check(server.port(), "/", &[200])).await;
        assert!(!out.success);
        assert_eq!(out.detail, "status 503");
    }

    #[tokio::test]
    async fn http_probe_accepts_any_listed_status() {
        let server = HttpServer::start(v4(), 204).await;
        let out = probe(v4(), http_check(server.port(), "/", &[200, 204])).await;
        assert!(out.success, "{out:?}");
        assert_eq!(out.detail, "status 204");
    }

    #[tokio::test]
    async fn http_probe_does_not_follow_redirects() {
        let server = HttpServer::start(v4(), 302).await;
        let out = probe(v4(), http_check(server.port(), "/", &[200])).await;
        assert!(!out.success);
        assert_eq!(out.detail, "status 302");
        assert_eq!(server.requests().len(), 1);
    }

    #[tokio::test]
    async fn http_probe_over_ipv6_uses_a_bracketed_url() {
        let server = HttpServer::start(v6(), 200).await;
        let check = http_check(server.port(), "/health", &[200]);
        let checker = Checker::new(Some(v6()), &check);
        let url = format!("http://[::1]:{}/health", server.port());
        assert_eq!(checker.url(), Some(url.as_str()));
        let out = checker.probe().await;
        assert!(out.success, "{out:?}");
        let head = server.requests().pop().unwrap().to_ascii_lowercase();
        assert!(
            head.contains(&format!("host: [::1]:{}\r\n", server.port())),
            "{head}"
        );
    }

    #[tokio::test]
    async fn http_probe_to_a_closed_port_fails_as_refused() {
        let port = closed_port(v6()).await;
        let out = probe(v6(), http_check(port, "/", &[200])).await;
        assert!(!out.success);
        assert_eq!(out.detail, "connection refused");
    }

    #[tokio::test]
    async fn http_probe_to_a_silent_server_times_out_within_margin() {
        let (port, _server) = silent_server(v4()).await;
        let start = Instant::now();
        let out = probe(v4(), http_check(port, "/", &[200])).await;
        let elapsed = start.elapsed();
        assert!(!out.success);
        assert_eq!(out.detail, "timeout after 300ms");
        assert!(out.latency >= TIMEOUT, "{out:?}");
        assert!(elapsed < TIMEOUT + MARGIN, "{elapsed:?}");
    }

    #[tokio::test]
    async fn http_probe_to_a_non_http_server_fails_with_a_reason() {
        let listener = TcpListener::bind((v4(), 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let _server = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Ok((mut stream, _)) = listener.accept().await {
                let _ = stream.write_all(b"SSH-2.0-OpenSSH_9.6\r\n").await;
            }
        });
        let out = probe(v4(), http_check(port, "/", &[200])).await;
        assert!(!out.success);
        assert!(!out.detail.is_empty());
        assert!(!out.detail.starts_with("timeout"), "{out:?}");
    }

    #[tokio::test]
    async fn http_check_with_a_relative_path_fails_every_probe() {
        let server = HttpServer::start(v4(), 200).await;
        let path = format!("@127.0.0.1:{}/", server.port());
        let out = probe(v4(), http_check(server.port(), &path, &[200])).await;
        assert!(!out.success);
        assert!(out.detail.contains("does not start with '/'"), "{out:?}");
        assert!(server.requests().is_empty());
    }
}

#[cfg(test)]
mod exec_tests {
    use std::time::Duration;

    use super::exec;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[tokio::test]
    async fn exit_status_zero_is_success_and_anything_else_is_failure() {
        assert!(exec(&argv(&["true"]), Duration::from_secs(2)).await.success);
        let failed = exec(&argv(&["false"]), Duration::from_secs(2)).await;
        assert!(!failed.success);
        assert!(
            failed.detail.contains("exit status: 1"),
            "{}",
            failed.detail
        );
    }

    #[tokio::test]
    async fn a_command_past_its_timeout_fails_and_is_killed() {
        let slow = exec(&argv(&["sleep", "5"]), Duration::from_millis(100)).await;
        assert!(!slow.success);
        assert!(slow.latency < Duration::from_secs(2), "{:?}", slow.latency);
    }

    #[tokio::test]
    async fn a_missing_program_fails_with_its_name() {
        let missing = exec(&argv(&["/nonexistent/check"]), Duration::from_secs(1)).await;
        assert!(!missing.success && missing.detail.contains("/nonexistent/check"));
    }
}
