//! Test harness: packet builders, fixture tables, network-namespace topologies, privilege guard.
