//! `switchyard decap`: the backends' side of `forward: ipip` (decision 0013). Attaches the
//! decapsulator (`router-ebpf/src/bin/decap.rs`, embedded as [`object::decap`]) to a backend's
//! interface through a `bpf_link` pinned at `<pin path>/decap/link_<iface>`, so it stays
//! attached after the command exits, and removes it again. The program has no maps: nothing
//! else is pinned.
//!
//! A pinned link that is live on the interface here is kept (running the command again
//! changes nothing); one whose interface is gone is replaced. One that runs on another
//! interface, or in another network namespace (decision 0010), is live there: attaching and
//! detaching refuse it and change nothing, since replacing or unpinning it would remove that
//! namespace's decapsulator. Each network namespace that shares a bpffs takes its own
//! `--pin-path`.

use std::path::{Path, PathBuf};

use aya::{
    Ebpf,
    programs::{
        Xdp,
        links::{FdLink, PinnedLink},
    },
};

use super::{
    DataplaneError,
    attach::{self, Attached, LinkState, Mode},
    link, load, object,
};

/// The directory under a pin path where the decapsulator's links are pinned.
#[must_use]
pub fn pin_dir(pin_path: &Path) -> PathBuf {
    pin_path.join("decap")
}

/// Attaches the decapsulator to `iface` in `mode` and pins its link under
/// [`pin_dir`]`(pin_path)`; keeps a link already live there, in the mode it runs in
/// ([`Attached::Adopted`] says which).
///
/// # Errors
///
/// As [`attach::attach`]: a missing interface, another XDP program attached
/// ([`DataplaneError::Busy`]), a refused mode, a pin path off bpffs, a link that cannot be
/// pinned; [`DataplaneError::StubObject`] for a stub build, [`DataplaneError::Program`] when
/// the kernel refuses the program.
pub fn attach(iface: &str, mode: Mode, pin_path: &Path) -> Result<Attached, DataplaneError> {
    let index = attach::ifindex(iface)?;
    let dir = pin_dir(pin_path);
    load::prepare_pin_dir(&dir)?;
    let attached = attach_in(&dir, iface, index, mode);
    if attached.is_err() {
        // A refused attach leaves no empty directory behind (it fails while links remain).
        let _ = std::fs::remove_dir(&dir);
    }
    attached
}

/// [`attach`] with the pin directory made.
fn attach_in(dir: &Path, iface: &str, index: u32, mode: Mode) -> Result<Attached, DataplaneError> {
    let path = attach::link_path(dir, iface);
    let io = |what: &'static str, e: std::io::Error| DataplaneError::Io {
        what,
        path: path.clone(),
        source: e,
    };
    let replaced = match link::state(&path, iface).map_err(|e| io("reading the pinned link", e))? {
        LinkState::Live(_, running) => return Ok(Attached::Adopted(running)),
        LinkState::None => None,
        LinkState::Defunct(info, _) if info.ifindex != 0 => return Err(live_elsewhere(&path)),
        LinkState::Defunct(_, why) => Some(why),
    };
    let mut ebpf = Ebpf::load(object::decap()?).map_err(|e| DataplaneError::Load(Box::new(e)))?;
    let prog: &mut Xdp = ebpf
        .program_mut(object::DECAP_PROGRAM)
        .ok_or(DataplaneError::MissingMap("decap program"))?
        .try_into()
        .map_err(|e| DataplaneError::Program(Box::new(e)))?;
    prog.load()
        .map_err(|e| DataplaneError::Program(Box::new(e)))?;
    let id = prog
        .attach_to_if_index(index, mode.xdp())
        .map_err(|e| attach::attach_error(iface, mode, e))?;
    let link = prog
        .take_link(id)
        .map_err(|e| DataplaneError::Program(Box::new(e)))?;
    let fd_link = FdLink::try_from(link).map_err(|e| {
        io(
            "this kernel gave no bpf_link (needs 5.9+) for",
            std::io::Error::other(e.to_string()),
        )
    })?;
    if replaced.is_some() {
        std::fs::remove_file(&path).map_err(|e| io("removing the defunct link", e))?;
    }
    fd_link.pin(&path).map_err(|e| {
        io(
            "pinning the XDP link at",
            std::io::Error::other(e.to_string()),
        )
    })?;
    Ok(replaced.map_or(Attached::New, Attached::Replaced))
}

/// Detaches the decapsulator from `iface` by removing its pinned link.
///
/// # Errors
///
/// [`DataplaneError::Io`] when no link for `iface` is pinned under [`pin_dir`]`(pin_path)`,
/// the one pinned runs on another interface or namespace, or it cannot be unpinned.
pub fn detach(iface: &str, pin_path: &Path) -> Result<(), DataplaneError> {
    let path = attach::link_path(&pin_dir(pin_path), iface);
    if let Ok(LinkState::Defunct(info, _)) = link::state(&path, iface)
        && info.ifindex != 0
    {
        return Err(live_elsewhere(&path));
    }
    let link = PinnedLink::from_pin(&path).map_err(|_| DataplaneError::Io {
        what: "the decapsulator is not attached here (no pinned link under --pin-path):",
        path: path.clone(),
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    let fd_link = link.unpin().map_err(|source| DataplaneError::Io {
        what: "unpinning",
        path: path.clone(),
        source,
    })?;
    // Closing the last reference to the link detaches the program.
    drop(fd_link);
    // The directory goes with its last link (it fails, harmlessly, while others remain).
    let _ = std::fs::remove_dir(pin_dir(pin_path));
    Ok(())
}

/// The error for a pinned link that runs on another interface or in another network
/// namespace: it is that one's decapsulator, and stays.
fn live_elsewhere(path: &Path) -> DataplaneError {
    DataplaneError::Io {
        what: "the decapsulator link pinned here runs on another interface or in another \
               network namespace (give each namespace its own --pin-path); switchyard changed \
               nothing:",
        path: path.to_path_buf(),
        source: std::io::ErrorKind::AlreadyExists.into(),
    }
}
