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

/// Two pools, two classes and group `web` acting per class with `split_by: client`.
const BY_CLASS: &str = "\
services: [ { name: web, vip: 198.18.0.10, port: 80, protocol: tcp, forward: dsr-l2, to: { decide: web } } ]
pools:
  - { name: stable, backends: [ { address: 198.18.1.11 } ] }
  - { name: canary, backends: [ { address: 198.18.1.12 } ] }
classes:
  vip: { prefixes: [198.18.5.0/24, \"2001:db8:5::/48\"] }
  trial: { prefixes: [198.18.6.0/24] }
decisions:
  - name: web
    split_by: client
    rules:
      - id: canary
        when: \"true\"
        then:
          by_class:
            vip: { pool: stable }
            trial: { pool: canary }
            default: { split: [ { pool: stable, weight: 80 }, { pool: canary, weight: 20 } ] }
";

#[test]
fn a_by_class_group_writes_its_class_words_and_prefixes_before_a_service_looks_classes_up() {
    use router_common::{
        SVC_F_CLASSES, SVC_F_SPLIT_CLIENT, SVC_F_SPLIT_PREFIX, class_decision_index,
    };

    let cfg = crate::config::load_files(&[("a.yaml".into(), BY_CLASS.into())]).expect("config");
    let by_class = cfg.decisions[0].rules[0].then.clone();
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let decided = BTreeMap::from([("web".to_owned(), by_class)]);
    p.apply_decided(&mut dp, &cfg, &decided).expect("apply");
    let slot = p.groups()["web"].slot;
    let (stable, canary) = (
        p.pools()["stable"].slot as u16,
        p.pools()["canary"].slot as u16,
    );
    let class = |c| Decision::decode(dp.class_decisions[&class_decision_index(slot, c)]);
    // Ids by name: trial 1, vip 2; the others take the default's word.
    assert_eq!((class(1).pool_a, class(1).pool_b), (canary, NO_POOL));
    assert_eq!((class(2).pool_a, class(2).pool_b), (stable, NO_POOL));
    let default = Decision::decode(dp.decisions[&slot]);
    assert_eq!(
        (default.pool_a, default.pool_b, default.split_b),
        (stable, canary, 2_000)
    );
    for c in 3..=router_common::MAX_CLASSES {
        assert_eq!(class(c), default, "class {c}");
    }
    assert_eq!(dp.class_prefixes.len(), 3);
    // The service looks classes up, and splits by client, only after every class word and the
    // prefixes are written.
    let web = p.services()["web"].value;
    assert_eq!(
        web.flags & (SVC_F_CLASSES | SVC_F_SPLIT_CLIENT | SVC_F_SPLIT_PREFIX),
        SVC_F_CLASSES | SVC_F_SPLIT_CLIENT
    );
    let service_at = dp
        .log
        .iter()
        .position(|w| matches!(w, Write::Service(_, s) if s.flags & SVC_F_CLASSES != 0))
        .expect("the service");
    let last_class_word = dp
        .log
        .iter()
        .rposition(|w| matches!(w, Write::ClassDecision(..)));
    let last_prefix = dp
        .log
        .iter()
        .rposition(|w| matches!(w, Write::ClassPrefix(..)));
    assert!(
        last_class_word < Some(service_at) && last_prefix < Some(service_at),
        "{:?}",
        dp.log
    );

    // A switch to one pool: every class word, then the group's word.
    dp.log.clear();
    let word = p
        .publish_decision(&mut dp, "web", &Action::pool("stable"))
        .expect("publish")
        .expect("written");
    assert_eq!(
        dp.log.len(),
        router_common::MAX_CLASSES as usize + 1,
        "{:?}",
        dp.log
    );
    assert_eq!(dp.log.last(), Some(&Write::Decision(slot, word)));
    for c in 1..=router_common::MAX_CLASSES {
        assert_eq!(dp.class_decisions[&class_decision_index(slot, c)], word);
    }
    // Nothing more for the same action; a group without by_class writes no class word.
    dp.log.clear();
    assert_eq!(
        p.publish_decision(&mut dp, "web", &Action::pool("stable"))
            .expect("publish"),
        None
    );
    assert!(dp.log.is_empty());
}

#[test]
fn a_group_without_by_class_writes_no_class_word_and_sets_no_class_flag() {
    let cfg = web_failover(SwitchPolicy::default());
    let mut dp = MemoryDataplane::default();
    let mut p = Publisher::new();
    let decided = BTreeMap::from([("web-failover".to_owned(), Action::pool("dc1"))]);
    p.apply_decided(&mut dp, &cfg, &decided).expect("apply");
    assert!(dp.class_decisions.is_empty() && dp.class_prefixes.is_empty());
    assert!(
        p.services()
            .values()
            .all(|s| s.value.flags & router_common::SVC_F_CLASSES == 0)
    );
    p.publish_decision(&mut dp, "web-failover", &Action::pool("dc2"))
        .expect("publish");
    assert!(dp.class_decisions.is_empty());
}
