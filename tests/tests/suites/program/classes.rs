//! Client classes in the data path (decision 0036): a new flow's class is the longest prefix of
//! its client's address in `CLIENT_CLASSES`, else a live classifier answer; the class's word
//! decides its pool. Under `SVC_F_SPLIT_CLIENT` a client keeps its side of a split whatever its
//! ports, and a larger share moves only clients towards the pool that grew. A client with
//! neither class nor answer, on a `SVC_F_CLASSIFY` service, is reported in `UNKNOWN_CLIENTS`
//! within the ring's limits.
//!
//! The class maps and service flags are written here directly (through the agent's helpers in
//! `publish::classes`), on the services and pools a plain config published.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use anyhow::{Context as _, Result, ensure};
use router_common::{
    CLASS_STAT_RING_LIMITED, CLASS_STAT_RING_SENT, CLASS_STAT_UNKNOWN, Decision, FAMILY_V4,
    FAMILY_V6, MAX_CLASSES, NO_POOL, PROTO_TCP, Reason, SVC_F_CLASSES, SVC_F_CLASSIFY,
    SVC_F_SPLIT_CLIENT, SVC_F_SPLIT_PREFIX, ServiceKey, UNKNOWN_BURST, class_stat_index,
};
use router_tests::{
    addrs::{VIP_V4, VIP_V6, backend_v4, backend_v6},
    lab::{Lab, pool},
    packets, privileged,
};
use switchyard::{
    config::{
        Agent, Config, Conntrack, Forward, HashMode, Protocol, Service, SplitShare, Target,
        WhenAllDown,
    },
    dataplane::{Dataplane as _, counters},
    publish::classes::{
        ClientPrefix, client_addr, replace_class_prefixes, set_client_answer, write_class_words,
    },
};

use super::fixture::{Out, Step, To, check, flush, forwarded, run, step};

/// Class ids as the agent assigns them (classes sorted by name): `a` is the wide prefix, `b`
/// the narrow one inside it.
const CLASS_A: u32 = 1;
const CLASS_B: u32 = 2;

/// Backends: pool `stable` is backend 1, `canary` backend 2, `gold` backend 3 (and their IPv6
/// twins `stable6`, `canary6`, `gold6`).
const STABLE: usize = 1;
const CANARY: usize = 2;
const GOLD: usize = 3;

/// `web` (80) splits stable/canary, `gold` (82) goes to gold; `web6` and `gold6` likewise on the
/// IPv6 VIP.
fn config() -> Config {
    let service = |name: &str, vip: IpAddr, port: u16, to: Target| Service {
        name: name.into(),
        vip,
        port,
        protocol: Protocol::Tcp,
        forward: Forward::DsrL2,
        hash: HashMode::FiveTuple,
        to,
    };
    let split = |a: &str, b: &str| {
        Target::Split(vec![
            SplitShare {
                pool: a.into(),
                weight: 1,
            },
            SplitShare {
                pool: b.into(),
                weight: 1,
            },
        ])
    };
    let one = |name: &str, addr: IpAddr| pool(name, vec![addr], WhenAllDown::Drop);
    Config {
        agent: Agent::default(),
        fleet: None,
        conntrack: Conntrack::default(),
        announce: None,
        hooks: Vec::new(),
        vips: vec![],
        services: vec![
            service("web", VIP_V4.into(), 80, split("stable", "canary")),
            service("gold", VIP_V4.into(), 82, Target::Pool("gold".into())),
            service("web6", VIP_V6.into(), 80, split("stable6", "canary6")),
            service("gold6", VIP_V6.into(), 82, Target::Pool("gold6".into())),
        ],
        pools: vec![
            one("stable", backend_v4(STABLE).into()),
            one("canary", backend_v4(CANARY).into()),
            one("gold", backend_v4(GOLD).into()),
            one("stable6", backend_v6(STABLE).into()),
            one("canary6", backend_v6(CANARY).into()),
            one("gold6", backend_v6(GOLD).into()),
        ],
        state: vec![],
        decisions: vec![],
        classes: Vec::new(),
        rules: std::sync::Arc::default(),
    }
}

fn lab(tag: &str) -> Option<Lab> {
    if privileged::require_root_and_bpf(tag).is_err() {
        return None;
    }
    Some(Lab::new(tag, 3, &config()).expect("lab"))
}

/// The `SERVICES` key of TCP port `port` on the VIP of `v6`'s family.
fn key(v6: bool, port: u16) -> ServiceKey {
    let mut addr = [0u8; 16];
    let family = if v6 {
        addr = VIP_V6.octets();
        FAMILY_V6
    } else {
        addr[..4].copy_from_slice(&VIP_V4.octets());
        FAMILY_V4
    };
    ServiceKey {
        addr,
        port: port.to_be(),
        proto: PROTO_TCP,
        family,
    }
}

/// The slot of pool `name`.
fn pool_slot(lab: &Lab, name: &str) -> Result<u16> {
    let slot = lab
        .publisher
        .pools()
        .get(name)
        .with_context(|| format!("no pool {name}"))?
        .slot;
    Ok(u16::try_from(slot)?)
}

/// Sets `flags` on the service of `v6`'s family on port 80 (`web`/`web6`), and writes `word` as
/// its decision word. Returns its decision slot.
fn web(lab: &mut Lab, v6: bool, flags: u32, word: Decision) -> Result<u32> {
    let k = key(v6, 80);
    let mut svc = lab.maps.service(&k).context("web is not published")?;
    lab.maps.set_decision(svc.decision, word.encode())?;
    svc.flags |= flags;
    lab.maps.set_service(k, svc)?;
    Ok(svc.decision)
}

/// A word that sends every flow to `pool`.
fn to_pool(pool: u16) -> Decision {
    Decision::pool(pool)
}

/// A word that sends `split_b` of 10,000 to `b`, the rest to `a`.
fn split(a: u16, b: u16, split_b: u16) -> Decision {
    Decision {
        pool_a: a,
        pool_b: b,
        split_b,
        fallback: NO_POOL,
    }
}

/// Class words for a slot: class `A` → `a`, class `B` → `b`, every other class → `default`.
fn words(a: Decision, b: Decision, default: Decision) -> [u64; MAX_CLASSES as usize] {
    std::array::from_fn(|i| match u32::try_from(i + 1) {
        Ok(CLASS_A) => a.encode(),
        Ok(CLASS_B) => b.encode(),
        _ => default.encode(),
    })
}

/// Publishes classes `a` and `b`: `a` holds the /16 and the /48, `b` the /24 and the /64 inside
/// them.
fn classes(lab: &mut Lab) -> Result<()> {
    let p = |a: &str, bits| ClientPrefix::new(a.parse().expect("address"), bits).expect("prefix");
    let wanted: BTreeMap<ClientPrefix, u32> = [
        (p("198.19.0.0", 16), CLASS_A),
        (p("198.19.6.0", 24), CLASS_B),
        (p("2001:db8:a::", 48), CLASS_A),
        (p("2001:db8:a:6::", 64), CLASS_B),
    ]
    .into();
    replace_class_prefixes(&mut lab.maps, &mut BTreeMap::new(), &wanted)?;
    Ok(())
}

/// A new TCP flow from `src:sport` to the VIP of its family on `port`, which must reach backend
/// `to`.
fn flow_to(name: &str, src: IpAddr, sport: u16, port: u16, to: usize) -> Step {
    let vip: IpAddr = if src.is_ipv6() {
        VIP_V6.into()
    } else {
        VIP_V4.into()
    };
    forwarded(name, packets::tcp(src, sport, vip, port), Reason::NewFlow)
        .out(Out::Mac)
        .to(To::Is(to))
        .into()
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn v6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse::<Ipv6Addr>().expect("address"))
}

/// Class words set up on `web` and `web6`: class A → gold, class B → canary, no class →
/// stable.
fn classed(lab: &mut Lab) -> Result<()> {
    classes(lab)?;
    for v6 in [false, true] {
        let sfx = if v6 { "6" } else { "" };
        let (stable, canary, gold) = (
            pool_slot(lab, &format!("stable{sfx}"))?,
            pool_slot(lab, &format!("canary{sfx}"))?,
            pool_slot(lab, &format!("gold{sfx}"))?,
        );
        // The class words first, then the flag that makes the program read them.
        let slot = lab.maps.service(&key(v6, 80)).context("web")?.decision;
        write_class_words(
            &mut lab.maps,
            slot,
            &words(to_pool(gold), to_pool(canary), to_pool(stable)),
        )?;
        web(lab, v6, SVC_F_CLASSES, to_pool(stable))?;
    }
    Ok(())
}

#[test]
fn a_client_s_class_is_its_longest_prefix_v4_and_v6() -> Result<()> {
    let Some(mut lab) = lab("cls-lpm") else {
        return Ok(());
    };
    classed(&mut lab)?;
    run(
        &mut lab,
        [
            flow_to("in the /24 of B", v4(198, 19, 6, 7), 40000, 80, CANARY),
            flow_to("in the /16 of A", v4(198, 19, 9, 1), 40000, 80, GOLD),
            flow_to("A, next to B's /24", v4(198, 19, 7, 0), 40000, 80, GOLD),
            flow_to("no class", v4(198, 18, 100, 1), 40000, 80, STABLE),
            flow_to("in the /64 of B", v6("2001:db8:a:6::7"), 40000, 80, CANARY),
            flow_to("in the /48 of A", v6("2001:db8:a:7::1"), 40000, 80, GOLD),
            flow_to("no class v6", v6("2001:db8:b::1"), 40000, 80, STABLE),
            // A service without the flag reads no class.
            flow_to("gold ignores classes", v4(198, 19, 6, 7), 40000, 82, GOLD),
            check("counted by class and side", |lab, _| {
                let n = |class, side| {
                    counters::sum(&lab.maps.class_stats, class_stat_index(class, side)).packets
                };
                ensure!(n(CLASS_B, 0) == 2, "class B: {}", n(CLASS_B, 0));
                ensure!(n(CLASS_A, 0) == 3, "class A: {}", n(CLASS_A, 0));
                ensure!(n(0, 0) == 2, "no class: {}", n(0, 0));
                Ok(())
            }),
        ],
    )
}

/// Writes an answer of `class` for `client`, live for `ttl` from the program's time now.
fn answer(client: IpAddr, class: u32, ttl: Duration) -> Step {
    step(&format!("answer {client}: class {class}"), move |lab, _| {
        let now = lab.now()?;
        set_client_answer(&mut lab.maps, client, class, ttl, now)?;
        Ok(())
    })
}

#[test]
fn a_live_answer_classes_a_client_until_it_expires_and_a_static_class_wins() -> Result<()> {
    let Some(mut lab) = lab("cls-ans") else {
        return Ok(());
    };
    classed(&mut lab)?;
    let unclassed = v4(198, 18, 100, 2);
    let unclassed6 = v6("2001:db8:b::2");
    let in_b = v4(198, 19, 6, 8);
    run(
        &mut lab,
        [
            flow_to("before the answer", unclassed, 41000, 80, STABLE),
            answer(unclassed, CLASS_B, Duration::from_secs(10)),
            answer(unclassed6, CLASS_A, Duration::from_secs(10)),
            answer(in_b, CLASS_A, Duration::from_secs(10)),
            flow_to("the answer is used", unclassed, 41001, 80, CANARY),
            flow_to("the answer is used v6", unclassed6, 41001, 80, GOLD),
            flow_to("the static class wins", in_b, 41001, 80, CANARY),
            step("clock + 9 s", |lab, _| {
                lab.advance_clock(Duration::from_secs(9))
            }),
            flow_to("still live", unclassed, 41002, 80, CANARY),
            step("clock + 2 s", |lab, _| {
                lab.advance_clock(Duration::from_secs(2))
            }),
            flow_to("expired, ignored", unclassed, 41003, 80, STABLE),
            flow_to("expired, ignored v6", unclassed6, 41003, 80, STABLE),
            forwarded(
                "a tracked flow keeps its backend",
                packets::tcp(unclassed, 41001, VIP_V4.into(), 80),
                Reason::ConntrackHit,
            )
            .out(Out::Mac)
            .to(To::Is(CANARY))
            .into(),
        ],
    )
}

/// `clients` clients of `web` (v4), one flow each from port `sport`, each remembered as
/// `{tag} {i}`; `addr(i)` is client `i`'s address.
fn one_flow_each(tag: &str, clients: u32, sport: u16, addr: fn(u32) -> IpAddr) -> Vec<Step> {
    (0..clients)
        .map(|i| {
            forwarded(
                &format!("{tag} {i}"),
                packets::tcp(addr(i), sport, VIP_V4.into(), 80),
                Reason::NewFlow,
            )
            .out(Out::Mac)
            .to(To::Record(format!("{tag} {i:04}")))
            .into()
        })
        .collect()
}

/// Client `i` of the split tests: 198.18.(10 + i / 200).(1 + i % 200).
#[expect(
    clippy::cast_possible_truncation,
    reason = "no test asks for 48,000 clients, so each octet fits"
)]
fn client(i: u32) -> IpAddr {
    v4(198, 18, (10 + i / 200) as u8, (1 + i % 200) as u8)
}

#[test]
fn under_split_client_a_client_keeps_its_side_whatever_its_ports() -> Result<()> {
    let Some(mut lab) = lab("cls-side") else {
        return Ok(());
    };
    let (stable, canary) = (pool_slot(&lab, "stable")?, pool_slot(&lab, "canary")?);
    web(&mut lab, false, 0, split(stable, canary, 5_000))?;
    // Under the default, one client's flows spread over both pools.
    let mut table: Vec<Step> = (0..40u16)
        .map(|port| {
            forwarded(
                &format!("flow {port}"),
                packets::tcp(client(0), 42000 + port, VIP_V4.into(), 80),
                Reason::NewFlow,
            )
            .out(Out::Mac)
            .to(To::Record(format!("spread {port}")))
            .into()
        })
        .collect();
    table.push(check("one client's flows spread", |_, memo| {
        let sides = memo.with_prefix("spread ");
        ensure!(
            sides.contains(&STABLE) && sides.contains(&CANARY),
            "{sides:?}"
        );
        Ok(())
    }));
    table.push(step("split by client", move |lab, _| {
        web(lab, false, SVC_F_SPLIT_CLIENT, split(stable, canary, 5_000))?;
        Ok(())
    }));
    for i in 0..20 {
        for port in 0..10u16 {
            table.push(
                forwarded(
                    &format!("client {i} port {port}"),
                    packets::tcp(client(i), 43000 + port, VIP_V4.into(), 80),
                    Reason::NewFlow,
                )
                .out(Out::Mac)
                .to(if port == 0 {
                    To::Record(format!("side {i:02}"))
                } else {
                    To::Same(format!("side {i:02}"))
                })
                .into(),
            );
        }
    }
    table.push(check("both sides have clients", |_, memo| {
        let sides = memo.with_prefix("side ");
        let b = sides.iter().filter(|s| **s == CANARY).count();
        ensure!((3..=17).contains(&b), "{b} of 20 clients on canary");
        Ok(())
    }));
    run(&mut lab, table)
}

#[test]
fn under_split_prefix_the_clients_of_one_network_share_a_side() -> Result<()> {
    let Some(mut lab) = lab("cls-net") else {
        return Ok(());
    };
    let (stable, canary) = (pool_slot(&lab, "stable")?, pool_slot(&lab, "canary")?);
    web(
        &mut lab,
        false,
        SVC_F_SPLIT_CLIENT | SVC_F_SPLIT_PREFIX,
        split(stable, canary, 5_000),
    )?;
    let mut table: Vec<Step> = Vec::new();
    for net in 0..16u8 {
        for (n, host) in [(0, 1u8), (1, 77), (2, 254)] {
            table.push(
                forwarded(
                    &format!("198.18.{}.{host}", 20 + net),
                    packets::tcp(
                        v4(198, 18, 20 + net, host),
                        44000 + u16::from(host),
                        VIP_V4.into(),
                        80,
                    ),
                    Reason::NewFlow,
                )
                .out(Out::Mac)
                .to(if n == 0 {
                    To::Record(format!("net {net:02}"))
                } else {
                    To::Same(format!("net {net:02}"))
                })
                .into(),
            );
        }
    }
    table.push(check("networks on both sides", |_, memo| {
        let sides = memo.with_prefix("net ");
        ensure!(
            sides.contains(&STABLE) && sides.contains(&CANARY),
            "{sides:?}"
        );
        Ok(())
    }));
    run(&mut lab, table)
}

/// Clients of the share test.
const CLIENTS: u32 = 400;

#[test]
fn a_larger_share_moves_only_clients_towards_the_pool_that_grew() -> Result<()> {
    let Some(mut lab) = lab("cls-move") else {
        return Ok(());
    };
    let (stable, canary) = (pool_slot(&lab, "stable")?, pool_slot(&lab, "canary")?);
    web(
        &mut lab,
        false,
        SVC_F_SPLIT_CLIENT,
        split(stable, canary, 500),
    )?;
    let mut table = one_flow_each("at 5%", CLIENTS, 45000, client);
    table.push(flush());
    table.push(step("canary to 25%", move |lab, _| {
        web(lab, false, SVC_F_SPLIT_CLIENT, split(stable, canary, 2_500))?;
        Ok(())
    }));
    table.extend(one_flow_each("at 25%", CLIENTS, 45001, client));
    table.push(check("movement", |_, memo| {
        let mut before = memo.with_prefix("at 5% ");
        let mut after = memo.with_prefix("at 25% ");
        ensure!(before.len() == CLIENTS as usize && after.len() == CLIENTS as usize);
        // `with_prefix` does not keep order: compare client by client.
        let side = |tag: &str, i: u32| memo.get(&format!("{tag} {i:04}"));
        let (mut to_canary, mut to_stable) = (0, 0);
        for i in 0..CLIENTS {
            match (side("at 5%", i)?, side("at 25%", i)?) {
                (STABLE, CANARY) => to_canary += 1,
                (CANARY, STABLE) => to_stable += 1,
                _ => {}
            }
        }
        before.retain(|s| *s == CANARY);
        after.retain(|s| *s == CANARY);
        println!(
            "clients on canary: {} at 5 %, {} at 25 %; moved to canary {to_canary} of {CLIENTS} \
             (minimum: 20 % = {}), to stable {to_stable}",
            before.len(),
            after.len(),
            CLIENTS / 5
        );
        ensure!(
            to_stable == 0,
            "{to_stable} clients moved from canary to stable"
        );
        // 20 % of 400 is 80; the binomial's standard deviation is 8.
        ensure!(
            (50..=110).contains(&to_canary),
            "{to_canary} of {CLIENTS} moved"
        );
        Ok(())
    }));
    run(&mut lab, table)
}

#[test]
fn an_unknown_client_is_reported_once_within_the_ring_s_burst() -> Result<()> {
    let Some(mut lab) = lab("cls-ring") else {
        return Ok(());
    };
    let stable = pool_slot(&lab, "stable")?;
    web(
        &mut lab,
        false,
        SVC_F_CLASSES | SVC_F_CLASSIFY,
        to_pool(stable),
    )?;
    let slot = lab.maps.service(&key(false, 80)).context("web")?.decision;
    write_class_words(
        &mut lab.maps,
        slot,
        &words(to_pool(stable), to_pool(stable), to_pool(stable)),
    )?;
    classes(&mut lab)?;
    let mut ring = lab
        .maps
        .take_unknown_clients()
        .context("no UNKNOWN_CLIENTS reader")?;
    let stat = |lab: &Lab, i| counters::sum(&lab.maps.class_stats, i).packets;

    // Twice the burst of new clients in one window: the burst is reported, the rest counted.
    let burst = UNKNOWN_BURST * 2;
    let flows: Vec<Step> = (0..burst)
        .map(|i| flow_to(&format!("new client {i}"), client(i), 46000, 80, STABLE))
        .chain([flow_to(
            "a classed client is not reported",
            v4(198, 19, 6, 1),
            46000,
            80,
            STABLE,
        )])
        .collect();
    run(&mut lab, flows)?;
    let records = ring.drain();
    ensure!(
        records.len() == UNKNOWN_BURST as usize,
        "{} records for {burst} new clients (burst {UNKNOWN_BURST})",
        records.len()
    );
    let first = records.first().context("no record")?;
    ensure!(
        first.client == client(0)
            && first.vip == IpAddr::V4(VIP_V4)
            && first.port == 80
            && first.proto == PROTO_TCP,
        "{first:?}"
    );
    ensure!(stat(&lab, CLASS_STAT_RING_SENT) == u64::from(UNKNOWN_BURST));
    ensure!(stat(&lab, CLASS_STAT_RING_LIMITED) == u64::from(UNKNOWN_BURST));
    ensure!(stat(&lab, CLASS_STAT_UNKNOWN) == u64::from(burst));

    // In the next window, one client's burst of connections is one record: its placeholder
    // answer holds the others back until it expires.
    let again = client(1_000);
    let mut table: Vec<Step> = vec![step("next window", |lab, _| {
        lab.advance_clock(Duration::from_secs(2))
    })];
    table.extend((0..10).map(|p| flow_to(&format!("flow {p}"), again, 47000 + p, 80, STABLE)));
    run(&mut lab, table)?;
    let records = ring.drain();
    ensure!(records.len() == 1, "{records:?}");
    ensure!(records[0].client == again, "{records:?}");
    let placeholder = lab
        .maps
        .client_answer(&client_addr(again))
        .context("no placeholder answer")?;
    ensure!(placeholder.class == 0, "{placeholder:?}");

    // Once the placeholder expired, the client is reported again.
    run(
        &mut lab,
        [
            step("past the hold", |lab, _| {
                lab.advance_clock(Duration::from_secs(10))
            }),
            flow_to("after the hold", again, 47100, 80, STABLE),
        ],
    )?;
    let records = ring.drain();
    ensure!(
        records.len() == 1 && records[0].client == again,
        "{records:?}"
    );
    Ok(())
}
