//! The example the Debian package installs as /etc/switchyard/switchyard.yaml: valid as shipped
//! (all comments: defaults, no service), and valid once its commented lines are uncommented as
//! it tells the operator to (remove the leading `# `; `## ` lines are prose).

use std::path::Path;

use switchyard::config::load_files;

fn example() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("package/switchyard.yaml");
    std::fs::read_to_string(&path).unwrap()
}

/// The example with its `# ` lines uncommented and its `##` prose dropped.
fn uncommented(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with("##"))
        .map(|l| {
            l.strip_prefix("# ")
                .unwrap_or(if l == "#" { "" } else { l })
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_packaged_example_is_valid_and_configures_nothing_as_shipped() {
    let cfg = load_files(&[("switchyard.yaml".into(), example())]).unwrap();
    assert!(cfg.services.is_empty() && cfg.pools.is_empty());
    assert_eq!(cfg.agent, switchyard::config::Agent::default());
}

#[test]
fn the_packaged_example_uncommented_is_a_valid_service() {
    let text = uncommented(&example());
    assert!(!text.lines().any(|l| l.starts_with('#')), "{text}");
    let cfg = load_files(&[("switchyard.yaml".into(), text.clone())])
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(cfg.services.len(), 1);
    assert_eq!(cfg.pools.len(), 1);
    assert_eq!(cfg.pools[0].backends.len(), 2);
    // The agent settings it spells out are the defaults.
    assert_eq!(cfg.agent, switchyard::config::Agent::default());
}
