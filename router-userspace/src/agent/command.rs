//! What the runtime executes. Every change to the running agent is a [`Command`], executed one
//! at a time by the event loop — probe verdicts, next hops, deadlines, counter samples, applies,
//! and the operator's `state set` and overrides alike — so the order of two changes is the order
//! they reached the loop. A [`Query`] reads a snapshot of the runtime between two commands.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use rules::engine::{AuditRecord, CanaryOp, OverrideRequest, RampStatus};
use tokio::sync::oneshot;

use super::apply::Outcome;
use crate::{
    api::{ctl::StateEntry, metrics::Scrape, status::Status},
    config::Fragments,
    decision::GroupExplanation,
    nexthop::NextHopEvent,
    probe::{HealthEvent, agent_check::AgentRead},
};

/// An answer: the value, or what was wrong (for a `400`).
pub type Reply<T> = oneshot::Sender<Result<T, String>>;

/// One switch written into the maps.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Published {
    /// The group.
    pub group: String,
    /// The new action.
    pub to: rules::engine::Action,
    /// The word written.
    pub word: u64,
    /// From the triggering event to the completed write, µs.
    pub latency_us: u64,
}

/// What `ctl backend` asks of one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainOp {
    /// Drain it; evict it once the timeout (if any) passes.
    Drain(Option<Duration>),
    /// End its drain.
    Undrain,
}

/// One change to the running agent.
#[derive(Debug)]
pub enum Command {
    /// A probe's result.
    Health(HealthEvent),
    /// A round of next-hop changes from the resolver.
    NextHops(Vec<NextHopEvent>),
    /// A decision group's deadline may have passed.
    Deadline,
    /// The one-second tick: sample the counters into the rates the rules read.
    Sample,
    /// Read the config directory and apply it. `only_if_changed`: only when its fragments
    /// changed since they were last read (the directory watch).
    ApplyDirectory {
        /// `watch`, `sighup`, `ctl apply`.
        source: &'static str,
        /// Skip fragments already read.
        only_if_changed: bool,
        /// Where the outcome goes (none for the watch and SIGHUP).
        reply: Option<Reply<Outcome>>,
    },
    /// Apply these fragments (a rollback to a recorded version).
    Apply {
        /// The fragments.
        fragments: Fragments,
        /// `rollback to N`.
        source: String,
        /// Where the outcome goes.
        reply: Reply<Outcome>,
    },
    /// The history recorded (or failed to record) the version of the apply whose fragments
    /// hash to `hash`.
    Recorded {
        /// The applied fragments' content hash.
        hash: String,
        /// The version number, `None` when the record failed.
        version: Option<u64>,
    },
    /// `ctl state set NAME=VALUE`.
    SetState {
        /// Variable.
        name: String,
        /// Value as text.
        value: String,
        /// When the API took the request: the start of the decision's latency.
        event: Instant,
        /// Whether anything changed.
        reply: Reply<bool>,
    },
    /// `ctl override` (`Some`) or `ctl override clear` (`None`).
    Override {
        /// The group.
        group: String,
        /// The override.
        request: Option<OverrideRequest>,
        /// When the API took the request.
        event: Instant,
        /// The switch written, if the override switched the group.
        reply: Reply<Option<Published>>,
    },
    /// `ctl canary pause|resume|abort`.
    Canary {
        /// The group.
        group: String,
        /// What to do.
        op: CanaryOp,
        /// When the API took the request.
        event: Instant,
        /// The ramp afterwards, and the switch written if the share changed.
        reply: Reply<(RampStatus, Option<Published>)>,
    },
    /// `ctl backend drain` or `ctl backend undrain`.
    Drain {
        /// The pool.
        pool: String,
        /// The backend's address.
        address: IpAddr,
        /// What to do.
        op: DrainOp,
        /// Whether the maps changed.
        reply: Reply<bool>,
    },
    /// `switchyard flows --purge`, once the flows are deleted from connection tracking:
    /// advance the generation of these backend slots, so no CPU's flow cache serves a copy of
    /// a purged flow (`Publisher::renew_generations`). The answer: how many were written.
    RenewGenerations {
        /// Backend slots.
        slots: Vec<u32>,
        /// How many slots were written.
        reply: Reply<usize>,
    },
    /// An agent-check's answer (or why there was none).
    AgentCheck(AgentRead),
    /// What the fleet's etcd task learned (`crate::fleet`).
    Fleet(crate::fleet::FleetEvent),
    /// A read.
    Query(Query),
}

impl From<AgentRead> for Command {
    fn from(read: AgentRead) -> Self {
        Command::AgentCheck(read)
    }
}

/// A read of the runtime, answered between two commands.
#[derive(Debug)]
pub enum Query {
    /// `GET /status`.
    Status(oneshot::Sender<Status>),
    /// `GET /state`.
    State(oneshot::Sender<Vec<StateEntry>>),
    /// `GET /decisions`, optionally one group's.
    Decisions(Option<String>, oneshot::Sender<Vec<AuditRecord>>),
    /// `GET /explain/{group}` (no sets) and `POST /what-if` (`var=value` sets).
    Explain {
        /// The group.
        group: String,
        /// Hypothetical values.
        sets: Vec<(String, String)>,
        /// The explanation.
        reply: Reply<GroupExplanation>,
    },
    /// `GET /metrics`: the values read at scrape time.
    Scrape(oneshot::Sender<Scrape>),
    /// The running version, for `GET /versions`.
    Running(oneshot::Sender<Option<u64>>),
    /// `GET /weights/{pool}`.
    Weights(String, Reply<crate::api::weights::PoolWeightsView>),
    /// `GET /canary/{group}`: the group's canary ramp, with its next step in seconds from now.
    Canary(String, Reply<crate::api::ctl::CanaryView>),
    /// The names of the published service and backend slots (`GET /flows`,
    /// `POST /flows/purge`).
    FlowCatalog(oneshot::Sender<crate::flows::Catalog>),
    /// `GET /classes`: the client classes and their new flows.
    Classes(Reply<crate::api::classes::ClassesView>),
    /// `GET /trace`: where a new flow `client` → `vip` (`proto`) goes.
    Trace {
        /// The client's address and port.
        client: std::net::SocketAddr,
        /// The virtual IP and port.
        vip: std::net::SocketAddr,
        /// `router_common::PROTO_TCP` or `PROTO_UDP`.
        proto: u8,
        /// The trace.
        reply: Reply<crate::trace::Trace>,
    },
}
