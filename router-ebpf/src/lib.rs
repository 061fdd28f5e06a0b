//! Host-side placeholder: the XDP program is the `router` binary (`src/main.rs`), built for
//! `bpfel-unknown-none`. This empty library lets `router-userspace` name the crate as a build
//! dependency, so cargo rebuilds the agent when the program's dependencies change.
#![no_std]
