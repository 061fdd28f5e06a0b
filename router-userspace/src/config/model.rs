//! The validated runtime configuration: what the rest of the agent consumes. Produced only by
//! `config::load` (parse → validate → convert); every value here has passed validation, so
//! consumers need no error paths for malformed config.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

/// Default `agent.api`: loopback, port 9900.
pub const DEFAULT_API: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9900);
/// Default `agent.pin_path`.
pub const DEFAULT_PIN_PATH: &str = "/sys/fs/bpf/switchyard";
/// Default `agent.state_dir`: where the agent keeps what must survive a restart (the audit log
/// of decisions).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/switchyard";
/// Default backend weight.
pub const DEFAULT_WEIGHT: u32 = 100;
/// Largest backend weight.
pub const MAX_WEIGHT: u32 = 65_535;
/// Default health check interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// Default health check timeout (capped at the interval).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default consecutive failures that mark a backend down.
pub const DEFAULT_UNHEALTHY_THRESHOLD: u32 = 3;
/// Default consecutive successes that mark a down backend up.
pub const DEFAULT_HEALTHY_THRESHOLD: u32 = 2;
/// Default backoff factor: no backoff.
pub const DEFAULT_BACKOFF_FACTOR: f64 = 1.0;
/// Default HTTP health check path.
pub const DEFAULT_HTTP_PATH: &str = "/";
/// Default accepted HTTP status codes.
pub const DEFAULT_HTTP_EXPECT: &[u16] = &[200];
/// Shortest `conntrack:` timeout: twice the interval at which the program rewrites a busy
/// flow's last-seen time (`router_common::SEEN_REFRESH`, about a second), so a flow that sends
/// packets never looks idle.
pub const MIN_FLOW_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest `conntrack.second_chance`: an hour.
pub const MAX_SECOND_CHANCE: Duration = Duration::from_hours(1);
/// Longest `conntrack:` timeout: 7 days.
pub const MAX_FLOW_TIMEOUT: Duration = Duration::from_hours(7 * 24);

const _: () = assert!(
    router_common::ticks(MAX_FLOW_TIMEOUT) < router_common::MAX_TIMEOUT_TICKS,
    "the longest conntrack timeout fits the program's clock"
);

/// Host ports one virtual IP may pass to the host's stack ([`Vip::host_ports`]).
pub const MAX_HOST_PORTS: usize = router_common::VIP_HOST_PORTS;

/// `vips:` entry: what the balancer does with traffic to a virtual IP (the address of one or
/// more services) that no service takes. Every service's address is a virtual IP with the
/// defaults (`echo: true`, no host ports) unless an entry says otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vip {
    /// The virtual IP: some service's `vip`.
    pub address: IpAddr,
    /// Answer ICMP and `ICMPv6` echo requests to it, from it, while one of its services has a
    /// usable backend (default `true`).
    pub echo: bool,
    /// `(protocol, port)` passed to the host's stack instead of dropped, at most
    /// [`MAX_HOST_PORTS`] (a port no service of the address has).
    pub host_ports: Vec<(Protocol, u16)>,
    /// New flows a second the address takes across its services (1 – 100,000,000); past it
    /// a new flow is dropped (`vip_rate_limited`) and tracked flows go on. `None`: no limit.
    pub new_flows_per_second: Option<u32>,
}

/// The whole merged configuration of one config directory.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `agent:`.
    pub agent: Agent,
    /// `fleet:`: `None` when the node decides on its own (no etcd).
    pub fleet: Option<Fleet>,
    /// `conntrack:`.
    pub conntrack: Conntrack,
    /// `vips:`: settings of virtual IPs that differ from the defaults ([`Vip`]), in file order.
    pub vips: Vec<Vip>,
    /// `announce:`: how the agent announces its virtual IPs to a routing daemon; `None`
    /// (no `announce:`) announces nothing.
    pub announce: Option<Announce>,
    /// `services:`, in file order (files in name order).
    pub services: Vec<Service>,
    /// `pools:`, in file order (files in name order).
    pub pools: Vec<Pool>,
    /// `state:` variables, in file order.
    pub state: Vec<StateVar>,
    /// `decisions:` groups, in file order.
    pub decisions: Vec<DecisionGroup>,
    /// `classes:`: client classes by source prefix, sorted by name (at most [`MAX_CLASSES`]);
    /// a class's id in the maps is its place here plus one ([`Config::class_id`]).
    pub classes: Vec<ClientClass>,
    /// `hooks:`: what runs on switches, health transitions and rejected configs, in file order.
    pub hooks: Vec<Hook>,
    /// The expressions of `state` and `decisions`, compiled once (at the end of validation).
    pub rules: std::sync::Arc<super::compiled::Rules>,
}

impl Config {
    /// This configuration with its rules compiled ([`super::compiled::compile`]); validation
    /// calls it, and so do tests that build a configuration by hand.
    ///
    /// # Errors
    ///
    /// What did not compile (validation reports it before this is reached).
    pub fn compiled(mut self) -> Result<Self, String> {
        self.rules = std::sync::Arc::new(super::compiled::compile(&self)?);
        Ok(self)
    }

    /// The id of client class `name` in the maps (1..=[`MAX_CLASSES`]: its place in
    /// [`Config::classes`], sorted by name, plus one); `None` for a name that is no class
    /// (`default` among them: class 0).
    #[must_use]
    pub fn class_id(&self, name: &str) -> Option<u32> {
        let i = self.classes.iter().position(|c| c.name == name)?;
        u32::try_from(i + 1).ok()
    }

    /// The prefix set the program's `CLIENT_CLASSES` trie is to hold: every class's prefixes
    /// with the id of the class that wins there. The trie takes the longest prefix that holds a
    /// client; a prefix nested in one of a class with a higher `precedence` is written with
    /// that class, so the trie's answer is, for every address, the class of highest precedence
    /// among the prefixes that hold it, the longest prefix among equals (decision 0037).
    #[must_use]
    pub fn class_prefixes(&self) -> std::collections::BTreeMap<SourceRange, u32> {
        let all: Vec<(SourceRange, u32, u32)> = self
            .classes
            .iter()
            .zip(1u32..)
            .flat_map(|(c, id)| {
                c.prefixes
                    .iter()
                    .map(move |p| (*p, id, c.precedence.unwrap_or(0)))
            })
            .collect();
        all.iter()
            .map(|&(p, id, _)| {
                // Every prefix that holds `p` (itself among them) competes for its addresses:
                // the prefixes that hold one address nest, so the trie's longest match `p`
                // answers for all of them.
                let winner = all
                    .iter()
                    .filter(|(q, _, _)| q.contains_range(p))
                    .max_by_key(|(q, _, precedence)| (*precedence, q.prefix))
                    .map_or(id, |w| w.1);
                (p, winner)
            })
            .collect()
    }
}

/// Most client classes: the program's class ids are 1..=15 (0 is no class).
pub const MAX_CLASSES: usize = router_common::MAX_CLASSES as usize;

/// Most prefixes of all client classes together (the size of the program's trie).
pub const MAX_CLASS_PREFIXES: usize = router_common::MAX_CLASS_PREFIXES as usize;

/// `classes.<name>`: the clients whose source address is under one of the prefixes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientClass {
    /// Name (letters, digits, `-`, `_`; not `default`, which a `by_class` action gives to
    /// clients of no class).
    pub name: String,
    /// Source prefixes, IPv4 and IPv6, host bits zero (at least one); no prefix is in two
    /// classes.
    pub prefixes: Vec<SourceRange>,
    /// Which class wins where its prefixes nest with another class's: the higher, whatever
    /// the prefix lengths (absent counts as 0; among equals the longest prefix wins).
    pub precedence: Option<u32>,
}

/// `agent:` settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Agent {
    /// HTTP API and `/metrics` (default `127.0.0.1:9900`); an address other than a loopback
    /// one only with [`Agent::api_token_file`].
    pub api: SocketAddr,
    /// A file holding the API's bearer token (absolute path; one line of at least
    /// [`MIN_API_TOKEN_LEN`] printable characters, no spaces). With it every request needs
    /// `Authorization: Bearer TOKEN` (RFC 6750 §2.1), else `401`; `status` and `ctl` read it.
    pub api_token_file: Option<PathBuf>,
    /// With a token, `GET` requests (status, metrics, versions, decisions, explain, weights:
    /// nothing that changes the agent) are answered without one (default `false`).
    pub api_open_read: bool,
    /// bpffs directory the maps and the XDP link are pinned under, absolute (default
    /// `/sys/fs/bpf/switchyard`).
    pub pin_path: PathBuf,
    /// Directory for what must survive an agent restart, such as the audit log of decisions,
    /// absolute (default `/var/lib/switchyard`).
    pub state_dir: PathBuf,
}

impl Default for Agent {
    fn default() -> Self {
        Self {
            api: DEFAULT_API,
            api_token_file: None,
            api_open_read: false,
            pin_path: PathBuf::from(DEFAULT_PIN_PATH),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
        }
    }
}

/// The shortest API token `agent.api_token_file` may hold, in bytes.
pub const MIN_API_TOKEN_LEN: usize = 16;

/// Default `fleet.prefix`.
pub const DEFAULT_FLEET_PREFIX: &str = "/switchyard";
/// Default `fleet.lease_ttl`.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(2);
/// Default `fleet.dial_timeout`.
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(2);
/// Default `fleet.request_timeout`.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Bounds of `fleet.lease_ttl`: etcd counts a lease in whole seconds.
pub const LEASE_TTL_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_mins(1));
/// Bounds of `fleet.dial_timeout` and `fleet.request_timeout`.
pub const FLEET_TIMEOUT_RANGE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_mins(1));

/// `fleet:` settings: the etcd cluster on which a fleet of balancers elects one leader per
/// decision group and shares decisions, pushed state and overrides (`crate::fleet`). Taken when
/// the agent starts; a reload that changes them is refused until a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fleet {
    /// This node's name, unique in the fleet (default: the host name); letters, digits, `.`,
    /// `_`, `-`, at most 63 bytes.
    pub node: String,
    /// etcd client endpoints, `http://HOST:PORT`, or `https://HOST:PORT` with [`Fleet::tls`]
    /// (at least one, no duplicates; `HOST:PORT` in the file takes the scheme `tls` implies).
    pub endpoints: Vec<String>,
    /// Prefix of every key the fleet writes (default `/switchyard`): starts with `/`, no
    /// trailing `/`.
    pub prefix: String,
    /// TTL of the node's lease, whole seconds, 1 s to 60 s (default 2 s): a dead leader's groups
    /// are taken over at most this long after its last keep-alive.
    pub lease_ttl: Duration,
    /// How long a connection to an endpoint may take, 100 ms to 60 s (default 2 s).
    pub dial_timeout: Duration,
    /// How long one etcd request may take, 100 ms to 60 s (default 1 s); past it etcd counts as
    /// unreachable.
    pub request_timeout: Duration,
    /// TLS to etcd (`https://` endpoints), `None` for plain HTTP.
    pub tls: Option<FleetTls>,
}

/// `fleet.tls:`: TLS to etcd (etcd's `--cert-file`/`--key-file`, and `--client-cert-auth`
/// with `--trusted-ca-file` when the agent shows a client certificate). The files are PEM, read
/// again at each connection to etcd, so certificates renewed in place are taken at the next
/// reconnection; validation reads them once to report a missing or malformed file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetTls {
    /// The CA certificate(s) the agent verifies etcd's server certificate against (absolute path).
    pub ca: PathBuf,
    /// The client certificate and its private key (absolute paths), `None` without client
    /// authentication.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The name etcd's certificate must carry, `None` for each endpoint's host.
    pub server_name: Option<String>,
}

/// `conntrack:` settings: how long a tracked flow may stay idle in each state before it is a
/// new flow again (its next packet is selected from the current table). Each is 1 s to 7 days.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conntrack {
    /// A TCP flow that has sent only a SYN (default 60 s).
    pub tcp_syn: Duration,
    /// A TCP flow that sent more than a SYN, and neither FIN nor RST (default 900 s).
    pub tcp_established: Duration,
    /// A TCP flow whose client sent a FIN or an RST (default 10 s).
    pub tcp_closing: Duration,
    /// A UDP flow (default 60 s).
    pub udp: Duration,
    /// How long after a pool's table changes a TCP packet without a tracked flow that opens no
    /// connection goes to the backend the previous table names (`router_common::POOL_F_SECOND_CHANCE`):
    /// 0 (the default) is never, at most an hour.
    pub second_chance: Duration,
}

impl Conntrack {
    /// The timeouts in ticks of the program's clock, indexed by flow state
    /// (`router_common::FLOW_TCP_SYN`, `FLOW_TCP_OPEN`, `FLOW_TCP_CLOSING`, `FLOW_UDP`): the
    /// `timeouts` of the `CONFIG` map.
    #[must_use]
    pub fn ticks(&self) -> [u32; router_common::FLOW_STATES] {
        use router_common::{FLOW_TCP_CLOSING, FLOW_TCP_OPEN, FLOW_TCP_SYN, FLOW_UDP, ticks};
        let mut t = [0; router_common::FLOW_STATES];
        t[usize::from(FLOW_TCP_SYN)] = ticks(self.tcp_syn);
        t[usize::from(FLOW_TCP_OPEN)] = ticks(self.tcp_established);
        t[usize::from(FLOW_TCP_CLOSING)] = ticks(self.tcp_closing);
        t[usize::from(FLOW_UDP)] = ticks(self.udp);
        t
    }
}

impl Default for Conntrack {
    /// `router_common::DEFAULT_TIMEOUTS`.
    fn default() -> Self {
        use router_common::{
            DEFAULT_TIMEOUTS, FLOW_TCP_CLOSING, FLOW_TCP_OPEN, FLOW_TCP_SYN, FLOW_UDP,
        };
        let secs = |state: u8| Duration::from_secs(u64::from(DEFAULT_TIMEOUTS[usize::from(state)]));
        Self {
            tcp_syn: secs(FLOW_TCP_SYN),
            tcp_established: secs(FLOW_TCP_OPEN),
            tcp_closing: secs(FLOW_TCP_CLOSING),
            udp: secs(FLOW_UDP),
            second_chance: Duration::ZERO,
        }
    }
}

/// The dummy interface the agent creates for its announcement routes when `announce:` names
/// none.
pub const DEFAULT_ANNOUNCE_INTERFACE: &str = "switchyard0";

/// The route protocol (`rtm_protocol`, `ip route ... proto N`) the agent's announcement routes
/// carry when `announce:` gives none: 83 ('S'), unused by iproute2's `rt_protos`, the number
/// the next-hop resolver marks its neighbour entries with.
pub const DEFAULT_ANNOUNCE_PROTOCOL: u8 = 83;

/// The routing table of the announcement routes when `announce:` gives none: `main` (254).
pub const DEFAULT_ANNOUNCE_TABLE: u32 = 254;

/// `announce:` settings: the agent adds a host route (/32, /128) for each virtual IP it
/// announces to the dummy interface `interface`, marked with `protocol`, in `table`; a routing
/// daemon (BIRD) exports the routes it finds there. What "announced" means is in
/// `crate::announce`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Announce {
    /// The dummy interface the agent owns (created if missing; default `switchyard0`), a
    /// Linux interface name of 1 to 15 bytes.
    pub interface: String,
    /// The route protocol number of the routes, 5 to 255 (0 to 4 are the kernel's own;
    /// default 83). Routes of this protocol on `interface` are the agent's: a restarted agent
    /// removes those it does not announce.
    pub protocol: u8,
    /// The routing table of the routes, 1 to 2^32-1 except 253 (`default`) and 255 (`local`)
    /// (default 254, `main`).
    pub table: u32,
    /// Interfaces on a shared segment where a newly announced virtual IP is advertised by a
    /// gratuitous ARP (IPv4) or an unsolicited neighbour advertisement (IPv6), in file order.
    pub garp: Vec<String>,
}

impl Default for Announce {
    fn default() -> Self {
        Self {
            interface: DEFAULT_ANNOUNCE_INTERFACE.to_owned(),
            protocol: DEFAULT_ANNOUNCE_PROTOCOL,
            table: DEFAULT_ANNOUNCE_TABLE,
            garp: Vec::new(),
        }
    }
}

/// A hook's `timeout` when it gives none.
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(5);
/// Bounds of a hook's `timeout`.
pub const HOOK_TIMEOUT_RANGE: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_mins(1));

/// `hooks[]`: a command run, or a URL posted to, with the JSON of each event it asks for
/// (`crate::hooks` runs it, off the event loop).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hook {
    /// Its name, unique among the hooks (a name as for pools: it labels the hook's metrics).
    pub name: String,
    /// What it runs.
    pub target: HookTarget,
    /// The events it gets (default all three), each once, in the order of [`HookEvent`].
    pub events: Vec<HookEvent>,
    /// How long one run may take, 1 ms to 60 s (default 5 s): a command still running then
    /// is killed, a POST abandoned.
    pub timeout: Duration,
}

/// What a hook runs: exactly one of `command` and `url`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookTarget {
    /// `command`: a program and its arguments, run without a shell, the event's JSON on its
    /// standard input (and in `SWITCHYARD_EVENT`).
    Command(Vec<String>),
    /// `url`: an `http://` URL the event's JSON is posted to.
    Url(String),
}

impl std::fmt::Display for HookTarget {
    /// `command /usr/local/bin/page-oncall --team lb` or `POST http://127.0.0.1:8099/events`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Command(argv) => write!(f, "command {}", argv.join(" ")),
            Self::Url(url) => write!(f, "POST {url}"),
        }
    }
}

/// An event a hook can get (`hooks[].events`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HookEvent {
    /// `switch`: a decision group's new action written into the maps.
    Switch,
    /// `health`: a backend's health-check verdict changed (up or down).
    Health,
    /// `config_rejected`: a change of the config (directory, `ctl apply`, rollback) refused.
    ConfigRejected,
}

impl HookEvent {
    /// Every event, in order: a hook's `events` when it gives none.
    pub const ALL: [HookEvent; 3] = [Self::Switch, Self::Health, Self::ConfigRejected];

    /// The word in `events` and in the event's `kind`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Switch => "switch",
            Self::Health => "health",
            Self::ConfigRejected => "config_rejected",
        }
    }
}

/// Transport protocol of a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// How packets reach a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forward {
    /// Rewrite MAC addresses only; the backend holds the VIP on a loopback and replies directly.
    DsrL2,
    /// Rewrite the destination address; replies come back through the program.
    Nat,
    /// Encapsulate in an outer IP header of the VIP's family to the backend (IPv4 in IPv4,
    /// IPv6 in IPv6), its source taken per flow from this range; the backend decapsulates,
    /// holds the VIP on a loopback and replies directly (decision 0013).
    Ipip(SourceRange),
}

/// An address range, `network/prefix` with the host bits zero: `encap_source` of an `ipip`
/// service, of the VIP's family; a client class's prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceRange {
    /// The network address (host bits zero).
    pub network: IpAddr,
    /// Prefix length: at most 32 (IPv4) or 128 (IPv6).
    pub prefix: u8,
}

impl SourceRange {
    /// Whether `address` lies in the range (an address of the other family never does).
    #[must_use]
    pub fn contains(&self, address: IpAddr) -> bool {
        let host_bits = |bits: u32| bits - u32::from(self.prefix).min(bits);
        match (self.network, address) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(host_bits(32)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(host_bits(128)).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }

    /// Whether every address of `inner` is in this range (same family, no longer prefix).
    #[must_use]
    pub fn contains_range(&self, inner: SourceRange) -> bool {
        self.prefix <= inner.prefix && self.contains(inner.network)
    }
}

impl std::fmt::Display for SourceRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// What a new flow's hash covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashMode {
    /// Addresses, ports and protocol (default).
    FiveTuple,
    /// Source address only: every connection of a client lands on one backend.
    SourceIp,
}

/// Where a service sends new flows.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// `{ pool: NAME }`.
    Pool(String),
    /// `{ split: [ { pool, weight }, { pool, weight } ] }`: exactly two different pools (the
    /// decision word carries two; see docs/decisions), weights > 0.
    Split(Vec<SplitShare>),
    /// `{ decide: GROUP }`: the action of decision group `GROUP` (validated to exist). Every
    /// service that names one group shares its decision word, so one write switches them all.
    Decide(String),
}

/// One pool of a split.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitShare {
    /// Pool name (validated to exist).
    pub pool: String,
    /// Relative weight, ≥ 1 (required).
    pub weight: u32,
}

/// `services[]`. `(vip, port, protocol)` is unique across services.
#[derive(Clone, Debug, PartialEq)]
pub struct Service {
    /// Unique name: 1–64 ASCII letters, digits, `-` or `_`.
    pub name: String,
    /// Virtual IP (not unspecified, not multicast).
    pub vip: IpAddr,
    /// Port, 1–65535.
    pub port: u16,
    /// Protocol (required).
    pub protocol: Protocol,
    /// Forwarding mode (required; `ipip` with its `encap_source`).
    pub forward: Forward,
    /// Hash mode (default five-tuple).
    pub hash: HashMode,
    /// Target (required).
    pub to: Target,
}

/// What to do with a pool's packets when no backend is usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenAllDown {
    /// Drop them (default).
    Drop,
    /// Pass them to the kernel stack.
    Pass,
}

/// What becomes of the tracked flows of a backend that stops taking new ones
/// (`pools[].on_backend_down`: its health check failed; a decision group's `on_failback`: the
/// group failed back away from its pool).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlowPolicy {
    /// They stay on it until they end (default); new flows avoid it.
    #[default]
    Keep,
    /// Their next packet is answered with a TCP RST from the virtual IP; UDP flows migrate.
    Reset,
    /// They are re-selected onto a usable backend (a TCP peer that has no such connection
    /// answers the next segment with an RST).
    Migrate,
}

impl FlowPolicy {
    /// The config's word for it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            FlowPolicy::Keep => "keep",
            FlowPolicy::Reset => "reset",
            FlowPolicy::Migrate => "migrate",
        }
    }
}

/// `pools[].backends[]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Backend {
    /// Address (the same family as every service that uses the pool).
    pub address: IpAddr,
    /// Relative weight, 0–65535 (default 100); 0 drains: tracked flows stay, no new ones.
    pub weight: u32,
}

/// `pools[]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    /// Unique name: 1–64 ASCII letters, digits, `-` or `_`.
    pub name: String,
    /// Backends (at least one), unique addresses.
    pub backends: Vec<Backend>,
    /// Health check; `None` means every backend counts as healthy.
    pub health_check: Option<HealthCheck>,
    /// Behaviour with no usable backend.
    pub when_all_down: WhenAllDown,
    /// Slow start: a backend that joins the pool's table (new, or back from down or a drain)
    /// ramps linearly from weight 1 to its weight over this long (`HAProxy`'s `slowstart`).
    pub slow_start: Option<std::time::Duration>,
    /// A circuit breaker per backend (`crate::breaker`); `None`: none.
    pub breaker: Option<Breaker>,
    /// Adaptive weights (`weights.adaptive`); `None`: the configured weights stand.
    pub adaptive: Option<Adaptive>,
    /// What becomes of a backend's tracked flows when its health check fails (default keep).
    pub on_backend_down: FlowPolicy,
}

/// Default `weights.adaptive.window`: the pass rate and RTT p99 are taken over this long.
pub const DEFAULT_WEIGHT_WINDOW: Duration = Duration::from_mins(5);
/// Default `weights.adaptive.tolerance`.
pub const DEFAULT_WEIGHT_TOLERANCE: f64 = 0.05;
/// Default `weights.adaptive.smoothing`.
pub const DEFAULT_WEIGHT_SMOOTHING: f64 = 0.3;
/// Default `weights.adaptive.max_decrease_per_second`.
pub const DEFAULT_MAX_DECREASE_PER_SECOND: f64 = 0.05;
/// Default `weights.adaptive.interval`.
pub const DEFAULT_WEIGHT_INTERVAL: Duration = Duration::from_secs(15);
/// Default `weights.adaptive.agent_check.interval`.
pub const DEFAULT_AGENT_INTERVAL: Duration = Duration::from_secs(2);
/// Default `weights.adaptive.agent_check.timeout` (capped at the interval).
pub const DEFAULT_AGENT_TIMEOUT: Duration = Duration::from_secs(1);

/// `pools[].weights.adaptive`: each backend's weight follows its health check's pass rate and
/// RTT (and an agent's answers), `base × (alpha + beta·pass_rate + gamma·latency_score +
/// delta·agent_score)` (see `crate::weights`). The coefficients are each 0 to 1 and add up
/// to 1, so a backend that passes every probe, is the pool's fastest and whose agent says 100 %
/// keeps its configured weight.
#[derive(Clone, Debug, PartialEq)]
pub struct Adaptive {
    /// The constant share.
    pub alpha: f64,
    /// The share of the pass rate.
    pub beta: f64,
    /// The share of the latency score.
    pub gamma: f64,
    /// The share of the agent's `NN%` (default 0; only with `agent_check`).
    pub delta: f64,
    /// Time between two computations (default 15 s).
    pub interval: Duration,
    /// Weight of the previous value in each new one, 0 to below 1 (default 0.3).
    pub smoothing: f64,
    /// Largest fall of a weight per second, as a share of its previous value (default 0.05).
    pub max_decrease_per_second: f64,
    /// The pass rate and the RTT p99 are taken over this long (default 5 min), at least
    /// `interval`.
    pub window: Duration,
    /// Relative change of every weight under which no table is rebuilt, 0 to below 1 (default
    /// 0.05).
    pub tolerance: f64,
    /// The `HAProxy` agent-check each backend answers, if any.
    pub agent_check: Option<AgentCheck>,
}

/// `weights.adaptive.agent_check`: a TCP connection to the backend's `port`, one line read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentCheck {
    /// Port on the backend.
    pub port: u16,
    /// Time between two connections (default 2 s).
    pub interval: Duration,
    /// Time a connection and its answer may take, never more than `interval` (default 1 s).
    pub timeout: Duration,
}

/// `pools[].breaker`: each backend's L4 circuit breaker (`crate::breaker`). Failures are failed
/// probes, RSTs the backend sends to NAT clients and SYNs retransmitted to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Breaker {
    /// Failures within `window` that open the breaker (1–1000).
    pub failure_threshold: u32,
    /// How far back failures count (1 s – 1 h, default 10 s).
    pub window: std::time::Duration,
    /// How long an open breaker stays open before it lets a trial share through (1 s – 1 h).
    pub recovery_timeout: std::time::Duration,
    /// Successes in a row (passed probes, seconds of new flows without a failure) that close
    /// a half-open breaker (1–100, default 2).
    pub success_threshold: u32,
    /// The share of its weight a half-open backend takes, percent (1–100, default 10).
    pub trial_weight: u32,
}

/// Default `breaker.window`.
pub const DEFAULT_BREAKER_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);
/// Default `breaker.success_threshold`.
pub const DEFAULT_BREAKER_SUCCESSES: u32 = 2;
/// Default `breaker.trial_weight`, percent.
pub const DEFAULT_BREAKER_TRIAL_WEIGHT: u32 = 10;

/// What a health check does to one backend.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckKind {
    /// Connect to `port` over TCP; success is an established connection.
    Tcp {
        /// Port on the backend.
        port: u16,
    },
    /// `GET path` on `port` over HTTP/1.1; success is a status in `expect`.
    Http {
        /// Port on the backend.
        port: u16,
        /// Request path, starting with `/`, without spaces or control characters (default `/`).
        path: String,
        /// Accepted status codes (default `[200]`).
        expect: Vec<u16>,
    },
    /// Run a command (no shell); success is exit status 0 within the timeout, as keepalived's
    /// `MISC_CHECK`. For pools, `{address}` in an argument is replaced by the backend's address.
    Exec {
        /// Program and arguments.
        command: Vec<String>,
    },
    /// Ask the DNS server on `port` (over UDP) for `record` records of `query`; success is a
    /// `NOERROR` answer with at least one such record that holds every value of `expect`.
    Dns {
        /// Port of the server on the backend (default 53).
        port: u16,
        /// The name asked for, such as `example.org` (absolute: no search domains).
        query: String,
        /// Record type, upper case: one of [`DNS_RECORD_TYPES`].
        record: String,
        /// Values the answer must hold, in the record's text form (`198.18.0.5`, `mail.example.org`);
        /// addresses are kept in their canonical form. Empty: any answer of the type passes.
        expect: Vec<String>,
    },
    /// Send one UDP datagram to `port` and wait for a reply; success is a reply that contains
    /// `expect` (any reply when `expect` is `None`).
    Udp {
        /// Port on the backend.
        port: u16,
        /// The datagram sent (`send:` as text, or `send_hex:`); may be empty.
        send: Vec<u8>,
        /// Bytes the reply must contain (`expect:` as text, or `expect_hex:`).
        expect: Option<Vec<u8>>,
    },
    /// A TLS handshake with `port`; success is a completed handshake (and, when verifying, a
    /// certificate valid for the name and now).
    Tls {
        /// Port on the backend.
        port: u16,
        /// How the server's certificate is judged.
        tls: TlsOptions,
    },
    /// `GET path` on `port` over HTTP/1.1 over TLS; success is a status in `expect`.
    Https {
        /// Port on the backend (default 443).
        port: u16,
        /// Request path, as for [`CheckKind::Http`] (default `/`).
        path: String,
        /// Accepted status codes (default `[200]`).
        expect: Vec<u16>,
        /// How the server's certificate is judged.
        tls: TlsOptions,
    },
}

/// The DNS record types a `dns` check may ask for.
pub const DNS_RECORD_TYPES: &[&str] =
    &["A", "AAAA", "CNAME", "MX", "NS", "PTR", "SOA", "SRV", "TXT"];

/// The TLS side of a `tls` or `https` check.
#[derive(Clone, Debug, PartialEq)]
pub struct TlsOptions {
    /// Server name sent (SNI) and checked against the certificate; `None` sends none and checks
    /// the certificate against the backend's IP address.
    pub sni: Option<String>,
    /// Whether the certificate must chain to a trusted root, be valid now and name the server
    /// (default true). When false any certificate passes: only the handshake is judged.
    pub verify: bool,
    /// PEM file of the roots trusted instead of the system's (`/etc/ssl/certs`).
    pub ca: Option<std::path::PathBuf>,
}

/// `pools[].health_check`.
#[derive(Clone, Debug, PartialEq)]
pub struct HealthCheck {
    /// The probe.
    pub kind: CheckKind,
    /// Time between probes while healthy (default 1 s); ±10 % jitter is added.
    pub interval: Duration,
    /// Time a probe may take, never more than `interval` (default 1 s, or `interval` if that is
    /// shorter).
    pub timeout: Duration,
    /// Consecutive failures that mark a backend down (default 3).
    pub unhealthy_threshold: u32,
    /// Consecutive successes that mark a down backend up (default 2).
    pub healthy_threshold: u32,
    /// Probe spacing while down.
    pub backoff: Backoff,
}

/// Probe spacing while a backend is down: `interval · factor^n`, capped at `max`.
#[derive(Clone, Debug, PartialEq)]
pub struct Backoff {
    /// Growth per failed probe while down, ≥ 1 (default 1: no backoff).
    pub factor: f64,
    /// Cap on the spacing (default: `interval`).
    pub max: Duration,
}

/// `state.<name>`: a named, typed value with one source.
#[derive(Clone, Debug, PartialEq)]
pub struct StateVar {
    /// Name, usable in expressions (validated with `rules::syntax::is_name`).
    pub name: String,
    /// Where its value comes from.
    pub source: StateSource,
}

/// The one source of a state variable.
#[derive(Clone, Debug, PartialEq)]
pub enum StateSource {
    /// `probe:` — a bool: true while the probe is healthy (thresholds as for pools).
    Probe(StateProbe),
    /// `push: { default }` — set by `switchyard ctl state set`; typed by its default.
    Push(PushValue),
    /// `expr: "…"` — a bool derived from other variables and built-ins (no cycles).
    Expr(String),
    /// `metric: { of, above, below, for }` — a bool with hysteresis over a counter rate: turns
    /// true once `of` has stayed above `above` for `for`, false once it has stayed below
    /// `below` for `for`.
    Metric(MetricSpec),
}

/// A typed value of a `push` variable (its default, and every later `state set`).
#[derive(Clone, Debug, PartialEq)]
pub enum PushValue {
    /// `true` / `false`.
    Bool(bool),
    /// A number.
    Number(f64),
    /// A string.
    String(String),
}

/// `state.<name>.probe`.
#[derive(Clone, Debug, PartialEq)]
pub struct StateProbe {
    /// The address probed (`tcp: "198.18.1.50:5432"`, `http: "http://198.18.1.11/health"`,
    /// `dns: { address: "198.18.1.53:53", … }`); `None` for `exec`.
    pub address: Option<IpAddr>,
    /// What is probed and how often; thresholds and backoff as for pools.
    pub check: HealthCheck,
}

/// `state.<name>.metric`.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricSpec {
    /// The rate watched: `service.<name>.packets_per_second` or `….bytes_per_second`,
    /// `backend.<address>.packets_per_second` (validated to name a configured object).
    pub of: String,
    /// Rate (per second) above which the variable turns true.
    pub above: f64,
    /// Rate (per second) below which it turns false again (≤ `above`).
    pub below: f64,
    /// How long the rate must stay past a threshold before the value changes.
    pub hold: Duration,
}

/// `decisions[]`: a decision group.
#[derive(Clone, Debug, PartialEq)]
pub struct DecisionGroup {
    /// Unique name (services name it in `to: { decide }`).
    pub name: String,
    /// Rules in declaration order (the engine orders them by priority, then this order).
    pub rules: Vec<DecisionRule>,
    /// Action when no rule is true; `None` keeps the current action.
    pub default: Option<rules::engine::Action>,
    /// `switch:` policy (every duration defaults to zero).
    pub switch: SwitchPolicy,
    /// `require:` — a bool expression over `target.*` (and any variable) that vetoes a target.
    pub require: Option<String>,
    /// `automatic:` — a bool variable; while false, automatic switching is frozen.
    pub automatic: Option<String>,
    /// What becomes of the flows tracked on the pool the group leaves when it fails back
    /// (switches back to a pool it had left; default keep).
    pub on_failback: FlowPolicy,
    /// `canary:` — a ramp of new flows onto a canary pool.
    pub canary: Option<CanaryRamp>,
    /// `split_by:`: what decides the side of a split a new flow takes (default `flow`).
    pub split_by: SplitBy,
}

/// `decisions[].canary`: the share of new flows sent to `pool` rises through `steps`, one step
/// per `hold`, while `rollback_when` stays false; when it turns true the share drops to zero
/// and the ramp stops (`rules::engine::canary`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanaryRamp {
    /// The canary pool (of the group's address family).
    pub pool: String,
    /// Shares in units of 1/`rules::engine::SHARE_SCALE` (`5%` is 500), increasing, each in
    /// (0, 100 %].
    pub steps: Vec<u32>,
    /// How long each step holds before the next.
    pub hold: Duration,
    /// A bool expression, compiled like `when`; `None`: no automatic rollback.
    pub rollback_when: Option<String>,
}

impl DecisionGroup {
    /// Whether an action of the group (a rule's or the default) is `by_class`: its services
    /// then look their clients' classes up (`SVC_F_CLASSES`), whatever action is published.
    #[must_use]
    pub fn uses_classes(&self) -> bool {
        let by_class = |a: &rules::engine::Action| matches!(a, rules::engine::Action::ByClass(_));
        self.rules.iter().any(|r| by_class(&r.then)) || self.default.as_ref().is_some_and(by_class)
    }
}

/// `decisions[].split_by`: what a split hashes to choose a new flow's side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitBy {
    /// The flow's 5-tuple: each connection on its own (default).
    #[default]
    Flow,
    /// The client's address: a client keeps its side while the weights stand, and a change of
    /// weights moves only the clients between the old and the new share.
    Client,
    /// The client's /24 (IPv4) or /48 (IPv6): the clients of one network share a side.
    ClientPrefix,
}

impl SplitBy {
    /// The config's word for it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            SplitBy::Flow => "flow",
            SplitBy::Client => "client",
            SplitBy::ClientPrefix => "client_prefix",
        }
    }
}

/// `decisions[].rules[]`.
#[derive(Clone, Debug, PartialEq)]
pub struct DecisionRule {
    /// Unique within the group.
    pub id: String,
    /// Higher first (default 0).
    pub priority: i64,
    /// `when:` — a bool expression.
    pub when: String,
    /// `then:` — one pool or a split of two pools.
    pub then: rules::engine::Action,
}

/// `decisions[].switch`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SwitchPolicy {
    /// A new candidate must hold this long before a switch.
    pub stable_for: Duration,
    /// Minimum time between two switches.
    pub cooldown: Duration,
    /// Returning to a higher-priority rule needs this much continuous truth.
    pub failback_after: Duration,
}

#[cfg(test)]
mod tests {
    use super::SourceRange;

    #[test]
    fn a_source_range_contains_the_addresses_under_its_prefix_of_its_family() {
        let range = |s: &str, prefix| SourceRange {
            network: s.parse().unwrap(),
            prefix,
        };
        let v4 = range("198.18.1.8", 29);
        assert!(v4.contains("198.18.1.8".parse().unwrap()));
        assert!(v4.contains("198.18.1.15".parse().unwrap()));
        assert!(!v4.contains("198.18.1.16".parse().unwrap()));
        assert!(!v4.contains("::ffff:198.18.1.9".parse().unwrap()));
        assert!(range("0.0.0.0", 0).contains("203.0.113.1".parse().unwrap()));
        assert!(range("198.18.1.9", 32).contains("198.18.1.9".parse().unwrap()));
        let v6 = range("2001:db8:1::", 64);
        assert!(v6.contains("2001:db8:1::11".parse().unwrap()));
        assert!(!v6.contains("2001:db8:2::11".parse().unwrap()));
        assert!(range("::", 0).contains("2001:db8::1".parse().unwrap()));
    }
}
