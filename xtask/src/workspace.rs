//! The workspace xtask works in, and the cargo and shell commands it runs there.

use std::{
    ffi::OsString,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

/// The workspace root and the build profile xtask itself was built with (the `switchyard`
/// binary and `xtask-lab` are built with the same one, so each is found next to the other).
pub struct Workspace {
    root: PathBuf,
    release: bool,
}

impl Workspace {
    /// The workspace this xtask was built from.
    pub fn locate() -> Self {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        Self {
            root: manifest.parent().unwrap_or(manifest).to_path_buf(),
            release: !cfg!(debug_assertions),
        }
    }

    /// The workspace root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `cargo` (the one that runs xtask, if any) in the workspace root.
    pub fn cargo(&self) -> Command {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
        let mut cmd = Command::new(cargo);
        cmd.current_dir(&self.root);
        cmd
    }

    /// `--release` when xtask is a release build.
    pub fn profile_args(&self) -> &'static [&'static str] {
        if self.release { &["--release"] } else { &[] }
    }

    /// Runs `xtask/setup.sh`.
    pub fn setup(&self) -> Result<()> {
        let script = self.root.join("xtask/setup.sh");
        let status = Command::new("bash")
            .arg(&script)
            .current_dir(&self.root)
            .status()
            .with_context(|| format!("cannot run bash {}", script.display()))?;
        if !status.success() {
            bail!(
                "{} failed ({status}); it needs root for apt-get, rustup and mount \
                 (`cargo xtask doctor` shows what is missing)",
                script.display()
            );
        }
        Ok(())
    }

    /// `cargo build -p router-userspace --bin switchyard`.
    /// Quiet: aya-build replays the eBPF build's output as ~40 warning lines on every build.
    pub fn build_switchyard(&self) -> Result<()> {
        println!(
            "xtask: cargo build -p router-userspace --bin switchyard \
             (the first build takes several minutes)"
        );
        let start = Instant::now();
        run(self
            .cargo()
            .args(["build", "--quiet", "-p", "router-userspace"])
            .args(["--bin", "switchyard"])
            .args(self.profile_args()))?;
        println!(
            "xtask: switchyard built ({:.0} s)",
            start.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Builds `xtask-lab` (feature `lab`) and replaces this process with it, running `args`.
    pub fn hand_over_to_lab(&self, args: &[&str]) -> Result<ExitCode> {
        println!("xtask: cargo build -p xtask --features lab --bin xtask-lab");
        run(self
            .cargo()
            .args(["build", "--quiet", "-p", "xtask", "--features", "lab"])
            .args(["--bin", "xtask-lab"])
            .args(self.profile_args()))
        .context("building xtask-lab (if the eBPF build failed: `cargo xtask setup`)")?;
        let exe = std::env::current_exe().context("cannot find the running xtask")?;
        let lab = exe.with_file_name("xtask-lab");
        // exec only returns on failure.
        let err = Command::new(&lab).args(args).exec();
        Err(err).with_context(|| format!("cannot run {}", lab.display()))
    }
}

/// Runs `cmd` with inherited output; fails unless it exits 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    Ok(())
}
