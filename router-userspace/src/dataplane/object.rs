//! The XDP objects, built by `build.rs` from `router-ebpf` and embedded in the binary: the data
//! plane, a minimal baseline program for benchmarks, and the backends' decapsulator.

use aya::include_bytes_aligned;

use super::DataplaneError;

/// Name of the XDP program inside the object.
pub const PROGRAM: &str = "switchyard";

/// Name of the ipip encapsulation program inside the object, which [`PROGRAM`] tail-calls
/// through the `IPIP_TX` program array.
pub const IPIP_PROGRAM: &str = "switchyard_ipip";

/// Name of the program inside the [`baseline`] object.
pub const BASELINE_PROGRAM: &str = "baseline";

static OBJECT: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/router"));
static BASELINE: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/baseline"));
static DECAP: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/decap"));

/// Name of the program inside the [`decap`] object.
pub const DECAP_PROGRAM: &str = "decap";

/// The ELF bytes of the XDP object.
///
/// # Errors
///
/// [`DataplaneError::StubObject`] when the binary was built with `AYA_BUILD_SKIP=1` (a
/// zero-byte stub).
pub fn bytes() -> Result<&'static [u8], DataplaneError> {
    if OBJECT.is_empty() {
        Err(DataplaneError::StubObject)
    } else {
        Ok(OBJECT)
    }
}

/// The ELF bytes of the baseline XDP object, for benchmarks: a program ([`BASELINE_PROGRAM`])
/// that parses Ethernet and the IPv4/IPv6 header, swaps the MAC addresses and returns
/// `XDP_TX` (`router-ebpf/src/bin/baseline.rs`). Switchyard's cost is reported relative to it
/// (docs/performance.md); the agent never loads it.
///
/// # Errors
///
/// [`DataplaneError::StubObject`] for a stub build, like [`bytes`].
pub fn baseline() -> Result<&'static [u8], DataplaneError> {
    if BASELINE.is_empty() {
        Err(DataplaneError::StubObject)
    } else {
        Ok(BASELINE)
    }
}

/// The ELF bytes of the backends' IP-in-IP decapsulator (`router-ebpf/src/bin/decap.rs`,
/// program [`DECAP_PROGRAM`]), which `switchyard decap` attaches.
///
/// # Errors
///
/// [`DataplaneError::StubObject`] for a stub build, like [`bytes`].
pub fn decap() -> Result<&'static [u8], DataplaneError> {
    if DECAP.is_empty() {
        Err(DataplaneError::StubObject)
    } else {
        Ok(DECAP)
    }
}
