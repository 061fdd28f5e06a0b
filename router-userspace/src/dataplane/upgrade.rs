//! `switchyard upgrade`: replacing the XDP program behind pinned links with the one embedded in
//! this binary, in place (decision 0007).
//!
//! Each interface's program is attached through a `bpf_link` pinned at
//! `<pin dir>/link_<iface>` (decision 0004). `BPF_LINK_UPDATE` swaps the program a link runs in
//! one step: the kernel publishes the new program with a single pointer store, so every packet
//! runs either the old program or the new one, never none. The link keeps its id and its pin;
//! the program id changes. The new program is loaded with the pinned maps, so it starts with
//! the running config, connection tracking and counters.
//!
//! Nothing is changed until every check passed: the pin path is on bpffs, every interface has
//! a pinned link of this binary's layout version that is live on the interface of that name in
//! this network namespace ([`super::link`]), every map is pinned (upgrade reuses maps, it
//! never creates one), and the pinned maps have the layout this program declares
//! ([`super::layout::check_pins`]).
//!
//! Upgrade does not take the agent's pin-directory lock: that lock makes one writer of map
//! *contents*, and upgrade writes none — it reads the pins and updates links. Taking it would
//! make upgrade impossible while an agent runs, which is when it is wanted. Upgrades are
//! serialized among themselves by a lock on `agent.pin_path` itself (not the directory the
//! agent locks).

use std::{
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
};

use aya::programs::{
    links::{FdLink, PinnedLink},
    xdp::XdpLink,
};
use router_common::ABI_VERSION;

use super::{DataplaneError, attach, layout, load};

/// What `upgrade` did on one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upgraded {
    /// Interface.
    pub iface: String,
    /// Kernel id of the pinned link (unchanged by the upgrade).
    pub link_id: u32,
    /// Kernel id of the program the link ran before.
    pub old_program: u32,
    /// Kernel id of the program it runs now.
    pub new_program: u32,
}

/// Every check `upgrade` makes before it changes anything, for `interfaces` under
/// `agent.pin_path` = `pin_path`. Returns the pin directory.
///
/// # Errors
///
/// The first check that fails, in this order: `pin_path` not on bpffs
/// ([`load::check_bpffs`]); for each interface in turn, no pinned link
/// ([`DataplaneError::OtherLayoutAttached`] when another layout version has one,
/// [`DataplaneError::NotAttached`] otherwise), a link whose state cannot be read
/// ([`DataplaneError::Io`]) or a defunct one ([`DataplaneError::DefunctLink`]); a map not
/// pinned ([`DataplaneError::PinsIncomplete`]); pinned maps that cannot be adopted
/// ([`layout::check_pins`]).
pub fn preflight(pin_path: &Path, interfaces: &[String]) -> Result<PathBuf, DataplaneError> {
    load::check_bpffs(pin_path)?;
    let pin_dir = load::pin_dir(pin_path);
    for iface in interfaces {
        let link = attach::link_path(&pin_dir, iface);
        if PinnedLink::from_pin(&link).is_err() {
            if let Some((theirs, other)) = attach::other_layout_links(&pin_dir, iface)
                .into_iter()
                .next()
            {
                return Err(DataplaneError::OtherLayoutAttached {
                    iface: iface.clone(),
                    link: other,
                    theirs,
                    ours: ABI_VERSION,
                });
            }
            return Err(DataplaneError::NotAttached {
                iface: iface.clone(),
                link,
            });
        }
        if let attach::LinkState::Defunct(_, why) = attach::link_state(&pin_dir, iface)? {
            return Err(DataplaneError::DefunctLink {
                iface: iface.clone(),
                link,
                why,
            });
        }
    }
    let missing = attach::missing_map_pins(&pin_dir);
    if !missing.is_empty() {
        return Err(DataplaneError::PinsIncomplete {
            pin_dir,
            missing: missing.join(", "),
        });
    }
    layout::check_pins(&pin_dir)?;
    Ok(pin_dir)
}

/// Replaces the program behind the pinned link of each of `interfaces` with this binary's,
/// reusing the maps pinned under `pin_path` (`agent.pin_path`). Safe while an agent runs.
///
/// # Errors
///
/// Before any change: those of [`preflight`], another upgrade running or the lock failing
/// ([`DataplaneError::Io`]), a program the kernel refuses (those of [`load::load`]). A pinned
/// link that cannot be opened or read, or is not XDP ([`DataplaneError::Io`]), or a link update
/// that fails ([`DataplaneError::Upgrade`]), stops part-way: the interfaces already done stay
/// on the new program and the others on the old one — both programs are of the same layout
/// and share the maps, so both keep forwarding.
pub fn upgrade(pin_path: &Path, interfaces: &[String]) -> Result<Vec<Upgraded>, DataplaneError> {
    let pin_dir = preflight(pin_path, interfaces)?;
    let _lock = lock(pin_path)?;
    let mut ebpf = load::load(Some(&pin_dir))?;
    let prog = load::program_mut(&mut ebpf)?;
    let new_program = prog
        .info()
        .map_err(|e| DataplaneError::Program(Box::new(e)))?
        .id();
    let mut done: Vec<Upgraded> = Vec::new();
    for iface in interfaces {
        let path = attach::link_path(&pin_dir, iface);
        let io = |what: &'static str, e: String| DataplaneError::Io {
            what,
            path: path.clone(),
            source: std::io::Error::other(e),
        };
        let fd_link = FdLink::from(
            PinnedLink::from_pin(&path)
                .map_err(|e| io("opening the pinned link", e.to_string()))?,
        );
        let info = fd_link
            .info()
            .map_err(|e| io("reading the pinned link", e.to_string()))?;
        let (link_id, old_program) = (info.id(), info.program_id());
        let xdp_link = XdpLink::try_from(fd_link)
            .map_err(|e| io("not an XDP link (bpftool link show):", e.to_string()))?;
        let id = prog
            .attach_to_link(xdp_link)
            .map_err(|source| DataplaneError::Upgrade {
                link: path.clone(),
                done: done
                    .iter()
                    .map(|u| u.iface.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                source: Box::new(source),
            })?;
        // The program now owns this fd of the link; the pin keeps the link (and so the
        // attachment) alive once it is closed, here or when `ebpf` is dropped.
        drop(prog.take_link(id));
        done.push(Upgraded {
            iface: iface.clone(),
            link_id,
            old_program,
            new_program,
        });
    }
    Ok(done)
}

/// An exclusive `flock` on `pin_path` (the parent of the directory agents lock), held for one
/// upgrade.
fn lock(pin_path: &Path) -> Result<std::fs::File, DataplaneError> {
    let dir = std::fs::File::open(pin_path).map_err(|source| DataplaneError::Io {
        what: "opening",
        path: pin_path.to_owned(),
        source,
    })?;
    // SAFETY: flock(2) on a file descriptor this function owns.
    if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let source = std::io::Error::last_os_error();
        let what = if source.raw_os_error() == Some(libc::EWOULDBLOCK) {
            "another `switchyard upgrade` runs on"
        } else {
            "locking"
        };
        return Err(DataplaneError::Io {
            what,
            path: pin_path.to_owned(),
            source,
        });
    }
    Ok(dir)
}
