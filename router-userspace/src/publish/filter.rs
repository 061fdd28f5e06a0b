//! The `SERVICE_FILTER` bits of a configuration: one per service key (a request's virtual IP,
//! port, protocol and family), one per source a NAT service's replies come from (each
//! configured backend address, with the service's port and protocol), and one per virtual IP
//! (its address and family: the program looks it up in `VIPS`). The program passes a
//! packet whose bits are clear without any hash-map lookup (router-ebpf `select.rs`).
//!
//! A bit is set for everything that can be served, so the filter never hides a service; a
//! false positive costs the packet the lookups the filter saves.

use router_common::{
    FILTER_ENTRIES, FILTER_F_NAT, FILTER_FLAGS, FILTER_NAT_REPLY, FILTER_SERVICE, FILTER_VIP,
    hash::filter_bit,
};

use super::{PublishError, Publisher, addr16, family, service_key};
use crate::{
    config::{Config, Forward},
    dataplane::Dataplane,
};

/// The filter words for `cfg` ([`FILTER_ENTRIES`] words): bit `b` at word `b / 64`, bit
/// `b % 64`, then the flag word ([`FILTER_F_NAT`] when a NAT service has reply sources).
#[must_use]
pub fn build(cfg: &Config) -> Vec<u64> {
    let mut words = vec![0u64; FILTER_ENTRIES as usize];
    let mut nat = false;
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
        // Every configured backend, not only those of the pools the service names: a tracked
        // flow stays on its backend while the backend is usable and the service keeps its
        // slot, so a NAT service moved to another pool (or from a decision group to one)
        // still sends its earlier flows to backends of the pools it left, and their replies
        // must still be restored. A backend no pool has is down, and its flows re-select.
        for p in &cfg.pools {
            for b in &p.backends {
                nat = true;
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
    // Every service's address, as a virtual IP (port and protocol 0).
    for s in &cfg.services {
        let key = service_key(s);
        set(filter_bit(&key.addr, 0, 0, key.family, FILTER_VIP));
    }
    if nat {
        words[FILTER_FLAGS as usize] |= FILTER_F_NAT;
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
        for (i, w) in (0..FILTER_ENTRIES).zip(&words) {
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
