//! The config loader from the outside: fragments in, a `Config` or every problem out.
//!
//! - [`load`] — what converts, with its defaults
//! - [`state`] — state variables, decision groups and `decide` targets, and lint warnings
//! - [`protocols`] — the dns, udp, tls and https probes, with their defaults
//! - [`dir`] — loading a config directory: merge order, leftovers, what is never read
//! - [`reference`] — the reference config: what it reports, its copy, random edits of it
//! - [`invalid`] — every refused config and its exact problems, as a golden table
//! - [`package`] — the example config the Debian package installs

mod dir;
mod invalid;
mod load;
mod package;
mod protocols;
mod reference;
mod state;

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use switchyard::config::{Config, load_files};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
        .collect()
}

fn load(list: &[(&str, &str)]) -> Config {
    match load_files(&files(list)) {
        Ok(config) => config,
        Err(e) => panic!("expected a config, got:\n{e}"),
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const MINIMAL: &str = "\
services:
  - name: web
    vip: 198.18.0.10
    port: 80
    protocol: tcp
    forward: dsr-l2
    to: { pool: dc1 }
pools:
  - name: dc1
    backends:
      - { address: 198.18.1.11 }
";

/// The `services:` half of [`MINIMAL`].
fn services_only() -> String {
    MINIMAL
        .split("pools:")
        .next()
        .unwrap_or_default()
        .to_owned()
}
