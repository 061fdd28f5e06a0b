//! Local servers for the probe tests: a minimal HTTP responder, a server that never answers,
//! and a port known to be closed. Loopback only.

use std::{
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU16, Ordering},
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

/// Aborts a server task when dropped.
pub(crate) struct Guard(pub(crate) JoinHandle<()>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Answers every request with a fixed, changeable status and an empty body, then closes.
pub(crate) struct HttpServer {
    port: u16,
    status: Arc<AtomicU16>,
    requests: Arc<Mutex<Vec<String>>>,
    _task: Guard,
}

impl HttpServer {
    pub(crate) async fn start(ip: IpAddr, status: u16) -> Self {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let status = Arc::new(AtomicU16::new(status));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (st, rq) = (status.clone(), requests.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(respond(stream, st.clone(), rq.clone()));
            }
        });
        Self {
            port,
            status,
            requests,
            _task: Guard(task),
        }
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn set_status(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    /// Request heads received so far (request line and headers).
    pub(crate) fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

async fn respond(mut stream: TcpStream, status: Arc<AtomicU16>, requests: Arc<Mutex<Vec<String>>>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    requests
        .lock()
        .unwrap()
        .push(String::from_utf8_lossy(&head).into_owned());
    let status = status.load(Ordering::SeqCst);
    let response =
        format!("HTTP/1.1 {status} Test\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Accepts connections and never sends a byte. Returns the port and the server's guard.
pub(crate) async fn silent_server(ip: IpAddr) -> (u16, Guard) {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    (port, Guard(task))
}

/// A port on `ip` that was just bound and released, so nothing listens on it.
pub(crate) async fn closed_port(ip: IpAddr) -> u16 {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    listener.local_addr().unwrap().port()
}
