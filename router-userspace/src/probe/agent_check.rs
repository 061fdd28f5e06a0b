//! `HAProxy` agent-check clients: one tokio task per backend of a pool with
//! `weights.adaptive.agent_check`, which connects to the backend's agent port, reads one line
//! (at most [`MAX_ANSWER`] bytes, until a line end or the agent closes), and reports what it read
//! or why it read nothing. What the line means is `crate::weights::answer`'s.

use std::net::{IpAddr, SocketAddr};

use tokio::{io::AsyncReadExt as _, net::TcpStream, sync::mpsc, task::JoinSet};

use super::MIN_DELAY;
use crate::{
    config::{AgentCheck, Config},
    weights::answer::MAX_ANSWER,
};

/// One read of a backend's agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentRead {
    /// The pool.
    pub pool: String,
    /// The backend.
    pub address: IpAddr,
    /// The line read (without its line end), or why there was none.
    pub read: Result<Vec<u8>, String>,
}

/// The running agent-check tasks of one configuration; dropping it stops them.
#[must_use = "dropping an AgentCheckSet stops its checks"]
#[derive(Debug)]
pub struct AgentCheckSet {
    tasks: JoinSet<()>,
}

impl AgentCheckSet {
    /// Number of backends being asked.
    #[must_use]
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether no backend is asked.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

/// Starts one task per backend of every pool of `cfg` with an agent-check, each sending an
/// [`AgentRead`] (converted into `T`) after every attempt.
///
/// # Panics
///
/// If called outside a tokio runtime.
pub fn spawn<T>(cfg: &Config, events: &mpsc::Sender<T>) -> AgentCheckSet
where
    T: From<AgentRead> + Send + 'static,
{
    let mut tasks = JoinSet::new();
    for pool in &cfg.pools {
        let Some(check) = pool.adaptive.as_ref().and_then(|a| a.agent_check.clone()) else {
            continue;
        };
        for b in &pool.backends {
            tasks.spawn(run(
                pool.name.clone(),
                b.address,
                check.clone(),
                events.clone(),
            ));
        }
    }
    AgentCheckSet { tasks }
}

async fn run<T: From<AgentRead>>(
    pool: String,
    address: IpAddr,
    check: AgentCheck,
    events: mpsc::Sender<T>,
) {
    let target = SocketAddr::new(address, check.port);
    loop {
        let read = match tokio::time::timeout(check.timeout, read_line(target)).await {
            Ok(read) => read,
            Err(_) => Err(format!(
                "no answer within {}",
                humantime::format_duration(check.timeout)
            )),
        };
        let event = AgentRead {
            pool: pool.clone(),
            address,
            read,
        };
        if events.send(event.into()).await.is_err() {
            return;
        }
        // ±10 % jitter, as the health checks have, so the agents are not asked in lockstep.
        let jitter = 1.0 + (fastrand::f64() * 2.0 - 1.0) * 0.1;
        tokio::time::sleep(check.interval.mul_f64(jitter).max(MIN_DELAY)).await;
    }
}

/// Connects to `target` and reads up to the first line end, the agent's close, or one byte
/// past [`MAX_ANSWER`] (which the parser refuses).
async fn read_line(target: SocketAddr) -> Result<Vec<u8>, String> {
    let mut stream = TcpStream::connect(target)
        .await
        .map_err(|e| format!("connecting to {target}: {e}"))?;
    let mut line = Vec::with_capacity(64);
    let mut buf = [0u8; 128];
    loop {
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| format!("reading from {target}: {e}"))?;
        let chunk = buf.get(..n).unwrap_or_default();
        if let Some(end) = chunk.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(chunk.get(..end).unwrap_or_default());
            return Ok(line);
        }
        line.extend_from_slice(chunk);
        if n == 0 || line.len() > MAX_ANSWER {
            return Ok(line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Time a test waits for an answer before it fails.
    const PATIENCE: Duration = Duration::from_secs(10);
    use tokio::{io::AsyncWriteExt as _, net::TcpListener};

    async fn serve_once(answer: &'static [u8]) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let _ = s.write_all(answer).await;
        });
        addr
    }

    #[tokio::test]
    async fn reads_one_line_up_to_its_end_or_the_close() {
        let addr = serve_once(b"50% drain\nignored\n").await;
        let got = tokio::time::timeout(PATIENCE, read_line(addr))
            .await
            .unwrap();
        assert_eq!(got, Ok(b"50% drain".to_vec()));
        let addr = serve_once(b"up").await;
        let got = tokio::time::timeout(PATIENCE, read_line(addr))
            .await
            .unwrap();
        assert_eq!(got, Ok(b"up".to_vec()));
        let long: &'static [u8] = Box::leak(vec![b'x'; 4 * MAX_ANSWER].into_boxed_slice());
        let addr = serve_once(long).await;
        let got = tokio::time::timeout(PATIENCE, read_line(addr))
            .await
            .unwrap();
        assert!(got.unwrap().len() > MAX_ANSWER);
    }

    #[tokio::test]
    async fn a_refused_connection_says_so() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let got = tokio::time::timeout(PATIENCE, read_line(addr))
            .await
            .unwrap();
        assert!(
            got.unwrap_err()
                .starts_with(&format!("connecting to {addr}"))
        );
    }
}
