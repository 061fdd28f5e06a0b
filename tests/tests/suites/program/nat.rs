//! NAT replies: the reply of a tracked NAT flow, from the backend's own address, gets the VIP
//! back as its source and goes to the client; an unrelated packet from the backend is left
//! alone.

use anyhow::Result;
use router_common::Reason;
use router_tests::{
    addrs::{self, backend_mac, backend_v4},
    packets,
};

use super::fixture::{Fields, Memo, On, Out, Step, To, Verdict, forwarded, pass, run};
use super::{c4, lab, v4};

/// The UDP datagram the backend of the request sends from its own address, port 53, to the
/// client's port `cport`, on its link to the lb.
fn from_backend(memo: &Memo, cport: u16) -> Result<Vec<u8>> {
    let b = memo.get("request")?;
    let mut frame = packets::udp(backend_v4(b).into(), 53, c4(), cport);
    frame[..6].copy_from_slice(&addrs::lb_backend_side_mac(b));
    frame[6..12].copy_from_slice(&backend_mac(b));
    Ok(frame)
}

#[test]
fn a_nat_reply_gets_the_virtual_ip_back() -> Result<()> {
    let Some(mut lab) = lab("fx-natrep") else {
        return Ok(());
    };
    let request = packets::udp(c4(), 5400, v4(), 53);
    run(
        &mut lab,
        [
            forwarded("request", request, Reason::NewFlow).to(To::Record("request".into())),
            // The backend answers the client from its own address.
            forwarded("reply", Vec::new(), Reason::NatReply)
                .built(|memo| from_backend(memo, 5400))
                .on(On::BackendOf("request".into()))
                .verdict(Verdict::Redirect)
                .out(Out::Fields(Fields {
                    dst_mac: Some(addrs::CLIENT_MAC),
                    src: Some(v4()),
                    dst: Some(c4()),
                    checksums_ok: true,
                    ..Fields::default()
                })),
            // An unrelated packet from the backend is left alone.
            pass("stray packet", Vec::new(), Reason::NoService)
                .built(|memo| from_backend(memo, 5401))
                .on(On::BackendOf("request".into())),
        ]
        .map(Step::from),
    )
}
