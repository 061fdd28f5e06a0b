//! Large generated configurations for the apply benchmarks (the config lifecycle's target: "1,000 services, 5,000
//! backends and 200 rules"), written as fragments an operator could have written
//! (`docs/configuration.md`), and a second version of the same configuration with a typical
//! change in it.
//!
//! ```
//! use router_tests::bench::large_config::{Shape, Version, fragments};
//! let files = fragments(&Shape::LARGE, Version::Base);
//! assert_eq!(files.len(), 100);
//! let cfg = switchyard::config::load_files(&files).unwrap();
//! assert_eq!(cfg.services.len(), 1_000);
//! ```
//!
//! What [`Shape::LARGE`] generates (every number derives from the shape):
//!
//! - **Services**: 1,000, ten per fragment over 100 fragments (`000-large.yaml` …). Four per
//!   virtual IP (`198.19.0.1` … `198.19.0.250`): TCP 80, TCP 443, UDP 53, TCP 8080. One in five
//!   is `nat`, the others `dsr-l2`; one in seven hashes on the source address. Six in ten send
//!   to one pool, two in ten split 90/10 between two pools, two in ten follow a decision group.
//! - **Pools**: 50 of 100 backends each (5,000 backends), in the first 50 fragments; backend `i`
//!   of pool `p` is `198.18.(100+p).(1+i)`, weight 100. Even pools have an HTTP health check,
//!   odd ones a TCP check; one in eight passes to the kernel when all backends are down.
//! - **State**: 43 variables — three global push variables (`automation`, `maintenance`,
//!   `load`) and, per group, a push variable `gN_drain` and a derived `gN_primary_ok`.
//! - **Decisions**: 20 groups of 10 rules (200 rules), each with a default, switch timing,
//!   `require` and `automatic`; rules read state variables and pool built-ins and choose a pool
//!   or a split.
//!
//! [`Version::OneWeight`] changes one backend's weight, the smallest change that reaches the
//! maps. [`Version::Changed`] is the same configuration after a routine change: 1 % of the backends
//! replaced by new addresses (for [`Shape::LARGE`]: one in each pool, 50 in all) and 10 other
//! backends reweighted (100 → 150), in 10 pools. Applying one version over the other exercises
//! every step of a real change: new backend slots beside the old ones, every pool's Maglev table
//! rebuilt and flipped, the replaced backends retired.
//!
//! Addresses are inside the benchmarking range 198.18.0.0/15 and do not meet the standard
//! topology's (`crate::addrs`: `198.18.0.0/24` and `198.18.11–42.0/24`), so the forwarding
//! benchmark can add its real service beside them.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

/// How large a generated configuration is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Services.
    pub services: usize,
    /// Pools (at most `router_common::MAX_POOLS`).
    pub pools: usize,
    /// Backends in each pool (at most [`Shape::MAX_BACKENDS_PER_POOL`]).
    pub backends_per_pool: usize,
    /// Decision groups (services follow them only if there is at least one).
    pub groups: usize,
    /// Rules in each decision group (at least 2).
    pub rules_per_group: usize,
    /// Fragments (files) the configuration is spread over (at least 1).
    pub fragments: usize,
}

impl Shape {
    /// The configuration of the apply benchmark: 1,000 services, 50 pools of 100
    /// backends (5,000), 20 decision groups of 10 rules (200), over 100 fragments.
    pub const LARGE: Self = Self {
        services: 1_000,
        pools: 50,
        backends_per_pool: 100,
        groups: 20,
        rules_per_group: 10,
        fragments: 100,
    };

    /// Most backends per pool: each pool has one /24 (`198.18.(100+p).0/24`) for its backends
    /// and their replacements.
    pub const MAX_BACKENDS_PER_POOL: usize = 120;

    /// Backends in all pools.
    #[must_use]
    pub fn backends(&self) -> usize {
        self.pools * self.backends_per_pool
    }

    /// Rules in all groups.
    #[must_use]
    pub fn rules(&self) -> usize {
        self.groups * self.rules_per_group
    }

    /// State variables: three global ones and two per group.
    #[must_use]
    pub fn state_variables(&self) -> usize {
        3 + 2 * self.groups
    }
}

/// Which version of a shape's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The configuration as described in the module documentation.
    Base,
    /// [`Version::Base`] with 1 % of its backends replaced and 10 backends reweighted.
    Changed,
    /// [`Version::Base`] with one backend reweighted (the first of the first pool): the
    /// smallest change that reaches the maps.
    OneWeight,
}

/// Weight of every backend, except the reweighted ones of [`Version::Changed`].
const WEIGHT: u32 = 100;
/// Weight of the backends [`Version::Changed`] reweights.
const CHANGED_WEIGHT: u32 = 150;
/// Backends [`Version::Changed`] reweights (fewer if the shape has fewer than ten times that).
const REWEIGHTED: usize = 10;

/// Whether backend `global` (pool · backends per pool + index) is replaced in
/// [`Version::Changed`]: one in a hundred, 1 %.
fn replaced(global: usize) -> bool {
    global % 100 == 37
}

/// Whether backend `global` is reweighted in [`Version::Changed`]: [`REWEIGHTED`] backends,
/// evenly spread, none of them a replaced one.
fn reweighted(shape: &Shape, global: usize) -> bool {
    let step = (shape.backends() / REWEIGHTED).max(1);
    global % step == step / 2 && !replaced(global) && global / step < REWEIGHTED
}

/// The number of backends [`Version::Changed`] replaces and reweights: `(replaced, reweighted)`.
#[must_use]
pub fn changes(shape: &Shape) -> (usize, usize) {
    let all = 0..shape.backends();
    (
        all.clone().filter(|g| replaced(*g)).count(),
        all.filter(|g| reweighted(shape, *g)).count(),
    )
}

/// Name of pool `p`.
#[must_use]
pub fn pool_name(p: usize) -> String {
    format!("p{p:02}")
}

/// Address of backend `i` of pool `p` in `version`.
///
/// # Panics
/// If `p` is 156 or more or `i` is [`Shape::MAX_BACKENDS_PER_POOL`] or more (no such address in
/// the pool's /24).
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    reason = "in range by the assertion: 100 + p ≤ 255, host ≤ 241"
)]
pub fn backend_address(shape: &Shape, p: usize, i: usize, version: Version) -> Ipv4Addr {
    assert!(
        p < 156 && i < Shape::MAX_BACKENDS_PER_POOL,
        "pool {p}, backend {i}"
    );
    let global = p * shape.backends_per_pool + i;
    // A replacement lives in the upper half of the pool's /24, out of the way of the others.
    let host = if version == Version::Changed && replaced(global) {
        1 + Shape::MAX_BACKENDS_PER_POOL + i
    } else {
        1 + i
    };
    Ipv4Addr::new(198, 18, (100 + p) as u8, host as u8)
}

/// Virtual IP of service `s`: four services per address, from `198.19.0.1`.
#[expect(
    clippy::cast_possible_truncation,
    reason = "1 + v % 250 ≤ 250, and v / 250 fits an octet below 256,000 services"
)]
fn vip(s: usize) -> Ipv4Addr {
    let v = s / 4;
    Ipv4Addr::new(198, 19, (v / 250) as u8, (1 + v % 250) as u8)
}

/// The fragments of `shape`'s configuration in `version`, as `(file name, YAML text)` in name
/// order, ready for `switchyard::config::load_files` or to be written into a directory.
///
/// # Panics
/// If the shape has no fragment, no pool, fewer than two rules per group, more pools than the
/// addresses allow (155) or more than [`Shape::MAX_BACKENDS_PER_POOL`] backends per pool. (Data
/// plane limits are the configuration's to check: a shape beyond them gives a configuration
/// that is rejected.)
#[must_use]
pub fn fragments(shape: &Shape, version: Version) -> Vec<(String, String)> {
    assert!(shape.fragments >= 1, "at least one fragment");
    assert!(shape.pools >= 1, "at least one pool");
    assert!(
        shape.groups == 0 || shape.rules_per_group >= 2,
        "a group has at least two rules"
    );
    assert!(
        shape.pools < 156 && shape.backends_per_pool <= Shape::MAX_BACKENDS_PER_POOL,
        "{shape:?} has more pools or backends than addresses"
    );
    let mut files: Vec<Sections> = (0..shape.fragments).map(|_| Sections::default()).collect();
    let per_file = shape.services.div_ceil(shape.fragments);
    for s in 0..shape.services {
        files[s / per_file].services.push_str(&service(shape, s));
    }
    for p in 0..shape.pools {
        files[p % shape.fragments]
            .pools
            .push_str(&pool(shape, p, version));
    }
    files[0].state.push_str(
        "  automation: { push: { default: true } }\n  maintenance: { push: { default: false } }\n  \
         load: { push: { default: 0 } }\n",
    );
    for g in 0..shape.groups {
        let f = &mut files[g % shape.fragments];
        let primary = pool_name(group_pool(shape, g, 0));
        let _ = write!(
            f.state,
            "  g{g}_drain: {{ push: {{ default: false }} }}\n  g{g}_primary_ok: {{ expr: \
             \"pool.{primary}.healthy_ratio >= 0.5 AND NOT g{g}_drain\" }}\n"
        );
        f.decisions.push_str(&group(shape, g));
    }
    files
        .into_iter()
        .enumerate()
        .map(|(k, f)| (format!("{k:03}-large.yaml"), f.text()))
        .collect()
}

/// The top-level sections of one fragment.
#[derive(Default)]
struct Sections {
    services: String,
    pools: String,
    state: String,
    decisions: String,
}

impl Sections {
    fn text(&self) -> String {
        let mut out = String::new();
        for (key, body) in [
            ("services", &self.services),
            ("pools", &self.pools),
            ("state", &self.state),
            ("decisions", &self.decisions),
        ] {
            if !body.is_empty() {
                let _ = write!(out, "{key}:\n{body}");
            }
        }
        out
    }
}

/// Services 8 and 9 of every ten follow a group; this is service `s`'s turn among them.
fn deciding_index(s: usize) -> usize {
    (s / 10) * 2 + (s % 10 - 8)
}

fn service(shape: &Shape, s: usize) -> String {
    let (port, protocol) = [(80, "tcp"), (443, "tcp"), (53, "udp"), (8080, "tcp")][s % 4];
    let forward = if s % 5 == 4 { "nat" } else { "dsr-l2" };
    let hash = if s % 7 == 3 { ", hash: source_ip" } else { "" };
    let a = pool_name(s % shape.pools);
    let to = match s % 10 {
        6 | 7 if shape.pools >= 2 => {
            let b = pool_name((s + 1) % shape.pools);
            format!("{{ split: [ {{ pool: {a}, weight: 90 }}, {{ pool: {b}, weight: 10 }} ] }}")
        }
        8 | 9 if shape.groups > 0 => format!("{{ decide: g{} }}", deciding_index(s) % shape.groups),
        _ => format!("{{ pool: {a} }}"),
    };
    format!(
        "  - {{ name: svc{s:04}, vip: \"{}\", port: {port}, protocol: {protocol}, forward: \
         {forward}{hash}, to: {to} }}\n",
        vip(s)
    )
}

fn pool(shape: &Shape, p: usize, version: Version) -> String {
    let mut out = format!("  - name: {}\n", pool_name(p));
    out.push_str(if p.is_multiple_of(2) {
        "    health_check: { http: { port: 8080, path: /health }, interval: 1s, timeout: 500ms }\n"
    } else {
        "    health_check: { tcp: { port: 80 }, interval: 2s, unhealthy_threshold: 2 }\n"
    });
    if p % 8 == 7 {
        out.push_str("    when_all_down: pass\n");
    }
    out.push_str("    backends:\n");
    for i in 0..shape.backends_per_pool {
        let global = p * shape.backends_per_pool + i;
        let weight = if (version == Version::Changed && reweighted(shape, global))
            || (version == Version::OneWeight && global == 0)
        {
            CHANGED_WEIGHT
        } else {
            WEIGHT
        };
        let _ = writeln!(
            out,
            "      - {{ address: \"{}\", weight: {weight} }}",
            backend_address(shape, p, i, version)
        );
    }
    out
}

/// Pool `k` of group `g`'s three (primary, secondary, tertiary).
fn group_pool(shape: &Shape, g: usize, k: usize) -> usize {
    (g * 3 + k) % shape.pools
}

#[expect(
    clippy::many_single_char_names,
    reason = "the group's three pools by position (a, b, c) and the two a rule picks (x, y)"
)]
#[expect(
    clippy::cast_possible_wrap,
    reason = "a rule's index in its group, far below i64::MAX"
)]
fn group(shape: &Shape, g: usize) -> String {
    let [a, b, c] = [0, 1, 2].map(|k| pool_name(group_pool(shape, g, k)));
    let mut out = format!("  - name: g{g}\n    rules:\n");
    for r in 0..shape.rules_per_group {
        let priority = 1000 - 10 * r as i64;
        let (when, then) = match r {
            0 => (
                format!("g{g}_primary_ok AND NOT maintenance"),
                format!("{{ pool: {a} }}"),
            ),
            1 => (
                format!("NOT g{g}_primary_ok AND pool.{b}.healthy_count >= 10"),
                format!("{{ pool: {b} }}"),
            ),
            _ => {
                let (x, y) = if r % 2 == 0 { (&b, &c) } else { (&c, &a) };
                (
                    format!(
                        "load >= {} AND pool.{x}.healthy_ratio > 0.{} AND NOT g{g}_drain",
                        10 * r,
                        r % 10
                    ),
                    if r % 3 == 0 {
                        format!("{{ pool: {x} }}")
                    } else {
                        format!(
                            "{{ split: [ {{ pool: {x}, weight: 80 }}, {{ pool: {y}, weight: 20 }} ] }}"
                        )
                    },
                )
            }
        };
        let _ = writeln!(
            out,
            "      - {{ id: r{r}, priority: {priority}, when: \"{when}\", then: {then} }}"
        );
    }
    let _ = write!(
        out,
        "    default: {{ pool: {a} }}\n    switch: {{ stable_for: 1s, cooldown: 5s, \
         failback_after: 30s }}\n    require: \"target.healthy_count >= 1\"\n    automatic: \
         automation\n"
    );
    out
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::net::IpAddr;

    use switchyard::config::{Config, Target, load_files};

    use super::*;

    fn load(version: Version) -> Config {
        load_files(&fragments(&Shape::LARGE, version))
            .unwrap_or_else(|e| panic!("the generated {version:?} config is rejected:\n{e}"))
    }

    /// (pool, address) → weight.
    fn backends(cfg: &Config) -> BTreeMap<(String, IpAddr), u32> {
        cfg.pools
            .iter()
            .flat_map(|p| {
                p.backends
                    .iter()
                    .map(|b| ((p.name.clone(), b.address), b.weight))
            })
            .collect()
    }

    #[test]
    fn the_large_shape_is_valid_and_as_large_as_it_says() {
        let cfg = load(Version::Base);
        assert_eq!(cfg.services.len(), 1_000);
        assert_eq!(cfg.pools.len(), 50);
        assert_eq!(backends(&cfg).len(), 5_000);
        assert_eq!(cfg.decisions.len(), 20);
        let rules: usize = cfg.decisions.iter().map(|g| g.rules.len()).sum();
        assert_eq!(rules, 200);
        assert_eq!(cfg.state.len(), Shape::LARGE.state_variables());
        // Every form of target is present, and every group is followed by some service.
        let followed: BTreeSet<&str> = cfg
            .services
            .iter()
            .filter_map(|s| match &s.to {
                Target::Decide(g) => Some(g.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(followed.len(), 20);
        assert!(
            cfg.services
                .iter()
                .any(|s| matches!(s.to, Target::Split(_)))
        );
        assert!(cfg.services.iter().any(|s| matches!(s.to, Target::Pool(_))));
    }

    #[test]
    fn the_changed_version_replaces_one_percent_and_reweights_ten() {
        let (base, changed) = (load(Version::Base), load(Version::Changed));
        assert_eq!(changes(&Shape::LARGE), (50, 10));
        let (a, b) = (backends(&base), backends(&changed));
        let gone = a.keys().filter(|k| !b.contains_key(*k)).count();
        let new = b.keys().filter(|k| !a.contains_key(*k)).count();
        let reweighted = a
            .iter()
            .filter(|(k, w)| b.get(*k).is_some_and(|v| v != *w))
            .count();
        assert_eq!((gone, new, reweighted), (50, 50, 10));
        // One replaced backend in every pool; nothing else differs.
        let pools: BTreeSet<&String> = a
            .keys()
            .filter(|k| !b.contains_key(*k))
            .map(|(p, _)| p)
            .collect();
        assert_eq!(pools.len(), 50);
        assert_eq!(base.services, changed.services);
        assert_eq!(base.decisions, changed.decisions);
    }

    #[test]
    fn the_one_weight_version_changes_one_weight() {
        let (a, b) = (
            backends(&load(Version::Base)),
            backends(&load(Version::OneWeight)),
        );
        assert_eq!(a.len(), b.len());
        let changed: Vec<_> = a.iter().filter(|(k, w)| b.get(*k) != Some(*w)).collect();
        assert_eq!(changed.len(), 1);
        assert_eq!(b[changed[0].0], 150);
    }
}
