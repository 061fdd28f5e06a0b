//! Whether a pinned XDP link is live on an interface of this network namespace.
//!
//! A pinned `bpf_link` outlives the interface it was attached to: when the device is
//! unregistered the kernel detaches the program and the link stays, reporting ifindex 0
//! (`bpf_xdp_link_fill_link_info`). And bpffs is one file system for every network namespace,
//! so a pin may name an interface of another namespace that happens to share this one's name,
//! and even its ifindex (ifindexes are allocated per namespace). A link counts as live on
//! `iface` only when both views agree: the link's `bpf_link_info` names the ifindex `iface` has
//! in this namespace, and that interface reports the link's program as its XDP program
//! (`IFLA_XDP` of `RTM_GETLINK`, asked in this namespace).
//!
//! The same `IFLA_XDP` answer says in which mode the interface runs each program (driver,
//! generic or offloaded): a live link's mode is read from it ([`AttachedMode`]), never assumed
//! from what an agent was asked for. A program runs in one mode on one interface: the kernel
//! refuses native and generic programs side by side, and an offloaded program is bound to its
//! device and attaches in no other mode.

use std::{
    ffi::CString,
    fmt,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

use netlink_packet_core::{NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{LinkAttribute, LinkMessage, LinkXdp, XdpAttached},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// `BPF_OBJ_GET` (uapi `enum bpf_cmd`).
const BPF_OBJ_GET: libc::c_long = 7;
/// `BPF_OBJ_GET_INFO_BY_FD`.
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// `BPF_LINK_TYPE_XDP` (uapi `enum bpf_link_type`).
const BPF_LINK_TYPE_XDP: u32 = 6;

/// What the kernel says about a pinned XDP link (`struct bpf_link_info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpLinkInfo {
    /// Kernel id of the link.
    pub id: u32,
    /// Kernel id of the program it runs.
    pub program_id: u32,
    /// Index of the interface it is attached to, in the namespace of that interface; 0 when
    /// the interface is gone.
    pub ifindex: u32,
}

/// The mode an XDP program runs in on an interface, as the kernel reports it (`IFLA_XDP`:
/// `IFLA_XDP_DRV_PROG_ID`, `IFLA_XDP_SKB_PROG_ID`, `IFLA_XDP_HW_PROG_ID`, or
/// `IFLA_XDP_ATTACHED` beside `IFLA_XDP_PROG_ID`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachedMode {
    /// In the driver (`XDP_ATTACHED_DRV`, `ip link` shows `xdp`/`xdpdrv`): what `--mode native`
    /// attaches.
    Native,
    /// On the skb, after the driver (`XDP_ATTACHED_SKB`, `ip link` shows `xdpgeneric`): what
    /// `--mode generic` attaches.
    Generic,
    /// On the NIC (`XDP_ATTACHED_HW`, `xdpoffload`): never attached by switchyard, but reported
    /// as it is.
    Offloaded,
}

impl AttachedMode {
    /// `native`, `generic` or `offloaded`: the words of `--mode`, as `status` and the log show
    /// them.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            AttachedMode::Native => "native",
            AttachedMode::Generic => "generic",
            AttachedMode::Offloaded => "offloaded",
        }
    }
}

impl fmt::Display for AttachedMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One XDP program attached to an interface, and in which mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// Kernel id of the program (never 0).
    pub program: u32,
    /// The mode it runs in.
    pub mode: AttachedMode,
}

/// The XDP attachment of one interface of this network namespace, from `IFLA_XDP`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceXdp {
    /// Its ifindex here.
    pub ifindex: u32,
    /// The XDP programs attached to it, at most one per mode, in the order native, generic,
    /// offloaded; empty when none.
    pub attachments: Vec<Attachment>,
}

impl InterfaceXdp {
    /// Ids of the programs attached, in the order of [`InterfaceXdp::attachments`].
    #[must_use]
    pub fn programs(&self) -> Vec<u32> {
        self.attachments.iter().map(|a| a.program).collect()
    }

    /// The mode `program` runs in here, `None` when it is not attached here.
    #[must_use]
    pub fn mode_of(&self, program: u32) -> Option<AttachedMode> {
        self.attachments
            .iter()
            .find(|a| a.program == program)
            .map(|a| a.mode)
    }
}

/// The programs an `IFLA_XDP` nest reports, with their modes ([`InterfaceXdp::attachments`]).
///
/// The per-mode ids (`IFLA_XDP_DRV_PROG_ID`, `_SKB_`, `_HW_`; every kernel with XDP links sends
/// them) are authoritative. Without any, a single program is read from `IFLA_XDP_PROG_ID` and
/// the mode `IFLA_XDP_ATTACHED` gives it; `XDP_ATTACHED_MULTI` or an unknown value then names
/// no mode, and nothing is reported. Program id 0 means none.
#[must_use]
pub fn attachments(xdp: &[LinkXdp]) -> Vec<Attachment> {
    let per_mode = |mode: AttachedMode| {
        xdp.iter().find_map(|x| match (x, mode) {
            (LinkXdp::DrvProgId(id), AttachedMode::Native)
            | (LinkXdp::SkbProgId(id), AttachedMode::Generic)
            | (LinkXdp::HwProgId(id), AttachedMode::Offloaded)
                if *id != 0 =>
            {
                Some(Attachment { program: *id, mode })
            }
            _ => None,
        })
    };
    let found: Vec<Attachment> = [
        AttachedMode::Native,
        AttachedMode::Generic,
        AttachedMode::Offloaded,
    ]
    .into_iter()
    .filter_map(per_mode)
    .collect();
    if !found.is_empty() {
        return found;
    }
    let program = xdp.iter().find_map(|x| match x {
        LinkXdp::ProgId(id) if *id != 0 => Some(*id),
        _ => None,
    });
    let mode = xdp.iter().find_map(|x| match x {
        LinkXdp::Attached(XdpAttached::Driver) => Some(AttachedMode::Native),
        LinkXdp::Attached(XdpAttached::SocketBuffer) => Some(AttachedMode::Generic),
        LinkXdp::Attached(XdpAttached::Hardware) => Some(AttachedMode::Offloaded),
        _ => None,
    });
    match (program, mode) {
        (Some(program), Some(mode)) => vec![Attachment { program, mode }],
        _ => Vec::new(),
    }
}

/// Why a pinned link is not live on its interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Defunct {
    /// The interface it was attached to was deleted (the link reports ifindex 0): the program
    /// runs nowhere.
    InterfaceGone,
    /// It is attached to ifindex `theirs`, which is not the interface of that name here
    /// (`ours`: its ifindex here, `None` when there is no such interface here) — an interface
    /// of another namespace, or another interface of this one.
    OtherInterface {
        /// The link's ifindex.
        theirs: u32,
        /// The interface's ifindex in this namespace.
        ours: Option<u32>,
    },
    /// Its ifindex is the interface's here, but the interface runs another XDP program (or
    /// none): the link is an interface of another namespace with the same ifindex.
    OtherNamespace {
        /// The link's program.
        link_program: u32,
        /// The programs the interface here runs.
        running: Vec<u32>,
    },
}

impl fmt::Display for Defunct {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Defunct::InterfaceGone => write!(f, "interface gone"),
            Defunct::OtherInterface {
                theirs,
                ours: Some(ours),
            } => write!(
                f,
                "attached to ifindex {theirs}, not this namespace's interface of that name \
                 (ifindex {ours})"
            ),
            Defunct::OtherInterface { theirs, ours: None } => write!(
                f,
                "attached to ifindex {theirs}; this namespace has no interface of that name"
            ),
            Defunct::OtherNamespace {
                link_program,
                running,
            } => {
                let running = if running.is_empty() {
                    "no XDP program".to_owned()
                } else {
                    let ids: Vec<String> = running.iter().map(u32::to_string).collect();
                    format!("program {}", ids.join(", "))
                };
                write!(
                    f,
                    "the interface here runs {running}, not the link's program {link_program}: \
                     the link is another network namespace's"
                )
            }
        }
    }
}

/// The state of the link pinned for an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// No link is pinned.
    None,
    /// The link runs its program on the interface, in this namespace, in the mode given (read
    /// from the interface, not from what the agent was asked for).
    Live(XdpLinkInfo, AttachedMode),
    /// A link is pinned but does not run on the interface here.
    Defunct(XdpLinkInfo, Defunct),
}

impl LinkState {
    /// `live`, `defunct (REASON)` or `none`, as `/status` reports it.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            LinkState::None => "none".into(),
            LinkState::Live(..) => "live".into(),
            LinkState::Defunct(_, why) => format!("defunct ({why})"),
        }
    }
}

/// Whether the link `info` is live on the interface `iface` has here (`here`, `None` when
/// there is none), and if so in which mode the interface runs its program: see the module
/// documentation.
///
/// # Errors
///
/// Why the link is defunct: [`Defunct::InterfaceGone`] when it reports ifindex 0,
/// [`Defunct::OtherInterface`] when `here` is missing or has another ifindex,
/// [`Defunct::OtherNamespace`] when `here` does not run the link's program.
pub fn judge(info: &XdpLinkInfo, here: Option<&InterfaceXdp>) -> Result<AttachedMode, Defunct> {
    if info.ifindex == 0 {
        return Err(Defunct::InterfaceGone);
    }
    let Some(here) = here.filter(|h| h.ifindex == info.ifindex) else {
        return Err(Defunct::OtherInterface {
            theirs: info.ifindex,
            ours: here.map(|h| h.ifindex),
        });
    };
    here.mode_of(info.program_id)
        .ok_or_else(|| Defunct::OtherNamespace {
            link_program: info.program_id,
            running: here.programs(),
        })
}

/// The state of the link pinned at `path` for `iface`.
///
/// # Errors
///
/// The pin exists but is not an XDP link the kernel describes ([`pinned_xdp_link`]), or the
/// interface cannot be queried over rtnetlink ([`interface_xdp`]).
pub fn state(path: &Path, iface: &str) -> std::io::Result<LinkState> {
    if !path.exists() {
        return Ok(LinkState::None);
    }
    let info = pinned_xdp_link(path)?;
    let here = interface_xdp(iface)?;
    Ok(match judge(&info, here.as_ref()) {
        Ok(mode) => LinkState::Live(info, mode),
        Err(why) => LinkState::Defunct(info, why),
    })
}

/// Opens the link pinned at `path` and reads its `bpf_link_info`.
///
/// # Errors
///
/// A path with a NUL byte (`InvalidInput`), no pin or a pin that is not a link (the error of
/// bpf(2)), or a link that is not XDP.
#[expect(
    clippy::cast_possible_truncation,
    reason = "the two bpf_attr sizes are a few words, and bpf(2)'s descriptor is an int that \
              syscall(2) widens to a long"
)]
pub fn pinned_xdp_link(path: &Path) -> std::io::Result<XdpLinkInfo> {
    use std::os::unix::ffi::OsStrExt as _;
    // `union bpf_attr` for BPF_OBJ_GET: pathname, bpf_fd, file_flags.
    #[repr(C)]
    struct ObjGet {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
    }
    // The head of `struct bpf_link_info` and its `xdp` member (the union is 8-aligned).
    #[repr(C)]
    #[derive(Default)]
    struct LinkInfo {
        kind: u32,
        id: u32,
        prog_id: u32,
        _pad: u32,
        ifindex: u32,
        _rest: [u32; 11],
    }
    // `union bpf_attr` for BPF_OBJ_GET_INFO_BY_FD: bpf_fd, info_len, info.
    #[repr(C)]
    struct GetInfo {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let attr = ObjGet {
        pathname: c.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
    };
    // SAFETY: bpf(2) reads `attr` (size given) and the C string it points to, both alive for
    // the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET,
            &raw const attr,
            size_of::<ObjGet>() as u32,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut info = LinkInfo::default();
    let attr = GetInfo {
        bpf_fd: fd.as_raw_fd().cast_unsigned(),
        info_len: size_of::<LinkInfo>() as u32,
        info: &raw mut info as u64,
    };
    // SAFETY: bpf(2) reads `attr` and writes at most `info_len` bytes into `info`, both alive
    // for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &raw const attr,
            size_of::<GetInfo>() as u32,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if info.kind != BPF_LINK_TYPE_XDP {
        return Err(std::io::Error::other(format!(
            "not an XDP link (link type {})",
            info.kind
        )));
    }
    Ok(XdpLinkInfo {
        id: info.id,
        program_id: info.prog_id,
        ifindex: info.ifindex,
    })
}

/// The XDP attachment of the interface named `iface` in this process's network namespace
/// (`RTM_GETLINK` by `IFLA_IFNAME`), or `None` when there is no such interface.
///
/// # Errors
///
/// The rtnetlink socket cannot be opened, bound or connected; the request cannot be sent or
/// the answer received; the answer does not fit 64 KiB, does not parse, or is an error other
/// than "no such device" or not a link.
pub fn interface_xdp(iface: &str) -> std::io::Result<Option<InterfaceXdp>> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut message = LinkMessage::default();
    message
        .attributes
        .push(LinkAttribute::IfName(iface.to_owned()));
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::GetLink(message));
    request.header.flags = NLM_F_REQUEST;
    request.header.sequence_number = 1;
    request.finalize();
    let mut buf = vec![0; request.buffer_len()];
    request.serialize(&mut buf);
    socket.send(&buf, 0)?;
    // One answer: the link (a few KiB with its statistics) or an error.
    let mut answer = Vec::with_capacity(1 << 16);
    // MSG_TRUNC: the length returned is the datagram's, even when it did not fit.
    let len = socket.recv(&mut answer, libc::MSG_TRUNC)?;
    if len > answer.len() {
        return Err(std::io::Error::other(format!(
            "the rtnetlink answer for {iface} is larger than {} bytes",
            answer.capacity()
        )));
    }
    let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&answer)
        .map_err(|e| std::io::Error::other(format!("parsing the rtnetlink answer: {e}")))?;
    match reply.payload {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => {
            let attachments = link
                .attributes
                .iter()
                .find_map(|a| match a {
                    LinkAttribute::Xdp(xdp) => Some(attachments(xdp)),
                    _ => None,
                })
                .unwrap_or_default();
            Ok(Some(InterfaceXdp {
                ifindex: link.header.index,
                attachments,
            }))
        }
        NetlinkPayload::Error(e) if e.raw_code() == -libc::ENODEV => Ok(None),
        NetlinkPayload::Error(e) => Err(e.to_io()),
        other => Err(std::io::Error::other(format!(
            "unexpected rtnetlink answer for {iface}: {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINK: XdpLinkInfo = XdpLinkInfo {
        id: 7,
        program_id: 42,
        ifindex: 5,
    };

    /// An interface at `ifindex` running `programs` natively.
    fn here(ifindex: u32, programs: &[u32]) -> InterfaceXdp {
        InterfaceXdp {
            ifindex,
            attachments: programs
                .iter()
                .map(|&program| Attachment {
                    program,
                    mode: AttachedMode::Native,
                })
                .collect(),
        }
    }

    #[test]
    fn a_link_is_live_only_on_its_ifindex_running_its_program() {
        assert_eq!(
            judge(&LINK, Some(&here(5, &[42]))),
            Ok(AttachedMode::Native)
        );
        let gone = XdpLinkInfo { ifindex: 0, ..LINK };
        assert_eq!(
            judge(&gone, Some(&here(9, &[]))),
            Err(Defunct::InterfaceGone)
        );
        assert_eq!(judge(&gone, None), Err(Defunct::InterfaceGone));
        assert_eq!(
            judge(&LINK, Some(&here(9, &[]))),
            Err(Defunct::OtherInterface {
                theirs: 5,
                ours: Some(9)
            })
        );
        assert_eq!(
            judge(&LINK, None),
            Err(Defunct::OtherInterface {
                theirs: 5,
                ours: None
            })
        );
        assert_eq!(
            judge(&LINK, Some(&here(5, &[43]))),
            Err(Defunct::OtherNamespace {
                link_program: 42,
                running: vec![43]
            })
        );
    }

    #[test]
    fn a_live_link_has_the_mode_its_program_runs_in_there() {
        let generic = InterfaceXdp {
            ifindex: 5,
            attachments: vec![Attachment {
                program: 42,
                mode: AttachedMode::Generic,
            }],
        };
        assert_eq!(judge(&LINK, Some(&generic)), Ok(AttachedMode::Generic));
        // Offloaded beside native: each program has its own mode.
        let both = InterfaceXdp {
            ifindex: 5,
            attachments: vec![
                Attachment {
                    program: 43,
                    mode: AttachedMode::Native,
                },
                Attachment {
                    program: 42,
                    mode: AttachedMode::Offloaded,
                },
            ],
        };
        assert_eq!(judge(&LINK, Some(&both)), Ok(AttachedMode::Offloaded));
        assert_eq!(both.programs(), vec![43, 42]);
        assert_eq!(both.mode_of(43), Some(AttachedMode::Native));
        assert_eq!(both.mode_of(44), None);
    }

    #[test]
    fn per_mode_program_ids_give_each_program_its_mode() {
        let at = |program, mode| Attachment { program, mode };
        // What a kernel sends for one generic program.
        let generic = [
            LinkXdp::SkbProgId(42),
            LinkXdp::Attached(XdpAttached::SocketBuffer),
            LinkXdp::ProgId(42),
        ];
        assert_eq!(attachments(&generic), vec![at(42, AttachedMode::Generic)]);
        let native = [
            LinkXdp::DrvProgId(7),
            LinkXdp::Attached(XdpAttached::Driver),
            LinkXdp::ProgId(7),
        ];
        assert_eq!(attachments(&native), vec![at(7, AttachedMode::Native)]);
        // Several modes: `IFLA_XDP_ATTACHED` says MULTI and no `IFLA_XDP_PROG_ID` comes.
        let multi = [
            LinkXdp::HwProgId(9),
            LinkXdp::DrvProgId(7),
            LinkXdp::Attached(XdpAttached::Multiple),
        ];
        assert_eq!(
            attachments(&multi),
            vec![at(7, AttachedMode::Native), at(9, AttachedMode::Offloaded)]
        );
        // The per-mode ids win over a contradicting summary.
        let contradicting = [
            LinkXdp::SkbProgId(42),
            LinkXdp::Attached(XdpAttached::Driver),
            LinkXdp::ProgId(42),
        ];
        assert_eq!(
            attachments(&contradicting),
            vec![at(42, AttachedMode::Generic)]
        );
    }

    #[test]
    fn without_per_mode_ids_the_summary_gives_the_mode() {
        let at = |program, mode| Attachment { program, mode };
        for (attached, mode) in [
            (XdpAttached::Driver, AttachedMode::Native),
            (XdpAttached::SocketBuffer, AttachedMode::Generic),
            (XdpAttached::Hardware, AttachedMode::Offloaded),
        ] {
            assert_eq!(
                attachments(&[LinkXdp::Attached(attached), LinkXdp::ProgId(3)]),
                vec![at(3, mode)],
                "{attached:?}"
            );
        }
        // Nothing attached, or a summary that names no single mode: no attachment.
        assert_eq!(attachments(&[LinkXdp::Attached(XdpAttached::None)]), vec![]);
        assert_eq!(attachments(&[]), vec![]);
        assert_eq!(
            attachments(&[LinkXdp::Attached(XdpAttached::Multiple), LinkXdp::ProgId(3)]),
            vec![]
        );
        assert_eq!(
            attachments(&[LinkXdp::Attached(XdpAttached::Other(9)), LinkXdp::ProgId(3)]),
            vec![]
        );
        // Id 0 is no program, per mode or not.
        assert_eq!(
            attachments(&[
                LinkXdp::DrvProgId(0),
                LinkXdp::Attached(XdpAttached::Driver),
                LinkXdp::ProgId(0)
            ]),
            vec![]
        );
    }

    #[test]
    fn modes_are_named_as_the_mode_option_names_them() {
        assert_eq!(AttachedMode::Native.to_string(), "native");
        assert_eq!(AttachedMode::Generic.to_string(), "generic");
        assert_eq!(AttachedMode::Offloaded.to_string(), "offloaded");
    }

    #[test]
    fn states_read_as_status_reports_them() {
        assert_eq!(LinkState::None.describe(), "none");
        assert_eq!(
            LinkState::Live(LINK, AttachedMode::Generic).describe(),
            "live"
        );
        assert_eq!(
            LinkState::Defunct(LINK, Defunct::InterfaceGone).describe(),
            "defunct (interface gone)"
        );
    }

    #[test]
    fn the_loopback_interface_is_found_and_a_missing_one_is_none() {
        let lo = interface_xdp("lo").unwrap().unwrap();
        assert_eq!(lo.ifindex, 1);
        assert_eq!(interface_xdp("sy-no-such-if").unwrap(), None);
    }
}
