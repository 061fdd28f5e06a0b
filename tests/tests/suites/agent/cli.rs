//! The `switchyard` binary's answers to bad input that needs no namespace: no privileges, a
//! broken config directory, a directory that does not exist.

use std::{fs, process::Command};

use anyhow::{Result, ensure};
use router_tests::agent::{binary, temp_dir};

/// Runs the binary with `args` (optionally as uid/gid 65534) and returns (exit code, stderr).
fn run(args: &[&str], unprivileged: bool) -> Result<(i32, String, String)> {
    let bin = binary()?;
    let out = if unprivileged {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&bin)
            .args(args)
            .output()?
    } else {
        Command::new(&bin).args(args).output()?
    };
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[test]
fn attach_without_privileges_says_so_and_changes_nothing() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: needs root to drop privileges from");
        return Ok(());
    }
    let dir = temp_dir("unpriv")?;
    let (code, _, err) = run(
        &[
            "attach",
            "--iface",
            "lo",
            "--config-dir",
            &dir.display().to_string(),
        ],
        true,
    )?;
    let _ = fs::remove_dir_all(&dir);
    ensure!(code == 1, "exit {code}: {err}");
    ensure!(err.contains("needs root"), "stderr: {err}");
    let (code, _, err) = run(&["detach", "--iface", "lo"], true)?;
    ensure!(
        code == 1 && err.contains("needs root"),
        "detach: exit {code}: {err}"
    );
    Ok(())
}

#[test]
fn validate_lists_every_problem_with_its_location_and_exits_1() -> Result<()> {
    let dir = temp_dir("validate")?;
    fs::write(
        dir.join("10-web.yaml"),
        "services:\n  - { name: web, vip: 198.18.0.10, port: 80, protocol: tcp, forward: dsr-l2, to: { pool: web1 } }\npools:\n  - name: web\n    backends: [ { address: 198.18.11.11, weight: 70000 } ]\n    health_check: { tcp: { port: 80 }, intervall: 1s }\n",
    )?;
    fs::write(
        dir.join("20-bad.yaml"),
        "pools: [ { name: x, backends: [ { address: nope } ] }\n",
    )?;
    let (code, out, err) = run(&["validate", &dir.display().to_string()], false)?;
    let _ = fs::remove_dir_all(&dir);
    println!("{err}");
    ensure!(code == 1, "exit {code}: {out}{err}");
    for want in [
        "10-web.yaml:2 services[0].to.pool: unknown pool \"web1\"; did you mean \"web\"?",
        "10-web.yaml:5 pools[0].backends[0].weight",
        "10-web.yaml:6 pools[0].health_check.intervall: unknown key \"intervall\"; did you mean \"interval\"?",
        "20-bad.yaml:2: invalid YAML",
    ] {
        ensure!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    Ok(())
}

#[test]
fn a_missing_config_directory_is_a_clear_error() -> Result<()> {
    let (code, _, err) = run(&["validate", "/nonexistent/switchyard"], false)?;
    ensure!(code == 1, "exit {code}");
    ensure!(err.contains("/nonexistent/switchyard"), "stderr: {err}");
    Ok(())
}

/// `ctl`'s `--config-dir` and `--api` are accepted after the command as well as before it: both
/// orders reach the same lookup (here: no agent anywhere, so the same refusal, not a usage
/// error).
#[test]
fn ctl_options_go_before_or_after_the_command() -> Result<()> {
    let dir = temp_dir("ctl-order")?;
    let dir_s = dir.display().to_string();
    let api = "http://127.0.0.1:9";
    let before = run(
        &["ctl", "--config-dir", &dir_s, "--api", api, "versions"],
        false,
    )?;
    let after = run(
        &["ctl", "versions", "--config-dir", &dir_s, "--api", api],
        false,
    )?;
    let _ = fs::remove_dir_all(&dir);
    for (code, _, err) in [&before, &after] {
        ensure!(*code != 0 && !err.contains("unexpected argument"), "{err}");
        ensure!(
            err.contains("no agent answers at http://127.0.0.1:9"),
            "{err}"
        );
    }
    Ok(())
}
