//! Attaching the program to interfaces through pinned `bpf_link`s.
//!
//! A link pinned at `<pin dir>/link_<iface>` keeps the program attached after the agent exits:
//! the data plane keeps forwarding with the last maps, and a restarted agent adopts the link
//! instead of attaching again (the program never leaves the interface). Only `detach` removes
//! it — the agent never detaches by accident.
//!
//! A link is adopted only while it is live on the interface of that name in this network
//! namespace ([`super::link`]): one whose interface was deleted (and perhaps created again), or
//! one pinned for an interface of another namespace, is unpinned and replaced by a new
//! attachment (decision 0010).
//!
//! The mode of an adopted link is read from the kernel ([`LinkState::Live`]), never taken from
//! what was asked: an attachment in another mode than `--mode` asked for is kept as it is and
//! reported ([`ModeMismatch`], decision 0019), because changing the mode means detaching.

use std::{
    ffi::CString,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    programs::{
        XdpMode,
        links::{FdLink, PinnedLink},
    },
};
use router_common::{ABI_VERSION, maps};

pub use super::link::{AttachedMode, LinkState};

use super::{
    DataplaneError,
    link::{self, Defunct},
    load,
    maps::KernelMaps,
};

/// How the program is asked to run on an interface (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Native (driver) XDP: the default, and the fast one.
    Native,
    /// Generic (skb) XDP: works on any interface, at the cost of an skb per packet.
    Generic,
}

impl Mode {
    /// `native` or `generic`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Mode::Native => "native",
            Mode::Generic => "generic",
        }
    }

    pub(crate) fn xdp(self) -> XdpMode {
        match self {
            Mode::Native => XdpMode::Driver,
            Mode::Generic => XdpMode::Skb,
        }
    }

    /// The mode the kernel reports for a program attached in this one: the flags
    /// switchyard attaches with (`XDP_FLAGS_DRV_MODE`, `XDP_FLAGS_SKB_MODE`) make the kernel
    /// attach in exactly that mode or refuse.
    #[must_use]
    pub const fn attached(self) -> AttachedMode {
        match self {
            Mode::Native => AttachedMode::Native,
            Mode::Generic => AttachedMode::Generic,
        }
    }
}

/// An adopted attachment whose mode is not the one `--mode` asked for. It is kept as it runs
/// and said in the log and in `status`: changing the mode means detaching the program (the
/// kernel runs no native and generic program side by side, and a link cannot change its mode),
/// which the agent never does by accident (decision 0019).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModeMismatch {
    /// The mode asked for.
    pub asked: Mode,
    /// The mode the program runs in, read from the kernel.
    pub running: AttachedMode,
}

impl ModeMismatch {
    /// The mismatch between `asked` (`None`: no mode was asked for, so none is wrong) and
    /// `running`, or `None` when they agree.
    #[must_use]
    pub fn of(asked: Option<Mode>, running: AttachedMode) -> Option<Self> {
        let asked = asked?;
        (asked.attached() != running).then_some(Self { asked, running })
    }

    /// What the log and `status` say about it on `iface`: what runs, what was asked, and how
    /// to move to the mode asked for.
    #[must_use]
    pub fn describe(&self, iface: &str) -> String {
        let (asked, running) = (self.asked.name(), self.running);
        format!(
            "--mode {asked} was asked for, but the program already attached to {iface} runs in \
             {running} mode; it was adopted as it runs (switchyard detaches nothing by \
             accident). To run it in {asked} mode: stop the agent, `switchyard detach --iface \
             {iface} --keep-maps`, then start the agent with --mode {asked} (new connections \
             meet no program in between)"
        )
    }
}

/// What `attach` did on one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attached {
    /// Attached now.
    New,
    /// A link pinned by an earlier agent was found live on the interface and kept; its
    /// program runs in the mode given, read from the kernel.
    Adopted(AttachedMode),
    /// A pinned link was found defunct (for the reason given) and unpinned; attached now.
    Replaced(Defunct),
}

impl Attached {
    /// Whether this run attached the program (so undoing the run detaches it).
    #[must_use]
    pub fn attached_now(&self) -> bool {
        !matches!(self, Attached::Adopted(_))
    }
}

/// The interface index of `iface`.
///
/// # Errors
///
/// [`DataplaneError::NoSuchInterface`] when no interface has that name here (or the name
/// holds a NUL byte).
pub fn ifindex(iface: &str) -> Result<u32, DataplaneError> {
    let c = CString::new(iface).map_err(|_| DataplaneError::NoSuchInterface(iface.into()))?;
    // SAFETY: `c` is a valid C string.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        Err(DataplaneError::NoSuchInterface(iface.into()))
    } else {
        Ok(index)
    }
}

/// Where the link for `iface` is pinned.
#[must_use]
pub fn link_path(pin_dir: &Path, iface: &str) -> PathBuf {
    pin_dir.join(format!("link_{iface}"))
}

/// Interfaces with a pinned link under `pin_dir`.
pub fn attached_interfaces(pin_dir: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(pin_dir) else {
        return Vec::new();
    };
    let mut out: Vec<String> = dir
        .filter_map(Result::ok)
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("link_")
                .map(str::to_owned)
        })
        .collect();
    out.sort();
    out
}

/// The state of the link pinned for `iface` under `pin_dir`, judged in this process's network
/// namespace ([`link::state`]).
///
/// # Errors
///
/// [`DataplaneError::Io`] for a pin that is not an XDP link, or rtnetlink failing.
pub fn link_state(pin_dir: &Path, iface: &str) -> Result<LinkState, DataplaneError> {
    let path = link_path(pin_dir, iface);
    link::state(&path, iface).map_err(|source| DataplaneError::Io {
        what: "reading the pinned link",
        path,
        source,
    })
}

/// Attaches the loaded program to `iface` in `mode` (or adopts the link an earlier agent pinned
/// there, when it is live on this interface in this namespace, in whatever mode it runs:
/// [`Attached::Adopted`] says which), and adds the interface to `TX_PORTS` so other interfaces
/// can redirect to it. A defunct pinned link (its interface gone, or another namespace's) is
/// replaced: the new link is attached first, then the old pin removed and the new one pinned
/// in its place.
///
/// # Errors
///
/// These leave the interface as it was: a missing interface
/// ([`DataplaneError::NoSuchInterface`]), another XDP program already attached
/// ([`DataplaneError::Busy`], or [`DataplaneError::OtherLayoutAttached`] when it is a
/// switchyard program of another map layout), a mode the driver does not support or another
/// refusal to attach ([`DataplaneError::Attach`], [`DataplaneError::NotPrivileged`]), a pin at
/// the link's path that is not an XDP link, a kernel that gives no `bpf_link`, or a link that
/// cannot be pinned ([`DataplaneError::Io`]). Also [`DataplaneError::MissingMap`] or
/// [`DataplaneError::Program`] when `ebpf` has no XDP program or its link cannot be taken, and
/// [`DataplaneError::Io`] when `TX_PORTS` refuses the interface.
pub fn attach(
    ebpf: &mut Ebpf,
    maps: &mut KernelMaps,
    iface: &str,
    mode: Mode,
    pin_dir: &Path,
) -> Result<Attached, DataplaneError> {
    let index = ifindex(iface)?;
    let path = link_path(pin_dir, iface);
    let replaced = match link_state(pin_dir, iface)? {
        LinkState::Live(_, running) => {
            add_tx_port(maps, index)?;
            return Ok(Attached::Adopted(running));
        }
        LinkState::None => None,
        LinkState::Defunct(_, why) => Some(why),
    };
    // A program of another layout holds the interface: attaching would fail with EBUSY, and
    // its maps cannot be adopted. Say which, and how to move on.
    if let Some((theirs, link)) = other_layout_links(pin_dir, iface).into_iter().next() {
        return Err(DataplaneError::OtherLayoutAttached {
            iface: iface.into(),
            link,
            theirs,
            ours: ABI_VERSION,
        });
    }
    let prog = load::program_mut(ebpf)?;
    let id = prog
        .attach_to_if_index(index, mode.xdp())
        .map_err(|e| attach_error(iface, mode, e))?;
    let link = prog
        .take_link(id)
        .map_err(|e| DataplaneError::Program(Box::new(e)))?;
    // The netlink fallback (kernels before 5.9) gives a link that cannot be pinned.
    let fd_link = FdLink::try_from(link).map_err(|e| DataplaneError::Io {
        what: "this kernel gave no bpf_link (needs 5.9+) for",
        path: path.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    if replaced.is_some() {
        // Dropping `fd_link` on an error here detaches the new program again.
        std::fs::remove_file(&path).map_err(|source| DataplaneError::Io {
            what: "removing the defunct link",
            path: path.clone(),
            source,
        })?;
    }
    fd_link.pin(&path).map_err(|e| DataplaneError::Io {
        what: "pinning the XDP link at",
        path: path.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    add_tx_port(maps, index)?;
    Ok(replaced.map_or(Attached::New, Attached::Replaced))
}

/// Adds ifindex `index` to `TX_PORTS`, the interfaces the program may redirect to.
fn add_tx_port(maps: &mut KernelMaps, index: u32) -> Result<(), DataplaneError> {
    maps.tx_ports
        .insert(index, index, None, 0)
        .map_err(|e| DataplaneError::Io {
            what: "adding the interface to map",
            path: maps::TX_PORTS.into(),
            source: std::io::Error::other(e.to_string()),
        })
}

pub(crate) fn attach_error(
    iface: &str,
    mode: Mode,
    e: aya::programs::ProgramError,
) -> DataplaneError {
    if let aya::programs::ProgramError::SyscallError(s) = &e {
        match s.io_error.raw_os_error() {
            Some(libc::EBUSY | libc::EEXIST) => {
                return DataplaneError::Busy {
                    iface: iface.into(),
                };
            }
            Some(libc::EPERM | libc::EACCES) => {
                return DataplaneError::NotPrivileged("attaching an XDP program");
            }
            _ => {}
        }
    }
    DataplaneError::Attach {
        iface: iface.into(),
        mode: mode.name(),
        source: Box::new(e),
    }
}

/// What `detach` removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detached {
    /// The directory the link was pinned in.
    pub dir: PathBuf,
    /// Why the link was defunct, when it was (nothing ran on the interface here): removing it
    /// detached nothing in this namespace. `None` when it was live, or when its state could
    /// not be read (it is removed all the same).
    pub defunct: Option<Defunct>,
}

/// Detaches the program from `iface` by removing its pinned link. When no interface is left
/// and `keep_maps` is false, the map pins go too (the maps then disappear with the program).
/// A defunct link (its interface gone, or another namespace's) is removed the same way, and
/// the result says so.
///
/// The link is looked for in `pin_dir` (this binary's layout version), then in the other
/// version directories beside it (`<pin_path>/v<N>/`): detaching needs no knowledge of the map
/// layout, and it is the way out of a layout mismatch (decision 0007).
///
/// # Errors
///
/// [`DataplaneError::Io`] when no link for `iface` is pinned in either place (nothing is
/// changed then), or when it cannot be unpinned. Removing the map pins is best effort.
pub fn detach(pin_dir: &Path, iface: &str, keep_maps: bool) -> Result<Detached, DataplaneError> {
    let path = link_path(pin_dir, iface);
    let (dir, path) = if path.exists() {
        (pin_dir.to_owned(), path)
    } else if let Some((_, other)) = other_layout_links(pin_dir, iface).into_iter().next() {
        let dir = other
            .parent()
            .map_or_else(|| pin_dir.to_owned(), Path::to_owned);
        (dir, other)
    } else {
        (pin_dir.to_owned(), path)
    };
    let link = PinnedLink::from_pin(&path).map_err(|_| DataplaneError::Io {
        what: "switchyard is not attached here (no pinned link under the pin path of --config-dir's agent.pin_path):",
        path: path.clone(),
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    let defunct = match link::state(&path, iface) {
        Ok(LinkState::Defunct(_, why)) => Some(why),
        _ => None,
    };
    let fd_link = link.unpin().map_err(|source| DataplaneError::Io {
        what: "unpinning",
        path: path.clone(),
        source,
    })?;
    // Closing the last reference to the link detaches the program.
    drop(fd_link);
    if !keep_maps && attached_interfaces(&dir).is_empty() {
        if dir != pin_dir {
            // Another layout may name its maps differently: everything pinned in its
            // directory is its own.
            remove_other_layout_pins(&dir);
        }
        remove_map_pins(&dir);
    }
    Ok(Detached { dir, defunct })
}

/// Links for `iface` pinned by switchyard builds of another map layout version: the
/// `link_<iface>` of every `<pin_path>/v<N>/` beside `pin_dir` with N ≠ `ABI_VERSION`, as
/// (N, link path), lowest N first.
pub fn other_layout_links(pin_dir: &Path, iface: &str) -> Vec<(u32, PathBuf)> {
    let Some(pin_path) = pin_dir.parent() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(pin_path) else {
        return Vec::new();
    };
    let mut out: Vec<(u32, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.strip_prefix('v')?.parse().ok()?;
            let link = link_path(&e.path(), iface);
            (version != ABI_VERSION && link.exists()).then_some((version, link))
        })
        .collect();
    out.sort();
    out
}

/// The kernel ids of the link pinned for `iface` under `pin_dir` and of the program it runs,
/// as (link id, program id); `None` when no link is pinned there.
#[must_use]
pub fn pinned_link_ids(pin_dir: &Path, iface: &str) -> Option<(u32, u32)> {
    let link = FdLink::from(PinnedLink::from_pin(link_path(pin_dir, iface)).ok()?);
    let info = link.info().ok()?;
    Some((info.id(), info.program_id()))
}

/// An exclusive lock on a pin directory, held while an agent runs: one writer per set of maps.
#[derive(Debug)]
pub struct PinLock {
    _dir: std::fs::File,
}

/// Creates `pin_dir` if needed (on bpffs) and locks it (`flock`), or fails with
/// [`DataplaneError::AnotherAgent`] when another agent holds it: two agents would adopt the
/// same program and maps and overwrite each other's slots.
///
/// # Errors
///
/// [`DataplaneError::AnotherAgent`] as said; the errors of [`load::prepare_pin_dir`];
/// [`DataplaneError::Io`] when the directory cannot be opened or flock(2) fails otherwise.
pub fn lock_pin_dir(pin_dir: &Path) -> Result<PinLock, DataplaneError> {
    use std::os::fd::AsRawFd as _;
    load::prepare_pin_dir(pin_dir)?;
    let dir = std::fs::File::open(pin_dir).map_err(|source| DataplaneError::Io {
        what: "opening",
        path: pin_dir.to_owned(),
        source,
    })?;
    // SAFETY: flock(2) on a file descriptor this function owns.
    if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let source = std::io::Error::last_os_error();
        if source.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(DataplaneError::AnotherAgent(pin_dir.to_owned()));
        }
        return Err(DataplaneError::Io {
            what: "locking",
            path: pin_dir.to_owned(),
            source,
        });
    }
    Ok(PinLock { _dir: dir })
}

/// Whether any of the program's maps is pinned under `pin_dir` (an earlier agent's, to adopt).
#[must_use]
pub fn maps_pinned(pin_dir: &Path) -> bool {
    maps::ALL.iter().any(|name| pin_dir.join(name).exists())
}

/// The maps of the ABI not pinned under `pin_dir`.
#[must_use]
pub fn missing_map_pins(pin_dir: &Path) -> Vec<&'static str> {
    maps::ALL
        .iter()
        .copied()
        .filter(|name| !pin_dir.join(name).exists())
        .collect()
}

/// Refuses to adopt the maps under `pin_dir` when a program is attached through its pinned
/// links and some map is not pinned: loading would create a fresh map in its place, which the
/// running program never reads. Without a link nothing runs on the old maps, and a missing one
/// is simply created.
///
/// # Errors
///
/// [`DataplaneError::AttachedPinsIncomplete`] when some link is pinned under `pin_dir` and some
/// map is not.
pub fn check_adoptable(pin_dir: &Path) -> Result<(), DataplaneError> {
    let attached = attached_interfaces(pin_dir);
    let missing = missing_map_pins(pin_dir);
    if attached.is_empty() || missing.is_empty() {
        return Ok(());
    }
    Err(DataplaneError::AttachedPinsIncomplete {
        pin_dir: pin_dir.to_owned(),
        missing: missing.join(", "),
        attached: attached.join(", "),
    })
}

/// Removes the map pins under `pin_dir`, then the directory if that left it empty. The maps
/// themselves go when their last user (a program, an agent) does. Best effort.
pub fn remove_map_pins(pin_dir: &Path) {
    for name in maps::ALL {
        let _ = std::fs::remove_file(pin_dir.join(name));
    }
    let _ = std::fs::remove_dir(pin_dir);
    // And `agent.pin_path` itself, if nothing else lives there.
    if let Some(parent) = pin_dir.parent() {
        let _ = std::fs::remove_dir(parent);
    }
}

/// Removes every pin in `dir`, a directory of another layout version with no link left. Best
/// effort, like [`remove_map_pins`].
fn remove_other_layout_pins(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.filter_map(Result::ok) {
            if e.file_type().is_ok_and(|t| t.is_file()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mode_is_wrong_only_when_one_was_asked_for_and_another_runs() {
        for running in [
            AttachedMode::Native,
            AttachedMode::Generic,
            AttachedMode::Offloaded,
        ] {
            assert_eq!(ModeMismatch::of(None, running), None, "{running}");
        }
        assert_eq!(
            ModeMismatch::of(Some(Mode::Native), AttachedMode::Native),
            None
        );
        assert_eq!(
            ModeMismatch::of(Some(Mode::Generic), AttachedMode::Generic),
            None
        );
        let mismatch = ModeMismatch::of(Some(Mode::Native), AttachedMode::Generic).unwrap();
        assert_eq!(
            mismatch,
            ModeMismatch {
                asked: Mode::Native,
                running: AttachedMode::Generic
            }
        );
        let said = mismatch.describe("eth0");
        assert!(
            said.starts_with(
                "--mode native was asked for, but the program already attached to eth0 runs in \
                 generic mode"
            ),
            "{said}"
        );
        assert!(
            said.contains("switchyard detach --iface eth0 --keep-maps"),
            "{said}"
        );
        assert!(
            ModeMismatch::of(Some(Mode::Generic), AttachedMode::Offloaded).is_some(),
            "offloaded is neither mode switchyard attaches"
        );
    }

    #[test]
    fn each_asked_mode_is_the_mode_the_kernel_reports_for_it() {
        assert_eq!(Mode::Native.attached(), AttachedMode::Native);
        assert_eq!(Mode::Generic.attached(), AttachedMode::Generic);
        assert_eq!(Mode::Native.attached().name(), Mode::Native.name());
        assert_eq!(Mode::Generic.attached().name(), Mode::Generic.name());
        assert!(Attached::New.attached_now());
        assert!(!Attached::Adopted(AttachedMode::Generic).attached_now());
    }

    #[test]
    fn links_of_other_layout_versions_are_found_beside_this_one() {
        let root = std::env::temp_dir().join(format!("switchyard-layouts-{}", std::process::id()));
        let ours = root.join(format!("v{ABI_VERSION}"));
        let next = root.join(format!("v{}", ABI_VERSION + 1));
        let later = root.join(format!("v{}", ABI_VERSION + 2));
        for d in [&ours, &next, &later, &root.join("vx"), &root.join("other")] {
            std::fs::create_dir_all(d).unwrap();
        }
        for link in [
            ours.join("link_eth0"),
            next.join("link_eth0"),
            root.join("vx/link_eth0"),
            root.join("other/link_eth0"),
            later.join("link_eth1"),
        ] {
            std::fs::write(link, "").unwrap();
        }
        let found = other_layout_links(&ours, "eth0");
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(found, vec![(ABI_VERSION + 1, next.join("link_eth0"))]);
    }
}
