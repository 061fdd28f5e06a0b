//! Fragments: every fragment of a datagram reaches the backend its first fragment reached (and
//! is NAT-rewritten like it), which is the backend of the datagram's flow in either order of
//! arrival; a later fragment whose first was never seen is passed untouched; a fragment never
//! follows the fragments of another service; an IPv6 later fragment is not parsed past its
//! fragment header, and a fragment header past the payload length is malformed.

use anyhow::{Result, ensure};
use router_common::Reason;
use router_tests::packets::{self, set_u16};

use super::fixture::{Out, Step, To, Verdict, check, dropped, flush, forwarded, nat, pass, run};
use super::{c4, c6, lab, v4, v6};

const UDP: u8 = 17;

#[test]
fn all_fragments_of_a_datagram_reach_one_backend() -> Result<()> {
    let Some(mut lab) = lab("fx-frag") else {
        return Ok(());
    };
    let payload = [7u8; 200];
    let mut table: Vec<Step> = Vec::new();
    for id in 1..=8u16 {
        let full = packets::udp_with(c4(), 6000 + id, v4(), 53, &payload);
        let (first, later) = packets::fragment_v4(&full, 64, id)?;
        let name = format!("v4 datagram {id}");
        table.push(
            forwarded(&format!("{name}: first fragment"), first, Reason::Fragment)
                .to(To::Record(name.clone()))
                .into(),
        );
        table.push(
            nat(&format!("{name}: later fragment"), later, Reason::Fragment)
                .verdict(Verdict::Redirect)
                .to(To::Same(name))
                .into(),
        );
    }
    for id in 1..=4u32 {
        let full = packets::udp_with(c6(), 7000 + u16::try_from(id)?, v6(), 53, &payload);
        let (first, later) = packets::fragment_v6(&full, 64, id)?;
        let name = format!("v6 datagram {id}");
        // Read the MAC directly: etherparse 0.16 misparses a later IPv6 fragment as UDP.
        table.push(
            forwarded(&format!("{name}: first fragment"), first, Reason::Fragment)
                .out(Out::Mac)
                .to(To::Record(name.clone()))
                .into(),
        );
        table.push(
            forwarded(&format!("{name}: later fragment"), later, Reason::Fragment)
                .out(Out::Mac)
                .to(To::Same(name))
                .into(),
        );
    }
    // A later fragment whose first was never seen is passed, untouched.
    let full = packets::udp_with(c4(), 6999, v4(), 53, &payload);
    let (_, orphan) = packets::fragment_v4(&full, 64, 999)?;
    table.push(pass("orphan fragment", orphan, Reason::FragmentUnknown).into());
    table.push(check("fragments counted", |lab, _| {
        ensure!(
            lab.reason(Reason::Fragment) >= 8 + 8 + 8,
            "fragments not counted"
        );
        Ok(())
    }));
    run(&mut lab, table)
}

/// A fragmented datagram belongs to its flow: its first fragment (which carries the ports) goes
/// to the backend of the flow's whole datagrams, and so do its later fragments, in both
/// orders of arrival (the flow's small datagrams first, or its fragmented one first).
#[test]
fn a_fragmented_datagram_reaches_the_backend_of_its_flow() -> Result<()> {
    let Some(mut lab) = lab("fx-fragflow") else {
        return Ok(());
    };
    let big = [9u8; 400];
    let small = [1u8; 8];
    let mut table: Vec<Step> = Vec::new();
    for (family, client, vip) in [("v4", c4(), v4()), ("v6", c6(), v6())] {
        for port in 0..40u16 {
            let sport = 30000 + port;
            let whole = packets::udp_with(client, sport, vip, 53, &small);
            let full = packets::udp_with(client, sport, vip, 53, &big);
            let id = u32::from(port) + 100;
            let (first, later) = if family == "v4" {
                packets::fragment_v4(&full, 64, u16::try_from(id)?)?
            } else {
                packets::fragment_v6(&full, 64, id)?
            };
            let flow = format!("{family} flow {sport}");
            let whole_row = |reason, to| {
                forwarded(&format!("{flow}: whole datagram"), whole.clone(), reason)
                    .out(Out::Mac)
                    .to(to)
            };
            let first_row = |to| {
                forwarded(
                    &format!("{flow}: first fragment"),
                    first.clone(),
                    Reason::Fragment,
                )
                .out(Out::Mac)
                .to(to)
            };
            let later_row = forwarded(&format!("{flow}: later fragment"), later, Reason::Fragment)
                .out(Out::Mac)
                .to(To::Same(flow.clone()));
            // Even ports: the whole datagram first; odd ports: the fragments first.
            let rows = if port % 2 == 0 {
                [
                    whole_row(Reason::NewFlow, To::Record(flow.clone())),
                    first_row(To::Same(flow.clone())),
                    later_row,
                ]
            } else {
                [
                    first_row(To::Record(flow.clone())),
                    later_row,
                    whole_row(Reason::ConntrackHit, To::Same(flow.clone())),
                ]
            };
            table.extend(rows.map(Step::from));
            table.push(flush());
        }
        let prefix = format!("{family} flow ");
        table.push(check(&format!("{family} flows spread"), move |_, memo| {
            let backends: std::collections::BTreeSet<usize> =
                memo.with_prefix(&prefix).into_iter().collect();
            ensure!(
                backends.len() > 1,
                "{family}: 40 flows all on backend {backends:?}: the port is not in the hash"
            );
            Ok(())
        }));
    }
    run(&mut lab, table)
}

#[test]
fn a_fragment_for_one_service_never_follows_another_services_fragments() -> Result<()> {
    let Some(mut lab) = lab("fz-fragsvc") else {
        return Ok(());
    };
    // A fragmented datagram to web (port 80, live pool) from a client …
    let full = packets::tcp(c4(), 40100, v4(), 80);
    let (web_first, _) = packets::fragment_v4(&full, 24, 0x2d00)?;
    // … must not carry the same client's fragmented datagram to "closed" (port 81, whose only
    // backend is down) to web's backend. Found by the fuzz run.
    let full = packets::tcp(c4(), 40101, v4(), 81);
    let (closed_first, _) = packets::fragment_v4(&full, 24, 0x2d01)?;
    run(
        &mut lab,
        [
            forwarded("web's first fragment", web_first, Reason::Fragment)
                .verdict(Verdict::Redirect)
                .out(Out::Unread)
                .into(),
            dropped(
                "first fragment to a service whose pool is down",
                closed_first,
                Reason::NoBackend,
            )
            .into(),
        ],
    )
}

/// A UDP/IPv6 datagram to dns6, fragmented after a destination-options header that belongs to
/// the fragmentable part (RFC 8200 §4.5): `(first, later)`.
fn v6_fragments_with_dstopts(sport: u16, id: u32) -> Result<(Vec<u8>, Vec<u8>)> {
    let full = packets::udp_with(c6(), sport, v6(), 53, &[9u8; 120]);
    let (head, l4) = full.split_at(14 + 40);
    let mut fragmentable = vec![UDP, 0, 1, 4, 0, 0, 0, 0];
    fragmentable.extend_from_slice(l4);
    let (a, b) = fragmentable.split_at(64);
    let make = |part: &[u8], offset: usize, more: bool| -> Result<Vec<u8>> {
        let mut f = head.to_vec();
        f[14 + 6] = 44;
        f[14 + 4..14 + 6].copy_from_slice(&u16::try_from(8 + part.len())?.to_be_bytes());
        let field = u16::try_from(offset / 8)? << 3 | u16::from(more);
        f.extend_from_slice(&[60, 0]);
        f.extend_from_slice(&field.to_be_bytes());
        f.extend_from_slice(&id.to_be_bytes());
        f.extend_from_slice(part);
        Ok(f)
    };
    Ok((make(a, 0, true)?, make(b, 64, false)?))
}

#[test]
fn an_ipv6_later_fragment_is_not_parsed_past_its_fragment_header() -> Result<()> {
    let Some(mut lab) = lab("fz-frag6") else {
        return Ok(());
    };
    let (first, later) = v6_fragments_with_dstopts(7100, 0x0bad_f00d)?;
    run(
        &mut lab,
        [
            forwarded("first fragment", first, Reason::Fragment)
                .verdict(Verdict::Redirect)
                .out(Out::Mac)
                .to(To::Record("first".into()))
                .into(),
            forwarded("later fragment", later, Reason::Fragment)
                .verdict(Verdict::Redirect)
                .out(Out::Mac)
                .to(To::Same("first".into()))
                .into(),
        ],
    )
}

#[test]
fn an_ipv6_fragment_header_past_the_payload_length_is_malformed() -> Result<()> {
    let Some(mut lab) = lab("fz-frag6len") else {
        return Ok(());
    };
    let (first, later) = v6_fragments_with_dstopts(7200, 0x0bad_cafe)?;
    run(
        &mut lab,
        [
            forwarded("first fragment", first, Reason::Fragment)
                .verdict(Verdict::Redirect)
                .out(Out::Unread)
                .into(),
            // Found by the fuzz run: payload length 1, so the fragment header is not in the
            // datagram.
            pass(
                "later fragment whose fragment header ends past the payload",
                set_u16(later, 18, 1),
                Reason::MalformedPass,
            )
            .into(),
        ],
    )
}
