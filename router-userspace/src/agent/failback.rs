//! Flows on the pool a decision group fails back away from (`decisions[].on_failback`).
//!
//! When a group's switch is a failback (back to a pool it had left), the pools of the action it
//! leaves keep the flows tracked on them under `keep`; under `reset` or `migrate` every backend
//! entry of such a pool is marked (`Publisher::set_left`) so the program resets or re-selects
//! them. A pool that another group or a service's static target still sends new flows to is
//! not marked (its new flows would be reset or re-selected too): the audit record says so. The
//! mark is cleared as soon as a group chooses the pool again, and by an apply after which the
//! pool has another user, the group is gone or its `on_failback` no longer marks. Every left pool, marked or not,
//! is listed in `status` with its open flows (counted from connection tracking by the API, as
//! for drains), so sessions left on the standby pool are never silent.

use rules::engine::{Switch, SwitchKind};

use super::runtime::Runtime;
use crate::config::FlowPolicy;

/// A pool a group failed back away from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Left {
    /// The group.
    pub group: String,
    /// Its `on_failback` when it left; `keep` too when another user of the pool prevented the
    /// mark.
    pub policy: FlowPolicy,
    /// Whether the pool's backend entries carry the mark.
    pub marked: bool,
}

impl Runtime {
    /// After an apply: a pool left by a failback keeps its mark only while the config still
    /// has the pool and the group, the group's `on_failback` still marks, and no other service
    /// or group sends new flows to the pool; otherwise the mark comes off (its new flows must
    /// never be reset or re-selected), and a pool the config no longer has is forgotten.
    pub(super) fn recheck_left(&mut self) {
        let pools: Vec<String> = self.left.keys().cloned().collect();
        for pool in pools {
            let Some(left) = self.left.get(&pool).cloned() else {
                continue;
            };
            if !self.config.pools.iter().any(|p| p.name == pool) {
                self.left.remove(&pool);
                continue;
            }
            if !left.marked {
                continue;
            }
            let policy = self
                .config
                .decisions
                .iter()
                .find(|g| g.name == left.group)
                .map_or(FlowPolicy::Keep, |g| g.on_failback);
            if policy == FlowPolicy::Keep || self.publisher.pool_in_use(&pool, &left.group) {
                if let Err(e) = self.publisher.set_left(&mut self.maps, &pool, None) {
                    log::error!("pool {pool}: clearing its failback mark failed: {e}");
                }
                self.left.insert(
                    pool,
                    Left {
                        policy: FlowPolicy::Keep,
                        marked: false,
                        ..left
                    },
                );
            }
        }
    }

    /// After `group`'s switch was written: clears the marks of the pools it now uses and, for
    /// a failback, marks the pools it left by its `on_failback`. Returns what the audit record
    /// of a failback says about the flows on the pools left.
    pub(super) fn after_switch(&mut self, group: &str, s: &Switch) -> Option<String> {
        for pool in s.to.live_pools() {
            if self.left.remove(pool).is_some_and(|l| l.marked)
                && let Err(e) = self.publisher.set_left(&mut self.maps, pool, None)
            {
                log::error!("pool {pool}: clearing its failback mark failed: {e}");
            }
        }
        if s.kind != SwitchKind::Failback {
            return None;
        }
        let policy = self
            .config
            .decisions
            .iter()
            .find(|g| g.name == group)
            .map_or(FlowPolicy::Keep, |g| g.on_failback);
        let left: Vec<String> = s
            .from
            .iter()
            .flat_map(rules::engine::Action::live_pools)
            .filter(|p| !s.to.live_pools().any(|q| q == *p))
            .map(str::to_owned)
            .collect();
        if left.is_empty() {
            return None;
        }
        let mut said = Vec::new();
        for pool in left {
            let shared = self.publisher.pool_in_use(&pool, group);
            let marked = policy != FlowPolicy::Keep && !shared;
            if marked && let Err(e) = self.publisher.set_left(&mut self.maps, &pool, Some(policy)) {
                log::error!("pool {pool}: writing its failback mark failed: {e}");
            }
            let what = match (policy, shared) {
                (FlowPolicy::Keep, _) => "stay until they end",
                (_, true) => "stay: another service sends new flows to the pool",
                (FlowPolicy::Reset, false) => "are reset (TCP) or re-selected (UDP)",
                (FlowPolicy::Migrate, false) => "are re-selected",
            };
            said.push(format!("flows on pool {pool} {what}"));
            self.left.insert(
                pool,
                Left {
                    group: group.to_owned(),
                    policy: if marked { policy } else { FlowPolicy::Keep },
                    marked,
                },
            );
        }
        Some(format!(
            "on_failback {}: {}",
            policy.name(),
            said.join("; ")
        ))
    }
}
