use std::time::{Duration, Instant};

use super::*;

/// A status with a service `web` on pool `web` (two backends, the second down) and a service
/// `api` decided by group `edge`.
fn status(second_healthy: bool) -> Status {
    serde_json::from_value(serde_json::json!({
        "generation": 3,
        "config_dir": "/etc/switchyard",
        "mode": "native",
        "interfaces": [],
        "services": [
            {"name": "web", "address": "198.18.0.10:80/tcp", "forward": "dsr-l2", "to": "pool web"},
            {"name": "api", "address": "198.18.0.11:443/tcp", "forward": "nat", "to": "decide edge"},
            {"name": "api6", "address": "[2001:db8::11]:443/tcp", "forward": "nat", "to": "decide edge"},
        ],
        "pools": [{
            "name": "web",
            "backends": [
                {"address": "198.18.1.1", "weight": 100, "healthy": true, "probe": null},
                {"address": "198.18.1.2", "weight": 100, "healthy": second_healthy,
                 "reason": if second_healthy { None } else { Some("health check failed") },
                 "probe": null},
            ],
        }],
        "rejected": null,
        "time": 0,
    }))
    .unwrap()
}

fn metrics(web: (u64, u64), api: (u64, u64), b1: u64, no_backend: u64) -> String {
    format!(
        "# HELP switchyard_service_packets Packets by service and action\n\
         # TYPE switchyard_service_packets counter\n\
         switchyard_service_packets_total{{service=\"web\",action=\"tx\"}} {}\n\
         switchyard_service_packets_total{{service=\"web\",action=\"drop\"}} 1\n\
         switchyard_service_bytes_total{{service=\"web\",action=\"tx\"}} {}\n\
         switchyard_service_packets_total{{service=\"api\",action=\"redirect\"}} {}\n\
         switchyard_service_bytes_total{{service=\"api\",action=\"redirect\"}} {}\n\
         switchyard_backend_packets_total{{pool=\"web\",backend=\"198.18.1.1\"}} {b1}\n\
         switchyard_backend_bytes_total{{pool=\"web\",backend=\"198.18.1.1\"}} {}\n\
         switchyard_packets_total{{reason=\"no_backend\"}} {no_backend}\n\
         switchyard_packets_total{{reason=\"new_flow\"}} 9\n\
         switchyard_packets_total{{reason=\"vip_no_service\"}} 0\n\
         switchyard_state_value{{name=\"odd \\\"name\\\", with comma\"}} 1\n\
         # EOF\n",
        web.0,
        web.1,
        api.0,
        api.1,
        b1 * 100
    )
}

fn sample(at: Instant, second_healthy: bool, text: &str) -> Sample {
    Sample {
        at,
        status: status(second_healthy),
        counters: Counters::parse(text),
        groups: vec![],
        switches: vec![],
    }
}

#[test]
fn counters_sum_the_verdicts_of_a_service_and_skip_other_families() {
    let c = Counters::parse(&metrics((10, 1000), (5, 500), 7, 2));
    assert_eq!(
        c.services["web"],
        Total {
            packets: 11,
            bytes: 1000
        }
    );
    assert_eq!(c.services["api"].packets, 5);
    assert_eq!(
        c.backends[&("web".to_owned(), "198.18.1.1".to_owned())],
        Total {
            packets: 7,
            bytes: 700
        }
    );
    assert_eq!(c.reasons["no_backend"].packets, 2);
    assert_eq!(c.services.len(), 2);
}

#[test]
fn a_label_value_keeps_its_escaped_quotes_and_commas() {
    let (name, labels, v) =
        sample_line(r#"switchyard_state_value{name="odd \"name\", with comma",x="y"} 1"#).unwrap();
    assert_eq!(name, "switchyard_state_value");
    assert_eq!(labels["name"], "odd \"name\", with comma");
    assert_eq!(labels["x"], "y");
    assert!((v - 1.0).abs() < f64::EPSILON);
    assert_eq!(sample_line("# EOF"), None);
    assert_eq!(sample_line("garbage"), None);
}

#[test]
fn rates_are_the_difference_over_the_time_between_samples() {
    let t0 = Instant::now();
    let mut v = View::new();
    v.update(sample(t0, true, &metrics((10, 1000), (0, 0), 0, 0)));
    assert!(
        v.services().iter().all(|s| s.rate.is_none()),
        "no rate from one sample"
    );
    v.update(sample(
        t0 + Duration::from_secs(2),
        true,
        &metrics((210, 41_000), (0, 0), 100, 0),
    ));
    let web = v.services().into_iter().find(|s| s.name == "web").unwrap();
    let r = web.rate.unwrap();
    assert!((r.pps - 100.0).abs() < 1e-9, "{r:?}");
    assert!((r.bps - 160_000.0).abs() < 1e-9, "{r:?}");
    let b1 = &v.backends()[0];
    assert!((b1.rate.unwrap().pps - 50.0).abs() < 1e-9);
    assert_eq!(
        v.backends()[1].rate,
        Some(Rate { pps: 0.0, bps: 0.0 }),
        "no counter: nothing counted yet"
    );
}

#[test]
fn a_counter_that_went_back_has_no_rate() {
    let t = Total {
        packets: 5,
        bytes: 5,
    };
    let less = Total {
        packets: 1,
        bytes: 1,
    };
    assert_eq!(rate(Some(t), less, 1.0), None);
    assert_eq!(rate(Some(t), t, 0.0), None);
    assert_eq!(rate(None, t, 1.0), None);
    assert_eq!(
        rate(Some(less), t, 2.0),
        Some(Rate {
            pps: 2.0,
            bps: 16.0
        })
    );
}

#[test]
fn a_pause_keeps_the_screen_and_the_rate_spans_it_after() {
    let t0 = Instant::now();
    let mut v = View::new();
    v.update(sample(t0, true, &metrics((0, 0), (0, 0), 0, 0)));
    assert_eq!(v.key(Key::Char('p')), Flow::Continue);
    v.update(sample(
        t0 + Duration::from_secs(1),
        false,
        &metrics((50, 0), (0, 0), 0, 0),
    ));
    assert!(v.backends()[1].up, "a paused view took a new sample");
    v.key(Key::Char(' '));
    v.update(sample(
        t0 + Duration::from_secs(4),
        false,
        &metrics((400, 0), (0, 0), 0, 0),
    ));
    assert_eq!(v.backends()[1].health, "down: health check failed");
    let web = v.services().into_iter().find(|s| s.name == "web").unwrap();
    assert!((web.rate.unwrap().pps - 100.0).abs() < 1e-9);
}

#[test]
fn sorting_by_rate_puts_the_busiest_first_and_cycles_back_to_names() {
    let t0 = Instant::now();
    let mut v = View::new();
    v.update(sample(t0, true, &metrics((0, 0), (0, 0), 0, 0)));
    v.update(sample(
        t0 + Duration::from_secs(1),
        true,
        &metrics((1, 1_000_000), (100, 100), 0, 0),
    ));
    let names = |v: &View| v.services().into_iter().map(|s| s.name).collect::<Vec<_>>();
    assert_eq!(names(&v), ["api", "api6", "web"]);
    v.key(Key::Char('s'));
    assert_eq!(v.sort, Sort::Pps);
    assert_eq!(names(&v), ["api", "web", "api6"], "api6 counted nothing");
    v.key(Key::Char('s'));
    assert_eq!(names(&v), ["web", "api", "api6"]);
    v.key(Key::Char('s'));
    assert_eq!(v.sort, Sort::Name);
}

#[test]
fn the_filter_is_typed_after_a_slash_and_q_is_then_a_letter() {
    let mut v = View::new();
    v.update(sample(
        Instant::now(),
        false,
        &metrics((0, 0), (0, 0), 0, 0),
    ));
    v.key(Key::Char('/'));
    for c in "1.2".chars() {
        assert_eq!(v.key(Key::Char(c)), Flow::Continue);
    }
    v.key(Key::Enter);
    assert!(!v.editing);
    assert_eq!(v.filter, "1.2");
    assert!(v.services().is_empty());
    let b = v.backends();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].address, "198.18.1.2");
    v.key(Key::Char('/'));
    assert_eq!(v.key(Key::Char('q')), Flow::Continue);
    v.key(Key::Backspace);
    v.key(Key::Char('W'));
    v.key(Key::Char('E'));
    v.key(Key::Enter);
    assert_eq!(
        v.services().into_iter().map(|s| s.name).collect::<Vec<_>>(),
        ["web"],
        "the filter ignores case"
    );
    v.key(Key::Char('/'));
    v.key(Key::Char('x'));
    v.key(Key::Esc);
    assert!(v.filter.is_empty(), "Esc while typing drops the filter");
    assert_eq!(v.services().len(), 3);
    assert_eq!(v.key(Key::Esc), Flow::Quit);
}

#[test]
fn q_and_control_c_quit() {
    assert_eq!(View::new().key(Key::Char('q')), Flow::Quit);
    let mut v = View::new();
    v.key(Key::Char('/'));
    assert_eq!(v.key(Key::Interrupt), Flow::Quit);
}

#[test]
fn the_agent_is_lost_when_refused_or_after_three_failed_polls_in_a_row() {
    let mut v = View::new();
    assert!(v.failed(PollError::Failed("timeout".into())).is_none());
    assert_eq!(v.problem.as_deref(), Some("timeout"));
    assert!(v.failed(PollError::Failed("timeout".into())).is_none());
    v.update(sample(Instant::now(), true, ""));
    assert_eq!(v.problem, None, "a good poll clears the problem");
    assert!(v.failed(PollError::Failed("a".into())).is_none());
    assert!(v.failed(PollError::Failed("b".into())).is_none());
    let why = v.failed(PollError::Failed("c".into())).unwrap();
    assert!(why.contains("3 polls in a row failed: c"), "{why}");
    assert!(
        View::new()
            .failed(PollError::Gone("refused".into()))
            .is_some()
    );
    let why = View::new()
        .failed(PollError::Refused("no token".into()))
        .unwrap();
    assert!(why.contains("refused") && why.contains("no token"), "{why}");
}

#[test]
fn drops_show_the_dropping_reasons_that_counted_packets() {
    let t0 = Instant::now();
    let mut v = View::new();
    v.update(sample(t0, true, &metrics((0, 0), (0, 0), 0, 4)));
    v.update(sample(
        t0 + Duration::from_secs(2),
        true,
        &metrics((0, 0), (0, 0), 0, 10),
    ));
    let d = v.drops();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].reason, "no_backend");
    assert_eq!(d[0].packets, 10);
    assert_eq!(d[0].pps, Some(3.0));
}

#[test]
fn groups_come_from_the_services_and_their_explanation() {
    assert_eq!(groups_of(&status(true)), ["edge"]);
    let g = Group::parse(
        "edge",
        r#"{"explanation":{"group":"edge","now_us":70000000,"automatic":true,
            "active":{"action":{"pool":"dc2"},"by":{"rule":"dc1-down"},"since_us":10000000},
            "override":null,"candidate":null,"wait":null,"no_match":false,
            "next_deadline_us":null,"rules":[],"default":null},
            "conditions":[],"text":"","fleet_role":null}"#,
    )
    .unwrap();
    assert_eq!(g.active, "pool=dc2");
    assert_eq!(g.by, "rule dc1-down");
    assert_eq!(g.for_secs, Some(60));
    assert!(Group::parse("edge", "{}").is_err());
}

#[test]
fn switches_are_the_newest_switch_records_first() {
    let json = r#"[
        {"seq":1,"at_us":1000000,"group":"edge","kind":"switch","switch":"failover",
         "from":{"pool":"dc1"},"to":{"pool":"dc2"},"by":{"rule":"dc1-down"},"cause":"probe"},
        {"seq":2,"at_us":2000000,"group":"web","kind":"breaker","from":null,"to":null,
         "by":null,"cause":"breaker"},
        {"seq":3,"at_us":3000000,"group":"edge","kind":"switch","switch":"failback",
         "from":{"pool":"dc2"},"to":{"split":[["dc1",95],["dc2",5]]},"by":"default",
         "cause":"timer"}
    ]"#;
    let s = switches(json).unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].to, "split=dc1:95,dc2:5");
    assert_eq!(s[0].by, "default");
    assert_eq!(s[1].from, "pool=dc1");
    assert_eq!(s[1].at_us, 1_000_000);
}

#[test]
fn human_numbers_fit_five_characters() {
    assert_eq!(human(0.0), "0");
    assert_eq!(human(999.0), "999");
    assert_eq!(human(1500.0), "1.5k");
    assert_eq!(human(2_500_000.0), "2.5M");
    assert_eq!(human(9.99e9), "10.0G");
}

#[test]
fn the_screen_shows_services_backends_health_and_the_pause() {
    use ratatui::{Terminal, backend::TestBackend};
    let mut v = View::new();
    let mut s = sample(Instant::now(), false, &metrics((0, 0), (0, 0), 0, 3));
    s.status.time = 100;
    s.switches = vec![Switch {
        at_us: 97_500_000,
        group: "edge".into(),
        from: "split=dc1:50,dc2:50".into(),
        to: "pool=dc2".into(),
        by: "override".into(),
        cause: "override set".into(),
    }];
    v.update(s);
    v.key(Key::Char('p'));
    let mut t = Terminal::new(TestBackend::new(140, 30)).unwrap();
    t.draw(|f| draw::draw(f, &v, "http://127.0.0.1:9900"))
        .unwrap();
    let text: String = t
        .backend()
        .buffer()
        .content()
        .chunks(140)
        .map(|line| {
            line.iter()
                .map(ratatui::buffer::Cell::symbol)
                .collect::<String>()
                + "\n"
        })
        .collect();
    for want in [
        "generation 3",
        "PAUSED",
        "198.18.0.10:80/tcp",
        "decide edge",
        "198.18.1.2",
        "down: health check failed",
        "no_backend",
        "q quit",
        // A split's whole switch, where it went included.
        "split=dc1:50,dc2:50 → pool=dc2",
    ] {
        assert!(text.contains(want), "{want:?} missing from\n{text}");
    }
}

#[test]
fn a_switch_is_dated_by_the_agents_wall_clock() {
    let mut s = sample(Instant::now(), true, "");
    s.status.time = 100;
    s.switches = vec![Switch {
        at_us: 97_500_000,
        group: "edge".into(),
        from: "pool=web".into(),
        to: "pool=spare".into(),
        by: "rule to-spare".into(),
        cause: "state".into(),
    }];
    let mut v = View::new();
    v.update(s);
    let w = v.switches();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].1, 3);
    v.key(Key::Char('/'));
    v.key(Key::Char('z'));
    assert!(v.switches().is_empty(), "the filter applies to switches");
}
