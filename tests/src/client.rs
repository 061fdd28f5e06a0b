//! Client-side helpers: connect from the client namespace, learn which backend answered,
//! exchange data, and count answers per backend.
//!
//! Functions that take a [`Netns`] open their sockets inside it; the others use the calling
//! thread's namespace, so call them inside [`Netns::run`]. Sockets keep their namespace, so
//! [`TcpSession`]s opened by [`tcp_sessions`] can be used from any thread afterwards.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};

use crate::netns::Netns;

/// Connect, read and write timeout of every helper here.
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// Answers per backend name.
pub type Tally = BTreeMap<String, usize>;

/// An open connection to a TCP echo server that has announced its backend.
#[derive(Debug)]
pub struct TcpSession {
    backend: String,
    stream: TcpStream,
}

impl TcpSession {
    /// Connects to `addr` (in the calling thread's namespace) and reads the backend's name.
    ///
    /// # Errors
    ///
    /// As [`TcpSession::connect_with_timeout`], with the timeout [`TIMEOUT`].
    pub fn connect(addr: SocketAddr) -> Result<Self> {
        Self::connect_with_timeout(addr, TIMEOUT)
    }

    /// Like [`TcpSession::connect`] with a connect timeout of `timeout`.
    ///
    /// # Errors
    ///
    /// When the connection is not accepted within `timeout`, or the server sends no name line
    /// (at most 64 bytes, UTF-8) within [`TIMEOUT`].
    pub fn connect_with_timeout(addr: SocketAddr, timeout: Duration) -> Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, timeout)
            .with_context(|| format!("connect to {addr}"))?;
        Self::greeted(stream, addr)
    }

    /// Connects to `addr` from local port `port` (a chosen 5-tuple; the address may be reused
    /// at once) and reads the backend's name.
    ///
    /// # Errors
    ///
    /// As [`TcpSession::connect`], and when the port cannot be bound.
    pub fn connect_from(addr: SocketAddr, port: u16) -> Result<Self> {
        let local: SocketAddr = if addr.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, port).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, port).into()
        };
        Self::connect_bound(addr, local)
    }

    /// Connects to `addr` from `local` (a chosen source address and port: the whole 5-tuple;
    /// the address may be reused at once) and reads the backend's name.
    ///
    /// # Errors
    ///
    /// As [`TcpSession::connect`], and when `local` cannot be bound.
    pub fn connect_bound(addr: SocketAddr, local: SocketAddr) -> Result<Self> {
        use socket2::{Domain, Socket, Type};
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        sock.set_reuse_address(true)?;
        sock.bind(&local.into())
            .with_context(|| format!("bind {local}"))?;
        sock.connect_timeout(&addr.into(), TIMEOUT)
            .with_context(|| format!("connect to {addr} from {local}"))?;
        Self::greeted(sock.into(), addr)
    }

    /// Ends the connection with an RST (`SO_LINGER` 0): no FIN exchange, no `TIME_WAIT`, and the
    /// 5-tuple is free for the next connection at once.
    ///
    /// # Errors
    ///
    /// When the socket option cannot be set.
    pub fn reset(self) -> Result<()> {
        socket2::SockRef::from(&self.stream).set_linger(Some(Duration::ZERO))?;
        drop(self);
        Ok(())
    }

    /// A session on `stream`, connected to `addr`, once the server's name line is read.
    fn greeted(mut stream: TcpStream, addr: SocketAddr) -> Result<Self> {
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        stream.set_nodelay(true)?;
        // Byte by byte: nothing but the name line may be consumed here.
        let mut name = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            stream
                .read_exact(&mut byte)
                .with_context(|| format!("read backend name from {addr}"))?;
            if byte[0] == b'\n' {
                break;
            }
            name.push(byte[0]);
            ensure!(name.len() <= 64, "{addr} sent no name line");
        }
        let backend = String::from_utf8(name).context("backend name is not UTF-8")?;
        Ok(Self { backend, stream })
    }

    /// The backend that accepted this connection.
    #[must_use]
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// The connection's local address (the client's port identifies the flow).
    ///
    /// # Errors
    ///
    /// When the socket cannot report it.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.stream.local_addr()?)
    }

    /// Sends `data` and checks that exactly `data` comes back.
    ///
    /// # Errors
    ///
    /// When sending or reading fails (or times out), or different bytes come back.
    pub fn echo(&mut self, data: &[u8]) -> Result<()> {
        self.stream.write_all(data).context("send")?;
        let mut back = vec![0u8; data.len()];
        self.stream.read_exact(&mut back).context("read echo")?;
        ensure!(back == data, "{} echoed different bytes", self.backend);
        Ok(())
    }

    /// Sends `data` and waits (up to [`TIMEOUT`]) for what comes back: `Ok(Ok(()))` when
    /// exactly `data` is echoed, `Ok(Err(kind))` when the read fails with `kind` (a reset is
    /// `ConnectionReset`), and how long after the send either happened.
    ///
    /// # Errors
    ///
    /// When the send fails, or different bytes come back.
    pub fn echo_or_error(
        &mut self,
        data: &[u8],
    ) -> Result<(Result<(), std::io::ErrorKind>, Duration)> {
        let sent = std::time::Instant::now();
        self.stream.write_all(data).context("send")?;
        let mut back = vec![0u8; data.len()];
        let r = self.stream.read_exact(&mut back);
        let took = sent.elapsed();
        match r {
            Ok(()) => {
                ensure!(back == data, "{} echoed different bytes", self.backend);
                Ok((Ok(()), took))
            }
            Err(e) => Ok((Err(e.kind()), took)),
        }
    }

    /// Half-closes, then checks the server closes too without sending anything more.
    ///
    /// # Errors
    ///
    /// When the half-close or the read fails (or times out), or the server sends more bytes.
    pub fn finish(mut self) -> Result<()> {
        self.stream.shutdown(Shutdown::Write)?;
        let mut rest = Vec::new();
        self.stream.read_to_end(&mut rest).context("read to EOF")?;
        ensure!(
            rest.is_empty(),
            "{} sent {} unexpected bytes",
            self.backend,
            rest.len()
        );
        Ok(())
    }
}

/// A payload of `len` bytes that differs per `seed`, so echoes cannot be confused.
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    reason = "each byte is taken modulo 251"
)]
pub fn payload(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k.wrapping_mul(31).wrapping_add(seed) % 251) as u8)
        .collect()
}

/// Opens `n` connections to `addr` from inside `ns` and keeps them open.
///
/// # Errors
///
/// When `ns` cannot be entered, or a connection fails as in [`TcpSession::connect`].
pub fn tcp_sessions(ns: &Netns, addr: SocketAddr, n: usize) -> Result<Vec<TcpSession>> {
    ns.run(|| {
        (0..n)
            .map(|_| TcpSession::connect(addr))
            .collect::<Result<Vec<_>>>()
    })?
}

/// Opens `n` connections, one after another, from inside `ns` to `addr`; on each reads the
/// backend's name, echoes a 1 KiB payload and closes. Counts connections per backend.
///
/// # Errors
///
/// When `ns` cannot be entered, or a connection fails to connect, echo or finish (the error
/// names the connection).
pub fn tcp_tally(ns: &Netns, addr: SocketAddr, n: usize) -> Result<Tally> {
    ns.run(|| -> Result<Tally> {
        let mut tally = Tally::new();
        for k in 0..n {
            let mut session =
                TcpSession::connect(addr).with_context(|| format!("connection {k}"))?;
            session.echo(&payload(k, 1024))?;
            *tally.entry(session.backend.clone()).or_default() += 1;
            session.finish()?;
        }
        Ok(tally)
    })?
}

/// Sends one datagram to `addr` from a fresh socket (a new source port, so a new flow) in the
/// calling thread's namespace and returns the backend name that answers. Retries twice.
///
/// # Errors
///
/// When the socket cannot be opened or used, no answer comes in three tries (a second each),
/// or the answer is not UTF-8.
pub fn udp_query(addr: SocketAddr) -> Result<String> {
    udp_ask(&udp_socket(addr)?, addr)
}

/// Sends `n` datagrams to `addr`, one after another, all from one socket (one flow), in the
/// calling thread's namespace; returns the answering backend of each, in order.
///
/// # Errors
///
/// As [`udp_query`], for the first datagram that fails (the error names it).
pub fn udp_flow(addr: SocketAddr, n: usize) -> Result<Vec<String>> {
    let sock = udp_socket(addr)?;
    (0..n)
        .map(|k| udp_ask(&sock, addr).with_context(|| format!("datagram {k}")))
        .collect()
}

/// One UDP flow: a socket on an ephemeral port connected to a service, asked in turn.
#[derive(Debug)]
pub struct UdpFlow {
    sock: UdpSocket,
    addr: SocketAddr,
}

impl UdpFlow {
    /// Asks the service which backend answers, on this flow (up to three tries).
    ///
    /// # Errors
    ///
    /// As [`udp_query`].
    pub fn ask(&self) -> Result<String> {
        udp_ask(&self.sock, self.addr)
    }
}

/// Opens a UDP flow to `addr` in the calling thread's namespace; nothing is sent yet.
///
/// # Errors
///
/// When the socket cannot be opened or connected.
pub fn udp_flow_socket(addr: SocketAddr) -> Result<UdpFlow> {
    Ok(UdpFlow {
        sock: udp_socket(addr)?,
        addr,
    })
}

/// A UDP socket on an ephemeral port, connected to `addr`: replies from any other source
/// address are ignored by the kernel.
fn udp_socket(addr: SocketAddr) -> Result<UdpSocket> {
    let local: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()?;
    let sock = UdpSocket::bind(local)?;
    sock.connect(addr)?;
    sock.set_read_timeout(Some(Duration::from_secs(1)))?;
    Ok(sock)
}

/// One question on `sock`, up to three tries.
fn udp_ask(sock: &UdpSocket, addr: SocketAddr) -> Result<String> {
    let mut buf = [0u8; 256];
    for _ in 0..3 {
        sock.send(b"who?\n")?;
        match sock.recv(&mut buf) {
            Ok(n) => {
                let text = std::str::from_utf8(&buf[..n]).context("reply is not UTF-8")?;
                return Ok(text.trim_end().to_owned());
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e).with_context(|| format!("UDP {addr}")),
        }
    }
    bail!("no UDP answer from {addr}")
}

/// Sends `n` single-datagram queries from inside `ns` to `addr`, each from a new socket, and
/// counts answers per backend.
///
/// # Errors
///
/// When `ns` cannot be entered, or a query fails as in [`udp_query`] (the error names it).
pub fn udp_tally(ns: &Netns, addr: SocketAddr, n: usize) -> Result<Tally> {
    ns.run(|| -> Result<Tally> {
        let mut tally = Tally::new();
        for k in 0..n {
            let name = udp_query(addr).with_context(|| format!("query {k}"))?;
            *tally.entry(name).or_default() += 1;
        }
        Ok(tally)
    })?
}

/// Sends `GET path` to `addr` (calling thread's namespace) and returns the status code.
///
/// # Errors
///
/// When the connection or the exchange fails or times out, or the answer has no status code.
pub fn http_status(addr: SocketAddr, path: &str) -> Result<u16> {
    let mut stream =
        TcpStream::connect_timeout(&addr, TIMEOUT).with_context(|| format!("connect to {addr}"))?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("malformed HTTP response {response:?}"))?;
    Ok(code)
}

/// Sums the counts of a tally.
#[must_use]
pub fn total(tally: &Tally) -> usize {
    tally.values().sum()
}

/// A raw ICMP (or `ICMPv6`) socket of the calling thread's namespace, for [`ping`] and
/// [`icmp_types`].
///
/// # Errors
///
/// When the socket cannot be opened (it needs `CAP_NET_RAW`).
pub fn icmp_socket(v6: bool) -> Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let (domain, proto) = if v6 {
        (Domain::IPV6, Protocol::ICMPV6)
    } else {
        (Domain::IPV4, Protocol::ICMPV4)
    };
    let sock = Socket::new(domain, Type::RAW, Some(proto)).context("raw ICMP socket")?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    Ok(sock)
}

/// The ICMP messages `sock` receives within `wait`, as (source, type, the rest of the
/// message). An IPv4 raw socket receives the IP header too; it is cut off here.
///
/// # Errors
///
/// When reading fails for another reason than the timeout.
pub fn icmp_messages(sock: &socket2::Socket, wait: Duration) -> Result<Vec<(IpAddr, Vec<u8>)>> {
    let deadline = std::time::Instant::now() + wait;
    let mut seen = Vec::new();
    while std::time::Instant::now() < deadline {
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 2048];
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                // SAFETY: `recv_from` initialised the first `n` bytes.
                let bytes: Vec<u8> = buf[..n]
                    .iter()
                    .map(|b| unsafe { b.assume_init() })
                    .collect();
                let Some(from) = from.as_socket().map(|s| s.ip()) else {
                    continue;
                };
                let msg = if from.is_ipv4() {
                    let ihl = usize::from(bytes.first().map_or(0, |b| b & 0x0f)) * 4;
                    bytes.get(ihl..).unwrap_or_default().to_vec()
                } else {
                    bytes
                };
                seen.push((from, msg));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e).context("reading ICMP"),
        }
    }
    Ok(seen)
}

/// Sends one echo request to `addr` from the calling thread's namespace and says whether `addr`
/// answered within `wait` (an echo reply with the request's identifier).
///
/// # Errors
///
/// When the raw socket cannot be opened or used.
pub fn ping(addr: IpAddr, wait: Duration) -> Result<bool> {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(1);
    let v6 = addr.is_ipv6();
    let sock = icmp_socket(v6)?;
    #[expect(
        clippy::cast_possible_truncation,
        reason = "any 16 bits of the process id tell this run's requests apart"
    )]
    let id = (std::process::id() as u16) ^ NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (request, reply) = if v6 { (128, 129) } else { (8, 0) };
    let [hi, lo] = id.to_be_bytes();
    let mut msg = vec![request, 0, 0, 0, hi, lo, 0, 1, b'p', b'i', b'n', b'g'];
    if !v6 {
        // The kernel fills in an ICMPv6 checksum (RFC 3542 §3.1), not an ICMP one.
        let sum = inet_checksum(&msg);
        msg[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    sock.send_to(&msg, &SocketAddr::new(addr, 0).into())
        .with_context(|| format!("echo request to {addr}"))?;
    Ok(icmp_messages(&sock, wait)?.iter().any(|(from, m)| {
        *from == addr && m.first() == Some(&reply) && m.get(4..6) == Some(&[hi, lo][..])
    }))
}

/// The Internet checksum (RFC 1071) of `data`.
fn inet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    #[expect(clippy::cast_possible_truncation, reason = "folded into 16 bits above")]
    let folded = sum as u16;
    !folded
}
