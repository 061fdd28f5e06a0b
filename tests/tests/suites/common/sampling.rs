//! Client connections opened one after another while a test changes the system, each with
//! when it started and which backend answered: the samples the timing suites measure
//! detection and switch times from.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;
use router_tests::{client::TcpSession, netns::Netns};

/// One client connection of a [`Stream`]: when it started, and the backend that echoed.
pub struct Conn {
    pub started: Instant,
    pub backend: Result<String, String>,
    /// The client's source port.
    pub port: Option<u16>,
}

/// Client connections opened one after another from the client namespace until stopped.
pub struct Stream {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Conn>>,
}

impl Stream {
    pub fn start(ns: &Netns, addr: SocketAddr) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = ns.spawn(move || {
            let mut conns = Vec::new();
            while !flag.load(Ordering::SeqCst) {
                let started = Instant::now();
                let (backend, port) = match exchange(addr) {
                    Ok((b, p)) => (Ok(b), Some(p)),
                    Err(e) => (Err(format!("{e:#}")), None),
                };
                conns.push(Conn {
                    started,
                    backend,
                    port,
                });
            }
            conns
        })?;
        Ok(Self { stop, thread })
    }

    pub fn finish(self) -> Vec<Conn> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or_default()
    }
}

/// Connects, echoes a short payload, closes; returns the backend and the source port.
pub fn exchange(addr: SocketAddr) -> Result<(String, u16)> {
    let mut s = TcpSession::connect(addr)?;
    let port = s.local_addr()?.port();
    s.echo(b"ping\n")?;
    let backend = s.backend().to_owned();
    s.finish()?;
    Ok((backend, port))
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
