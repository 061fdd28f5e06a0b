//! Small real servers that run in a backend namespace: TCP echo, UDP name, HTTP health.
//!
//! Every socket is created on a thread inside the backend's namespace (a socket belongs to
//! the namespace it was created in), then served by ordinary threads. The servers answer on
//! the VIP as well as on the backend's own address, so DSR (VIP on `lo`), NAT and plain
//! routing all reach them:
//!
//! - **TCP echo** on `[::]:`[`TCP_ECHO_PORT`] (dual-stack): on each connection it writes its
//!   name and a newline (`b2\n`), then echoes what it receives until EOF.
//! - **UDP name** on [`UDP_NAME_PORT`]: answers each datagram (up to 64 KiB, so reassembled
//!   fragmented datagrams too) with its name and a newline. It binds one socket per address
//!   (the VIPs and the backend's own), not the wildcard, so a reply leaves from the address
//!   the request was sent to — a connected client socket ignores replies from any other
//!   source.
//! - **HTTP health** on `[::]:`[`HEALTH_PORT`]: `GET /health` answers 200, or 503 after
//!   [`BackendServers::set_healthy`]`(false)`; [`BackendServers::kill_health`] closes the
//!   port, so probes see the connection refused. A minimal server, not `tiny_http`: stopping
//!   it must close the listening socket at once from any thread, with no extra dependency.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv6Addr, Shutdown, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::addrs::{
    HEALTH_PORT, TCP_ECHO_PORT, UDP_NAME_PORT, VIP_V4, VIP_V6, backend_name, backend_return_v4,
    backend_return_v6, backend_v4, backend_v6,
};
use crate::netns::{Netns, Topology};

/// How often a UDP server thread looks at its stop flag.
const UDP_POLL: Duration = Duration::from_millis(50);
/// How long the health server waits for a request.
const HTTP_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// State shared by a backend's server threads.
#[derive(Debug, Default)]
struct Shared {
    name: String,
    healthy: AtomicBool,
    stop: AtomicBool,
    tcp_connections: AtomicU64,
    udp_datagrams: AtomicU64,
    health_requests: AtomicU64,
    next_conn: AtomicU64,
    /// Every how many TCP echo connections one is reset at once (0: none).
    reset_every: AtomicU64,
    /// Open echo connections, so stopping can shut them down.
    conns: Mutex<HashMap<u64, TcpStream>>,
}

/// A listening socket and the thread accepting on it.
#[derive(Debug)]
struct Acceptor {
    listener: TcpListener,
    thread: JoinHandle<()>,
}

impl Acceptor {
    fn spawn(
        listener: TcpListener,
        name: String,
        serve: impl Fn(TcpStream) + Send + 'static,
    ) -> Result<Self> {
        let accepting = listener.try_clone()?;
        let thread = thread::Builder::new().name(name).spawn(move || {
            loop {
                match accepting.accept() {
                    Ok((stream, _)) => serve(stream),
                    // shutdown(2) on the listener wakes accept with EINVAL: time to stop.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        })?;
        Ok(Self { listener, thread })
    }

    /// Wakes the accepting thread, waits for it, and closes the port.
    fn stop(self) {
        // SAFETY: shutdown(2) on a descriptor `self.listener` owns; it makes a blocked
        // accept(2) on the same socket return EINVAL on Linux.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        let _ = self.thread.join();
    }
}

/// The servers of one backend. Dropping stops them.
#[derive(Debug)]
pub struct BackendServers {
    shared: Arc<Shared>,
    tcp: Option<Acceptor>,
    health: Option<Acceptor>,
    udp: Vec<JoinHandle<()>>,
}

impl BackendServers {
    /// Starts the servers in `ns`, announcing `name`; the UDP server binds each of
    /// `udp_addrs`. Returns once every socket is bound, so clients may connect at once.
    ///
    /// # Errors
    ///
    /// When `ns` cannot be entered, a socket cannot be bound (the error names it), or a server
    /// thread cannot be started.
    pub fn start(ns: &Netns, name: &str, udp_addrs: &[IpAddr]) -> Result<Self> {
        let any = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
        let (tcp, health, udp) = ns.run(|| -> Result<_> {
            let tcp = TcpListener::bind((any, TCP_ECHO_PORT)).context("bind TCP echo")?;
            let health = TcpListener::bind((any, HEALTH_PORT)).context("bind HTTP health")?;
            let udp = udp_addrs
                .iter()
                .map(|&a| {
                    UdpSocket::bind((a, UDP_NAME_PORT)).with_context(|| format!("bind UDP {a}"))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((tcp, health, udp))
        })??;
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            healthy: AtomicBool::new(true),
            ..Shared::default()
        });
        let mut servers = Self {
            shared: shared.clone(),
            tcp: None,
            health: None,
            udp: Vec::new(),
        };
        let s = shared.clone();
        servers.tcp = Some(Acceptor::spawn(tcp, format!("{name}-tcp"), move |c| {
            serve_echo(&s, c);
        })?);
        let s = shared.clone();
        servers.health = Some(Acceptor::spawn(health, format!("{name}-http"), move |c| {
            // A thread per request: a probe that connects and sends nothing must not stall
            // the others for the read timeout.
            let s = s.clone();
            let _ = thread::Builder::new()
                .name(format!("{}-req", s.name))
                .spawn(move || serve_health(&s, c));
        })?);
        for sock in udp {
            sock.set_read_timeout(Some(UDP_POLL))?;
            let s = shared.clone();
            servers.udp.push(
                thread::Builder::new()
                    .name(format!("{name}-udp"))
                    .spawn(move || serve_udp(&s, &sock))?,
            );
        }
        Ok(servers)
    }

    /// Starts backend `i`'s servers in the standard topology: name `bI`, UDP on both VIPs, the
    /// backend's own addresses and, for a directly attached backend, its return-link addresses.
    ///
    /// # Errors
    ///
    /// As [`BackendServers::start`].
    pub fn start_standard(topo: &Topology, i: usize) -> Result<Self> {
        let mut addrs: Vec<IpAddr> = vec![
            VIP_V4.into(),
            VIP_V6.into(),
            backend_v4(i).into(),
            backend_v6(i).into(),
        ];
        if i <= topo.direct_backend_count() {
            addrs.extend([
                IpAddr::from(backend_return_v4(i)),
                backend_return_v6(i).into(),
            ]);
        }
        Self::start(topo.backend(i), &backend_name(i), &addrs)
    }

    /// The name the servers announce.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Makes `GET /health` answer 200 (`true`) or 503 (`false`).
    pub fn set_healthy(&self, healthy: bool) {
        self.shared.healthy.store(healthy, Ordering::SeqCst);
    }

    /// What `GET /health` answers now (`true` for 200).
    #[must_use]
    pub fn is_healthy(&self) -> bool {
        self.shared.healthy.load(Ordering::SeqCst)
    }

    /// Makes the TCP echo server reset one in every `n` connections it accepts, at once and
    /// before its greeting (an RST, `SO_LINGER` 0); 0 resets none.
    pub fn reset_every(&self, n: u64) {
        self.shared.reset_every.store(n, Ordering::SeqCst);
    }

    /// Stops the health server and closes its port: connections are refused from now on.
    pub fn kill_health(&mut self) {
        if let Some(health) = self.health.take() {
            health.stop();
        }
    }

    /// TCP echo connections accepted so far.
    #[must_use]
    pub fn tcp_connections(&self) -> u64 {
        self.shared.tcp_connections.load(Ordering::SeqCst)
    }

    /// UDP datagrams answered so far.
    #[must_use]
    pub fn udp_datagrams(&self) -> u64 {
        self.shared.udp_datagrams.load(Ordering::SeqCst)
    }

    /// Health requests answered so far.
    #[must_use]
    pub fn health_requests(&self) -> u64 {
        self.shared.health_requests.load(Ordering::SeqCst)
    }

    /// Stops every server, closes their ports and shuts down open echo connections.
    pub fn stop(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for acceptor in [self.tcp.take(), self.health.take()].into_iter().flatten() {
            acceptor.stop();
        }
        let conns = std::mem::take(&mut *lock(&self.shared.conns));
        for stream in conns.values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        for t in self.udp.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for BackendServers {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Starts the servers of every backend of `topo` ([`BackendServers::start_standard`]).
///
/// # Errors
///
/// As [`BackendServers::start`], for the first backend whose servers do not start.
pub fn start_all(topo: &Topology) -> Result<Vec<BackendServers>> {
    (1..=topo.backend_count())
        .map(|i| BackendServers::start_standard(topo, i))
        .collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn serve_echo(shared: &Arc<Shared>, stream: TcpStream) {
    shared.tcp_connections.fetch_add(1, Ordering::SeqCst);
    let id = shared.next_conn.fetch_add(1, Ordering::SeqCst);
    let every = shared.reset_every.load(Ordering::SeqCst);
    if every > 0 && id.is_multiple_of(every) {
        let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
        return;
    }
    if let Ok(clone) = stream.try_clone() {
        lock(&shared.conns).insert(id, clone);
    }
    let s = shared.clone();
    let spawned = thread::Builder::new()
        .name(format!("{}-conn", shared.name))
        .spawn(move || {
            let _ = echo(&s.name, stream);
            lock(&s.conns).remove(&id);
        });
    if spawned.is_err() {
        lock(&shared.conns).remove(&id);
    }
}

fn echo(name: &str, mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.write_all(format!("{name}\n").as_bytes())?;
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return stream.shutdown(Shutdown::Write);
        }
        stream.write_all(&buf[..n])?;
    }
}

fn serve_udp(shared: &Shared, sock: &UdpSocket) {
    let reply = format!("{}\n", shared.name);
    // The largest UDP payload: a datagram longer than the buffer would be truncated, and
    // reassembled fragments make long ones.
    let mut buf = vec![0u8; 64 * 1024];
    while !shared.stop.load(Ordering::SeqCst) {
        match sock.recv_from(&mut buf) {
            Ok((_, peer)) => {
                if sock.send_to(reply.as_bytes(), peer).is_ok() {
                    shared.udp_datagrams.fetch_add(1, Ordering::SeqCst);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => thread::sleep(UDP_POLL),
        }
    }
}

fn serve_health(shared: &Shared, mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(HTTP_READ_TIMEOUT));
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&request);
    let mut words = line.split_whitespace();
    let (status, body) = match (words.next(), words.next()) {
        (Some("GET" | "HEAD"), Some("/health")) if shared.healthy.load(Ordering::SeqCst) => {
            ("200 OK", "ok\n")
        }
        (Some("GET" | "HEAD"), Some("/health")) => ("503 Service Unavailable", "unhealthy\n"),
        (Some(_), Some(_)) => ("404 Not Found", "not found\n"),
        _ => ("400 Bad Request", "bad request\n"),
    };
    shared.health_requests.fetch_add(1, Ordering::SeqCst);
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nX-Backend: {}\r\nConnection: close\r\n\r\n{body}",
        body.len(),
        shared.name
    );
    let _ = stream.write_all(response.as_bytes());
    let _ = stream.shutdown(Shutdown::Write);
}
