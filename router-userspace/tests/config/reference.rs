//! The reference config (`tests/fixtures/reference`): it reports only what is not supported yet
//! or inconsistent in it, it matches the design copy where that is present, and random edits of
//! it give a `Config` or problems, never a panic.

use std::{fs, path::Path};

use switchyard::config::{load_dir, load_files};

use crate::fixtures;

#[test]
fn reference_config_reports_only_what_is_not_supported_or_inconsistent() {
    let Err(e) = load_dir(&fixtures().join("reference")) else {
        panic!("the reference config uses features that are not supported yet");
    };
    let lines: Vec<String> = e.to_string().lines().map(str::to_owned).collect();
    assert_eq!(
        lines,
        [
            // Not a missing feature but the reference itself: web (IPv4) and web6 (IPv6)
            // share web-failover, whose pools have IPv4 backends only.
            "reference.yaml:78 decisions[0].name: used by services of different address \
             families: \"web\" (IPv4 198.18.0.10) and \"web6\" (IPv6 2001:db8::10, at \
             reference.yaml:25); every pool of a group must serve each service using it; use one \
             group per address family",
        ]
    );
}

#[test]
fn reference_fixture_matches_the_design_copy_when_present() {
    // shared/ sits beside the repository on developer machines and in CI.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let design = [
        "shared/design/reference.yaml",
        "../shared/design/reference.yaml",
    ]
    .iter()
    .map(|p| root.join(p))
    .find(|p| p.is_file());
    let Some(design) = design else {
        eprintln!("shared/design/reference.yaml not found; fixture drift not checked");
        return;
    };
    let fixture = fixtures().join("reference/reference.yaml");
    assert_eq!(
        fs::read_to_string(design).unwrap(),
        fs::read_to_string(fixture).unwrap(),
        "tests/fixtures/reference/reference.yaml is out of date"
    );
}

/// Random edits of the reference config (cut, insert YAML punctuation, duplicate or swap
/// lines) must give a `Config` or problems, never a panic.
#[test]
fn random_edits_never_panic() {
    let reference = fs::read_to_string(fixtures().join("reference/reference.yaml")).unwrap();
    let tokens = [
        ":", "- ", "[", "]", "{", "}", "\n", "  ", "\"", "'", "~", "&a ", "*a", "!!str ", "#", "0",
        "-1", "1s", "::", ",", "\t", "é", "65536", "?", "|", ">",
    ];
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a remainder below n, which is a usize"
    )]
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n.max(1) as u64) as usize
    };
    for _ in 0..2_000 {
        let mut lines: Vec<String> = reference.lines().map(str::to_owned).collect();
        for _ in 0..=next(3) {
            let l = next(lines.len());
            match next(4) {
                0 => {
                    let line = &mut lines[l];
                    let at = next(line.len() + 1);
                    let end = (at + next(8)).min(line.len());
                    if line.is_char_boundary(at) && line.is_char_boundary(end) {
                        line.replace_range(at..end, "");
                    }
                }
                1 => {
                    let line = &mut lines[l];
                    let at = next(line.len() + 1);
                    if line.is_char_boundary(at) {
                        line.insert_str(at, tokens[next(tokens.len())]);
                    }
                }
                2 => {
                    let copy = lines[l].clone();
                    lines.insert(next(lines.len()), copy);
                }
                _ => {
                    let m = next(lines.len());
                    lines.swap(l, m);
                }
            }
        }
        let text = lines.join("\n");
        if let Err(e) = load_files(&[("r.yaml".to_owned(), text)]) {
            assert!(!e.problems.is_empty());
        }
    }
}
