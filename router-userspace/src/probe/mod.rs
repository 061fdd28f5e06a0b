//! Health probes: the scheduler that runs one task per backend and reports every probe.
//!
//! - [`policy`] decides health and probe spacing (pure; thresholds, jitter, backoff).
//! - [`check`] runs one probe (TCP connect or HTTP status, with a timeout).
//! - [`spawn`] ties them together: each task loops *probe → [`HealthState::record`] → send a
//!   [`HealthEvent`] → sleep [`HealthState::next_delay`]*. The spacing is measured from the end
//!   of one probe to the start of the next, and the first probe runs at once.
//!
//! Every probe is reported, not only transitions: the agent feeds outcomes into its latency
//! histogram and rebuilds tables on transitions. Each target starts from the health table's
//! verdict ([`ProbeTarget::healthy`]): one that starts healthy reports `healthy: true` until
//! `unhealthy_threshold` failures, and one that starts down — down, or awaiting its first
//! check ([`crate::health`]) — reports `healthy: false` until `healthy_threshold` passes in a
//! row bring the [`Transition::Up`] that puts it in service.

pub mod agent_check;
pub mod check;
pub mod policy;
pub mod protocols;
#[cfg(test)]
mod test_support;

use std::{net::IpAddr, time::Duration};

use tokio::{sync::mpsc, task::JoinSet};

pub use check::{Checker, ProbeOutcome};
pub use policy::{HealthState, Transition};

use crate::config::{Config, HealthCheck, model::StateSource};

/// Floor on the time between two probes of one target, so a zero interval cannot spin a core.
pub const MIN_DELAY: Duration = Duration::from_millis(10);

/// What a probe's verdict is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    /// A backend of a pool with a health check.
    Backend {
        /// The pool.
        pool: String,
        /// The backend's address.
        address: IpAddr,
    },
    /// A `state:` variable with a `probe:` source.
    State(String),
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Backend { pool, address } => write!(f, "{pool}/{address}"),
            Self::State(var) => write!(f, "state {var}"),
        }
    }
}

/// One thing to probe.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeTarget {
    /// What the verdict is about.
    pub subject: Subject,
    /// The address probed (the port comes from the check); `None` for an `exec` state probe.
    pub address: Option<IpAddr>,
    /// How and how often to probe it.
    pub check: HealthCheck,
    /// Its health when probing starts: the health table's verdict (a probe that assumed "up"
    /// would never report the recovery of a backend that is down). `false` for a backend
    /// awaiting its first check, so that only `healthy_threshold` passed probes in a row put
    /// it in service.
    pub healthy: bool,
}

/// The probes of `cfg`: every backend of a pool with a health check, starting from
/// `healthy(pool, address)`, then every probe variable (starting healthy).
pub fn targets(cfg: &Config, healthy: impl Fn(&str, IpAddr) -> bool) -> Vec<ProbeTarget> {
    let backends = cfg
        .pools
        .iter()
        .filter_map(|p| p.health_check.as_ref().map(|hc| (p, hc)))
        .flat_map(|(p, hc)| p.backends.iter().map(move |b| (p, hc, b.address)))
        .map(|(p, hc, address)| ProbeTarget {
            subject: Subject::Backend {
                pool: p.name.clone(),
                address,
            },
            address: Some(address),
            check: hc.clone(),
            healthy: healthy(&p.name, address),
        });
    let state = cfg.state.iter().filter_map(|v| match &v.source {
        StateSource::Probe(p) => Some(ProbeTarget {
            subject: Subject::State(v.name.clone()),
            address: p.address,
            check: p.check.clone(),
            healthy: true,
        }),
        _ => None,
    });
    backends.chain(state).collect()
}

/// The result of one probe, with the health it leaves its subject in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthEvent {
    /// What was probed.
    pub subject: Subject,
    /// What the probe saw.
    pub outcome: ProbeOutcome,
    /// The change of health this probe caused, if any (at most one per threshold crossing).
    pub transition: Option<Transition>,
    /// Whether the subject counts as healthy after this probe.
    pub healthy: bool,
}

/// The running probe tasks of one configuration. Dropping it aborts them all, so applying a new
/// configuration is `set = probe::spawn(new_targets, tx)`: the old tasks stop, and the new
/// ones start from each target's `healthy`.
#[must_use = "dropping a ProbeSet stops its probes"]
#[derive(Debug)]
pub struct ProbeSet {
    tasks: JoinSet<()>,
}

impl ProbeSet {
    /// Number of targets being probed.
    #[must_use]
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether no target is being probed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

/// Starts one probe task per target, each sending a [`HealthEvent`] on `events` after every
/// probe.
///
/// A task waits for room in the channel, so a consumer that falls behind delays that target's
/// next probe rather than losing a transition; a task whose receiver is gone stops.
///
/// # Panics
///
/// If called outside a tokio runtime (as `tokio::spawn` does).
#[expect(
    clippy::needless_pass_by_value,
    reason = "the set takes the sender it is given: when its tasks end, a channel fed by it \
              alone closes"
)]
pub fn spawn(targets: Vec<ProbeTarget>, events: mpsc::Sender<HealthEvent>) -> ProbeSet {
    let mut tasks = JoinSet::new();
    for target in targets {
        tasks.spawn(run(target, events.clone()));
    }
    ProbeSet { tasks }
}

async fn run(target: ProbeTarget, events: mpsc::Sender<HealthEvent>) {
    let checker = Checker::new(target.address, &target.check);
    let mut state = HealthState::resume(&target.check, target.healthy);
    loop {
        let outcome = checker.probe().await;
        let transition = state.record(outcome.success);
        if let Some(t) = transition {
            log::debug!("probe {}: {t:?} ({})", target.subject, outcome.detail);
        }
        let event = HealthEvent {
            subject: target.subject.clone(),
            outcome,
            transition,
            healthy: state.is_healthy(),
        };
        if events.send(event).await.is_err() {
            return;
        }
        let jitter = fastrand::f64() * 2.0 - 1.0;
        tokio::time::sleep(state.next_delay(jitter).max(MIN_DELAY)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::HttpServer;
    use super::*;
    use crate::config::{Backoff, CheckKind};
    use std::net::Ipv6Addr;
    use tokio::net::TcpListener;

    /// Bound on any single wait in these tests; reached only when something is broken.
    const PATIENCE: Duration = Duration::from_secs(10);

    fn fast_check(kind: CheckKind) -> HealthCheck {
        HealthCheck {
            kind,
            interval: Duration::from_millis(20),
            timeout: Duration::from_millis(500),
            unhealthy_threshold: 3,
            healthy_threshold: 2,
            backoff: Backoff {
                factor: 2.0,
                max: Duration::from_millis(80),
            },
        }
    }

    fn target(pool: &str, address: IpAddr, kind: CheckKind) -> ProbeTarget {
        ProbeTarget {
            subject: Subject::Backend {
                pool: pool.to_owned(),
                address,
            },
            address: Some(address),
            check: fast_check(kind),
            healthy: true,
        }
    }

    async fn next(rx: &mut mpsc::Receiver<HealthEvent>) -> HealthEvent {
        tokio::time::timeout(PATIENCE, rx.recv())
            .await
            .expect("no event in time")
            .expect("channel closed")
    }

    #[tokio::test]
    async fn a_target_that_goes_down_produces_exactly_one_down_after_the_threshold() {
        let ip = IpAddr::from([127, 0, 0, 1]);
        // Never accepted: connects complete in the kernel's backlog until the listener closes.
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, mut rx) = mpsc::channel(16);
        let _set = spawn(vec![target("web", ip, CheckKind::Tcp { port })], tx);

        for _ in 0..2 {
            let ev = next(&mut rx).await;
            assert!(
                ev.outcome.success && ev.healthy && ev.transition.is_none(),
                "{ev:?}"
            );
        }
        drop(listener);

        let mut failures = 0;
        let mut downs = Vec::new();
        while failures < 7 {
            let ev = next(&mut rx).await;
            if ev.outcome.success {
                assert_eq!(failures, 0, "success after a failure: {ev:?}");
                continue;
            }
            failures += 1;
            assert_eq!(ev.outcome.detail, "connection refused");
            assert_eq!(ev.healthy, failures < 3, "{ev:?}");
            if let Some(t) = ev.transition {
                downs.push((failures, t));
            }
        }
        assert_eq!(downs, [(3, Transition::Down)]);
    }

    #[tokio::test]
    async fn a_recovering_http_target_reports_one_down_then_one_up() {
        let ip = IpAddr::from(Ipv6Addr::LOCALHOST);
        let server = HttpServer::start(ip, 200).await;
        let kind = CheckKind::Http {
            port: server.port(),
            path: "/healthz".to_owned(),
            expect: vec![200],
        };
        let (tx, mut rx) = mpsc::channel(16);
        let _set = spawn(vec![target("api", ip, kind)], tx);

        let first = next(&mut rx).await;
        assert_eq!(
            first.subject,
            Subject::Backend {
                pool: "api".into(),
                address: ip
            }
        );
        assert_eq!(first.outcome.detail, "status 200");
        assert!(first.healthy);

        server.set_status(503);
        let mut transitions = Vec::new();
        let mut failed = 0;
        loop {
            let ev = next(&mut rx).await;
            if !ev.outcome.success {
                assert_eq!(ev.outcome.detail, "status 503");
                failed += 1;
            }
            transitions.extend(ev.transition);
            if ev.transition == Some(Transition::Down) {
                assert_eq!(failed, 3);
                break;
            }
        }
        server.set_status(200);
        let mut passed = 0;
        loop {
            let ev = next(&mut rx).await;
            passed += usize::from(ev.outcome.success);
            transitions.extend(ev.transition);
            if ev.transition == Some(Transition::Up) {
                assert!(ev.healthy);
                break;
            }
        }
        assert_eq!(passed, 2);
        assert_eq!(transitions, [Transition::Down, Transition::Up]);
    }

    #[tokio::test]
    async fn every_target_is_probed_by_its_own_task() {
        let v4 = IpAddr::from([127, 0, 0, 1]);
        let v6 = IpAddr::from(Ipv6Addr::LOCALHOST);
        let listener = TcpListener::bind((v4, 0)).await.unwrap();
        let tcp_port = listener.local_addr().unwrap().port();
        let server = HttpServer::start(v6, 200).await;
        let targets = vec![
            target("a", v4, CheckKind::Tcp { port: tcp_port }),
            target(
                "b",
                v6,
                CheckKind::Http {
                    port: server.port(),
                    path: "/".to_owned(),
                    expect: vec![200],
                },
            ),
        ];
        let (tx, mut rx) = mpsc::channel(16);
        let set = spawn(targets, tx);
        assert_eq!(set.len(), 2);

        let mut seen = std::collections::HashSet::new();
        while seen.len() < 2 {
            let ev = next(&mut rx).await;
            assert!(ev.outcome.success, "{ev:?}");
            seen.insert(ev.subject);
        }
        let backend = |pool: &str, address| Subject::Backend {
            pool: pool.into(),
            address,
        };
        assert!(seen.contains(&backend("a", v4)) && seen.contains(&backend("b", v6)));
    }

    #[tokio::test]
    async fn dropping_the_set_stops_its_probes() {
        let ip = IpAddr::from([127, 0, 0, 1]);
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, mut rx) = mpsc::channel(16);
        let set = spawn(vec![target("web", ip, CheckKind::Tcp { port })], tx);
        next(&mut rx).await;
        drop(set);
        // The aborted tasks drop their senders, which closes the channel.
        let drained = tokio::time::timeout(PATIENCE, async {
            let mut n = 0;
            while rx.recv().await.is_some() {
                n += 1;
            }
            n
        })
        .await
        .expect("channel still open after the set was dropped");
        assert!(drained <= 16);
    }

    #[tokio::test]
    async fn an_empty_set_is_empty() {
        let (tx, _rx) = mpsc::channel(1);
        let set = spawn(Vec::new(), tx);
        assert!(set.is_empty());
        assert_eq!(set.len(), 0);
    }
}
