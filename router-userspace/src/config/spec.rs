//! The file shapes: serde `*Spec` types that mirror the YAML keys one to one.
//!
//! Every struct rejects unknown keys (`deny_unknown_fields`). Every field is optional and every
//! leaf is read as text, so serde only fails on the shape of the file (an unknown key, a list
//! where a mapping belongs); missing keys, numbers, addresses, durations and names are checked by
//! `validate`, which reports all of them with their positions instead of stopping at the first.
//!
use serde::Deserialize;

/// `agent:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentSpec {
    pub api: Option<String>,
    pub api_token_file: Option<String>,
    pub api_open_read: Option<String>,
    pub pin_path: Option<String>,
    pub state_dir: Option<String>,
}

/// `fleet:`: the etcd cluster a fleet of balancers makes its decisions on.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FleetSpec {
    pub node: Option<String>,
    pub endpoints: Option<Vec<String>>,
    pub prefix: Option<String>,
    pub lease_ttl: Option<String>,
    pub dial_timeout: Option<String>,
    pub request_timeout: Option<String>,
    pub tls: Option<FleetTlsSpec>,
}

/// `fleet.tls:`: how the agent verifies etcd and, optionally, proves who it is.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FleetTlsSpec {
    pub ca: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    pub server_name: Option<String>,
}

/// `conntrack:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConntrackSpec {
    pub tcp_syn: Option<String>,
    pub tcp_established: Option<String>,
    pub tcp_closing: Option<String>,
    pub udp: Option<String>,
    pub second_chance: Option<String>,
}

/// `announce:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AnnounceSpec {
    pub interface: Option<String>,
    pub protocol: Option<String>,
    pub table: Option<String>,
    pub garp: Option<Vec<String>>,
}

/// `services[]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServiceSpec {
    pub name: Option<String>,
    pub vip: Option<String>,
    pub port: Option<String>,
    pub protocol: Option<String>,
    pub forward: Option<String>,
    pub encap_source: Option<String>,
    pub hash: Option<String>,
    pub to: Option<TargetSpec>,
}

/// `services[].to`: exactly one of the three keys.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TargetSpec {
    pub pool: Option<String>,
    pub split: Option<Vec<SplitShareSpec>>,
    pub decide: Option<String>,
}

/// `services[].to.split[]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SplitShareSpec {
    pub pool: Option<String>,
    pub weight: Option<String>,
}

/// `vips[]`: how one virtual IP is handled beyond its services.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VipSpec {
    pub address: Option<String>,
    pub echo: Option<String>,
    /// `tcp/PORT` or `udp/PORT`.
    pub host_ports: Option<Vec<String>>,
    pub new_flows_per_second: Option<String>,
}

/// `pools[]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PoolSpec {
    pub name: Option<String>,
    pub backends: Option<Vec<BackendSpec>>,
    pub health_check: Option<HealthCheckSpec>,
    pub when_all_down: Option<String>,
    pub slow_start: Option<String>,
    pub on_backend_down: Option<String>,
    pub weights: Option<WeightsSpec>,
    pub breaker: Option<BreakerSpec>,
}

/// `pools[].breaker`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BreakerSpec {
    pub failure_threshold: Option<String>,
    pub window: Option<String>,
    pub recovery_timeout: Option<String>,
    pub success_threshold: Option<String>,
    pub trial_weight: Option<String>,
}

/// `pools[].weights`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WeightsSpec {
    pub adaptive: Option<AdaptiveSpec>,
}

/// `pools[].weights.adaptive`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AdaptiveSpec {
    pub alpha: Option<String>,
    pub beta: Option<String>,
    pub gamma: Option<String>,
    pub delta: Option<String>,
    pub interval: Option<String>,
    pub smoothing: Option<String>,
    pub max_decrease_per_second: Option<String>,
    pub window: Option<String>,
    pub tolerance: Option<String>,
    pub agent_check: Option<AgentCheckSpec>,
}

/// `pools[].weights.adaptive.agent_check`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentCheckSpec {
    pub port: Option<String>,
    pub interval: Option<String>,
    pub timeout: Option<String>,
}

/// `pools[].backends[]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BackendSpec {
    pub address: Option<String>,
    pub weight: Option<String>,
}

/// `pools[].health_check`: exactly one probe key plus timing.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HealthCheckSpec {
    pub tcp: Option<TcpCheckSpec>,
    pub http: Option<HttpCheckSpec>,
    pub exec: Option<ExecCheckSpec>,
    pub interval: Option<String>,
    pub timeout: Option<String>,
    pub unhealthy_threshold: Option<String>,
    pub healthy_threshold: Option<String>,
    pub backoff: Option<BackoffSpec>,
    pub dns: Option<DnsCheckSpec>,
    pub udp: Option<UdpCheckSpec>,
    pub tls: Option<TlsCheckSpec>,
    pub https: Option<HttpsCheckSpec>,
}

/// `health_check.dns` (and `state.*.probe.dns`, where `address` replaces `port`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DnsCheckSpec {
    pub port: Option<String>,
    pub address: Option<String>,
    pub query: Option<String>,
    pub record: Option<String>,
    pub expect: Option<Vec<String>>,
}

/// `health_check.udp` (and `state.*.probe.udp`, where `address` replaces `port`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UdpCheckSpec {
    pub port: Option<String>,
    pub address: Option<String>,
    pub send: Option<String>,
    pub send_hex: Option<String>,
    pub expect: Option<String>,
    pub expect_hex: Option<String>,
}

/// `health_check.tls` (and `state.*.probe.tls`, where `address` replaces `port`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TlsCheckSpec {
    pub port: Option<String>,
    pub address: Option<String>,
    pub sni: Option<String>,
    pub verify: Option<String>,
    pub ca: Option<String>,
}

/// `health_check.https`: `http`'s keys and `tls`'s.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HttpsCheckSpec {
    pub port: Option<String>,
    pub path: Option<String>,
    pub expect: Option<Vec<String>>,
    pub sni: Option<String>,
    pub verify: Option<String>,
    pub ca: Option<String>,
}

/// `health_check.tcp`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TcpCheckSpec {
    pub port: Option<String>,
}

/// `health_check.http`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HttpCheckSpec {
    pub port: Option<String>,
    pub path: Option<String>,
    pub expect: Option<Vec<String>>,
}

/// `health_check.exec` (and `state.*.probe.exec`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecCheckSpec {
    pub command: Option<Vec<String>>,
}

/// `health_check.backoff`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BackoffSpec {
    pub factor: Option<String>,
    pub max: Option<String>,
}

/// `state.<name>`: exactly one source.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StateVarSpec {
    pub probe: Option<StateProbeSpec>,
    pub push: Option<PushSpec>,
    pub expr: Option<String>,
    pub metric: Option<MetricSpecSpec>,
}

/// `state.<name>.probe`: one of `tcp`, `http`, `exec`, plus timing as for pools.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StateProbeSpec {
    /// `"host:port"`.
    pub tcp: Option<String>,
    /// `"http://host[:port]/path"`.
    pub http: Option<String>,
    /// Accepted HTTP status codes (with `http` only).
    pub expect: Option<Vec<String>>,
    pub exec: Option<ExecCheckSpec>,
    pub interval: Option<String>,
    pub timeout: Option<String>,
    pub unhealthy_threshold: Option<String>,
    pub healthy_threshold: Option<String>,
    pub backoff: Option<BackoffSpec>,
    pub dns: Option<DnsCheckSpec>,
    pub udp: Option<UdpCheckSpec>,
    pub tls: Option<TlsCheckSpec>,
    /// With an `https://` URL in `http`: the name sent and checked (SNI).
    pub sni: Option<String>,
    /// With an `https://` URL in `http`: whether the certificate is verified (default true).
    pub verify: Option<String>,
    /// With an `https://` URL in `http`: PEM file of the trusted roots.
    pub ca: Option<String>,
}

/// `state.<name>.push`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PushSpec {
    pub default: Option<String>,
}

/// `state.<name>.metric`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MetricSpecSpec {
    pub of: Option<String>,
    pub above: Option<String>,
    pub below: Option<String>,
    #[serde(rename = "for")]
    pub hold: Option<String>,
}

/// `decisions[]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DecisionGroupSpec {
    pub name: Option<String>,
    pub rules: Option<Vec<RuleSpec>>,
    pub default: Option<ActionSpec>,
    pub switch: Option<SwitchSpec>,
    pub require: Option<String>,
    pub automatic: Option<String>,
    pub on_failback: Option<String>,
    pub canary: Option<CanarySpec>,
    /// `flow`, `client` or `client_prefix`.
    pub split_by: Option<String>,
}

/// `decisions[].canary`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CanarySpec {
    pub pool: Option<String>,
    pub steps: Option<Vec<String>>,
    pub hold: Option<String>,
    pub rollback_when: Option<String>,
}

/// `decisions[].rules[]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RuleSpec {
    pub id: Option<String>,
    pub priority: Option<String>,
    pub when: Option<String>,
    pub then: Option<ActionSpec>,
}

/// `then:` and `default:`: one pool, a split, or one of those per client class.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ActionSpec {
    pub pool: Option<String>,
    pub split: Option<Vec<SplitShareSpec>>,
    /// Class name (or `default`) → its action (validation refuses a `by_class` in it).
    pub by_class: Option<std::collections::BTreeMap<String, ActionSpec>>,
}

/// `classes.<name>`: a client class.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClassSpec {
    pub prefixes: Option<Vec<String>>,
    pub precedence: Option<String>,
}

/// `decisions[].switch`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SwitchSpec {
    pub stable_for: Option<String>,
    pub cooldown: Option<String>,
    pub failback_after: Option<String>,
}

/// `hooks[]`: exactly one of `command` and `url`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HookSpec {
    pub name: Option<String>,
    pub command: Option<Vec<String>>,
    pub url: Option<String>,
    pub events: Option<Vec<String>>,
    pub timeout: Option<String>,
}

/// The top-level keys a fragment may have, in the order the docs list them.
pub(crate) const TOP_LEVEL_KEYS: &[&str] = &[
    "agent",
    "fleet",
    "conntrack",
    "announce",
    "services",
    "vips",
    "pools",
    "state",
    "classes",
    "decisions",
    "hooks",
];
