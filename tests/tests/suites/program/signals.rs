//! Failure signals for the circuit breaker (`BACKEND_SIGNALS`): a SYN retransmitted to a
//! backend (at most once a second per connection) and an RST a NAT backend sends its client are counted for that backend; the
//! connection's other packets count nothing.

use anyhow::{Result, ensure};
use router_common::{BackendSignals, Reason};
use router_tests::{
    addrs::{self, backend_mac, backend_v4},
    packets::{self, Tcp},
};

use super::fixture::{Fields, Memo, On, Out, Step, To, Verdict, advance, check, forwarded, run};
use super::{c4, lab, v4};

/// The signals of `web`'s backend `b`, summed over CPUs.
fn signals(lab: &router_tests::lab::Lab, b: usize) -> Result<BackendSignals> {
    let addr = std::net::IpAddr::from(backend_v4(b));
    let slot = lab.publisher.pools()["web"]
        .backends
        .iter()
        .find(|x| x.address == addr)
        .map(|x| x.slot)
        .ok_or_else(|| anyhow::anyhow!("no slot for backend {b}"))?;
    Ok(lab
        .maps
        .backend_signals
        .get(&slot, 0)?
        .iter()
        .fold(BackendSignals::default(), |a, s| BackendSignals {
            rsts: a.rsts + s.rsts,
            syn_retransmits: a.syn_retransmits + s.syn_retransmits,
        }))
}

/// Checks the signals of the backend recorded as `name`.
fn signals_are(name: &'static str, rsts: u64, syn_retransmits: u64) -> Step {
    check(
        &format!("{name}: {rsts} RSTs, {syn_retransmits} SYN retransmits"),
        move |lab, memo| {
            let got = signals(lab, memo.get(name)?)?;
            ensure!(
                got == BackendSignals {
                    rsts,
                    syn_retransmits
                },
                "{got:?}"
            );
            Ok(())
        },
    )
}

/// A TCP segment with `flags` from `api`'s backend (the one recorded as `request`), from its
/// own address and port 8080 to the client's `cport`, on its link to the lb.
fn from_backend(memo: &Memo, cport: u16, flags: Tcp) -> Result<Vec<u8>> {
    let b = memo.get("request")?;
    let mut frame = packets::tcp_with(backend_v4(b).into(), 8080, c4(), cport, flags);
    frame[..6].copy_from_slice(&addrs::lb_backend_side_mac(b));
    frame[6..12].copy_from_slice(&backend_mac(b));
    Ok(frame)
}

/// A reply on its way to the client, from the VIP.
fn to_client() -> Out {
    Out::Fields(Fields {
        dst_mac: Some(addrs::CLIENT_MAC),
        src: Some(v4()),
        dst: Some(c4()),
        checksums_ok: true,
        ..Fields::default()
    })
}

#[test]
fn a_retransmitted_syn_is_counted_for_its_backend() -> Result<()> {
    let Some(mut lab) = lab("fx-sig-syn") else {
        return Ok(());
    };
    let syn = packets::tcp_with(c4(), 48_000, v4(), 80, Tcp::Syn);
    let table: Vec<Step> = vec![
        forwarded("SYN", syn.clone(), Reason::NewFlow)
            .to(To::Record("flow".into()))
            .into(),
        signals_are("flow", 0, 0),
        // Repeated at once (faster than any retransmission timer): not counted.
        forwarded("SYN again at once", syn.clone(), Reason::NewFlow)
            .to(To::Same("flow".into()))
            .into(),
        signals_are("flow", 0, 0),
        advance(std::time::Duration::from_millis(1100)),
        forwarded("retransmitted after 1.1 s", syn.clone(), Reason::NewFlow)
            .to(To::Same("flow".into()))
            .into(),
        forwarded("and again at once", syn.clone(), Reason::NewFlow)
            .to(To::Same("flow".into()))
            .into(),
        signals_are("flow", 0, 1),
        advance(std::time::Duration::from_millis(1100)),
        forwarded("retransmitted after another 1.1 s", syn, Reason::NewFlow)
            .to(To::Same("flow".into()))
            .into(),
        signals_are("flow", 0, 2),
        // The handshake completes: the connection's packets count nothing more.
        forwarded(
            "ACK",
            packets::tcp_with(c4(), 48_000, v4(), 80, Tcp::Ack),
            Reason::ConntrackHit,
        )
        .to(To::Same("flow".into()))
        .into(),
        signals_are("flow", 0, 2),
    ];
    run(&mut lab, table)
}

#[test]
fn an_rst_from_a_nat_backend_is_counted_for_it() -> Result<()> {
    let Some(mut lab) = lab("fx-sig-rst") else {
        return Ok(());
    };
    let port = 48_100;
    let table: Vec<Step> = vec![
        forwarded(
            "request",
            packets::tcp_with(c4(), port, v4(), 8080, Tcp::Syn),
            Reason::NewFlow,
        )
        .to(To::Record("request".into()))
        .into(),
        forwarded("reply", Vec::new(), Reason::NatReply)
            .built(move |memo| from_backend(memo, port, Tcp::Ack))
            .on(On::BackendOf("request".into()))
            .verdict(Verdict::Redirect)
            .out(to_client())
            .into(),
        signals_are("request", 0, 0),
        forwarded("RST", Vec::new(), Reason::NatReply)
            .built(move |memo| from_backend(memo, port, Tcp::Rst))
            .on(On::BackendOf("request".into()))
            .verdict(Verdict::Redirect)
            .out(to_client())
            .into(),
        signals_are("request", 1, 0),
    ];
    run(&mut lab, table)
}
