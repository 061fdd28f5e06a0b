//! Virtual IPs: traffic to one that no service takes is dropped (`vip_no_service`), never
//! passed to a host that would route it back; an echo request is answered from it while one of
//! its services has a usable backend and its `vips:` entry allows it (`echo_reply`); other ICMP
//! types and the host ports its entry lists go to the host.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{Result, ensure};
use etherparse::{Icmpv6Type, PacketBuilder};
use router_common::Reason;
use router_tests::{
    addrs::{CLIENT_V4, CLIENT_V6, VIP_V4, VIP_V6, backend_v4},
    lab::Lab,
    packets::{self, FROM_CLIENT, TO_LB},
};
use switchyard::config::{Config, Forward, Protocol, Vip};

use super::fixture::{XDP_DROP, XDP_PASS, XDP_TX};
use super::{c4, fixture_config, lab, svc};

/// A virtual IP whose only service goes to the pool `drop` (its backend down in [`lab`]).
const DARK: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);
/// A virtual IP of `web` whose `vips:` entry turns echo off.
const QUIET: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 12);

/// [`fixture_config`] with the two addresses above, and SSH on the IPv4 VIP passed to the host.
fn config() -> Config {
    let mut cfg = fixture_config();
    cfg.services.push(svc(
        "dark",
        DARK.into(),
        80,
        Protocol::Tcp,
        Forward::DsrL2,
        "drop",
    ));
    cfg.services.push(svc(
        "quiet",
        QUIET.into(),
        80,
        Protocol::Tcp,
        Forward::DsrL2,
        "web",
    ));
    cfg.vips = vec![
        Vip {
            address: QUIET.into(),
            echo: false,
            host_ports: vec![],
            new_flows_per_second: None,
        },
        Vip {
            address: VIP_V4.into(),
            echo: true,
            host_ports: vec![(Protocol::Tcp, 22)],
            new_flows_per_second: None,
        },
    ];
    cfg
}

/// The fixture lab with [`config`] applied, `drop`'s backend down.
fn vip_lab(tag: &str) -> Option<Lab> {
    let mut lab = lab(tag)?;
    lab.apply(&config()).expect("apply");
    lab.set_health("drop", &backend_v4(2).to_string(), false)
        .expect("health");
    Some(lab)
}

/// Runs `frame` and checks its verdict and reason.
fn expect(lab: &Lab, what: &str, frame: &[u8], action: u32, reason: Reason) -> Result<Vec<u8>> {
    let before = lab.reason(reason);
    let run = lab.run(frame)?;
    ensure!(
        run.action == action && lab.reason(reason) == before + 1,
        "{what}: action {} (want {action}), {reason:?} not counted once",
        run.action
    );
    Ok(run.out)
}

/// Checks that `out` answers echo request `input`: turned around, the reply's type, checksums
/// that verify.
fn is_reply(input: &[u8], out: &[u8]) -> Result<()> {
    let (i, o) = (packets::inspect(input)?, packets::inspect(out)?);
    let reply = if i.src.is_ipv4() { 0 } else { 129 };
    ensure!(
        out.len() == input.len(),
        "length {} → {}",
        input.len(),
        out.len()
    );
    ensure!(
        (o.src, o.dst, o.src_mac, o.dst_mac) == (i.dst, i.src, i.dst_mac, i.src_mac),
        "not turned around: {i:?} → {o:?}"
    );
    ensure!(o.icmp_type == Some(reply), "type {:?}", o.icmp_type);
    ensure!(o.checksums_ok, "checksums do not verify: {o:?}");
    Ok(())
}

#[test]
fn echo_requests_to_a_virtual_ip_are_answered_from_it() -> Result<()> {
    let Some(lab) = vip_lab("fx-vip-echo") else {
        return Ok(());
    };
    let ping = packets::ping(CLIENT_V4, VIP_V4)?;
    is_reply(
        &ping,
        &expect(&lab, "ping", &ping, XDP_TX, Reason::EchoReply)?,
    )?;
    let ping6 = packets::ping6(CLIENT_V6, VIP_V6)?;
    is_reply(
        &ping6,
        &expect(&lab, "ping6", &ping6, XDP_TX, Reason::EchoReply)?,
    )?;
    Ok(())
}

#[test]
fn an_echo_request_is_dropped_while_no_backend_is_usable_or_echo_is_off() -> Result<()> {
    let Some(mut lab) = vip_lab("fx-vip-dark") else {
        return Ok(());
    };
    let dark = packets::ping(CLIENT_V4, DARK)?;
    expect(
        &lab,
        "ping, pool down",
        &dark,
        XDP_DROP,
        Reason::VipNoService,
    )?;
    lab.set_health("drop", &backend_v4(2).to_string(), true)?;
    is_reply(
        &dark,
        &expect(&lab, "ping, pool up", &dark, XDP_TX, Reason::EchoReply)?,
    )?;
    lab.set_health("drop", &backend_v4(2).to_string(), false)?;
    expect(
        &lab,
        "ping, pool down again",
        &dark,
        XDP_DROP,
        Reason::VipNoService,
    )?;
    let quiet = packets::ping(CLIENT_V4, QUIET)?;
    expect(
        &lab,
        "ping, echo off",
        &quiet,
        XDP_DROP,
        Reason::VipNoService,
    )?;
    Ok(())
}

#[test]
fn a_virtual_ip_passes_only_its_host_ports_and_other_icmp_to_the_host() -> Result<()> {
    let Some(lab) = vip_lab("fx-vip-ports") else {
        return Ok(());
    };
    let vip = IpAddr::V4(VIP_V4);
    let ssh = packets::tcp(c4(), 40_000, vip, 22);
    let out = expect(
        &lab,
        "tcp/22, a host port",
        &ssh,
        XDP_PASS,
        Reason::HostPort,
    )?;
    ensure!(out == ssh, "a passed frame was modified");
    let udp22 = packets::udp(c4(), 40_000, vip, 22);
    expect(
        &lab,
        "udp/22, not one",
        &udp22,
        XDP_DROP,
        Reason::VipNoService,
    )?;
    let telnet = packets::tcp(c4(), 40_000, vip, 23);
    expect(&lab, "tcp/23", &telnet, XDP_DROP, Reason::VipNoService)?;
    // Another IP protocol (GRE) to the address.
    let mut gre = packets::set_byte(packets::udp(c4(), 40_000, vip, 80), 14 + 9, 47);
    packets::fix_v4_checksum(&mut gre);
    expect(&lab, "GRE", &gre, XDP_DROP, Reason::VipNoService)?;
    // Neighbour discovery for the address is the host's.
    let mut ns = Vec::new();
    PacketBuilder::ethernet2(FROM_CLIENT, TO_LB)
        .ipv6(CLIENT_V6.octets(), VIP_V6.octets(), 255)
        .icmpv6(Icmpv6Type::Unknown {
            type_u8: 135,
            code_u8: 0,
            bytes5to8: [0; 4],
        })
        .write(&mut ns, &VIP_V6.octets())?;
    expect(
        &lab,
        "neighbour solicitation",
        &ns,
        XDP_PASS,
        Reason::NoService,
    )?;
    // An address that is no virtual IP is the host's, whatever the port.
    let other = packets::tcp(c4(), 40_000, Ipv4Addr::new(198, 18, 0, 99).into(), 23);
    expect(&lab, "no VIP", &other, XDP_PASS, Reason::NoService)?;
    Ok(())
}

#[test]
fn a_removed_service_takes_its_virtual_ip_with_it() -> Result<()> {
    let Some(mut lab) = vip_lab("fx-vip-gone") else {
        return Ok(());
    };
    let dark = packets::tcp(c4(), 40_000, DARK.into(), 8080);
    expect(&lab, "while a VIP", &dark, XDP_DROP, Reason::VipNoService)?;
    let mut cfg = config();
    cfg.services.retain(|s| s.name != "dark");
    lab.apply(&cfg)?;
    expect(&lab, "no longer a VIP", &dark, XDP_PASS, Reason::NoService)?;
    Ok(())
}

#[test]
fn an_echo_request_that_cannot_be_turned_around_is_not_answered() -> Result<()> {
    let Some(lab) = vip_lab("fx-vip-odd-echo") else {
        return Ok(());
    };
    let ping = packets::ping(CLIENT_V4, VIP_V4)?;
    // To the broadcast MAC: a reply would come from it.
    let mut broadcast = ping.clone();
    broadcast[..6].copy_from_slice(&[0xff; 6]);
    expect(
        &lab,
        "to the broadcast MAC",
        &broadcast,
        XDP_DROP,
        Reason::VipNoService,
    )?;
    // With IPv4 options (four NOPs): a reply would have to update or reverse them.
    let mut options = ping[..34].to_vec();
    options.extend_from_slice(&[1, 1, 1, 1]);
    options.extend_from_slice(&ping[34..]);
    options[14] = 0x46;
    let total = u16::from_be_bytes([options[16], options[17]]) + 4;
    options[16..18].copy_from_slice(&total.to_be_bytes());
    packets::fix_v4_checksum(&mut options);
    expect(
        &lab,
        "with IPv4 options",
        &options,
        XDP_DROP,
        Reason::VipNoService,
    )?;
    // A first fragment of a large echo request (more fragments set): not answered, and not
    // the host's.
    let mut first = ping.clone();
    first[20] |= 0x20;
    packets::fix_v4_checksum(&mut first);
    expect(
        &lab,
        "a fragmented echo request",
        &first,
        XDP_DROP,
        Reason::VipNoService,
    )?;
    Ok(())
}

#[test]
fn new_flows_past_a_virtual_ips_limit_are_dropped_and_tracked_flows_go_on() -> Result<()> {
    use super::fixture::{Step, To, advance, dropped, forwarded, run};
    use packets::Tcp;

    let Some(mut lab) = lab("fx-vip-rate") else {
        return Ok(());
    };
    // 5 new flows a second: 6 per window of 2^30 ns, for every service of the address.
    let mut cfg = fixture_config();
    cfg.vips = vec![Vip {
        address: VIP_V4.into(),
        echo: true,
        host_ports: vec![],
        new_flows_per_second: Some(5),
    }];
    lab.apply(&cfg)?;
    let v4: IpAddr = VIP_V4.into();
    let syn = |port: u16| packets::tcp_with(c4(), port, v4, 80, Tcp::Syn);
    let mut table: Vec<Step> = vec![
        forwarded("tracked SYN", syn(49_000), Reason::NewFlow)
            .to(To::Record("tracked".into()))
            .into(),
        forwarded(
            "its ACK",
            packets::tcp_with(c4(), 49_000, v4, 80, Tcp::Ack),
            Reason::ConntrackHit,
        )
        .to(To::Same("tracked".into()))
        .into(),
        // A retransmitted SYN is no new flow.
        forwarded("a SYN retransmitted", syn(49_001), Reason::NewFlow).into(),
        forwarded("again", syn(49_001), Reason::NewFlow).into(),
    ];
    for port in 49_002..49_006 {
        table.push(forwarded(&format!("SYN {port}"), syn(port), Reason::NewFlow).into());
    }
    for port in 49_006..49_009 {
        table.push(
            dropped(
                &format!("SYN {port}, over"),
                syn(port),
                Reason::VipRateLimited,
            )
            .into(),
        );
    }
    table.extend([
        // The limit is the address's, whatever the service.
        dropped(
            "a DNS query, over",
            packets::udp(c4(), 49_100, v4, 53),
            Reason::VipRateLimited,
        )
        .into(),
        forwarded(
            "the tracked flow goes on",
            packets::tcp_with(c4(), 49_000, v4, 80, Tcp::Ack),
            Reason::ConntrackHit,
        )
        .to(To::Same("tracked".into()))
        .into(),
        advance(std::time::Duration::from_secs(2)),
        forwarded("next window", syn(49_010), Reason::NewFlow).into(),
    ]);
    run(&mut lab, table)
}
