//! Checking the merged configuration and converting it into the runtime [`Config`].
//!
//! Each item is checked on its own first (every value, every missing key), giving a draft with
//! what could be read; then the drafts are checked together: unique names and service
//! addresses, `vips:` entries against the services, references to pools, address families, and
//! the data plane's limits. A [`Config`] is built only when no problem was reported.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
};

use super::{
    load::Parsed,
    model::{
        Agent, Config, Conntrack, DEFAULT_PIN_PATH, DEFAULT_STATE_DIR, Forward, HashMode,
        MAX_FLOW_TIMEOUT, MAX_SECOND_CHANCE, MIN_API_TOKEN_LEN, MIN_FLOW_TIMEOUT, Protocol,
        Service, SourceRange, SplitShare, Target,
    },
    report::{Item, Report, index_path, key_path},
    spec::{AgentSpec, ConntrackSpec, ServiceSpec, TargetSpec},
    values::{self, Bad, did_you_mean},
};

mod announce;
mod classes;
mod decisions;
mod fleet;
mod hooks;
pub(crate) use decisions::Checked;
mod pool;
mod protocols;
mod state;
mod vip;
mod weights;

/// A value read from one key.
pub(super) enum Field<V> {
    /// The key is absent (or its value is null).
    Absent,
    /// The value is wrong; already reported.
    Bad,
    /// The value.
    Ok(V),
}

impl<V> Field<V> {
    /// The value, or `default` when absent; `None` when bad.
    pub fn or(self, default: V) -> Option<V> {
        match self {
            Field::Absent => Some(default),
            Field::Bad => None,
            Field::Ok(v) => Some(v),
        }
    }

    /// `Some(None)` when absent, `Some(Some(v))` when set; `None` when bad.
    #[expect(
        clippy::option_option,
        reason = "an optional setting read: absent, set, or reported"
    )]
    pub fn or_none(self) -> Option<Option<V>> {
        match self {
            Field::Absent => Some(None),
            Field::Bad => None,
            Field::Ok(v) => Some(Some(v)),
        }
    }
}

/// Reads the optional leaf `rel` with `parse`, reporting a bad value.
pub(super) fn leaf<S, V>(
    it: &Item<S>,
    report: &mut Report,
    value: Option<&str>,
    rel: &str,
    parse: impl FnOnce(&str) -> Result<V, Bad>,
) -> Field<V> {
    if it.is_broken(rel) {
        return Field::Bad;
    }
    let Some(text) = value else {
        return Field::Absent;
    };
    match parse(text) {
        Ok(v) => Field::Ok(v),
        Err((message, hint)) => {
            it.err(report, rel, message, hint);
            Field::Bad
        }
    }
}

/// Reads the optional flow policy `rel` (`keep`, `reset` or `migrate`; default `keep`),
/// reporting a bad value.
pub(super) fn flow_policy<S>(
    it: &Item<S>,
    report: &mut Report,
    value: Option<&str>,
    rel: &str,
) -> Option<super::model::FlowPolicy> {
    use super::model::FlowPolicy;
    let choices = [
        ("keep", FlowPolicy::Keep),
        ("reset", FlowPolicy::Reset),
        ("migrate", FlowPolicy::Migrate),
    ];
    leaf(it, report, value, rel, |v| {
        values::choice(v, rel, &choices, &[])
    })
    .or(FlowPolicy::Keep)
}

/// Reads the required leaf `key` of the mapping at `parent`, reporting it missing or bad.
pub(super) fn required<S, V>(
    it: &Item<S>,
    report: &mut Report,
    value: Option<&str>,
    parent: &str,
    key: &str,
    parse: impl FnOnce(&str) -> Result<V, Bad>,
) -> Option<V> {
    let rel = key_path(parent, key);
    match leaf(it, report, value, &rel, parse) {
        Field::Ok(v) => Some(v),
        Field::Bad => None,
        Field::Absent => {
            missing(it, report, parent, key);
            None
        }
    }
}

/// Reports that the mapping at `parent` lacks `key` (unless `parent` is already reported).
pub(super) fn missing<S>(it: &Item<S>, report: &mut Report, parent: &str, key: &str) {
    if !it.is_broken(parent) {
        it.err(
            report,
            parent,
            format!("missing required key {key:?}"),
            None,
        );
    }
}

/// Checks the merged configuration; the [`Config`] when nothing was reported.
pub(crate) fn validate(parsed: &Parsed, report: &mut Report) -> Option<Config> {
    let agent = agents(&parsed.agents, report);
    let fleet = fleet::fleets(&parsed.fleets, report);
    let conntrack = conntracks(&parsed.conntracks, report);
    let announce = announce::announces(&parsed.announces, report);
    let pools: Vec<pool::Draft> = parsed.pools.iter().map(|p| pool::pool(p, report)).collect();
    let services: Vec<ServiceDraft> = parsed.services.iter().map(|s| service(s, report)).collect();

    unique_names(
        "pool",
        &parsed.pools,
        pools.iter().map(|p| p.name.as_deref()),
        report,
    );
    unique_names(
        "service",
        &parsed.services,
        services.iter().map(|s| s.name.as_deref()),
        report,
    );
    unique_addresses(&parsed.services, &services, report);
    let vips: Vec<vip::Draft> = parsed.vips.iter().map(|v| vip::entry(v, report)).collect();
    vip::check(parsed, &vips, &services, report);
    let users = references(parsed, &pools, &services, report);
    families(parsed, &pools, &services, &users, report);
    backends_are_not_vips(parsed, &pools, &services, report);
    encap_sources_are_unused(parsed, &pools, &services, report);
    pool::limits(parsed, report);
    let state: Vec<state::Draft> = parsed
        .state
        .iter()
        .map(|(name, it)| state::var(name, it, report))
        .collect();
    let groups: Vec<decisions::Draft> = parsed
        .decisions
        .iter()
        .map(|g| decisions::group(g, report))
        .collect();
    let whole = decisions::Whole {
        parsed,
        state: &state,
        groups: &groups,
        pools: &pools,
        services: &services,
    };
    let checked = decisions::check(&whole, report);
    let classes: Vec<classes::Draft> = parsed
        .classes
        .iter()
        .map(|(name, it)| classes::class(name, it, report))
        .collect();
    classes::check(parsed, &classes, &groups, report);
    let hooks = hooks::hooks(&parsed.hooks, report);

    if !report.is_empty() {
        return None;
    }
    let config = Config {
        agent: agent?,
        fleet,
        conntrack: conntrack?,
        announce: announce?,
        vips: vips.into_iter().map(|v| v.value).collect::<Option<_>>()?,
        services: services
            .into_iter()
            .map(|s| s.value)
            .collect::<Option<_>>()?,
        pools: pools.into_iter().map(|p| p.value).collect::<Option<_>>()?,
        state: state.into_iter().map(|v| v.value).collect::<Option<_>>()?,
        decisions: groups.into_iter().map(|g| g.value).collect::<Option<_>>()?,
        classes: classes::finish(classes)?,
        hooks: hooks?,
        rules: std::sync::Arc::default(),
    };
    match super::compiled::from_checked(&config, checked) {
        Ok(rules) => Some(Config {
            rules: std::sync::Arc::new(rules),
            ..config
        }),
        Err(e) => {
            let message = format!("the rules do not compile: {e}");
            report.add(0, None, String::new(), message, None);
            None
        }
    }
}

/// The agent: defaults, or the one `agent:` (more than one is an error).
fn agents(items: &[Item<AgentSpec>], report: &mut Report) -> Option<Agent> {
    let mut result = Some(Agent::default());
    let mut first: Option<String> = None;
    for it in items {
        let agent = agent(it, report);
        match &first {
            None => {
                first = Some(it.location(report, ""));
                result = agent;
            }
            Some(first) => {
                let hint = format!("first set at {first}; set it in one file");
                let message = "agent is set in more than one file".to_owned();
                it.err(report, "", message, Some(hint));
            }
        }
    }
    result
}

fn agent(it: &Item<AgentSpec>, report: &mut Report) -> Option<Agent> {
    let defaults = Agent::default();
    let api = leaf(it, report, it.spec.api.as_deref(), "api", api);
    let pin_path = leaf(it, report, it.spec.pin_path.as_deref(), "pin_path", |v| {
        absolute(v, "pin_path", DEFAULT_PIN_PATH)
    })
    .or(defaults.pin_path);
    let state_dir = leaf(it, report, it.spec.state_dir.as_deref(), "state_dir", |v| {
        absolute(v, "state_dir", DEFAULT_STATE_DIR)
    })
    .or(defaults.state_dir);
    let token = leaf(
        it,
        report,
        it.spec.api_token_file.as_deref(),
        "api_token_file",
        |v| {
            let path = absolute(v, "api_token_file", "/etc/switchyard/api.token")?;
            read_token(&path).map(|_| path)
        },
    );
    let open_read = leaf(
        it,
        report,
        it.spec.api_open_read.as_deref(),
        "api_open_read",
        |v| match v {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err((
                format!("api_open_read must be true or false, not {v:?}"),
                None,
            )),
        },
    );
    let has_token = matches!(token, Field::Ok(_));
    if let (Field::Ok(addr), Field::Absent) = (&api, &token)
        && !addr.ip().is_loopback()
    {
        let message = format!(
            "the API listens on {} (not a loopback address) only with api_token_file",
            addr.ip()
        );
        let hint = Some("set agent.api_token_file, or listen on 127.0.0.1".to_owned());
        it.err(report, "api", message, hint);
    }
    if matches!(open_read, Field::Ok(true)) && !has_token && !matches!(token, Field::Bad) {
        let message = "api_open_read opens reads of an API that has no token".to_owned();
        let hint = Some("set agent.api_token_file, or remove api_open_read".to_owned());
        it.err(report, "api_open_read", message, hint);
    }
    Some(Agent {
        api: api.or(defaults.api)?,
        api_token_file: token.or_none()?,
        api_open_read: open_read.or(false)?,
        pin_path: pin_path?,
        state_dir: state_dir?,
    })
}

/// The API token in `path`: its one line, trimmed.
///
/// # Errors
///
/// The file cannot be read, group or others may read or write it (as OpenSSH refuses such a
/// private key: whoever reads the token drives the agent), or it holds a token shorter than
/// [`MIN_API_TOKEN_LEN`] or with characters other than printable ASCII.
pub(crate) fn read_token(path: &std::path::Path) -> Result<String, Bad> {
    use std::os::unix::fs::PermissionsExt as _;
    let text = std::fs::read_to_string(path)
        .map_err(|e| (format!("{} cannot be read: {e}", path.display()), None))?;
    let token = text.trim();
    let hint = || {
        Some(format!(
            "one line of at least {MIN_API_TOKEN_LEN} printable characters, such as the output \
             of `openssl rand -hex 32`"
        ))
    };
    if token.len() < MIN_API_TOKEN_LEN || token.contains(char::is_whitespace) {
        return Err((format!("{} holds no usable token", path.display()), hint()));
    }
    if !token.chars().all(|c| c.is_ascii_graphic()) {
        return Err((
            format!(
                "{} holds characters other than printable ASCII",
                path.display()
            ),
            hint(),
        ));
    }
    let mode = std::fs::metadata(path)
        .map_err(|e| (format!("{} cannot be read: {e}", path.display()), None))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err((
            format!(
                "{} may be read or written by group or others (mode {:04o})",
                path.display(),
                mode & 0o7777
            ),
            Some(format!("chmod 600 {}", path.display())),
        ));
    }
    Ok(token.to_owned())
}

/// The flow timeouts: defaults, or the one `conntrack:` (more than one is an error).
fn conntracks(items: &[Item<ConntrackSpec>], report: &mut Report) -> Option<Conntrack> {
    let mut result = Some(Conntrack::default());
    let mut first: Option<String> = None;
    for it in items {
        let conntrack = conntrack(it, report);
        match &first {
            None => {
                first = Some(it.location(report, ""));
                result = conntrack;
            }
            Some(first) => {
                let hint = format!("first set at {first}; set it in one file");
                let message = "conntrack is set in more than one file".to_owned();
                it.err(report, "", message, Some(hint));
            }
        }
    }
    result
}

fn conntrack(it: &Item<ConntrackSpec>, report: &mut Report) -> Option<Conntrack> {
    let defaults = Conntrack::default();
    let s = &it.spec;
    let mut timeout = |value: Option<&str>, key: &str, default| {
        leaf(it, report, value, key, |v| {
            values::duration_within(v, key, MIN_FLOW_TIMEOUT, MAX_FLOW_TIMEOUT)
        })
        .or(default)
    };
    let tcp_syn = timeout(s.tcp_syn.as_deref(), "tcp_syn", defaults.tcp_syn);
    let tcp_established = timeout(
        s.tcp_established.as_deref(),
        "tcp_established",
        defaults.tcp_established,
    );
    let tcp_closing = timeout(
        s.tcp_closing.as_deref(),
        "tcp_closing",
        defaults.tcp_closing,
    );
    let udp = timeout(s.udp.as_deref(), "udp", defaults.udp);
    let second_chance = leaf(
        it,
        report,
        s.second_chance.as_deref(),
        "second_chance",
        |v| {
            values::duration_within(
                v,
                "second_chance",
                std::time::Duration::ZERO,
                MAX_SECOND_CHANCE,
            )
        },
    )
    .or(defaults.second_chance);
    Some(Conntrack {
        tcp_syn: tcp_syn?,
        tcp_established: tcp_established?,
        tcp_closing: tcp_closing?,
        udp: udp?,
        second_chance: second_chance?,
    })
}

fn api(s: &str) -> Result<SocketAddr, Bad> {
    let addr: SocketAddr = s.parse().map_err(|_| {
        (
            format!("{s:?} is not a socket address"),
            Some("write IP:port, such as 127.0.0.1:9900 or [::1]:9900".to_owned()),
        )
    })?;
    if addr.port() == 0 {
        return Err((
            "port must be a number from 1 to 65535, not 0".to_owned(),
            None,
        ));
    }
    Ok(addr)
}

/// An absolute path without NUL bytes; `what` names the key, `example` is its default.
fn absolute(s: &str, what: &str, example: &str) -> Result<PathBuf, Bad> {
    let path = PathBuf::from(s);
    if s.contains('\0') {
        // A path the kernel cannot take (and that aya's pin lookups would panic on).
        Err((format!("{what} must not contain a NUL byte: {s:?}"), None))
    } else if path.is_absolute() {
        Ok(path)
    } else {
        Err((
            format!("{what} must be an absolute path, not {s:?}"),
            Some(format!("such as {example}")),
        ))
    }
}

/// What could be read of one service.
struct ServiceDraft {
    name: Option<String>,
    vip: Option<IpAddr>,
    port: Option<u16>,
    protocol: Option<Protocol>,
    /// Pools the target names: (path, pool).
    refs: Vec<(String, String)>,
    /// The service, when every key of it is right.
    value: Option<Service>,
}

fn service(it: &Item<ServiceSpec>, report: &mut Report) -> ServiceDraft {
    use values::choice;
    let s = &it.spec;
    let name = required(it, report, s.name.as_deref(), "", "name", values::name);
    let vip = required(it, report, s.vip.as_deref(), "", "vip", values::address);
    let port = required(it, report, s.port.as_deref(), "", "port", values::port);
    let protocols = [("tcp", Protocol::Tcp), ("udp", Protocol::Udp)];
    let protocol = required(it, report, s.protocol.as_deref(), "", "protocol", |v| {
        choice(v, "protocol", &protocols, &[])
    });
    let forwards = [
        ("dsr-l2", Mode::DsrL2),
        ("nat", Mode::Nat),
        ("ipip", Mode::Ipip),
    ];
    let mode = required(it, report, s.forward.as_deref(), "", "forward", |v| {
        choice(v, "forward mode", &forwards, &[])
    });
    let encap = leaf(
        it,
        report,
        s.encap_source.as_deref(),
        "encap_source",
        values::range,
    );
    let forward = forward(it, report, mode, encap, vip);
    let hashes = [
        ("five_tuple", HashMode::FiveTuple),
        ("source_ip", HashMode::SourceIp),
    ];
    let hash = leaf(it, report, s.hash.as_deref(), "hash", |v| {
        choice(v, "hash", &hashes, &[])
    })
    .or(HashMode::FiveTuple);
    let (to, refs) = match &s.to {
        _ if it.is_broken("to") => (None, Vec::new()),
        None => {
            missing(it, report, "", "to");
            (None, Vec::new())
        }
        Some(to) => target(it, report, to),
    };
    let value = (|| {
        Some(Service {
            name: name.clone()?,
            vip: vip?,
            port: port?,
            protocol: protocol?,
            forward: forward?,
            hash: hash?,
            to: to?,
        })
    })();
    ServiceDraft {
        name,
        vip,
        port,
        protocol,
        refs,
        value,
    }
}

/// A `forward:` word, before `ipip` has its range.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    DsrL2,
    Nat,
    Ipip,
}

/// The forwarding mode from `forward:` and `encap_source:`: `ipip` needs a range of the
/// VIP's family (the outer header's), and no other mode takes one.
fn forward(
    it: &Item<ServiceSpec>,
    report: &mut Report,
    mode: Option<Mode>,
    encap: Field<(IpAddr, u8)>,
    vip: Option<IpAddr>,
) -> Option<Forward> {
    let example = "such as `encap_source: 198.18.250.0/24` (IPv6: `2001:db8:250::/64`)";
    match (mode?, encap) {
        (Mode::Ipip, Field::Absent) => {
            it.err(
                report,
                "",
                "forward mode \"ipip\" needs the key \"encap_source\": the range the outer \
                 source addresses come from"
                    .to_owned(),
                Some(example.to_owned()),
            );
            None
        }
        (Mode::Ipip, Field::Ok((network, prefix))) => {
            let vip = vip?;
            if network.is_ipv4() != vip.is_ipv4() {
                let family = |a: IpAddr| if a.is_ipv4() { "IPv4" } else { "IPv6" };
                it.err(
                    report,
                    "encap_source",
                    format!(
                        "encap_source {network}/{prefix} is {}, but the vip {vip} is {}",
                        family(network),
                        family(vip)
                    ),
                    Some(
                        "the outer header has the family of the VIP and its backends \
                         (IPv4 in IPv4, IPv6 in IPv6)"
                            .to_owned(),
                    ),
                );
                return None;
            }
            Some(Forward::Ipip(SourceRange { network, prefix }))
        }
        (other, Field::Ok(_)) => {
            let name = if other == Mode::Nat { "nat" } else { "dsr-l2" };
            it.err(
                report,
                "encap_source",
                format!("encap_source is only for forward: ipip, not {name}"),
                None,
            );
            None
        }
        (_, Field::Bad) => None,
        (Mode::DsrL2, Field::Absent) => Some(Forward::DsrL2),
        (Mode::Nat, Field::Absent) => Some(Forward::Nat),
    }
}

/// `to:`, and the pools it names (checked to exist later, with the whole config).
fn target(
    it: &Item<ServiceSpec>,
    report: &mut Report,
    to: &TargetSpec,
) -> (Option<Target>, Vec<(String, String)>) {
    let given: Vec<&str> = [
        ("pool", to.pool.is_some() || it.is_broken("to.pool")),
        ("split", to.split.is_some() || it.is_broken("to.split")),
        ("decide", to.decide.is_some() || it.is_broken("to.decide")),
    ]
    .into_iter()
    .filter_map(|(key, set)| set.then_some(key))
    .collect();
    match given.as_slice() {
        [] => {
            let message = "`to` needs one of pool, split, decide".to_owned();
            let hint = Some("for example `to: { pool: dc1 }`".to_owned());
            it.err(report, "to", message, hint);
        }
        [_] => {}
        _ => {
            let message = format!(
                "`to` has {}: give exactly one of pool, split, decide",
                given.join(" and ")
            );
            it.err(report, "to", message, None);
        }
    }
    let mut refs = Vec::new();
    let mut target = None;
    let pool = leaf(it, report, to.pool.as_deref(), "to.pool", |v| {
        if v.is_empty() {
            Err(("pool name must not be empty".to_owned(), None))
        } else {
            Ok(v.to_owned())
        }
    });
    if let Field::Ok(pool) = pool {
        refs.push(("to.pool".to_owned(), pool.clone()));
        target = Some(Target::Pool(pool));
    }
    if let Some(split) = to.split.as_ref().filter(|_| !it.is_broken("to.split")) {
        target = self::split(it, report, "to.split", split, &mut refs).map(Target::Split);
    }
    let decide = leaf(it, report, to.decide.as_deref(), "to.decide", values::name);
    if let Field::Ok(group) = decide {
        target = Some(Target::Decide(group));
    }
    let target = if given.len() == 1 { target } else { None };
    (target, refs)
}

/// A split at `base` (`to.split`, `rules[0].then.split`): exactly two shares of two different
/// pools, each weight ≥ 1. The pools it names are added to `refs` as `(path, pool)`.
pub(super) fn split<S>(
    it: &Item<S>,
    report: &mut Report,
    base: &str,
    split: &[super::spec::SplitShareSpec],
    refs: &mut Vec<(String, String)>,
) -> Option<Vec<SplitShare>> {
    let mut ok = true;
    if split.len() != 2 {
        let message = format!("a split needs exactly 2 pools, found {}", split.len());
        let hint = Some("the data plane's decision word carries two pools".to_owned());
        it.err(report, base, message, hint);
        ok = false;
    }
    let mut shares = Vec::new();
    for (i, share) in split.iter().enumerate() {
        let rel = index_path(base, i);
        let pool = required(it, report, share.pool.as_deref(), &rel, "pool", |v| {
            Ok(v.to_owned())
        });
        let weight = required(it, report, share.weight.as_deref(), &rel, "weight", |v| {
            values::number(v, "split weight", 1, u32::MAX)
        });
        if let Some(pool) = &pool {
            let pool_rel = key_path(&rel, "pool");
            if shares.iter().any(|s: &SplitShare| &s.pool == pool) {
                let message = format!("pool {pool:?} is in the split twice");
                let hint = Some("split between two different pools".to_owned());
                it.err(report, &pool_rel, message, hint);
                ok = false;
            }
            refs.push((pool_rel, pool.clone()));
        }
        match (pool, weight) {
            (Some(pool), Some(weight)) => shares.push(SplitShare { pool, weight }),
            _ => ok = false,
        }
    }
    ok.then_some(shares)
}

/// Reports every name used twice, naming the first.
fn unique_names<'a, S>(
    kind: &str,
    items: &[Item<S>],
    names: impl Iterator<Item = Option<&'a str>>,
    report: &mut Report,
) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, name) in names.enumerate() {
        let (Some(name), Some(it)) = (name, items.get(i)) else {
            continue;
        };
        match seen.get(name).and_then(|&j| items.get(j)) {
            Some(first) => {
                let hint = format!("first defined at {}", first.location(report, "name"));
                let message = format!("duplicate {kind} name {name:?}");
                it.err(report, "name", message, Some(hint));
            }
            None => {
                seen.insert(name, i);
            }
        }
    }
}

/// Reports two services on one `(vip, port, protocol)`: the key of the services map.
fn unique_addresses(items: &[Item<ServiceSpec>], drafts: &[ServiceDraft], report: &mut Report) {
    let mut seen: HashMap<(IpAddr, u16, Protocol), usize> = HashMap::new();
    for (i, (it, draft)) in items.iter().zip(drafts).enumerate() {
        let (Some(vip), Some(port), Some(protocol)) = (draft.vip, draft.port, draft.protocol)
        else {
            continue;
        };
        match seen.get(&(vip, port, protocol)) {
            Some(&j) => {
                let other = drafts.get(j).and_then(|d| d.name.as_deref()).unwrap_or("?");
                let first = items
                    .get(j)
                    .map(|f| f.location(report, "vip"))
                    .unwrap_or_default();
                let proto = match protocol {
                    Protocol::Tcp => "tcp",
                    Protocol::Udp => "udp",
                };
                let message = format!(
                    "{}/{proto} is already the address of service {other:?}",
                    SocketAddr::new(vip, port)
                );
                it.err(report, "vip", message, Some(format!("first at {first}")));
            }
            None => {
                seen.insert((vip, port, protocol), i);
            }
        }
    }
}

/// Checks that every pool a service names exists; returns, per pool, the services using it.
fn references(
    parsed: &Parsed,
    pools: &[pool::Draft],
    services: &[ServiceDraft],
    report: &mut Report,
) -> Vec<Vec<usize>> {
    let names: Vec<&str> = pools.iter().filter_map(|p| p.name.as_deref()).collect();
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    for (i, p) in pools.iter().enumerate() {
        if let Some(name) = p.name.as_deref() {
            by_name.entry(name).or_insert(i);
        }
    }
    let unparsed_hint = unparsed_hint(parsed, report, "it may be defined in");
    let mut users = vec![Vec::new(); pools.len()];
    for (i, (it, draft)) in parsed.services.iter().zip(services).enumerate() {
        for (rel, pool) in &draft.refs {
            if let Some(&p) = by_name.get(pool.as_str()) {
                if let Some(u) = users.get_mut(p) {
                    u.push(i);
                }
            } else {
                let hint = did_you_mean(pool, &names).or_else(|| unparsed_hint.clone());
                it.err(report, rel, format!("unknown pool {pool:?}"), hint);
            }
        }
    }
    users
}

/// Checks that every backend of a pool has the address family of each service using it.
fn families(
    parsed: &Parsed,
    pools: &[pool::Draft],
    services: &[ServiceDraft],
    users: &[Vec<usize>],
    report: &mut Report,
) {
    let family = |ip: &IpAddr| if ip.is_ipv4() { "IPv4" } else { "IPv6" };
    for ((it, draft), users) in parsed.pools.iter().zip(pools).zip(users) {
        for (b, address) in &draft.backends {
            let clash = users.iter().find_map(|&s| {
                let service = services.get(s)?;
                let vip = service.vip?;
                (vip.is_ipv4() != address.is_ipv4()).then_some((s, service, vip))
            });
            let Some((s, service, vip)) = clash else {
                continue;
            };
            let name = service.name.as_deref().unwrap_or("?");
            let message = format!(
                "backend {address} is {} but service {name:?} has the {} virtual IP {vip}",
                family(address),
                family(&vip)
            );
            let at = parsed.services.get(s).map(|x| x.location(report, "vip"));
            let hint = format!(
                "every backend of a pool must have the address family of each service using it \
                 (service {name:?} is at {})",
                at.unwrap_or_default()
            );
            let rel = key_path(&index_path("backends", *b), "address");
            it.err(report, &rel, message, Some(hint));
        }
    }
}

/// Reports every `encap_source` range that holds a virtual IP or a backend's address. A
/// backend drops a packet whose source is one of its own addresses as a martian (RFC 1812
/// §5.3.7; Linux `ip_route_input`), and every backend holds the VIP on its loopback: an outer
/// source from such a range is traffic lost without a trace, for the flows hashed onto it.
fn encap_sources_are_unused(
    parsed: &Parsed,
    pools: &[pool::Draft],
    services: &[ServiceDraft],
    report: &mut Report,
) {
    let hint = Some(
        "the outer source addresses must be addresses no host uses, such as a range set aside \
         for the balancers (the network between them and the backends must let it through)"
            .to_owned(),
    );
    for (it, draft) in parsed.services.iter().zip(services) {
        let Some(Forward::Ipip(range)) = draft.value.as_ref().map(|s| s.forward) else {
            continue;
        };
        let vips = parsed
            .services
            .iter()
            .zip(services)
            .filter_map(|(other, s)| {
                let vip = s.vip.filter(|&v| range.contains(v))?;
                let name = s.name.as_deref().unwrap_or("?");
                let at = other.location(report, "vip");
                Some((
                    vip,
                    format!("{vip}, the virtual IP of service {name:?} ({at})"),
                ))
            });
        let backends = parsed.pools.iter().zip(pools).flat_map(|(other, p)| {
            p.backends.iter().filter_map(|(b, address)| {
                if !range.contains(*address) {
                    return None;
                }
                let name = p.name.as_deref().unwrap_or("?");
                let at = other.location(report, &key_path(&index_path("backends", *b), "address"));
                Some((
                    *address,
                    format!("{address}, a backend of pool {name:?} ({at})"),
                ))
            })
        });
        // One message per range: the first address it holds, where it is, and how many others
        // (an address counted once, however many services or pools name it).
        let mut held: Vec<(IpAddr, String)> = Vec::new();
        for (address, text) in vips.chain(backends) {
            if held.iter().all(|(a, _)| *a != address) {
                held.push((address, text));
            }
        }
        if let Some((_, first)) = held.first() {
            let more = match held.len() {
                1 => String::new(),
                n => format!(" and {} more", n - 1),
            };
            it.err(
                report,
                "encap_source",
                format!("encap_source {range} holds {first}{more}"),
                hint.clone(),
            );
        }
    }
}

/// Reports every backend whose address is a service's virtual IP: NAT would send packets back
/// to the VIP (and the program never lowers the TTL, so nothing ends the loop); DSR would hand
/// them to whatever holds the VIP.
fn backends_are_not_vips(
    parsed: &Parsed,
    pools: &[pool::Draft],
    services: &[ServiceDraft],
    report: &mut Report,
) {
    for (it, draft) in parsed.pools.iter().zip(pools) {
        for (b, address) in &draft.backends {
            let Some((s, service)) = services
                .iter()
                .enumerate()
                .find(|(_, s)| s.vip == Some(*address))
            else {
                continue;
            };
            let name = service.name.as_deref().unwrap_or("?");
            let at = parsed
                .services
                .get(s)
                .map(|x| x.location(report, "vip"))
                .unwrap_or_default();
            let message = format!("{address} is the virtual IP of service {name:?} ({at})");
            let hint = Some("a backend must be a real server's own address".to_owned());
            let rel = key_path(&index_path("backends", *b), "address");
            it.err(report, &rel, message, hint);
        }
    }
}

/// A hint for a name or address a file that could not be loaded may hold: `lead` and the files'
/// names (`it may be defined in 10-web.yaml, which could not be loaded`), or `None` when every
/// file loaded.
pub(super) fn unparsed_hint(parsed: &Parsed, report: &Report, lead: &str) -> Option<String> {
    let files: Vec<&str> = parsed
        .unparsed
        .iter()
        .map(|&f| report.file_name(f))
        .collect();
    if files.is_empty() {
        return None;
    }
    Some(format!(
        "{lead} {}, which could not be loaded",
        files.join(", ")
    ))
}

#[cfg(test)]
mod token_tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::read_token;

    #[test]
    fn a_token_file_others_may_read_is_refused_with_the_chmod_that_fixes_it() {
        let path = std::env::temp_dir().join(format!("switchyard-token-{}", std::process::id()));
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        for (mode, ok) in [
            (0o644, false),
            (0o640, false),
            (0o602, false),
            (0o600, true),
            (0o400, true),
        ] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let got = read_token(&path);
            match (ok, &got) {
                (true, Ok(t)) => assert_eq!(t, "0123456789abcdef0123"),
                (false, Err((msg, Some(hint)))) => {
                    assert!(msg.contains(&format!("(mode {mode:04o})")), "{msg}");
                    assert_eq!(hint, &format!("chmod 600 {}", path.display()));
                }
                _ => panic!("mode {mode:o}: {got:?}"),
            }
        }
        std::fs::remove_file(&path).unwrap();
    }
}
