//! The probes past TCP and plain HTTP: a DNS query, a UDP request and reply, a TLS handshake,
//! and the TLS configuration an `https` check's HTTP client uses.
//!
//! TLS is rustls with the `ring` provider. With `verify` the server's certificate must chain to
//! the roots of `ca` (a PEM file) or, without it, the system's (`/etc/ssl/certs`), be valid now
//! and name the server: the `sni` name, or the backend's IP address when there is none. Without
//! `verify` any certificate passes and only the handshake is judged. DNS messages are built and
//! read with hickory-proto; the exchange is one UDP datagram each way.

use std::{net::SocketAddr, path::Path, str::FromStr, sync::Arc, time::Duration};

use hickory_proto::{
    op::{Message, MessageType, OpCode, Query, ResponseCode},
    rr::{Name, RecordType},
};
use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
    pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject},
};
use tokio::{
    net::{TcpStream, UdpSocket},
    time::Instant,
};
use tokio_rustls::TlsConnector;

use super::check::{ProbeOutcome, describe_io, outcome, timed_out};
use crate::config::TlsOptions;

/// Makes rustls's `ring` provider the process's default, once; later calls do nothing.
///
/// reqwest is built with `rustls-no-provider` (so aws-lc-rs is not): every HTTP client it
/// builds without a TLS configuration of its own (the CLI's, hooks', plain `http` probes') asks
/// rustls for the process's default provider and panics when there is none. So the binary's
/// `main` and every place here that builds such a client call this first.
pub fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err only when another provider was installed first, which then serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Largest datagram read: a UDP reply or a DNS answer (without EDNS a server sends ≤ 512 bytes).
const MAX_DATAGRAM: usize = 65_535;

/// A rustls client configuration for `tls` (ring provider, TLS 1.2 and 1.3).
///
/// # Errors
/// The reason as text: `ca` cannot be read or holds no certificate, or no trusted root is
/// found in the system's store.
pub fn client_config(tls: &TlsOptions) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS configuration: {e}"))?;
    let config = if tls.verify {
        builder
            .with_root_certificates(roots(tls.ca.as_deref())?)
            .with_no_client_auth()
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth()
    };
    Ok(config)
}

/// The trusted roots: the certificates of `ca`, or the system's.
fn roots(ca: Option<&Path>) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    if let Some(path) = ca {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .and_then(Iterator::collect)
            .map_err(|e| format!("cannot read ca {}: {e}", path.display()))?;
        let (added, _) = store.add_parsable_certificates(certs);
        if added == 0 {
            return Err(format!("ca {} holds no usable certificate", path.display()));
        }
    } else {
        let found = rustls_native_certs::load_native_certs();
        store.add_parsable_certificates(found.certs);
        if store.is_empty() {
            return Err("no trusted roots in the system's store; give ca".to_owned());
        }
    }
    Ok(store)
}

/// The name a TLS probe sends and checks: `sni`, else the backend's address (no SNI is sent
/// for an address).
///
/// # Errors
/// The reason as text when `sni` is no server name (validation refuses such a name).
pub fn server_name(tls: &TlsOptions, addr: SocketAddr) -> Result<ServerName<'static>, String> {
    match &tls.sni {
        Some(sni) => ServerName::try_from(sni.clone()).map_err(|e| format!("bad sni {sni:?}: {e}")),
        None => Ok(ServerName::IpAddress(addr.ip().into())),
    }
}

/// Accepts any certificate (`verify: false`); signatures are still checked, so the handshake
/// is a real one with the holder of the certificate's key.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A TLS handshake with `addr` as `name`; success is a completed handshake, closed at once.
pub async fn tls(
    addr: SocketAddr,
    name: &ServerName<'static>,
    config: &Arc<ClientConfig>,
    timeout: Duration,
) -> ProbeOutcome {
    let start = Instant::now();
    let connector = TlsConnector::from(Arc::clone(config));
    let handshake = async {
        let tcp = TcpStream::connect(addr).await?;
        connector.connect(name.clone(), tcp).await
    };
    let result = tokio::time::timeout(timeout, handshake).await;
    let latency = start.elapsed();
    match result {
        Ok(Ok(stream)) => {
            let version = stream
                .get_ref()
                .1
                .protocol_version()
                .map_or_else(|| "TLS".to_owned(), |v| format!("{v:?}"));
            outcome(true, latency, format!("handshake done ({version})"))
        }
        Ok(Err(e)) => outcome(false, latency, describe_io(&e)),
        Err(_) => outcome(false, latency, timed_out(timeout)),
    }
}

/// Sends `send` to `addr` over UDP and waits for one reply; success is a reply that contains
/// `expect` (any reply without it).
pub async fn udp(
    addr: SocketAddr,
    send: &[u8],
    expect: Option<&[u8]>,
    timeout: Duration,
) -> ProbeOutcome {
    let start = Instant::now();
    let exchange = async {
        let socket = connected_udp(addr).await?;
        socket.send(send).await?;
        let mut buf = vec![0; MAX_DATAGRAM];
        let n = socket.recv(&mut buf).await?;
        buf.truncate(n);
        Ok::<_, std::io::Error>(buf)
    };
    let result = tokio::time::timeout(timeout, exchange).await;
    let latency = start.elapsed();
    match result {
        Ok(Ok(reply)) => match expect {
            Some(e) if !contains(&reply, e) => outcome(
                false,
                latency,
                format!("reply of {} bytes lacks the expected bytes", reply.len()),
            ),
            _ => outcome(true, latency, format!("reply of {} bytes", reply.len())),
        },
        Ok(Err(e)) => outcome(false, latency, describe_io(&e)),
        Err(_) => outcome(false, latency, timed_out(timeout)),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// A UDP socket of `addr`'s family, connected to it (so an ICMP port unreachable reads as
/// "connection refused", and datagrams from elsewhere are not read).
async fn connected_udp(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let local: SocketAddr = if addr.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(addr).await?;
    Ok(socket)
}

/// A DNS question, prepared once.
#[derive(Clone, Debug)]
pub struct DnsQuestion {
    name: Name,
    record: RecordType,
    /// Values every passing answer holds (text forms, compared without case or a final dot).
    expect: Vec<String>,
}

impl DnsQuestion {
    /// `record` records of `query` (absolute: no search domains apply).
    ///
    /// # Errors
    /// The reason as text, when `query` is no domain name or `record` no record type.
    pub fn new(query: &str, record: &str, expect: &[String]) -> Result<Self, String> {
        let mut name =
            Name::from_ascii(query).map_err(|e| format!("bad DNS name {query:?}: {e}"))?;
        name.set_fqdn(true);
        let record =
            RecordType::from_str(record).map_err(|e| format!("bad record type {record:?}: {e}"))?;
        Ok(Self {
            name,
            record,
            expect: expect.to_vec(),
        })
    }
}

/// Asks the server at `addr` `question` over UDP; success is a `NOERROR` answer with at least
/// one record of the type asked, holding every expected value.
pub async fn dns(addr: SocketAddr, question: &DnsQuestion, timeout: Duration) -> ProbeOutcome {
    let start = Instant::now();
    let id = fastrand::u16(..);
    let mut request = Message::new();
    request
        .set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(question.name.clone(), question.record));
    let bytes = match request.to_vec() {
        Ok(b) => b,
        Err(e) => return outcome(false, Duration::ZERO, format!("cannot encode query: {e}")),
    };
    let exchange = async {
        let socket = connected_udp(addr).await?;
        socket.send(&bytes).await?;
        let mut buf = vec![0; MAX_DATAGRAM];
        // A reply to an earlier, timed-out query of this socket cannot arrive (each probe has
        // its own socket), but a datagram that is no answer to this query is skipped, not
        // judged.
        loop {
            let n = socket.recv(&mut buf).await?;
            if let Ok(m) = Message::from_vec(&buf[..n])
                && m.id() == id
                && m.message_type() == MessageType::Response
            {
                return Ok::<_, std::io::Error>(m);
            }
        }
    };
    let result = tokio::time::timeout(timeout, exchange).await;
    let latency = start.elapsed();
    match result {
        Ok(Ok(answer)) => judge_dns(&answer, question, latency),
        Ok(Err(e)) => outcome(false, latency, describe_io(&e)),
        Err(_) => outcome(false, latency, timed_out(timeout)),
    }
}

fn judge_dns(answer: &Message, question: &DnsQuestion, latency: Duration) -> ProbeOutcome {
    let rcode = answer.response_code();
    if rcode != ResponseCode::NoError {
        // As dig writes it: NXDOMAIN, SERVFAIL, REFUSED.
        let name = format!("{rcode:?}").to_ascii_uppercase();
        return outcome(false, latency, format!("answer {name}"));
    }
    let values: Vec<String> = answer
        .answers()
        .iter()
        .filter(|r| r.record_type() == question.record)
        .map(|r| r.data().to_string())
        .collect();
    if values.is_empty() {
        return outcome(
            false,
            latency,
            format!("no {} record for {}", question.record, question.name),
        );
    }
    let norm = |s: &str| s.trim_end_matches('.').to_ascii_lowercase();
    let have: Vec<String> = values.iter().map(|v| norm(v)).collect();
    let missing: Vec<&str> = question
        .expect
        .iter()
        .filter(|e| !have.contains(&norm(e)))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        outcome(true, latency, format!("answer {}", values.join(", ")))
    } else {
        outcome(
            false,
            latency,
            format!("answer {} lacks {}", values.join(", "), missing.join(", ")),
        )
    }
}

#[cfg(test)]
#[path = "protocols_tests.rs"]
mod tests;
