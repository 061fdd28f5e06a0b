//! Incremental Internet checksum updates (RFC 1624 eqn. 3: `HC' = ~(~HC + ~m + m')`).
//!
//! The data are copied to the stack before summing, and the loops have constant bounds, so the
//! verifier sees no packet-pointer arithmetic here. (aya-rs/aya#1562: some Rust shapes of
//! checksum code — slices of packet memory, iterator chains — are rejected; this one passes.)

/// Folds the carries of a one's-complement sum of 16-bit words into its low 16 bits: two
/// rounds fold any `u32`.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "after two folds the sum fits in 16 bits: the cast drops only zero bits"
)]
fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

#[inline(always)]
fn word(b: &[u8], i: usize) -> u32 {
    match (b.get(i), b.get(i + 1)) {
        (Some(hi), Some(lo)) => (u32::from(*hi) << 8) | u32::from(*lo),
        _ => 0,
    }
}

/// The checksum `check` (as its wire bytes) after `old` is replaced by `new` in the covered data;
/// both are `N` bytes (4 for IPv4 addresses, 16 for IPv6), `N` even.
#[inline(always)]
pub fn replace<const N: usize>(check: [u8; 2], old: &[u8; N], new: &[u8; N]) -> [u8; 2] {
    let mut sum = u32::from(!u16::from_be_bytes(check));
    let mut i = 0;
    while i < N {
        sum += !word(old, i) & 0xffff;
        sum += word(new, i);
        i += 2;
    }
    (!fold(sum)).to_be_bytes()
}
