//! The names an expression may read, and their types: every `state:` variable and the agent's
//! built-ins. One function builds it, for validation (names resolve, types check) and for the
//! agent (slots of the live state), so both agree on every name.
//!
//! Built-ins (ARCHITECTURE.md, "State"):
//!
//! | name | type |
//! |---|---|
//! | `pool.<pool>.healthy` | bool: at least one healthy backend |
//! | `pool.<pool>.healthy_count`, `pool.<pool>.healthy_ratio` | number |
//! | `backend.<address>.healthy` | bool (any pool that has it healthy) |
//! | `backend.<address>.rtt_p99_ms` | number: p99 of its probe latency, ms |
//! | `backend.<address>.breaker_open` | bool: its circuit breaker is open in a pool that has it |
//! | `service.<service>.packets_per_second`, `service.<service>.bytes_per_second` | number |
//! | `target.healthy_count`, `target.healthy_ratio` | number: of the target an expression in `require` vets |
//!
//! An IPv6 address writes each `:` as `-` (`backend.2001-db8-11--11.healthy`; docs/rules.md).

use std::net::IpAddr;

use rules::{Schema, Type, check::SchemaError};

use super::model::{Config, PushValue, StateSource};

/// How an address appears in a built-in name.
#[must_use]
pub fn address_segment(a: IpAddr) -> String {
    a.to_string().replace(':', "-")
}

/// `pool.<pool>.<what>`.
#[must_use]
pub fn pool_name(pool: &str, what: &str) -> String {
    format!("pool.{pool}.{what}")
}

/// `backend.<address>.<what>`.
#[must_use]
pub fn backend_name(address: IpAddr, what: &str) -> String {
    format!("backend.{}.{what}", address_segment(address))
}

/// `service.<service>.<what>`.
#[must_use]
pub fn service_name(service: &str, what: &str) -> String {
    format!("service.{service}.{what}")
}

/// `target.healthy_count`: healthy backends of the target `require` is asked about.
pub const TARGET_HEALTHY_COUNT: &str = "target.healthy_count";
/// `target.healthy_ratio`: their share of the target's backends.
pub const TARGET_HEALTHY_RATIO: &str = "target.healthy_ratio";

/// The type of a state variable.
#[must_use]
pub fn state_type(source: &StateSource) -> Type {
    match source {
        StateSource::Push(PushValue::Number(_)) => Type::Number,
        StateSource::Push(PushValue::String(_)) => Type::String,
        _ => Type::Bool,
    }
}

/// Every name of `cfg`'s expressions: state variables first (in declaration order), then the
/// built-ins.
///
/// # Errors
///
/// The first name [`Schema::define`] refuses: [`SchemaError::Duplicate`] for a name defined
/// twice (a state variable named like a built-in), [`SchemaError::InvalidName`] for one an
/// expression cannot spell, [`SchemaError::Full`] past `u32::MAX` names.
pub fn build(cfg: &Config) -> Result<Schema, SchemaError> {
    let mut s = Schema::new();
    for v in &cfg.state {
        s.define(&v.name, state_type(&v.source))?;
    }
    let pools: Vec<(&str, Vec<IpAddr>)> = cfg
        .pools
        .iter()
        .map(|p| {
            (
                p.name.as_str(),
                p.backends.iter().map(|b| b.address).collect(),
            )
        })
        .collect();
    let services: Vec<&str> = cfg.services.iter().map(|s| s.name.as_str()).collect();
    for (name, ty) in builtins(&pools, &services) {
        s.define(&name, ty)?;
    }
    Ok(s)
}

/// The built-in names of a configuration with these pools (name, backend addresses) and
/// services, in schema order.
#[must_use]
pub fn builtins(pools: &[(&str, Vec<IpAddr>)], services: &[&str]) -> Vec<(String, Type)> {
    let mut out = Vec::new();
    for (p, _) in pools {
        out.push((pool_name(p, "healthy"), Type::Bool));
        out.push((pool_name(p, "healthy_count"), Type::Number));
        out.push((pool_name(p, "healthy_ratio"), Type::Number));
    }
    let mut addresses: Vec<IpAddr> = pools.iter().flat_map(|(_, b)| b.iter().copied()).collect();
    addresses.sort();
    addresses.dedup();
    for a in addresses {
        out.push((backend_name(a, "healthy"), Type::Bool));
        out.push((backend_name(a, "rtt_p99_ms"), Type::Number));
        out.push((backend_name(a, "breaker_open"), Type::Bool));
    }
    for svc in services {
        out.push((service_name(svc, "packets_per_second"), Type::Number));
        out.push((service_name(svc, "bytes_per_second"), Type::Number));
    }
    out.push((TARGET_HEALTHY_COUNT.to_owned(), Type::Number));
    out.push((TARGET_HEALTHY_RATIO.to_owned(), Type::Number));
    out
}

/// First segments reserved for built-ins: a state variable may not start with one.
pub const RESERVED: &[&str] = &["pool", "backend", "service", "target"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_files;

    #[test]
    fn the_reference_names_resolve_with_their_types() {
        let cfg = load_files(&[(
            "a.yaml".into(),
            "services: [ { name: web, vip: 198.18.0.10, port: 80, protocol: tcp, forward: dsr-l2, to: { pool: dc1 } } ]\n\
             pools: [ { name: dc1, backends: [ { address: 198.18.1.11 } ] },\n\
                      { name: dc6, backends: [ { address: \"2001:db8:11::11\" } ] } ]\n"
                .into(),
        )])
        .expect("valid");
        let s = build(&cfg).expect("schema");
        assert_eq!(
            s.get("pool.dc1.healthy_ratio").map(|(_, t)| t),
            Some(Type::Number)
        );
        assert_eq!(s.get("pool.dc1.healthy").map(|(_, t)| t), Some(Type::Bool));
        assert!(s.get("backend.198.18.1.11.healthy").is_some());
        assert!(s.get("backend.2001-db8-11--11.rtt_p99_ms").is_some());
        assert!(s.get("service.web.packets_per_second").is_some());
        assert!(s.get(TARGET_HEALTHY_COUNT).is_some());
        assert!(
            rules::compile(
                "pool.dc1.healthy_count >= 1 AND backend.198.18.1.11.healthy",
                &s
            )
            .is_ok()
        );
    }
}
