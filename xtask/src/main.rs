//! Placeholder: the xtask helpers are being written.
fn main() {}
