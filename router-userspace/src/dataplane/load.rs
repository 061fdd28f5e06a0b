//! Loading the XDP object: maps created (or, with a pin directory, reused from their pins) and
//! the program verified by the kernel.
//!
//! Maps are pinned under `<agent.pin_path>/v<ABI_VERSION>/NAME`: an agent of another layout
//! version never opens them (aya reuses a pinned map without checking its shape, so the version
//! in the path is the check).

use std::{
    ffi::CString,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

use aya::{Ebpf, EbpfLoader, programs::Xdp};
use router_common::{ABI_VERSION, maps};

use super::{DataplaneError, object};

/// `BPF_FS_MAGIC` from `linux/magic.h`.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The versioned directory the maps and links are pinned in.
pub fn pin_dir(pin_path: &Path) -> PathBuf {
    pin_path.join(format!("v{ABI_VERSION}"))
}

/// Checks that `path` (or its nearest existing ancestor) is on a BPF filesystem, then creates it.
pub fn prepare_pin_dir(path: &Path) -> Result<(), DataplaneError> {
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
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(DataplaneError::Io {
            what: "checking the file system of",
            path: probe.to_owned(),
            source: std::io::Error::last_os_error(),
        });
    }
    if st.f_type as i64 != BPF_FS_MAGIC {
        return Err(DataplaneError::NotBpffs(path.to_owned()));
    }
    std::fs::create_dir_all(path).map_err(|source| DataplaneError::Io {
        what: "creating",
        path: path.to_owned(),
        source,
    })
}

/// Loads the object and verifies the program. With `pins`, every map of
/// `router_common::maps::ALL` is reused from `pins/NAME` if pinned there, else created and
/// pinned; without, the maps are private to the returned [`Ebpf`] (tests).
pub fn load(pins: Option<&Path>) -> Result<Ebpf, DataplaneError> {
    let data = object::bytes()?;
    let mut loader = EbpfLoader::new();
    let paths: Vec<(&'static str, PathBuf)> = match pins {
        Some(dir) => {
            prepare_pin_dir(dir)?;
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
    let mut ebpf = loader.load(data).map_err(|e| match e {
        aya::EbpfError::MapError(aya::maps::MapError::CreateError { ref io_error, .. })
            if io_error.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            DataplaneError::NotPrivileged("loading the XDP program")
        }
        e => DataplaneError::Load(Box::new(e)),
    })?;
    let mut attempt = 1;
    loop {
        match program_mut(&mut ebpf)?.load() {
            Ok(()) => return Ok(ebpf),
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
pub fn program_mut(ebpf: &mut Ebpf) -> Result<&mut Xdp, DataplaneError> {
    let prog = ebpf
        .program_mut(object::PROGRAM)
        .ok_or(DataplaneError::MissingMap("program"))?;
    prog.try_into()
        .map_err(|e| DataplaneError::Program(Box::new(e)))
}

/// The XDP program of a loaded object, shared.
pub fn program(ebpf: &Ebpf) -> Result<&Xdp, DataplaneError> {
    let prog = ebpf
        .program(object::PROGRAM)
        .ok_or(DataplaneError::MissingMap("program"))?;
    prog.try_into()
        .map_err(|e| DataplaneError::Program(Box::new(e)))
}
