//! Why the program did what it did with a packet: one [`Reason`] per exit, counted per CPU in the
//! `REASON_STATS` map and exported by the agent as the `reason` label.

/// What the program returned, as a counter dimension.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `XDP_DROP`.
    Drop = 0,
    /// `XDP_PASS`: the kernel stack handles the packet.
    Pass = 1,
    /// `XDP_TX`: sent back out of the interface it came in on.
    Tx = 2,
    /// `XDP_REDIRECT`: sent out of another interface in the `TX_PORTS` device map.
    Redirect = 3,
}

impl Verdict {
    /// Number of verdicts (the stride of `SVC_STATS`).
    pub const COUNT: u32 = 4;
    /// Every verdict, in index order.
    pub const ALL: [Verdict; 4] = [Verdict::Drop, Verdict::Pass, Verdict::Tx, Verdict::Redirect];

    /// Label for metrics (the `action` label of the per-service counters).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Verdict::Drop => "drop",
            Verdict::Pass => "pass",
            Verdict::Tx => "tx",
            Verdict::Redirect => "redirect",
        }
    }
}

/// Why a packet got its verdict. Every exit of the program carries exactly one.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Not IPv4 or IPv6 (ARP, LLDP, …): passed untouched.
    NotIp = 0,
    /// IP, but no service matches `(destination, port, protocol)`: passed untouched.
    NoService = 1,
    /// A header was cut short or inconsistent before a service was identified: passed untouched,
    /// for the kernel's own checks to judge.
    MalformedPass = 2,
    /// A header was cut short or inconsistent in a packet addressed to a service: dropped, since
    /// it cannot be forwarded correctly.
    MalformedDrop = 3,
    /// A new flow: backend chosen from the Maglev table, flow tracked, forwarded.
    NewFlow = 4,
    /// A tracked flow: forwarded to its tracked backend.
    ConntrackHit = 5,
    /// A tracked flow whose backend is down or removed: a new backend was chosen.
    Reselected = 6,
    /// A fragment of a datagram whose first fragment chose the backend: forwarded there.
    Fragment = 7,
    /// A non-first fragment whose first fragment was not seen (reordered or evicted): passed.
    FragmentUnknown = 8,
    /// An ICMP error (fragmentation needed / packet too big) quoting a service flow: forwarded
    /// to that flow's backend (RFC 1191, RFC 8201).
    IcmpForwarded = 9,
    /// A backend's reply to a NAT flow: source restored to the virtual IP, forwarded.
    NatReply = 10,
    /// No usable backend in the decided pools nor the fallback: dropped (`when_all_down: drop`).
    NoBackend = 11,
    /// No usable backend, and the pool says `when_all_down: pass`: passed.
    AllDownPass = 12,
    /// The decided pools were empty; the fallback (last known good) pool was used.
    FallbackPool = 13,
    /// The chosen backend's slot has no resolved next hop in `NEXT_HOPS` (the agent could not
    /// resolve its neighbour, or has not yet): dropped.
    NoNextHop = 14,
    /// The route leaves through an interface missing from `TX_PORTS`: dropped.
    NoTxPort = 15,
    /// The service's decision or pool slot is missing or invalid (agent mid-apply): dropped.
    BadState = 16,
    /// An `ipip` packet that would exceed the egress MTU once encapsulated: an ICMP
    /// fragmentation-needed / `ICMPv6` packet-too-big went back to the client from the virtual
    /// IP instead (`XDP_TX`).
    TooBig = 17,
    /// An `ipip` packet that would exceed the egress MTU once encapsulated, and for which no
    /// ICMP error is sent (it is an ICMP error itself, or the egress MTU is below what the
    /// error's quote needs): dropped.
    TooBigDrop = 18,
    /// Addressed to a virtual IP, but no service takes it (another port or protocol, or an
    /// echo request the address does not answer): dropped. A virtual IP is the balancer's,
    /// so such traffic is never handed to the host to route back.
    VipNoService = 19,
    /// An ICMP/`ICMPv6` echo request to a virtual IP with a usable backend: answered from it
    /// (`XDP_TX`).
    EchoReply = 20,
    /// Addressed to a virtual IP on a port its `vips:` entry passes to the host: passed.
    HostPort = 21,
    /// A new flow past its virtual IP's `new_flows_per_second`: dropped (a client retries a
    /// SYN; a tracked flow is never limited).
    VipRateLimited = 22,
    /// A packet of a tracked TCP flow whose backend's entry says [`crate::BACKEND_F_RESET`]
    /// (`on_backend_down: reset`, or `on_failback: reset`): answered with a TCP RST from the
    /// virtual IP (`XDP_TX`), or dropped when it is itself an RST, a fragment or an ICMP error.
    BackendReset = 23,
    /// A TCP packet without a tracked flow that opens no connection, sent to the backend the
    /// pool's previous Maglev table names during its grace period after a table change
    /// ([`crate::POOL_F_SECOND_CHANCE`]), and tracked there: a connection that ECMP moved to
    /// this node keeps its backend.
    SecondChance = 24,
}

impl Reason {
    /// Number of reasons (entries of `REASON_STATS`).
    pub const COUNT: u32 = 25;
    /// Every reason, in index order.
    pub const ALL: [Reason; Self::COUNT as usize] = [
        Reason::NotIp,
        Reason::NoService,
        Reason::MalformedPass,
        Reason::MalformedDrop,
        Reason::NewFlow,
        Reason::ConntrackHit,
        Reason::Reselected,
        Reason::Fragment,
        Reason::FragmentUnknown,
        Reason::IcmpForwarded,
        Reason::NatReply,
        Reason::NoBackend,
        Reason::AllDownPass,
        Reason::FallbackPool,
        Reason::NoNextHop,
        Reason::NoTxPort,
        Reason::BadState,
        Reason::TooBig,
        Reason::TooBigDrop,
        Reason::VipNoService,
        Reason::EchoReply,
        Reason::HostPort,
        Reason::VipRateLimited,
        Reason::BackendReset,
        Reason::SecondChance,
    ];

    /// Label for metrics and `status` (the `reason` label).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Reason::NotIp => "not_ip",
            Reason::NoService => "no_service",
            Reason::MalformedPass => "malformed_pass",
            Reason::MalformedDrop => "malformed_drop",
            Reason::NewFlow => "new_flow",
            Reason::ConntrackHit => "conntrack_hit",
            Reason::Reselected => "reselected",
            Reason::Fragment => "fragment",
            Reason::FragmentUnknown => "fragment_unknown",
            Reason::IcmpForwarded => "icmp_forwarded",
            Reason::NatReply => "nat_reply",
            Reason::NoBackend => "no_backend",
            Reason::AllDownPass => "all_down_pass",
            Reason::FallbackPool => "fallback_pool",
            Reason::NoNextHop => "no_next_hop",
            Reason::NoTxPort => "no_tx_port",
            Reason::BadState => "bad_state",
            Reason::TooBig => "too_big",
            Reason::TooBigDrop => "too_big_drop",
            Reason::VipNoService => "vip_no_service",
            Reason::EchoReply => "echo_reply",
            Reason::HostPort => "host_port",
            Reason::VipRateLimited => "vip_rate_limited",
            Reason::BackendReset => "backend_reset",
            Reason::SecondChance => "second_chance",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_counter_slot() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?} is out of order in Reason::ALL");
        }
        let mut names: [&str; Reason::COUNT as usize] = [""; Reason::COUNT as usize];
        for (i, r) in Reason::ALL.iter().enumerate() {
            names[i] = r.name();
            assert!(
                !names[..i].contains(&r.name()),
                "duplicate label {}",
                r.name()
            );
        }
    }

    #[test]
    fn every_verdict_has_its_own_slot() {
        for (i, v) in Verdict::ALL.iter().enumerate() {
            assert_eq!(*v as usize, i);
        }
    }
}
