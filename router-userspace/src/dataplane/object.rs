//! The XDP object, built by `build.rs` from `router-ebpf` and embedded in the binary.

use aya::include_bytes_aligned;

use super::DataplaneError;

/// Name of the XDP program inside the object.
pub const PROGRAM: &str = "switchyard";

static OBJECT: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/router"));

/// The ELF bytes of the XDP object. Errors with [`DataplaneError::StubObject`] when the binary
/// was built with `AYA_BUILD_SKIP=1` (a zero-byte stub).
pub fn bytes() -> Result<&'static [u8], DataplaneError> {
    if OBJECT.is_empty() {
        Err(DataplaneError::StubObject)
    } else {
        Ok(OBJECT)
    }
}
