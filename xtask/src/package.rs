//! `cargo xtask package [--check]`: the Debian package (decision 0030).
//!
//! Build: the release `switchyard`, then the shell completions and manual pages it prints
//! (`switchyard completions SHELL`, `switchyard man DIR`) into `target/release/package/`, then
//! `cargo deb --no-build` with the assets of `[package.metadata.deb]` in
//! router-userspace/Cargo.toml. The generated files come from the binary being packaged, so
//! they always describe its commands.
//!
//! Check: the package is installed with dpkg into an empty root (it has no maintainer scripts,
//! so nothing runs), every path of [`INSTALLED`] must be there with its mode and be named in the
//! README, the installed binary must accept the installed example config (`switchyard
//! validate`), and the installed unit must pass `systemd-analyze verify` (on a copy whose
//! `ExecStart` names the installed binary: verify checks that the program exists, and this
//! machine has no /usr/bin/switchyard).

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::workspace::{Workspace, run};

/// What the package installs that the README names: (path, mode).
pub const INSTALLED: &[(&str, u32)] = &[
    ("/usr/bin/switchyard", 0o755),
    ("/usr/lib/systemd/system/switchyard.service", 0o644),
    ("/etc/default/switchyard", 0o644),
    ("/etc/switchyard/switchyard.yaml", 0o644),
    ("/usr/share/bash-completion/completions/switchyard", 0o644),
    ("/usr/share/zsh/vendor-completions/_switchyard", 0o644),
    (
        "/usr/share/fish/vendor_completions.d/switchyard.fish",
        0o644,
    ),
    ("/usr/share/man/man1/switchyard.1.gz", 0o644),
    ("/usr/share/man/man1/switchyard-attach.1.gz", 0o644),
    ("/usr/share/doc/switchyard/configuration.md", 0o644),
];

/// The configuration files dpkg keeps across upgrades (`conffiles`).
const CONFFILES: &[&str] = &["/etc/default/switchyard", "/etc/switchyard/switchyard.yaml"];

/// Builds the package and, with `check`, checks it; returns the `.deb`'s path.
pub fn run_package(ws: &Workspace, check: bool) -> Result<PathBuf> {
    let deb = build(ws)?;
    println!("xtask: package {}", deb.display());
    if check {
        self::check(ws, &deb)?;
        println!("xtask: package checked: installs where the README says; unit verified");
    }
    Ok(deb)
}

/// `target/` of the workspace (or `$CARGO_TARGET_DIR`).
fn target_dir(ws: &Workspace) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| ws.root().join("target"), PathBuf::from)
}

fn build(ws: &Workspace) -> Result<PathBuf> {
    println!(
        "xtask: cargo build --release -p router-userspace --bin switchyard \
         (a first release build takes about ten minutes)"
    );
    let start = std::time::Instant::now();
    run(ws
        .cargo()
        .args(["build", "--quiet", "--release", "-p", "router-userspace"])
        .args(["--bin", "switchyard"]))?;
    println!(
        "xtask: release switchyard built ({:.0} s)",
        start.elapsed().as_secs_f64()
    );
    let release = target_dir(ws).join("release");
    let bin = release.join("switchyard");
    let out = release.join("package");
    let _ = fs::remove_dir_all(&out);
    let completions = out.join("completions");
    fs::create_dir_all(&completions)?;
    for (shell, file) in [
        ("bash", "switchyard.bash"),
        ("zsh", "_switchyard"),
        ("fish", "switchyard.fish"),
    ] {
        let printed = Command::new(&bin)
            .args(["completions", shell])
            .stderr(Stdio::inherit())
            .output()
            .with_context(|| format!("cannot run {}", bin.display()))?;
        ensure!(
            printed.status.success() && !printed.stdout.is_empty(),
            "switchyard completions {shell} failed ({})",
            printed.status
        );
        fs::write(completions.join(file), printed.stdout)?;
    }
    let man = out.join("man");
    run(Command::new(&bin).arg("man").arg(&man))?;
    // Manual pages are installed compressed (Debian policy 12.1); -n keeps the archive
    // reproducible (no name or time stamp).
    let mut pages: Vec<PathBuf> = fs::read_dir(&man)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "1"))
        .collect();
    pages.sort();
    ensure!(!pages.is_empty(), "switchyard man wrote no page");
    run(Command::new("gzip").arg("-9nf").args(&pages))?;
    println!("xtask: cargo deb -p router-userspace --no-build");
    let built = ws
        .cargo()
        .args(["deb", "-p", "router-userspace", "--no-build"])
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run cargo deb (`cargo xtask setup` installs cargo-deb)")?;
    if !built.status.success() {
        bail!(
            "cargo deb failed ({}); is cargo-deb installed? (`cargo xtask setup`)",
            built.status
        );
    }
    // cargo-deb prints the package's path as its last line.
    let stdout = String::from_utf8_lossy(&built.stdout);
    let deb = stdout
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| Path::new(l).extension().is_some_and(|e| e == "deb"))
        .map(PathBuf::from)
        .context("cargo deb printed no .deb path")?;
    Ok(deb)
}

fn check(ws: &Workspace, deb: &Path) -> Result<()> {
    let root = target_dir(ws).join("debian/root");
    let _ = fs::remove_dir_all(&root);
    install_into(&root, deb)?;
    let readme = fs::read_to_string(ws.root().join("README.md")).context("reading README.md")?;
    for (path, mode) in INSTALLED {
        let at = root.join(path.trim_start_matches('/'));
        let meta =
            fs::metadata(&at).with_context(|| format!("the package does not install {path}"))?;
        ensure!(
            meta.is_file() && meta.permissions().mode() & 0o7777 == *mode,
            "{path}: mode {:o}, not {mode:o}",
            meta.permissions().mode() & 0o7777
        );
        ensure!(
            readme.contains(path),
            "README.md does not name {path}, which the package installs"
        );
    }
    let conffiles = fs::read_to_string(root.join("var/lib/dpkg/info/switchyard.conffiles"))
        .context("the package has no conffiles")?;
    for path in CONFFILES {
        ensure!(
            conffiles.lines().any(|l| l.trim() == *path),
            "{path} is not a conffile"
        );
    }
    let bin = root.join("usr/bin/switchyard");
    let example = root.join("etc/switchyard");
    let validated = Command::new(&bin)
        .arg("validate")
        .arg(&example)
        .output()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    ensure!(
        validated.status.success(),
        "the installed switchyard refuses the installed example config:\n{}{}",
        String::from_utf8_lossy(&validated.stdout),
        String::from_utf8_lossy(&validated.stderr)
    );
    verify_unit(&root)
}

/// Installs `deb` into the empty root `root` with dpkg, which records it there as a real
/// install does (status, file list, conffiles).
fn install_into(root: &Path, deb: &Path) -> Result<()> {
    let admin = root.join("var/lib/dpkg");
    fs::create_dir_all(admin.join("info"))?;
    fs::create_dir_all(admin.join("updates"))?;
    fs::write(admin.join("status"), "")?;
    fs::write(admin.join("available"), "")?;
    println!(
        "xtask: dpkg --root={} --install {}",
        root.display(),
        deb.display()
    );
    run(Command::new("dpkg")
        .arg(format!("--root={}", root.display()))
        .arg("--log=/dev/null")
        // The empty root has none of the package's dependencies (libc6).
        .arg("--force-depends")
        .arg("--install")
        .arg(deb))
}

/// `systemd-analyze verify` on a copy of the installed unit whose `ExecStart` runs the
/// installed binary.
fn verify_unit(root: &Path) -> Result<()> {
    let unit = root.join("usr/lib/systemd/system/switchyard.service");
    let text = fs::read_to_string(&unit)?;
    let bin = root.join("usr/bin/switchyard");
    ensure!(
        text.contains("ExecStart=/usr/bin/switchyard "),
        "{}: ExecStart does not run /usr/bin/switchyard",
        unit.display()
    );
    let copy_dir = root.join("../verify");
    let _ = fs::remove_dir_all(&copy_dir);
    fs::create_dir_all(&copy_dir)?;
    let copy = copy_dir.join("switchyard.service");
    fs::write(
        &copy,
        text.replace(
            "ExecStart=/usr/bin/switchyard ",
            &format!("ExecStart={} ", bin.display()),
        ),
    )?;
    println!("xtask: systemd-analyze verify switchyard.service");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&copy)
        .output()
        .context("cannot run systemd-analyze (apt package systemd; `cargo xtask setup`)")?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // verify exits 0 with warnings it prints (unknown settings among them): both fail.
    ensure!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify {}:\n{said}",
        unit.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the README's install section lists is what the check looks for.
    #[test]
    fn the_readme_names_every_installed_path() {
        let readme = include_str!("../../README.md");
        for (path, _) in INSTALLED {
            assert!(readme.contains(path), "README.md does not name {path}");
        }
    }

    /// The metadata installs every path the check looks for.
    #[test]
    fn the_deb_metadata_installs_every_checked_path() {
        let manifest = include_str!("../../router-userspace/Cargo.toml");
        for (path, _) in INSTALLED {
            let dest = path.trim_start_matches('/');
            let named = manifest.contains(&format!("\"{dest}\""))
                || Path::new(dest)
                    .parent()
                    .is_some_and(|dir| manifest.contains(&format!("\"{}/\"", dir.display())));
            assert!(named, "[package.metadata.deb] installs nothing at {path}");
        }
    }
}
