//! A config directory: fragments merge in name order and leftovers (hidden, editor and swap
//! files, other extensions) are skipped; a missing directory is one problem; FIFOs, devices and
//! huge files are refused without being read.

use std::{
    fs,
    path::{Path, PathBuf},
};

use switchyard::config::{Config, load_dir};

use crate::{MINIMAL, services_only};

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("switchyard-config-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, name: &str, text: &str) {
        fs::write(self.0.join(name), text).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn load_dir_merges_fragments_in_name_order_and_skips_leftovers() {
    let dir = TempDir::new("merge");
    dir.write("20-pools.yaml", &MINIMAL.replace(&services_only(), ""));
    dir.write("10-web.yaml", &services_only());
    dir.write(
        "30-more.yaml",
        "pools:\n  - { name: dc2, backends: [ { address: 198.18.2.11 } ] }\n",
    );
    for leftover in [
        ".hidden.yaml",
        ".#10-web.yaml",
        "10-web.yaml~",
        "10-web.yaml.swp",
        "notes.txt",
    ] {
        dir.write(leftover, "this: is not a fragment\n");
    }
    let config = load_dir(&dir.0).unwrap();
    assert_eq!(config.services.len(), 1);
    let pools: Vec<&str> = config.pools.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(pools, ["dc1", "dc2"]);
}

#[test]
fn with_a_fleet_the_node_sections_load_from_node_local_files() {
    let dir = TempDir::new("local");
    dir.write("10-web.yaml", MINIMAL);
    dir.write(
        "local.yaml",
        "fleet:\n  node: lb1\n  endpoints: [\"198.18.0.1:2379\"]\n",
    );
    dir.write("lb1.local.yaml", "agent:\n  api: 127.0.0.1:9091\n");
    let config = load_dir(&dir.0).unwrap();
    assert_eq!(config.fleet.map(|f| f.node).as_deref(), Some("lb1"));
    assert_eq!(config.agent.api.port(), 9091);
    // The same agent: in a shared fragment is refused (tests/invalid has the message).
    fs::rename(dir.0.join("lb1.local.yaml"), dir.0.join("20-agent.yaml")).unwrap();
    let e = load_dir(&dir.0).unwrap_err();
    assert_eq!(e.problems.len(), 1, "{e}");
    assert_eq!(e.problems[0].file, "20-agent.yaml");
    assert_eq!(e.problems[0].path, "agent");
}

#[test]
fn load_dir_reports_a_missing_directory() {
    let missing = std::env::temp_dir().join("switchyard-config-does-not-exist");
    let e = load_dir(&missing).unwrap_err();
    assert_eq!(e.problems.len(), 1);
    let line = e.to_string();
    assert!(
        line.starts_with(&format!(
            "{}: cannot read the configuration directory: ",
            missing.display()
        )),
        "{line}"
    );
}

/// Runs `load_dir` on another thread: `None` if it has not returned within 10 s.
fn load_dir_bounded(dir: &Path) -> Option<Result<Config, switchyard::config::ConfigError>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let dir = dir.to_owned();
    std::thread::spawn(move || {
        let _ = tx.send(load_dir(&dir));
    });
    rx.recv_timeout(std::time::Duration::from_secs(10)).ok()
}

#[test]
fn load_dir_refuses_fifos_devices_and_huge_files_without_reading_them() {
    let dir = TempDir::new("special");
    dir.write("10-web.yaml", MINIMAL);
    // A FIFO: opening it blocks until a writer comes.
    let fifo = std::ffi::CString::new(dir.0.join("20-fifo.yaml").to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    // A device: endless.
    std::os::unix::fs::symlink("/dev/zero", dir.0.join("30-zero.yaml")).unwrap();
    // A (sparse) file far larger than any configuration.
    let huge = fs::File::create(dir.0.join("40-huge.yaml")).unwrap();
    huge.set_len(64 << 20).unwrap();
    let Some(result) = load_dir_bounded(&dir.0) else {
        panic!("load_dir hung on a FIFO or a device");
    };
    let e = result.unwrap_err();
    let text = e.to_string();
    for name in ["20-fifo.yaml", "30-zero.yaml", "40-huge.yaml"] {
        assert!(
            e.problems.iter().any(|p| p.file == name),
            "{name} not reported: {text}"
        );
    }
    assert!(!text.contains("10-web.yaml"), "{text}");
}
