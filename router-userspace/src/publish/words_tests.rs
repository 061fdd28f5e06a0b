//! Decision groups in the maps: one slot per group, shared by its services; fallback.
#![expect(
    clippy::cast_possible_truncation,
    reason = "pool slots, below MAX_POOLS, compared with the decision word's u16 fields"
)]

use std::collections::BTreeMap;

use router_common::{Decision, NO_POOL};
use rules::engine::Action;

use super::Publisher;
use crate::{
    config::model::SwitchPolicy,
    dataplane::memory::{MemoryDataplane, Write},
    state::tests::web_failover,
};

#[test]
fn services_of_a_group_share_one_word_written_before_them() {
    let cfg = web_failover(SwitchPolicy::default());
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let decided = BTreeMap::from([("web-failover".to_owned(), Action::pool("dc1"))]);
    p.apply_decided(&mut dp, &cfg, &decided).expect("apply");
    let g = p.groups()["web-failover"].clone();
    let web = p.services()["web"].value;
    let web2 = p.services()["web2"].value;
    let stat = p.services()["static"].value;
    assert_eq!(web.decision, g.slot);
    assert_eq!(web2.decision, g.slot);
    assert_ne!(stat.decision, g.slot);
    assert_ne!(web.id, g.slot);
    let dc1 = p.pools()["dc1"].slot as u16;
    assert_eq!(Decision::decode(dp.decisions[&g.slot]), Decision::pool(dc1));
    // The group's word is written before any service that points at it.
    let word_at = dp
        .log
        .iter()
        .position(|w| matches!(w, Write::Decision(s, _) if *s == g.slot));
    let svc_at = dp.log.iter().position(|w| matches!(w, Write::Service(..)));
    assert!(word_at < svc_at, "{:?}", dp.log);
}

#[test]
fn one_write_switches_every_service_and_carries_the_last_known_good_pool() {
    let cfg = web_failover(SwitchPolicy::default());
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let decided = BTreeMap::from([("web-failover".to_owned(), Action::pool("dc1"))]);
    p.apply_decided(&mut dp, &cfg, &decided).expect("apply");
    let slot = p.groups()["web-failover"].slot;
    let (dc1, dc2) = (p.pools()["dc1"].slot as u16, p.pools()["dc2"].slot as u16);
    let before = dp.log.len();
    let word = p
        .publish_decision(&mut dp, "web-failover", &Action::pool("dc2"))
        .expect("publish")
        .expect("written");
    assert_eq!(dp.log[before..], [Write::Decision(slot, word)]);
    let d = Decision::decode(word);
    assert_eq!((d.pool_a, d.pool_b, d.fallback), (dc2, NO_POOL, dc1));
    assert_eq!(p.services()["web"].word, word);
    assert_eq!(p.services()["web2"].word, word);
    // Same action again: nothing written.
    assert_eq!(
        p.publish_decision(&mut dp, "web-failover", &Action::pool("dc2"))
            .expect("publish"),
        None
    );
    // dc2 dies, then we go back to dc1: dc2 had no healthy backend, so the fallback is not dc2
    // (and never the active pool itself).
    for b in ["198.18.2.11", "198.18.2.12"] {
        p.set_health(&mut dp, "dc2", b.parse().expect("addr"), false)
            .expect("health");
    }
    let word = p
        .publish_decision(&mut dp, "web-failover", &Action::pool("dc1"))
        .expect("publish")
        .expect("written");
    assert_eq!(Decision::decode(word).fallback, NO_POOL);
    // A reapply keeps the group's slot and word.
    let n = dp.log.len();
    p.apply(&mut dp, &cfg).expect("reapply");
    assert_eq!(p.groups()["web-failover"].slot, slot);
    assert!(!dp.log[n..].iter().any(|w| matches!(w, Write::Decision(..))));
}
