//! Switchyard's XDP program: parse → classify → select → forward → count.
//!
//! One entry ([`switchyard`]), one exit: [`process`] returns an [`Outcome`] carrying the XDP
//! action and the [`Reason`] for it, and the entry counts it before returning. The packet path
//! is described in docs/architecture.md; the maps in `router_common::maps`.
//!
//! Kernel contract: native XDP on veth and real NICs, `BPF_MAP_TYPE_DEVMAP_HASH` (5.4),
//! BTF-defined maps (5.2), LRU hash (4.10). The program calls no route lookup: next hops come
//! from maps the agent writes (`NEXT_HOPS`) or the program records (`NAT_REVERSE`).
#![no_std]
#![no_main]
// Inline BPF assembly: the parser's word loads from packet memory (`parse::packet_load!`).
#![feature(asm_experimental_arch)]
// The `#[xdp]` macro generates the exported entry symbol without its doc comment.
#![allow(missing_docs)]
#![expect(
    clippy::inline_always,
    reason = "the program is one BPF function by design: every helper is inlined into the entry, \
              so no packet pays a BPF-to-BPF call"
)]

mod class;
mod csum;
mod forward;
mod ipip;
mod maps;
mod parse;
mod reset;
mod select;
mod vip;

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use router_common::{
    FAMILY_V6, FRAG_F_NAT_REPLY, FlowKey, FragEntry, FragKey, NO_BACKEND, NatEntry, Reason,
    SVC_F_IPIP, SVC_F_NAT, SVC_F_VIP_LIMIT, ServiceKey, Traffic, Verdict, tcp_flags,
};

use crate::{
    maps::{BACKEND_STATS, FRAGMENTS, NAT_REVERSE, REASON_STATS, SCRATCH, SERVICES, SVC_STATS},
    parse::{Packet, frag},
    select::{keeping_backend, select},
};

/// Marks "no service" / "no backend" in an [`Outcome`].
const NONE: u32 = u32::MAX;

/// What happened to a packet.
struct Outcome {
    action: u32,
    reason: Reason,
    service: u32,
    backend: u32,
}

impl Outcome {
    /// The verdict a reason carries when the packet is not forwarded.
    const fn unforwarded(reason: Reason, service: u32) -> Self {
        let action = match reason {
            Reason::NotIp
            | Reason::NoService
            | Reason::MalformedPass
            | Reason::FragmentUnknown
            | Reason::AllDownPass => xdp_action::XDP_PASS,
            // The frame became an ICMP error back to the client (`ipip`).
            Reason::TooBig => xdp_action::XDP_TX,
            _ => xdp_action::XDP_DROP,
        };
        Self {
            action,
            reason,
            service,
            backend: NONE,
        }
    }
}

/// The XDP entry point: processes one frame and returns its action. Inlined into the exported
/// function the `#[xdp]` macro wraps it in, so no packet pays a BPF-to-BPF call and return.
#[xdp]
#[inline(always)]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the `#[xdp]` macro calls the entry with an owned `XdpContext`"
)]
pub fn switchyard(ctx: XdpContext) -> u32 {
    let mut out = process(&ctx);
    if out.action == ipip::DEFERRED {
        // An ipip packet: `switchyard_ipip` encapsulates, sends and counts it. It returns
        // here only when that program is missing from `IPIP_TX`.
        ipip::hand_over(&ctx, out.reason, out.service, out.backend);
        out = Outcome::unforwarded(Reason::BadState, out.service);
    }
    count(&ctx, &out);
    out.action
}

/// The second XDP program, entered only by tail call from [`switchyard`] (`IPIP_TX`): the
/// encapsulation of an ipip packet, with a stack of its own (see `ipip`). Inlined into its
/// exported wrapper, as [`switchyard`] is.
#[xdp]
#[inline(always)]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the `#[xdp]` macro calls the entry with an owned `XdpContext`"
)]
pub fn switchyard_ipip(ctx: XdpContext) -> u32 {
    let out = match ipip::send(&ctx) {
        Ok((action, reason, service, backend)) => Outcome {
            action,
            reason,
            service,
            backend,
        },
        Err((reason, service)) => Outcome::unforwarded(reason, service),
    };
    count(&ctx, &out);
    out.action
}

#[inline(always)]
fn process(ctx: &XdpContext) -> Outcome {
    let Some(pkt) = SCRATCH.get_ptr_mut(0) else {
        return Outcome::unforwarded(Reason::BadState, NONE);
    };
    // Per-CPU scratch: nothing else touches it while this program runs on this CPU.
    let pkt = unsafe { &mut *pkt };
    if let Err(reason) = parse::parse(ctx, pkt) {
        if reason == Reason::NoService {
            return unserved(ctx, pkt);
        }
        return Outcome::unforwarded(reason, NONE);
    }
    if pkt.frag == frag::LATER {
        return later_fragment(ctx, pkt);
    }
    if !select::may_be_service(&pkt.flow) {
        if select::may_be_nat_reply(&pkt.flow) {
            return nat_reply(ctx, pkt);
        }
        return unserved(ctx, pkt);
    }
    // A tracked flow is forwarded on its entry; the service map is read only for the others.
    let now = select::now();
    let (svc, choice) = match select::tracked(&pkt.flow, pkt.tcp, now, !pkt.is_icmp()) {
        Ok(hit) => hit,
        Err(miss) if miss.reset != select::NO_RESET => {
            // A tracked TCP flow whose backend resets its flows: answered from the virtual IP.
            return match reset::answer(ctx, pkt) {
                Ok(action) => Outcome {
                    action,
                    reason: Reason::BackendReset,
                    service: miss.reset,
                    backend: NONE,
                },
                Err(r) => Outcome::unforwarded(r, miss.reset),
            };
        }
        Err(miss) => {
            let key = ServiceKey {
                addr: pkt.flow.dst,
                port: pkt.flow.dport,
                proto: pkt.flow.proto,
                family: pkt.flow.family,
            };
            let Some(svc) = (unsafe { SERVICES.get(key) }).copied() else {
                return nat_reply(ctx, pkt);
            };
            if pkt.is_icmp() && svc.flags & SVC_F_NAT != 0 {
                return Outcome::unforwarded(Reason::NoService, svc.id);
            }
            // A flow's first packet counts against its virtual IP's new-flow limit; a
            // re-selected flow, a later fragment and an ICMP error are not new flows.
            if svc.flags & SVC_F_VIP_LIMIT != 0
                && !miss.reselect
                && !pkt.is_icmp()
                && vip::over_limit(&pkt.flow)
            {
                return Outcome::unforwarded(Reason::VipRateLimited, svc.id);
            }
            // A first fragment carries the whole 5-tuple: it is balanced (and tracked) as its
            // flow, so a fragmented datagram reaches the backend of the flow's whole
            // datagrams; the later fragments, which carry no ports, follow its choice through
            // `FRAGMENTS`.
            let bytes = (ctx.data_end() - ctx.data()) as u64;
            match select(&pkt.flow, &svc, !pkt.is_icmp(), miss, now, bytes) {
                Ok(c) => (svc, c),
                Err(reason) => return Outcome::unforwarded(reason, svc.id),
            }
        }
    };
    if pkt.is_icmp() && svc.flags & SVC_F_NAT != 0 {
        // Rewriting the quoted header of a NAT flow is not implemented: the kernel gets it.
        return Outcome::unforwarded(Reason::NoService, svc.id);
    }
    if pkt.frag == frag::FIRST {
        let entry = FragEntry {
            backend: choice.id,
            service: svc.id,
            flags: svc.flags,
            ..FragEntry::default()
        };
        let _ = FRAGMENTS.insert(frag_key(pkt), entry, 0);
    }
    let mut reason = choice.reason;
    if pkt.is_icmp() {
        reason = Reason::IcmpForwarded;
    } else if pkt.frag != frag::NONE {
        reason = Reason::Fragment;
    }
    if svc.flags & SVC_F_NAT != 0
        && let Err(r) = nat_request(ctx, pkt, &choice.backend.addr, svc.id, choice.id)
    {
        return Outcome::unforwarded(r, svc.id);
    }
    let sent = if svc.flags & SVC_F_IPIP != 0 {
        Ok(ipip::defer(pkt, choice.id, choice.backend.hop))
    } else {
        forward::to_backend(ctx, choice.id, choice.backend.hop)
    };
    finish(sent, reason, svc.id, choice.id)
}

/// Builds the outcome of a forwarding attempt.
#[inline(always)]
fn finish(sent: Result<u32, Reason>, reason: Reason, service: u32, backend: u32) -> Outcome {
    match sent {
        Ok(action) => Outcome {
            action,
            reason,
            service,
            backend,
        },
        Err(r) => Outcome::unforwarded(r, service),
    }
}

/// The `FRAGMENTS` key of a fragment. IPv6 identifies a datagram by addresses and
/// identification alone (RFC 8200 §4.5), and its fragments need not agree on the protocol the
/// parser sees (an extension header may open the fragmentable part): the protocol is 0 there.
#[inline(always)]
pub(crate) fn frag_key(pkt: &Packet) -> FragKey {
    FragKey {
        src: pkt.flow.src,
        dst: pkt.flow.dst,
        id: pkt.frag_id,
        proto: if pkt.flow.family == FAMILY_V6 {
            0
        } else {
            pkt.flow.proto
        },
        family: pkt.flow.family,
        _pad: [0; 2],
    }
}

/// A packet no service takes: passed, unless it is addressed to a virtual IP (`vip`).
#[inline(always)]
fn unserved(ctx: &XdpContext, pkt: &Packet) -> Outcome {
    let (action, reason) = vip::unserved(ctx, pkt);
    Outcome {
        action,
        reason,
        service: NONE,
        backend: NONE,
    }
}

/// A non-first fragment follows the first fragment's choice, if it was seen: the backend of a
/// request, or the way back of a NAT reply.
#[inline(always)]
fn later_fragment(ctx: &XdpContext, pkt: &Packet) -> Outcome {
    let Some(entry) = (unsafe { FRAGMENTS.get(frag_key(pkt)) }).copied() else {
        return Outcome::unforwarded(Reason::FragmentUnknown, NONE);
    };
    if entry.flags & FRAG_F_NAT_REPLY != 0 {
        if let Err(r) = forward::rewrite_addr(ctx, pkt, false, &entry.vip) {
            return Outcome::unforwarded(r, entry.service);
        }
        return finish(
            forward::emit(ctx, entry.ifindex, forward::macs(&entry.macs)),
            Reason::NatReply,
            entry.service,
            NONE,
        );
    }
    let Some(backend) = keeping_backend(entry.backend) else {
        return Outcome::unforwarded(Reason::NoBackend, entry.service);
    };
    if entry.flags & SVC_F_NAT != 0
        && let Err(r) = forward::rewrite_addr(ctx, pkt, true, &backend.addr)
    {
        return Outcome::unforwarded(r, entry.service);
    }
    let sent = if entry.flags & SVC_F_IPIP != 0 {
        Ok(ipip::defer(pkt, entry.backend, backend.hop))
    } else {
        forward::to_backend(ctx, entry.backend, backend.hop)
    };
    finish(sent, Reason::Fragment, entry.service, entry.backend)
}

/// Rewrites a request of a NAT service towards `backend` and records how to restore its replies
/// and where to send them: back out of the interface the request came in on, to the MAC it
/// came from.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "`ingress_ifindex` widens the `u32` field of `xdp_md` to `usize`: the cast gives it back"
)]
fn nat_request(
    ctx: &XdpContext,
    pkt: &Packet,
    backend: &[u8; 16],
    service: u32,
    slot: u32,
) -> Result<(), Reason> {
    // Whole datagrams and first fragments alike: a first fragment carries the whole 5-tuple.
    let reply = FlowKey {
        src: *backend,
        dst: pkt.flow.src,
        sport: pkt.flow.dport,
        dport: pkt.flow.sport,
        ..pkt.flow
    };
    let entry = NatEntry {
        vip: pkt.flow.dst,
        service,
        ifindex: ctx.ingress_ifindex() as u32,
        macs: forward::reversed_macs(ctx)?,
        backend: slot,
    };
    // Refreshes the entry too, so it ages like the flow (both maps are LRU).
    let _ = NAT_REVERSE.insert(reply, entry, 0);
    forward::rewrite_addr(ctx, pkt, true, backend)
}

/// A packet for no service may be a NAT backend's reply: restore the virtual IP as its source
/// and send it back the way its request came. A reply's first fragment records that for the
/// later ones. Anything else is passed untouched.
#[inline(always)]
fn nat_reply(ctx: &XdpContext, pkt: &Packet) -> Outcome {
    if pkt.is_icmp() {
        return Outcome::unforwarded(Reason::NoService, NONE);
    }
    let Some(entry) = (unsafe { NAT_REVERSE.get(pkt.flow) }).copied() else {
        return unserved(ctx, pkt);
    };
    if pkt.tcp & tcp_flags::RST != 0 {
        select::signal(entry.backend, select::Signal::Rst);
    }
    if let Err(r) = forward::rewrite_addr(ctx, pkt, false, &entry.vip) {
        return Outcome::unforwarded(r, entry.service);
    }
    if pkt.frag == frag::FIRST {
        let later = FragEntry {
            backend: NO_BACKEND,
            service: entry.service,
            flags: FRAG_F_NAT_REPLY,
            ifindex: entry.ifindex,
            vip: entry.vip,
            macs: entry.macs,
        };
        let _ = FRAGMENTS.insert(frag_key(pkt), later, 0);
    }
    finish(
        forward::emit(ctx, entry.ifindex, forward::macs(&entry.macs)),
        Reason::NatReply,
        entry.service,
        NONE,
    )
}

#[inline(always)]
fn add(counter: Option<*mut Traffic>, bytes: u64) {
    if let Some(t) = counter {
        // Per-CPU slot: no other writer while this program runs on this CPU.
        unsafe {
            (*t).packets += 1;
            (*t).bytes += bytes;
        }
    }
}

#[inline(always)]
fn count(ctx: &XdpContext, out: &Outcome) {
    let bytes = (ctx.data_end() - ctx.data()) as u64;
    add(REASON_STATS.get_ptr_mut(out.reason as u32), bytes);
    if out.service != NONE {
        let verdict = match out.action {
            xdp_action::XDP_PASS => Verdict::Pass,
            xdp_action::XDP_TX => Verdict::Tx,
            xdp_action::XDP_REDIRECT => Verdict::Redirect,
            _ => Verdict::Drop,
        };
        let slot = out
            .service
            .wrapping_mul(Verdict::COUNT)
            .wrapping_add(verdict as u32);
        add(SVC_STATS.get_ptr_mut(slot), bytes);
    }
    if out.backend != NONE && out.backend != NO_BACKEND {
        add(BACKEND_STATS.get_ptr_mut(out.backend), bytes);
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable: the program has no panicking paths (no indexing, unwrap or division by a
    // variable); the verifier would reject an infinite loop anyway.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
