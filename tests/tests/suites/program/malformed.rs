//! IP lengths that do not fit the frame — an IPv4 total length or IPv6 payload length past the
//! frame, below the header, or ending inside the TCP or UDP header — are malformed: passed
//! untouched, never rewritten and forwarded.

use anyhow::Result;
use router_common::Reason;
use router_tests::packets::{self, set_u16, unhex};

use super::fixture::{Step, pass, run};
use super::{c4, c6, lab, v4, v6};

#[test]
fn ip_lengths_that_do_not_fit_the_frame_are_malformed() -> Result<()> {
    let Some(mut lab) = lab("fz-len") else {
        return Ok(());
    };
    let udp4 = packets::udp(c4(), 5000, v4(), 53);
    let tcp4 = packets::tcp(c4(), 5001, v4(), 80);
    let tcp6 = packets::tcp(c6(), 5002, v6(), 80);
    let udp6 = packets::udp(c6(), 5003, v6(), 53);
    let malformed = |name, frame| Step::from(pass(name, frame, Reason::MalformedPass));
    run(
        &mut lab,
        [
            // Found by the fuzz run: a NAT service rewrote and forwarded these.
            malformed(
                "ipv4 total length 1 (fuzz)",
                unhex(
                    "0253590000fe025359000001080045000001000040004011ae8dc6120001c612000aede80035\
                     001cddbc50aa6af515f584c3c8bf922fa9decb10bb50c623",
                ),
            ),
            malformed(
                "ipv4 total length past the frame",
                set_u16(udp4.clone(), 16, 0xffff),
            ),
            malformed(
                "ipv4 total length below the IHL",
                set_u16(udp4.clone(), 16, 12),
            ),
            malformed(
                "ipv4 datagram ends inside the UDP header",
                set_u16(udp4, 16, 20 + 6),
            ),
            malformed(
                "ipv4 datagram ends inside the TCP header",
                set_u16(tcp4, 16, 20 + 12),
            ),
            malformed(
                "ipv6 payload length 8 under a 20-byte TCP header (fuzz)",
                unhex(
                    "0253590000fe02535900000186dd600000000008064020010db80000000000000000000000\
                     0120010db800000000000000000000001079c40050000003e8000000005002faf00dab0000\
                     737769746368796172642066697874757265207061796c6f61642c203438206279746573206c\
                     6f6e672e2e2e2e2e2e",
                ),
            ),
            malformed(
                "ipv6 payload length past the frame",
                set_u16(udp6.clone(), 18, 0x4000),
            ),
            malformed("ipv6 payload length 0", set_u16(udp6, 18, 0)),
            malformed(
                "ipv6 payload length 4, in the TCP header",
                set_u16(tcp6, 18, 4),
            ),
        ],
    )
}
