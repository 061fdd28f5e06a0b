//! Loading the XDP object: maps created (or, with a pin directory, reused from their pins) and
//! the program verified by the kernel.
//!
//! Maps are pinned under `<agent.pin_path>/v<ABI_VERSION>/NAME`: an agent of another layout
//! version never opens them. aya reuses a pinned map without checking its shape, so before
//! reusing, [`load`] also compares every pinned map with the program's declaration and the
//! layout version the pinned `CONFIG` carries ([`layout::check_pins`], decision 0007).

use std::{
    ffi::CString,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

use aya::{Ebpf, EbpfLoader, programs::Xdp};
use router_common::{ABI_VERSION, FLOW_CACHE_ENTRIES, maps};

use super::{DataplaneError, layout, object};

/// `BPF_FS_MAGIC` from `linux/magic.h`.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Names of file systems a pin path is likely to land on by mistake (`linux/magic.h`), for
/// the error message.
const FS_NAMES: [(i64, &str); 8] = [
    (0x0102_1994, "tmpfs"),
    (0x6265_6572, "sysfs"),
    (0xef53, "ext2/3/4"),
    (0x5846_5342, "xfs"),
    (0x9123_683e, "btrfs"),
    (0x794c_7630, "overlayfs"),
    (0x9fa0, "proc"),
    (0x6969, "nfs"),
];

/// The versioned directory the maps and links are pinned in.
#[must_use]
pub fn pin_dir(pin_path: &Path) -> PathBuf {
    pin_path.join(format!("v{ABI_VERSION}"))
}

/// Checks that `path`, or its nearest existing ancestor when it does not exist yet, is on a
/// BPF filesystem; creates nothing.
///
/// # Errors
///
/// [`DataplaneError::NotBpffs`], naming the file system found, when it is not bpffs;
/// [`DataplaneError::Io`] for a path with a NUL byte, or when statfs(2) fails.
pub fn check_bpffs(path: &Path) -> Result<(), DataplaneError> {
    let mut probe = path;
    while !probe.exists() {
        match probe.parent() {
            Some(p) => probe = p,
            None => break,
        }
    }
    let c = CString::new(probe.as_os_str().as_bytes()).map_err(|_| DataplaneError::Io {
        what: "pin path contains a NUL byte:",
        path: path.to_owned(),
        source: std::io::ErrorKind::InvalidInput.into(),
    })?;
    // SAFETY: `c` is a valid C string and `st` a properly sized out-parameter.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &raw mut st) } != 0 {
        return Err(DataplaneError::Io {
            what: "checking the file system of",
            path: probe.to_owned(),
            source: std::io::Error::last_os_error(),
        });
    }
    // `f_type` is signed on some targets; the magic numbers are 32-bit.
    let magic = st.f_type as i64 & 0xffff_ffff;
    if magic != BPF_FS_MAGIC {
        let fs = FS_NAMES.iter().find(|(m, _)| *m == magic).map_or_else(
            || format!("file system {magic:#x}"),
            |(_, n)| (*n).to_owned(),
        );
        return Err(DataplaneError::NotBpffs {
            path: path.to_owned(),
            probe: probe.to_owned(),
            fs,
        });
    }
    Ok(())
}

/// Checks that `path` (or its nearest existing ancestor) is on a BPF filesystem, then creates it.
///
/// # Errors
///
/// Those of [`check_bpffs`] (nothing created then), and [`DataplaneError::Io`] when the
/// directory cannot be created.
pub fn prepare_pin_dir(path: &Path) -> Result<(), DataplaneError> {
    check_bpffs(path)?;
    std::fs::create_dir_all(path).map_err(|source| DataplaneError::Io {
        what: "creating",
        path: path.to_owned(),
        source,
    })
}

/// Loads the object and verifies the program. With `pins`, every map of
/// `router_common::maps::ALL` is reused from `pins/NAME` if pinned there, else created and
/// pinned; without, the maps are private to the returned [`Ebpf`] (tests).
///
/// Before anything is reused, the pins are checked ([`layout::check_pins`]): a pinned map of
/// another shape, or a `CONFIG` written by an agent of another layout version, is an error and
/// nothing is loaded, created or pinned.
///
/// # Errors
///
/// [`DataplaneError::StubObject`] for a stub build; with `pins`, the errors of
/// [`prepare_pin_dir`] and [`layout::check_pins`]; [`DataplaneError::NotPrivileged`] when a
/// map cannot be created for lack of privileges; [`DataplaneError::Load`] when the object
/// cannot be loaded or a map created or pinned; [`DataplaneError::Program`] when the verifier
/// or the kernel refuses the program (after up to five attempts while it answers EAGAIN).
pub fn load(pins: Option<&Path>) -> Result<Ebpf, DataplaneError> {
    let data = object::bytes()?;
    let mut loader = EbpfLoader::new();
    let paths: Vec<(&'static str, PathBuf)> = match pins {
        Some(dir) => {
            prepare_pin_dir(dir)?;
            layout::check_pins(dir)?;
            maps::ALL
                .iter()
                .map(|name| (*name, dir.join(name)))
                .collect()
        }
        None => Vec::new(),
    };
    for (name, path) in &paths {
        loader.map_pin_path(name, path.as_path());
    }
    loader.map_max_entries(maps::FLOW_CACHE, flow_cache_entries());
    let mut ebpf = loader.load(data).map_err(|e| match e {
        aya::EbpfError::MapError(aya::maps::MapError::CreateError { ref io_error, .. })
            if io_error.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            DataplaneError::NotPrivileged("loading the XDP program")
        }
        e => DataplaneError::Load(Box::new(e)),
    })?;
    load_program(&mut ebpf, object::PROGRAM)?;
    load_program(&mut ebpf, object::IPIP_PROGRAM)?;
    set_ipip_tx(&mut ebpf)?;
    Ok(ebpf)
}

/// Entries of the flow cache: [`FLOW_CACHE_ENTRIES`] for every CPU up to the highest online
/// one, as the program indexes it by CPU id. Possible CPUs can far outnumber online ones (a
/// VM's hotplug slots); a CPU past the map's end (brought online later) has no cache and uses
/// connection tracking alone, as does every CPU but 0 when the online CPUs cannot be read.
fn flow_cache_entries() -> u32 {
    let cpus = aya::util::online_cpus()
        .ok()
        .and_then(|ids| ids.into_iter().max())
        .map_or(1, |max| max.saturating_add(1));
    cpus.saturating_mul(FLOW_CACHE_ENTRIES)
}

/// Puts the loaded `switchyard_ipip` program into `IPIP_TX`, where the data plane tail-calls
/// it for ipip services. A pinned `IPIP_TX` gets this load's program (the one the link runs
/// after an upgrade is of the same build).
fn set_ipip_tx(ebpf: &mut Ebpf) -> Result<(), DataplaneError> {
    let fd = {
        let prog: &Xdp = ebpf
            .program(object::IPIP_PROGRAM)
            .ok_or(DataplaneError::MissingMap("ipip program"))?
            .try_into()
            .map_err(|e| DataplaneError::Program(Box::new(e)))?;
        prog.fd()
            .map_err(|e| DataplaneError::Program(Box::new(e)))?
            .try_clone()
            .map_err(|e| {
                DataplaneError::Program(Box::new(aya::programs::ProgramError::IOError(e)))
            })?
    };
    let map = ebpf
        .map_mut(maps::IPIP_TX)
        .ok_or(DataplaneError::MissingMap(maps::IPIP_TX))?;
    let mut array = aya::maps::ProgramArray::try_from(map)
        .map_err(|e| DataplaneError::map(maps::IPIP_TX, e))?;
    array
        .set(0, &fd, 0)
        .map_err(|e| DataplaneError::map(maps::IPIP_TX, e))
}

/// Loads (verifies) the XDP program `name` of a loaded object.
fn load_program(ebpf: &mut Ebpf, name: &'static str) -> Result<(), DataplaneError> {
    let mut attempt = 1;
    loop {
        let prog: &mut Xdp = ebpf
            .program_mut(name)
            .ok_or(DataplaneError::MissingMap("program"))?
            .try_into()
            .map_err(|e| DataplaneError::Program(Box::new(e)))?;
        match prog.load() {
            Ok(()) => return Ok(()),
            // The verifier gives up with EAGAIN when a signal is pending for the loading
            // thread, and a failed load leaves the program unloaded: try again, as libbpf
            // does (up to 5 attempts). Seen in the multi-threaded program-fixture tests.
            Err(aya::programs::ProgramError::LoadError { ref io_error, .. })
                if io_error.raw_os_error() == Some(libc::EAGAIN) && attempt < LOAD_ATTEMPTS =>
            {
                attempt += 1;
            }
            Err(e) => return Err(DataplaneError::Program(Box::new(e))),
        }
    }
}

/// Attempts at `BPF_PROG_LOAD` while it fails with EAGAIN (libbpf's count).
const LOAD_ATTEMPTS: u32 = 5;

/// The XDP program of a loaded object.
///
/// # Errors
///
/// [`DataplaneError::MissingMap`] (named `program`) when the object has no program of that
/// name, [`DataplaneError::Program`] when it is not an XDP program.
pub fn program_mut(ebpf: &mut Ebpf) -> Result<&mut Xdp, DataplaneError> {
    let prog = ebpf
        .program_mut(object::PROGRAM)
        .ok_or(DataplaneError::MissingMap("program"))?;
    prog.try_into()
        .map_err(|e| DataplaneError::Program(Box::new(e)))
}

/// The XDP program of a loaded object, shared.
///
/// # Errors
///
/// As [`program_mut`].
pub fn program(ebpf: &Ebpf) -> Result<&Xdp, DataplaneError> {
    let prog = ebpf
        .program(object::PROGRAM)
        .ok_or(DataplaneError::MissingMap("program"))?;
    prog.try_into()
        .map_err(|e| DataplaneError::Program(Box::new(e)))
}
