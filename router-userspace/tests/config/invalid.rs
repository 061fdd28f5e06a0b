//! Invalid configs as a golden table. Each case is `tests/invalid/NAME.yaml` (one fragment) or
//! `tests/invalid/NAME/` (a config directory of fragments, loaded as the agent loads one), and
//! must be refused with exactly the text of `tests/invalid/NAME.expected`: the problems as the
//! loader reports them, one per line — `FILE:LINE PATH: MESSAGE` (an expression error goes on
//! with its source line and caret, indented).
//!
//! To add or change a case, write its fragments and regenerate the expected text, then review
//! the diff:
//!
//! ```text
//! UPDATE_GOLDEN=1 cargo test -p router-userspace --test config invalid
//! ```

use std::{
    fs,
    path::{Path, PathBuf},
};

use switchyard::config::{ConfigError, load_dir, load_files};

use crate::files;

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/invalid")
}

/// What loading case `path` reports, with a final newline; an error if it loads.
fn problems(path: &Path) -> Result<String, String> {
    let result = if path.is_dir() {
        load_dir(path)
    } else {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let text = fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
        load_files(&[(name.into_owned(), text)])
    };
    match result {
        Ok(config) => Err(format!("it loads: {config:?}")),
        Err(e) => Ok(format!("{e}\n")),
    }
}

#[test]
fn every_invalid_config_reports_exactly_its_expected_problems() {
    let dir = cases_dir();
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut entries: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("tests/invalid")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    let mut cases = 0;
    let mut failures = Vec::new();
    for path in &entries {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let case = if path.is_dir() {
            name.to_string()
        } else if let Some(stem) = name.strip_suffix(".yaml") {
            stem.to_owned()
        } else if let Some(stem) = name.strip_suffix(".expected") {
            let has_case = dir.join(stem).is_dir() || dir.join(format!("{stem}.yaml")).is_file();
            if !has_case {
                failures.push(format!("{name}: no {stem}.yaml or {stem}/ beside it"));
            }
            continue;
        } else {
            failures.push(format!("{name}: neither a case nor its expected problems"));
            continue;
        };
        cases += 1;
        let expected_path = dir.join(format!("{case}.expected"));
        let got = match problems(path) {
            Ok(got) => got,
            Err(e) => {
                failures.push(format!("{case}: {e}"));
                continue;
            }
        };
        if update {
            fs::write(&expected_path, &got).expect("write the expected problems");
            continue;
        }
        match fs::read_to_string(&expected_path) {
            Ok(want) if want == got => {}
            Ok(want) => failures.push(format!(
                "{case}: the loader reports\n{got}instead of\n{want}"
            )),
            Err(e) => failures.push(format!(
                "{case}: {}: {e} (UPDATE_GOLDEN=1 writes it)",
                expected_path.display()
            )),
        }
    }
    assert!(cases > 0, "no cases in {}", dir.display());
    assert!(
        failures.is_empty(),
        "{} of {cases} invalid configs:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn config_error_displays_one_problem_per_line() {
    let e: ConfigError = load_files(&files(&[("x.yaml", "a: 1\nb: 2\n")])).unwrap_err();
    assert_eq!(e.problems.len(), 2);
    assert_eq!(e.to_string().lines().count(), 2);
    assert_eq!(e.problems[1].line, Some(2));
    assert_eq!(e.problems[1].column, Some(1));
    assert_eq!(e.problems[1].path, "b");
}
