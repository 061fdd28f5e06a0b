//! A resource-level diff between two configurations: what an operator wants to read before a
//! rollback or after an apply (`ctl diff A B`), not a text diff.
//!
//! Resources are matched by name (services, pools, state variables, decision groups, hooks,
//! client classes),
//! `vips:` entries and backends by address (backends within their pool), rules by id within
//! their group; so moving a resource to another fragment, or reordering services, pools or a
//! virtual IP's host ports, is no change. Rule order is compared, because it breaks priority ties.
//!
//! The order of the changes does not depend on file order: the agent settings, the conntrack
//! timeouts, then services, `vips:` entries, pools (each followed by its backends), state
//! variables, decision groups (each followed by its rules), hooks, client classes; within each, by name (`vips:`
//! entries and backends by address, IPv4 before IPv6).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
};

use serde::{Deserialize, Serialize};

mod render;
use render::canary;
use render::{
    action, breaker, dur, forward, group, hash, host_ports, opt, opt_action, opt_health,
    opt_quoted, pool, probe, protocol, push, rule, service, slow_start, source, target, vip,
    weights, when_all_down,
};

use super::model::{
    Agent, Announce, ClientClass, Config, Conntrack, DecisionGroup, DecisionRule, HealthCheck,
    Hook, Pool, Service, StateSource, StateVar, Vip,
};

/// What happened to a resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// In the new configuration only (`+`).
    Added,
    /// In the old configuration only (`-`).
    Removed,
    /// In both, different (`~`).
    Changed,
}

impl Op {
    /// The prefix of a [`Change`]'s line: `+`, `-` or `~`.
    #[must_use]
    pub fn sign(self) -> char {
        match self {
            Self::Added => '+',
            Self::Removed => '-',
            Self::Changed => '~',
        }
    }
}

/// The kind of resource a [`Change`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `agent:` settings (no name).
    Agent,
    /// `conntrack:` timeouts (no name).
    Conntrack,
    /// `announce:` settings (no name).
    Announce,
    /// A service, by name.
    Service,
    /// A `vips:` entry, by address.
    Vip,
    /// A pool, by name.
    Pool,
    /// A backend, by address, in the pool named by [`Change::parent`].
    Backend,
    /// A state variable, by name.
    State,
    /// A decision group, by name.
    Decision,
    /// A rule, by id, in the decision group named by [`Change::parent`].
    Rule,
    /// A hook, by name.
    Hook,
    /// A client class, by name.
    Class,
}

impl Kind {
    /// How the kind reads in a line: `service`, `backend`, …
    #[must_use]
    pub fn word(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Conntrack => "conntrack",
            Self::Announce => "announce",
            Self::Service => "service",
            Self::Vip => "vip",
            Self::Pool => "pool",
            Self::Backend => "backend",
            Self::State => "state",
            Self::Decision => "decision",
            Self::Rule => "rule",
            Self::Hook => "hook",
            Self::Class => "class",
        }
    }

    /// The kind of the parent of a backend (pool) or a rule (decision group).
    fn parent(self) -> Kind {
        match self {
            Self::Backend => Self::Pool,
            Self::Rule => Self::Decision,
            other => other,
        }
    }
}

/// One setting that differs, as text: `port`, `80`, `8080`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldChange {
    /// The setting, as its key path inside the resource (`port`, `health_check.interval`,
    /// `switch.stable_for`; `rule order` for the order of a group's rules).
    pub field: String,
    /// The old value, as the configuration would spell it (`none` when it was not set).
    pub from: String,
    /// The new value.
    pub to: String,
}

/// One resource added, removed or changed.
///
/// Displayed as one line: `+ service web: 198.18.0.10:80/tcp, forward dsr-l2, hash five_tuple,
/// to pool dc1`, `~ service web: port 80 → 8080`, `~ pool dc1: backend 198.18.1.3 weight 1 → 2`,
/// `- decision web-failover: rule dc2-backup`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// Added, removed or changed.
    pub op: Op,
    /// What kind of resource.
    pub kind: Kind,
    /// The pool of a backend, the decision group of a rule; `None` for the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The resource's name (a `vips:` entry's or a backend's address, a rule's id; empty for the
    /// agent settings and the conntrack timeouts).
    pub name: String,
    /// For an added resource, what it is; for a removed one, what it was (one phrase). Empty
    /// for a change.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub summary: String,
    /// For a change, each setting that differs, in the resource's key order. Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldChange>,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ", self.op.sign())?;
        if let Some(parent) = &self.parent {
            write!(f, "{} {parent}: ", self.kind.parent().word())?;
        }
        f.write_str(self.kind.word())?;
        if !self.name.is_empty() {
            write!(f, " {}", self.name)?;
        }
        // A sub-resource reads as one phrase (`backend 198.18.1.3 weight 1 → 2`); a resource
        // is followed by a colon (`service web: port 80 → 8080`).
        let sep = if self.parent.is_some() { " " } else { ": " };
        if !self.summary.is_empty() {
            write!(f, "{sep}{}", self.summary)?;
        }
        for (i, field) in self.fields.iter().enumerate() {
            let sep = if i == 0 { sep } else { ", " };
            write!(f, "{sep}{} {} → {}", field.field, field.from, field.to)?;
        }
        Ok(())
    }
}

/// The resource-level difference between two configurations; see the module docs for what is
/// compared and in which order.
///
/// `Display` gives one line per change (no trailing newline); JSON is
/// `{"changes":[{"op":"changed","kind":"service","name":"web","fields":[{"field":"port",
/// "from":"80","to":"8080"}]}]}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diff {
    /// Every change, in the order of the module docs.
    pub changes: Vec<Change>,
}

impl Diff {
    /// What changed from `old` to `new`.
    #[must_use]
    pub fn between(old: &Config, new: &Config) -> Self {
        let mut d = Builder::default();
        d.agent(&old.agent, &new.agent);
        d.conntrack(&old.conntrack, &new.conntrack);
        d.announce(old.announce.as_ref(), new.announce.as_ref());
        for (name, old, new) in pair(&old.services, &new.services, |s| s.name.as_str()) {
            d.service(name, old, new);
        }
        for (address, old, new) in pair(&old.vips, &new.vips, |v| v.address) {
            d.vip(&address.to_string(), old, new);
        }
        for (name, old, new) in pair(&old.pools, &new.pools, |p| p.name.as_str()) {
            d.pool(name, old, new);
        }
        for (name, old, new) in pair(&old.state, &new.state, |v| v.name.as_str()) {
            d.state(name, old, new);
        }
        for (name, old, new) in pair(&old.decisions, &new.decisions, |g| g.name.as_str()) {
            d.decision(name, old, new);
        }
        for (name, old, new) in pair(&old.hooks, &new.hooks, |h| h.name.as_str()) {
            d.hook(name, old, new);
        }
        for (name, old, new) in pair(&old.classes, &new.classes, |c| c.name.as_str()) {
            d.class(name, old, new);
        }
        Diff { changes: d.changes }
    }

    /// Whether the two configurations are the same resource by resource.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// How many changes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.changes.len()
    }
}

impl fmt::Display for Diff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, change) in self.changes.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{change}")?;
        }
        Ok(())
    }
}

/// What changed from `old` to `new`: [`Diff::between`].
#[must_use]
pub fn diff(old: &Config, new: &Config) -> Diff {
    Diff::between(old, new)
}

/// The union of two lists' keys in key order, each with the old and the new item. Keys are
/// unique within a validated configuration; were one repeated, the last item would count.
fn pair<'a, K: Ord + Copy, T>(
    old: &'a [T],
    new: &'a [T],
    key: impl Fn(&'a T) -> K,
) -> Vec<(K, Option<&'a T>, Option<&'a T>)> {
    let old: BTreeMap<K, &T> = old.iter().map(|t| (key(t), t)).collect();
    let new: BTreeMap<K, &T> = new.iter().map(|t| (key(t), t)).collect();
    let keys: BTreeSet<K> = old.keys().chain(new.keys()).copied().collect();
    keys.into_iter()
        .map(|k| (k, old.get(&k).copied(), new.get(&k).copied()))
        .collect()
}

/// Collects changes in order.
#[derive(Default)]
struct Builder {
    changes: Vec<Change>,
}

impl Builder {
    fn push(&mut self, op: Op, kind: Kind, parent: Option<&str>, name: String, summary: String) {
        self.changes.push(Change {
            op,
            kind,
            parent: parent.map(str::to_owned),
            name,
            summary,
            fields: Vec::new(),
        });
    }

    /// Adds a `Changed` entry when `fields` has any.
    fn changed(&mut self, kind: Kind, parent: Option<&str>, name: String, fields: Fields) {
        if !fields.0.is_empty() {
            self.changes.push(Change {
                op: Op::Changed,
                kind,
                parent: parent.map(str::to_owned),
                name,
                summary: String::new(),
                fields: fields.0,
            });
        }
    }

    fn agent(&mut self, old: &Agent, new: &Agent) {
        let mut f = Fields::default();
        f.cmp("api", old.api, new.api);
        f.cmp("pin_path", old.pin_path.display(), new.pin_path.display());
        f.cmp(
            "state_dir",
            old.state_dir.display(),
            new.state_dir.display(),
        );
        self.changed(Kind::Agent, None, String::new(), f);
    }

    fn conntrack(&mut self, old: &Conntrack, new: &Conntrack) {
        let mut f = Fields::default();
        f.cmp("tcp_syn", dur(old.tcp_syn), dur(new.tcp_syn));
        f.cmp(
            "tcp_established",
            dur(old.tcp_established),
            dur(new.tcp_established),
        );
        f.cmp("tcp_closing", dur(old.tcp_closing), dur(new.tcp_closing));
        f.cmp("udp", dur(old.udp), dur(new.udp));
        f.cmp(
            "second_chance",
            dur(old.second_chance),
            dur(new.second_chance),
        );
        self.changed(Kind::Conntrack, None, String::new(), f);
    }

    /// Each `announce:` setting; `none` on the side without `announce:`.
    fn hook(&mut self, name: &str, old: Option<&Hook>, new: Option<&Hook>) {
        let events = |h: &Hook| {
            let names: Vec<&str> = h.events.iter().map(|e| e.name()).collect();
            format!("[{}]", names.join(", "))
        };
        let summary = |h: &Hook| {
            format!(
                "{}, events {}, timeout {}",
                h.target,
                events(h),
                dur(h.timeout)
            )
        };
        match (old, new) {
            (None, Some(h)) => self.push(Op::Added, Kind::Hook, None, name.into(), summary(h)),
            (Some(h), None) => self.push(Op::Removed, Kind::Hook, None, name.into(), summary(h)),
            (Some(a), Some(b)) => {
                let mut f = Fields::default();
                f.cmp("runs", &a.target, &b.target);
                f.cmp("events", events(a), events(b));
                f.cmp("timeout", dur(a.timeout), dur(b.timeout));
                self.changed(Kind::Hook, None, name.into(), f);
            }
            (None, None) => {}
        }
    }

    fn announce(&mut self, old: Option<&Announce>, new: Option<&Announce>) {
        let show = |a: Option<&Announce>, f: fn(&Announce) -> String| {
            a.map_or_else(|| "none".to_owned(), f)
        };
        let mut f = Fields::default();
        let fields: [(&str, Shown); 4] = [
            ("interface", |a| a.interface.clone()),
            ("protocol", |a| a.protocol.to_string()),
            ("table", |a| a.table.to_string()),
            ("garp", |a| format!("[{}]", a.garp.join(", "))),
        ];
        for (name, get) in fields {
            f.cmp(name, show(old, get), show(new, get));
        }
        self.changed(Kind::Announce, None, String::new(), f);
    }

    fn service(&mut self, name: &str, old: Option<&Service>, new: Option<&Service>) {
        match (old, new) {
            (None, Some(s)) => self.push(Op::Added, Kind::Service, None, name.into(), service(s)),
            (Some(s), None) => self.push(Op::Removed, Kind::Service, None, name.into(), service(s)),
            (Some(a), Some(b)) => {
                let mut f = Fields::default();
                f.cmp("vip", a.vip, b.vip);
                f.cmp("port", a.port, b.port);
                f.cmp("protocol", protocol(a.protocol), protocol(b.protocol));
                f.cmp("forward", forward(a.forward), forward(b.forward));
                f.cmp("hash", hash(a.hash), hash(b.hash));
                f.cmp("to", target(&a.to), target(&b.to));
                self.changed(Kind::Service, None, name.into(), f);
            }
            (None, None) => {}
        }
    }

    fn vip(&mut self, address: &str, old: Option<&Vip>, new: Option<&Vip>) {
        match (old, new) {
            (None, Some(v)) => self.push(Op::Added, Kind::Vip, None, address.into(), vip(v)),
            (Some(v), None) => self.push(Op::Removed, Kind::Vip, None, address.into(), vip(v)),
            (Some(a), Some(b)) => {
                let mut f = Fields::default();
                f.cmp("echo", a.echo, b.echo);
                f.cmp(
                    "host_ports",
                    host_ports(&a.host_ports),
                    host_ports(&b.host_ports),
                );
                f.cmp(
                    "new_flows_per_second",
                    opt(a.new_flows_per_second),
                    opt(b.new_flows_per_second),
                );
                self.changed(Kind::Vip, None, address.into(), f);
            }
            (None, None) => {}
        }
    }

    fn pool(&mut self, name: &str, old: Option<&Pool>, new: Option<&Pool>) {
        fn name_of<'a>(old: Option<&'a Pool>, new: Option<&'a Pool>) -> &'a str {
            old.or(new).map_or("", |p| p.name.as_str())
        }
        match (old, new) {
            (None, Some(p)) => self.push(Op::Added, Kind::Pool, None, name.into(), pool(p)),
            (Some(p), None) => self.push(Op::Removed, Kind::Pool, None, name.into(), pool(p)),
            (Some(a), Some(b)) => {
                let mut f = Fields::default();
                f.health(
                    "health_check",
                    a.health_check.as_ref(),
                    b.health_check.as_ref(),
                );
                f.cmp(
                    "when_all_down",
                    when_all_down(a.when_all_down),
                    when_all_down(b.when_all_down),
                );
                f.cmp(
                    "slow_start",
                    slow_start(a.slow_start),
                    slow_start(b.slow_start),
                );
                f.cmp("breaker", breaker(a.breaker), breaker(b.breaker));
                f.cmp(
                    "weights",
                    weights(a.adaptive.as_ref()),
                    weights(b.adaptive.as_ref()),
                );
                f.cmp(
                    "on_backend_down",
                    a.on_backend_down.name(),
                    b.on_backend_down.name(),
                );
                self.changed(Kind::Pool, None, name.into(), f);
            }
            (None, None) => {}
        }
        let none = [];
        let old_backends = old.map_or(&none[..], |p| &p.backends);
        let new_backends = new.map_or(&none[..], |p| &p.backends);
        for (address, a, b) in pair(old_backends, new_backends, |b| b.address) {
            let name = address.to_string();
            match (a, b) {
                (None, Some(b)) => {
                    let summary = format!("weight {}", b.weight);
                    self.push(
                        Op::Added,
                        Kind::Backend,
                        Some(name_of(old, new)),
                        name,
                        summary,
                    );
                }
                (Some(a), None) => {
                    let summary = format!("weight {}", a.weight);
                    self.push(
                        Op::Removed,
                        Kind::Backend,
                        Some(name_of(old, new)),
                        name,
                        summary,
                    );
                }
                (Some(a), Some(b)) => {
                    let mut f = Fields::default();
                    f.cmp("weight", a.weight, b.weight);
                    self.changed(Kind::Backend, Some(name_of(old, new)), name, f);
                }
                (None, None) => {}
            }
        }
    }

    fn state(&mut self, name: &str, old: Option<&StateVar>, new: Option<&StateVar>) {
        match (old, new) {
            (None, Some(v)) => {
                self.push(Op::Added, Kind::State, None, name.into(), source(&v.source));
            }
            (Some(v), None) => self.push(
                Op::Removed,
                Kind::State,
                None,
                name.into(),
                source(&v.source),
            ),
            (Some(a), Some(b)) => {
                let mut f = Fields::default();
                match (&a.source, &b.source) {
                    (StateSource::Probe(a), StateSource::Probe(b)) => {
                        f.cmp("probe.address", opt(a.address), opt(b.address));
                        f.health("probe", Some(&a.check), Some(&b.check));
                    }
                    (StateSource::Push(a), StateSource::Push(b)) => {
                        f.cmp("push.default", push(a), push(b));
                    }
                    (StateSource::Expr(a), StateSource::Expr(b)) => {
                        f.cmp("expr", format!("{a:?}"), format!("{b:?}"));
                    }
                    (StateSource::Metric(a), StateSource::Metric(b)) => {
                        f.cmp("metric.of", &a.of, &b.of);
                        f.cmp("metric.above", a.above, b.above);
                        f.cmp("metric.below", a.below, b.below);
                        f.cmp("metric.for", dur(a.hold), dur(b.hold));
                    }
                    (a, b) => f.cmp("source", source(a), source(b)),
                }
                self.changed(Kind::State, None, name.into(), f);
            }
            (None, None) => {}
        }
    }

    fn class(&mut self, name: &str, old: Option<&ClientClass>, new: Option<&ClientClass>) {
        let prefixes = |c: &ClientClass| {
            let all: Vec<String> = c.prefixes.iter().map(ToString::to_string).collect();
            all.join(", ")
        };
        let summary =
            |c: &ClientClass| format!("prefixes {}, precedence {}", prefixes(c), opt(c.precedence));
        match (old, new) {
            (None, Some(c)) => self.push(Op::Added, Kind::Class, None, name.into(), summary(c)),
            (Some(c), None) => self.push(Op::Removed, Kind::Class, None, name.into(), summary(c)),
            (Some(a), Some(b)) => {
                let mut f = Fields::default();
                f.cmp("prefixes", prefixes(a), prefixes(b));
                f.cmp("precedence", opt(a.precedence), opt(b.precedence));
                self.changed(Kind::Class, None, name.into(), f);
            }
            (None, None) => {}
        }
    }

    fn decision(&mut self, name: &str, old: Option<&DecisionGroup>, new: Option<&DecisionGroup>) {
        match (old, new) {
            (None, Some(g)) => self.push(Op::Added, Kind::Decision, None, name.into(), group(g)),
            (Some(g), None) => self.push(Op::Removed, Kind::Decision, None, name.into(), group(g)),
            (Some(a), Some(b)) => {
                let mut f = Fields::default();
                f.cmp(
                    "default",
                    opt_action(a.default.as_ref()),
                    opt_action(b.default.as_ref()),
                );
                let (sa, sb) = (&a.switch, &b.switch);
                f.cmp("switch.stable_for", dur(sa.stable_for), dur(sb.stable_for));
                f.cmp("switch.cooldown", dur(sa.cooldown), dur(sb.cooldown));
                f.cmp(
                    "switch.failback_after",
                    dur(sa.failback_after),
                    dur(sb.failback_after),
                );
                f.cmp(
                    "require",
                    opt_quoted(a.require.as_deref()),
                    opt_quoted(b.require.as_deref()),
                );
                f.cmp(
                    "automatic",
                    opt(a.automatic.as_deref()),
                    opt(b.automatic.as_deref()),
                );
                f.cmp("on_failback", a.on_failback.name(), b.on_failback.name());
                f.cmp(
                    "canary",
                    canary(a.canary.as_ref()),
                    canary(b.canary.as_ref()),
                );
                f.cmp("split_by", a.split_by.name(), b.split_by.name());
                // Declaration order breaks priority ties: compare the order of the rules both
                // have (added and removed ones are listed on their own).
                let ids_a: BTreeSet<&str> = a.rules.iter().map(|r| r.id.as_str()).collect();
                let ids_b: BTreeSet<&str> = b.rules.iter().map(|r| r.id.as_str()).collect();
                let common = |rules: &[DecisionRule], other: &BTreeSet<&str>| {
                    rules
                        .iter()
                        .map(|r| r.id.as_str())
                        .filter(|id| other.contains(id))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                f.cmp(
                    "rule order",
                    common(&a.rules, &ids_b),
                    common(&b.rules, &ids_a),
                );
                self.changed(Kind::Decision, None, name.into(), f);
            }
            (None, None) => {}
        }
        let none = [];
        let old_rules = old.map_or(&none[..], |g| &g.rules);
        let new_rules = new.map_or(&none[..], |g| &g.rules);
        for (id, a, b) in pair(old_rules, new_rules, |r| r.id.as_str()) {
            match (a, b) {
                (None, Some(r)) => self.push(Op::Added, Kind::Rule, Some(name), id.into(), rule(r)),
                (Some(r), None) => {
                    self.push(Op::Removed, Kind::Rule, Some(name), id.into(), rule(r));
                }
                (Some(a), Some(b)) => {
                    let mut f = Fields::default();
                    f.cmp("priority", a.priority, b.priority);
                    f.cmp("when", format!("{:?}", a.when), format!("{:?}", b.when));
                    f.cmp("then", action(&a.then), action(&b.then));
                    self.changed(Kind::Rule, Some(name), id.into(), f);
                }
                (None, None) => {}
            }
        }
    }
}

/// The settings that differ within one resource.
#[derive(Default)]
struct Fields(Vec<FieldChange>);

/// One `announce:` setting as [`Fields::cmp`] compares it.
type Shown = fn(&Announce) -> String;

impl Fields {
    /// Records `field` if its two values read differently. Every value is compared as it is
    /// shown: the text forms used here are exact (addresses, integers, shortest round-trip
    /// floats, durations to the nanosecond), so equal text means an equal setting.
    fn cmp(&mut self, field: &str, from: impl fmt::Display, to: impl fmt::Display) {
        let (from, to) = (from.to_string(), to.to_string());
        if from != to {
            self.0.push(FieldChange {
                field: field.to_owned(),
                from,
                to,
            });
        }
    }

    /// Records the differences between two health checks under `prefix`: the whole check when
    /// one side has none, else each setting.
    fn health(&mut self, prefix: &str, old: Option<&HealthCheck>, new: Option<&HealthCheck>) {
        match (old, new) {
            (Some(a), Some(b)) => {
                let p = |key: &str| format!("{prefix}.{key}");
                self.cmp(&p("probe"), probe(&a.kind), probe(&b.kind));
                self.cmp(&p("interval"), dur(a.interval), dur(b.interval));
                self.cmp(&p("timeout"), dur(a.timeout), dur(b.timeout));
                self.cmp(
                    &p("unhealthy_threshold"),
                    a.unhealthy_threshold,
                    b.unhealthy_threshold,
                );
                self.cmp(
                    &p("healthy_threshold"),
                    a.healthy_threshold,
                    b.healthy_threshold,
                );
                self.cmp(&p("backoff.factor"), a.backoff.factor, b.backoff.factor);
                self.cmp(&p("backoff.max"), dur(a.backoff.max), dur(b.backoff.max));
            }
            (a, b) => self.cmp(prefix, opt_health(a), opt_health(b)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_files;

    /// A config with services, pools, state and a decision group; each test edits a copy.
    const BASE: &str = "\
services:
  - { name: web, vip: 198.18.0.10, port: 80, protocol: tcp, forward: dsr-l2, to: { decide: wf } }
  - { name: dns, vip: 198.18.0.11, port: 53, protocol: udp, forward: nat, to: { pool: dc1 } }
pools:
  - name: dc1
    backends:
      - { address: 198.18.1.2, weight: 1 }
      - { address: 198.18.1.3, weight: 1 }
    health_check: { tcp: { port: 80 }, interval: 1s }
  - name: dc2
    backends: [ { address: 198.18.2.2 } ]
state:
  up: { push: { default: true } }
  ready: { expr: \"up\" }
decisions:
  - name: wf
    rules:
      - { id: primary, priority: 100, when: up, then: { pool: dc1 } }
      - { id: backup, priority: 90, when: NOT up, then: { pool: dc2 } }
    default: { pool: dc1 }
";

    fn config(files: &[(&str, &str)]) -> Config {
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect();
        load_files(&files).unwrap_or_else(|e| panic!("{e}"))
    }

    fn lines(old: &str, new: &str) -> Vec<String> {
        let d = Diff::between(&config(&[("x.yaml", old)]), &config(&[("x.yaml", new)]));
        d.to_string().lines().map(str::to_owned).collect()
    }

    /// `BASE` with each `(from, to)` replaced once (each `from` must be there).
    fn edit(pairs: &[(&str, &str)]) -> String {
        let mut text = BASE.to_owned();
        for (from, to) in pairs {
            assert!(text.contains(from), "{from}");
            text = text.replacen(from, to, 1);
        }
        text
    }

    #[test]
    fn classes_are_added_removed_and_changed_by_name() {
        let old = format!(
            "{BASE}classes:\n  vip: {{ prefixes: [198.18.5.0/24] }}\n  gone: {{ prefixes: [198.18.7.0/24] }}\n"
        );
        let new = format!(
            "{BASE}classes:\n  vip: {{ prefixes: [198.18.5.0/24, 198.18.8.0/24], precedence: 3 }}\n  \
             new: {{ prefixes: [\"2001:db8:5::/48\"] }}\n"
        );
        assert_eq!(
            lines(&old, &new),
            [
                "- class gone: prefixes 198.18.7.0/24, precedence none",
                "+ class new: prefixes 2001:db8:5::/48, precedence none",
                "~ class vip: prefixes 198.18.5.0/24 → 198.18.5.0/24, 198.18.8.0/24, precedence none → 3",
            ]
        );
    }

    #[test]
    fn hooks_are_added_removed_and_changed_by_name() {
        let old = format!(
            "{BASE}hooks:\n  - {{ name: page, command: [/bin/page, lb] }}\n  \
             - {{ name: gone, url: \"http://127.0.0.1:8099/\" }}\n"
        );
        let new = format!(
            "{BASE}hooks:\n  - {{ name: page, command: [/bin/page, lb], events: [switch], \
             timeout: 1s }}\n  - {{ name: new, url: \"http://127.0.0.1:8099/x\" }}\n"
        );
        assert_eq!(
            lines(&old, &new),
            [
                "- hook gone: POST http://127.0.0.1:8099/, events [switch, health, \
                 config_rejected], timeout 5s",
                "+ hook new: POST http://127.0.0.1:8099/x, events [switch, health, \
                 config_rejected], timeout 5s",
                "~ hook page: events [switch, health, config_rejected] → [switch], timeout 5s → 1s",
            ]
        );
    }

    #[test]
    fn the_same_config_has_no_changes_whatever_its_file_layout() {
        let whole = config(&[("x.yaml", BASE)]);
        let (services, rest) = BASE.split_at(BASE.find("pools:").unwrap());
        // Split across files in the other order: services and pools reorder, nothing changes.
        let split = config(&[("10-pools.yaml", rest), ("20-services.yaml", services)]);
        assert_ne!(whole.pools.len(), 0);
        let d = Diff::between(&whole, &split);
        assert!(d.is_empty(), "{d}");
        assert_eq!(d.to_string(), "");
        assert_eq!(serde_json::to_string(&d).unwrap(), r#"{"changes":[]}"#);
    }

    #[test]
    fn service_settings_are_compared_one_by_one() {
        let new = edit(&[
            ("port: 80,", "port: 8080,"),
            (
                "forward: nat, to: { pool: dc1 }",
                "forward: nat, to: { pool: dc2 }",
            ),
        ]);
        assert_eq!(
            lines(BASE, &new),
            [
                "~ service dns: to pool dc1 → pool dc2",
                "~ service web: port 80 → 8080"
            ]
        );
        let new = edit(&[(
            "vip: 198.18.0.11, port: 53, protocol: udp, forward: nat",
            "vip: 198.18.0.12, port: 53, protocol: tcp, forward: dsr-l2, hash: source_ip",
        )]);
        assert_eq!(
            lines(BASE, &new),
            [
                "~ service dns: vip 198.18.0.11 → 198.18.0.12, protocol udp → tcp, forward nat → dsr-l2, hash five_tuple → source_ip"
            ]
        );
    }

    #[test]
    fn services_added_and_removed_say_what_they_are() {
        let new = edit(&[(
            "  - { name: dns, vip: 198.18.0.11, port: 53, protocol: udp, forward: nat, to: { pool: dc1 } }\n",
            "  - { name: api, vip: 198.18.0.12, port: 443, protocol: tcp, forward: nat, to: { split: [ { pool: dc1, weight: 3 }, { pool: dc2, weight: 1 } ] } }\n",
        )]);
        assert_eq!(
            lines(BASE, &new),
            [
                "+ service api: 198.18.0.12:443/tcp, forward nat, hash five_tuple, to split dc1:3,dc2:1",
                "- service dns: 198.18.0.11:53/udp, forward nat, hash five_tuple, to pool dc1",
            ]
        );
    }

    #[test]
    fn backends_are_matched_by_address_within_their_pool() {
        let new = edit(&[
            // Reordered (no change), one weight changed, one removed, one added.
            (
                "      - { address: 198.18.1.2, weight: 1 }\n      - { address: 198.18.1.3, weight: 1 }\n",
                "      - { address: 198.18.1.4 }\n      - { address: 198.18.1.3, weight: 2 }\n",
            ),
        ]);
        assert_eq!(
            lines(BASE, &new),
            [
                "- pool dc1: backend 198.18.1.2 weight 1",
                "~ pool dc1: backend 198.18.1.3 weight 1 → 2",
                "+ pool dc1: backend 198.18.1.4 weight 100",
            ]
        );
        let reordered = edit(&[(
            "      - { address: 198.18.1.2, weight: 1 }\n      - { address: 198.18.1.3, weight: 1 }\n",
            "      - { address: 198.18.1.3, weight: 1 }\n      - { address: 198.18.1.2, weight: 1 }\n",
        )]);
        assert!(lines(BASE, &reordered).is_empty());
    }

    #[test]
    fn pool_settings_and_health_checks_are_compared() {
        let new = edit(&[(
            "health_check: { tcp: { port: 80 }, interval: 1s }",
            "health_check: { http: { port: 8080, path: /health }, interval: 500ms, unhealthy_threshold: 2 }\n    when_all_down: pass",
        )]);
        assert_eq!(
            lines(BASE, &new),
            [
                "~ pool dc1: health_check.probe tcp port 80 → http port 8080 path /health expect 200, \
                 health_check.interval 1s → 500ms, health_check.timeout 1s → 500ms, \
                 health_check.unhealthy_threshold 3 → 2, health_check.backoff.max 1s → 500ms, \
                 when_all_down drop → pass"
            ]
        );
        let new = edit(&[(
            "\n    health_check: { tcp: { port: 80 }, interval: 1s }",
            "",
        )]);
        assert_eq!(
            lines(BASE, &new),
            ["~ pool dc1: health_check tcp port 80 every 1s → none"]
        );
    }

    #[test]
    fn a_renamed_pool_is_one_removed_and_one_added_with_their_backends() {
        let new = BASE.replace("dc2", "dc3");
        assert_eq!(
            lines(BASE, &new),
            [
                "- pool dc2: 1 backend, health_check none, when_all_down drop",
                "- pool dc2: backend 198.18.2.2 weight 100",
                "+ pool dc3: 1 backend, health_check none, when_all_down drop",
                "+ pool dc3: backend 198.18.2.2 weight 100",
                "~ decision wf: rule backup then pool dc2 → pool dc3",
            ]
        );
    }

    #[test]
    fn state_variables_compare_their_source() {
        let new = edit(&[
            (
                "up: { push: { default: true } }",
                "up: { push: { default: false } }",
            ),
            (
                "ready: { expr: \"up\" }",
                "ready: { push: { default: \"yes\" } }\n  maint: { push: { default: 3 } }",
            ),
        ]);
        assert_eq!(
            lines(BASE, &new),
            [
                "+ state maint: push default 3",
                "~ state ready: source expr \"up\" → push default \"yes\"",
                "~ state up: push.default true → false",
            ]
        );
    }

    #[test]
    fn flow_policies_show_as_changes() {
        let new = edit(&[
            (
                "backends: [ { address: 198.18.2.2 } ]",
                "backends: [ { address: 198.18.2.2 } ]\n    on_backend_down: reset",
            ),
            (
                "default: { pool: dc1 }",
                "default: { pool: dc1 }\n    on_failback: migrate",
            ),
        ]);
        assert_eq!(
            lines(BASE, &new),
            [
                "~ pool dc2: on_backend_down keep → reset",
                "~ decision wf: on_failback keep → migrate",
            ]
        );
        // Saying the default changes nothing.
        let same = edit(&[(
            "backends: [ { address: 198.18.2.2 } ]",
            "backends: [ { address: 198.18.2.2 } ]\n    on_backend_down: keep",
        )]);
        assert!(lines(BASE, &same).is_empty());
    }

    #[test]
    fn decision_groups_compare_settings_rules_and_rule_order() {
        let new = edit(&[
            (
                "      - { id: primary, priority: 100, when: up, then: { pool: dc1 } }\n      - { id: backup, priority: 90, when: NOT up, then: { pool: dc2 } }\n",
                "      - { id: backup, priority: 90, when: NOT up, then: { split: [ { pool: dc2, weight: 9 }, { pool: dc1, weight: 1 } ] } }\n      - { id: primary, priority: 110, when: up AND ready, then: { pool: dc1 } }\n      - { id: canary, when: ready, then: { pool: dc2 } }\n",
            ),
            (
                "default: { pool: dc1 }",
                "default: { pool: dc2 }\n    switch: { stable_for: 2s }\n    automatic: up",
            ),
        ]);
        assert_eq!(
            lines(BASE, &new),
            [
                "~ decision wf: default pool dc1 → pool dc2, switch.stable_for 0s → 2s, \
                 automatic none → up, rule order primary, backup → backup, primary",
                "~ decision wf: rule backup then pool dc2 → split dc2:9,dc1:1",
                "+ decision wf: rule canary priority 0, when \"ready\", then pool dc2",
                "~ decision wf: rule primary priority 100 → 110, when \"up\" → \"up AND ready\"",
            ]
        );
        let without = BASE
            .split("decisions:")
            .next()
            .unwrap()
            .replace("to: { decide: wf }", "to: { pool: dc1 }");
        assert_eq!(
            lines(BASE, &without),
            [
                "~ service web: to decide wf → pool dc1",
                "- decision wf: 2 rules, default pool dc1",
                "- decision wf: rule backup priority 90, when \"NOT up\", then pool dc2",
                "- decision wf: rule primary priority 100, when \"up\", then pool dc1",
            ]
        );
    }

    #[test]
    fn agent_settings_are_compared() {
        let new = format!("{BASE}agent: {{ api: 127.0.0.1:9901, state_dir: /srv/sy }}\n");
        assert_eq!(
            lines(BASE, &new),
            [
                "~ agent: api 127.0.0.1:9900 → 127.0.0.1:9901, state_dir /var/lib/switchyard → /srv/sy"
            ]
        );
    }

    #[test]
    fn announce_settings_are_compared() {
        let new = format!("{BASE}announce: {{ garp: [eth0] }}\n");
        assert_eq!(
            lines(BASE, &new),
            [
                "~ announce: interface none → switchyard0, protocol none → 83, table none → 254, \
              garp none → [eth0]"
            ]
        );
        let other = format!("{BASE}announce: {{ interface: vips0, garp: [eth0] }}\n");
        assert_eq!(
            lines(&new, &other),
            ["~ announce: interface switchyard0 → vips0"]
        );
    }

    #[test]
    fn conntrack_timeouts_are_compared() {
        let new = format!("{BASE}conntrack: {{ tcp_established: 1h, udp: 30s }}\n");
        assert_eq!(
            lines(BASE, &new),
            ["~ conntrack: tcp_established 15m → 1h, udp 1m → 30s"]
        );
        // Written out at their defaults, the timeouts are no change.
        let defaults = format!(
            "{BASE}conntrack: {{ tcp_syn: 60s, tcp_established: 900s, tcp_closing: 10s, udp: 1m }}\n"
        );
        assert!(lines(BASE, &defaults).is_empty());
        let json = serde_json::to_value(Diff::between(
            &config(&[("x.yaml", BASE)]),
            &config(&[("x.yaml", &new)]),
        ))
        .unwrap();
        assert_eq!(json["changes"][0]["kind"], "conntrack");
    }

    #[test]
    fn vips_entries_are_matched_by_address() {
        let one =
            format!("{BASE}vips:\n  - {{ address: 198.18.0.10, host_ports: [udp/161, tcp/22] }}\n");
        assert_eq!(
            lines(BASE, &one),
            ["+ vip 198.18.0.10: echo true, host_ports [tcp/22, udp/161]"]
        );
        assert_eq!(
            lines(&one, BASE),
            ["- vip 198.18.0.10: echo true, host_ports [tcp/22, udp/161]"]
        );
        // Settings compared one by one; the order of the host ports is no change.
        let changed = format!(
            "{BASE}vips:\n  - {{ address: 198.18.0.10, echo: false, host_ports: [tcp/22] }}\n"
        );
        assert_eq!(
            lines(&one, &changed),
            ["~ vip 198.18.0.10: echo true → false, host_ports [tcp/22, udp/161] → [tcp/22]"]
        );
        let reordered = one.replace("[udp/161, tcp/22]", "[tcp/22, udp/161]");
        assert!(lines(&one, &reordered).is_empty());
        // After the services, before the pools; by address, IPv4 before IPv6, whatever the
        // file order.
        let v6 = edit(&[
            (
                "  - { name: dns,",
                "  - { name: dns6, vip: 2001:db8::11, port: 53, protocol: udp, forward: nat, \
                 to: { pool: dc6 } }\n  - { name: dns,",
            ),
            (
                "state:\n",
                "  - { name: dc6, backends: [ { address: 2001:db8:1::2 } ] }\nstate:\n",
            ),
        ]);
        let new = v6
            .replacen(
                "pools:\n",
                "vips:\n  - { address: 2001:db8::11, echo: false }\n  \
                 - { address: 198.18.0.11, host_ports: [] }\npools:\n",
                1,
            )
            .replace("to: { pool: dc1 } }", "to: { pool: dc2 } }")
            .replace(
                "backends: [ { address: 198.18.2.2 } ]",
                "backends: [ { address: 198.18.2.2 } ]\n    when_all_down: pass",
            );
        assert_eq!(
            lines(&v6, &new),
            [
                "~ service dns: to pool dc1 → pool dc2",
                "+ vip 198.18.0.11: echo true, host_ports []",
                "+ vip 2001:db8::11: echo false, host_ports []",
                "~ pool dc2: when_all_down drop → pass",
            ]
        );
        let json = serde_json::to_value(Diff::between(
            &config(&[("x.yaml", &one)]),
            &config(&[("x.yaml", &changed)]),
        ))
        .unwrap();
        assert_eq!(json["changes"][0]["kind"], "vip");
        assert_eq!(json["changes"][0]["name"], "198.18.0.10");
        assert_eq!(json["changes"][0]["fields"][1]["field"], "host_ports");
    }

    #[test]
    fn json_names_each_part_of_a_change() {
        let old = config(&[("x.yaml", BASE)]);
        let new = config(&[(
            "x.yaml",
            &edit(&[
                ("port: 80,", "port: 8080,"),
                (
                    "{ address: 198.18.1.3, weight: 1 }",
                    "{ address: 198.18.1.3, weight: 2 }",
                ),
            ]),
        )]);
        let d = Diff::between(&old, &new);
        assert_eq!(d.len(), 2);
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            serde_json::json!({ "changes": [
                { "op": "changed", "kind": "service", "name": "web",
                  "fields": [ { "field": "port", "from": "80", "to": "8080" } ] },
                { "op": "changed", "kind": "backend", "parent": "dc1", "name": "198.18.1.3",
                  "fields": [ { "field": "weight", "from": "1", "to": "2" } ] },
            ] })
        );
        // The CLI reads back what the API sends.
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<Diff>(&json).unwrap(), d);
        // And the reverse diff undoes it.
        let back = Diff::between(&new, &old);
        assert_eq!(
            back.to_string(),
            "~ service web: port 8080 → 80\n~ pool dc1: backend 198.18.1.3 weight 2 → 1"
        );
    }
}
