//! The `SERVICE_FILTER` bits of a configuration: one per service key (a request's virtual IP,
//! port, protocol and family) and one per source a NAT service's replies come from (each
//! backend address it may use, with the service's port and protocol). The program passes a
//! packet whose bits are clear without any hash-map lookup (router-ebpf `select.rs`).
//!
//! A bit is set for everything that can be served, so the filter never hides a service; a
//! false positive costs the packet the lookups the filter saves.

use std::collections::BTreeSet;

use router_common::{FILTER_NAT_REPLY, FILTER_SERVICE, FILTER_WORDS, hash::filter_bit};

use super::{PublishError, Publisher, addr16, family, service_key};
use crate::{
    config::{Config, Forward, Target},
    dataplane::Dataplane,
};

/// The filter words for `cfg`: [`FILTER_WORDS`] words, bit `b` at word `b / 64`, bit `b % 64`.
#[must_use]
pub fn build(cfg: &Config) -> Vec<u64> {
    let mut words = vec![0u64; FILTER_WORDS as usize];
    let mut set = |bit: u32| words[(bit / 64) as usize] |= 1 << (bit % 64);
    for s in &cfg.services {
        let key = service_key(s);
        set(filter_bit(
            &key.addr,
            key.port,
            key.proto,
            key.family,
            FILTER_SERVICE,
        ));
        if s.forward != Forward::Nat {
            continue;
        }
        // The pools a NAT service's new flows may reach; a decision group may pick any pool.
        let pools: BTreeSet<&str> = match &s.to {
            Target::Pool(p) => [p.as_str()].into(),
            Target::Split(shares) => shares.iter().map(|x| x.pool.as_str()).collect(),
            Target::Decide(_) => cfg.pools.iter().map(|p| p.name.as_str()).collect(),
        };
        for p in cfg.pools.iter().filter(|p| pools.contains(p.name.as_str())) {
            for b in &p.backends {
                set(filter_bit(
                    &addr16(b.address),
                    key.port,
                    key.proto,
                    family(b.address),
                    FILTER_NAT_REPLY,
                ));
            }
        }
    }
    words
}

impl Publisher {
    /// Makes `SERVICE_FILTER` hold `words`, writing only the words that differ from what it
    /// holds (every word when that is unknown, after a restore).
    pub(super) fn write_filter(
        &mut self,
        dp: &mut dyn Dataplane,
        words: Vec<u64>,
    ) -> Result<(), PublishError> {
        for (i, w) in (0..FILTER_WORDS).zip(&words) {
            if self.filter.as_ref().is_none_or(|old| old[i as usize] != *w) {
                dp.set_filter_word(i, *w)?;
            }
        }
        self.filter = Some(words);
        Ok(())
    }

    /// The filter for `cfg` with every bit of the current one kept: written before services
    /// change, so no packet of a service that stays misses its bit while they do.
    pub(super) fn filter_union(&self, new: &[u64]) -> Vec<u64> {
        match &self.filter {
            Some(old) => old.iter().zip(new).map(|(a, b)| a | b).collect(),
            None => new.to_vec(),
        }
    }
}
