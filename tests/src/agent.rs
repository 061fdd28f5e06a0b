//! The real `switchyard` binary as an operator runs it, inside the lb namespace of a
//! [`Topology`]: a config directory written to a temporary folder, `switchyard attach` started
//! as a child process, and everything undone on drop (agent stopped, program detached, pins
//! and an emptied `agent.pin_path` removed, folder deleted).
//!
//! The agent runs under `nsenter --net=…`, which switches only the network namespace: the
//! bpffs mount (and so the pins) stay visible, unlike under `ip netns exec`, which remounts
//! `/sys`.

use std::{
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use switchyard::api::status::{NextHopStatus, Status};

use crate::netns::{Netns, Topology};

/// Where the agent's local API listens, inside the lb namespace (its own loopback).
pub const API: &str = "127.0.0.1:9900";

/// The `switchyard` binary next to the running test (or xtask) executable:
/// `target/<profile>/switchyard`. `cargo test --workspace` builds it with router-userspace's
/// own integration tests; otherwise run `cargo build -p router-userspace` first.
///
/// # Errors
///
/// When the running executable's path cannot be read, or the binary is not there (the message
/// says how to build it).
pub fn binary() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().context("no parent")?.to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("switchyard");
    if !bin.exists() {
        bail!(
            "{} is missing: run `cargo build -p router-userspace` first",
            bin.display()
        );
    }
    Ok(bin)
}

/// A running agent and its config directory.
pub struct Agent {
    child: Option<Child>,
    lb: Netns,
    interfaces: Vec<String>,
    /// The config directory (a fresh temporary folder).
    pub config_dir: PathBuf,
    /// The agent's log file.
    pub log: PathBuf,
    /// `agent.pin_path` of the config directory when the agent started (the default when that
    /// config is invalid).
    pin_path: PathBuf,
    bin: PathBuf,
    /// The `--mode` each launch passes (`native`, `generic`), none when `None`.
    mode: Option<String>,
}

/// How a `switchyard attach` that was expected to fail ended
/// ([`Agent::attach_expecting_exit`]).
#[derive(Debug)]
pub struct Exited {
    /// Its exit status.
    pub status: ExitStatus,
    /// What it wrote to stdout and stderr.
    pub output: String,
    /// The files under the config's `agent.pin_path` when it had exited (the harness removes
    /// them afterwards); a start that failed should leave none. Always empty unless the pin
    /// path is a [`unique_pin_path`] (a broken config means the default path, which may be
    /// another agent's).
    pub pins_left: Vec<PathBuf>,
}

/// Prefix of the demo's pin paths (`cargo xtask demo`): with [`TEST_PIN_PREFIX`], the only pin
/// paths the harness ever removes.
pub const DEMO_PIN_PREFIX: &str = "/sys/fs/bpf/switchyard-demo-";

/// Prefix of every [`unique_pin_path`].
pub const TEST_PIN_PREFIX: &str = "/sys/fs/bpf/switchyard-test-";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh, unique folder under the system temporary directory.
///
/// # Errors
///
/// When the folder cannot be created.
pub fn temp_dir(role: &str) -> Result<PathBuf> {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("switchyard-{role}-{}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A pin path unique to this process and call, under `/sys/fs/bpf`.
pub fn unique_pin_path() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{TEST_PIN_PREFIX}{}-{n}", std::process::id())
}

/// Every file under `dir` (pins, on bpffs), recursively; empty when `dir` does not exist.
pub fn pins_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.filter_map(Result::ok) {
        let path = e.path();
        if path.is_dir() {
            out.extend(pins_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

impl Agent {
    /// Writes `files` (name, YAML text) into a new config directory, starts `switchyard attach`
    /// in the lb namespace on every lb interface ([`Topology::lb_interfaces`]: client side,
    /// each backend side, the router side) and waits until its API answers (up to 20 s; the
    /// program load dominates).
    ///
    /// # Errors
    ///
    /// When the config directory cannot be written, the binary is missing or cannot be
    /// started, or the agent exits or does not answer in time (the error carries its log).
    pub fn start(topo: &Topology, files: &[(&str, String)]) -> Result<Self> {
        let interfaces = topo.lb_interfaces();
        let mut agent = Self::spawn(topo, files, &interfaces)?;
        agent.wait_ready(Duration::from_secs(20))?;
        Ok(agent)
    }

    /// Like [`Agent::start`], on `interfaces` (in this order) of the lb namespace instead of
    /// the client side and every backend side: for a test that adds interfaces of its own.
    ///
    /// # Errors
    ///
    /// As [`Agent::start`].
    pub fn start_on(
        topo: &Topology,
        files: &[(&str, String)],
        interfaces: &[&str],
    ) -> Result<Self> {
        let interfaces: Vec<String> = interfaces.iter().map(|&i| i.to_owned()).collect();
        let mut agent = Self::spawn(topo, files, &interfaces)?;
        agent.wait_ready(Duration::from_secs(20))?;
        Ok(agent)
    }

    /// Like [`Agent::start_on`], with `switchyard attach --mode MODE` (`native`, `generic`);
    /// later launches ([`Agent::restart`], [`Agent::relaunch`]) pass the same until
    /// [`Agent::set_mode`].
    ///
    /// # Errors
    ///
    /// As [`Agent::start`].
    pub fn start_on_in_mode(
        topo: &Topology,
        files: &[(&str, String)],
        interfaces: &[&str],
        mode: &str,
    ) -> Result<Self> {
        let interfaces: Vec<String> = interfaces.iter().map(|&i| i.to_owned()).collect();
        let mut agent = Self::spawn_in_mode(topo, files, &interfaces, Some(mode))?;
        agent.wait_ready(Duration::from_secs(20))?;
        Ok(agent)
    }

    /// The `--mode` the next launches pass ([`Agent::restart`], [`Agent::relaunch`]); `None`
    /// passes none.
    pub fn set_mode(&mut self, mode: Option<&str>) {
        self.mode = mode.map(str::to_owned);
    }

    /// Runs `switchyard attach` on `interfaces` (in this order) with a config directory of
    /// `files`, for a start that must fail: waits up to `limit` for it to exit and returns its
    /// exit status, output and leftover pins. Fails if it is still running then. Either way
    /// the agent is then cleaned up like a dropped [`Agent`].
    ///
    /// # Errors
    ///
    /// When the config directory cannot be written, the binary is missing or cannot be
    /// started, or it still runs after `limit` (the error carries its log).
    pub fn attach_expecting_exit(
        topo: &Topology,
        files: &[(&str, String)],
        interfaces: &[&str],
        limit: Duration,
    ) -> Result<Exited> {
        let interfaces: Vec<String> = interfaces.iter().map(|&i| i.to_owned()).collect();
        let mut agent = Self::spawn(topo, files, &interfaces)?;
        agent.wait_exit(limit)
    }

    /// Starts `switchyard attach` again on the same interfaces and config directory, after
    /// [`Agent::stop`] or [`Agent::kill`], for a start that must fail (the program of the first
    /// run stays attached meanwhile): waits up to `limit` for it to exit and returns how. Fails
    /// if it is still running then (it is stopped when the agent is dropped).
    ///
    /// # Errors
    ///
    /// When an agent is still running, `switchyard attach` cannot be started, or it still
    /// runs after `limit`.
    pub fn relaunch_expecting_exit(&mut self, limit: Duration) -> Result<Exited> {
        if self.child.is_some() {
            bail!("the agent is still running");
        }
        self.launch()?;
        self.wait_exit(limit)
    }

    /// Waits up to `limit` for the running `switchyard attach` to exit.
    fn wait_exit(&mut self, limit: Duration) -> Result<Exited> {
        let start = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                return Ok(Exited {
                    status,
                    output: self.log_text(),
                    pins_left: if self.owns_pin_path() {
                        pins_under(&self.pin_path)
                    } else {
                        Vec::new()
                    },
                });
            }
            if start.elapsed() > limit {
                bail!(
                    "switchyard attach still runs after {limit:?}:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn spawn(topo: &Topology, files: &[(&str, String)], interfaces: &[String]) -> Result<Self> {
        Self::spawn_in_mode(topo, files, interfaces, None)
    }

    /// Like [`Agent::start_on`], in the namespace `lb` of a topology of the test's own (the
    /// fleet tests' balancers), without waiting for it to answer ([`Agent::wait_answering`]).
    ///
    /// # Errors
    ///
    /// When the config directory cannot be written, or the binary is missing or cannot be
    /// started.
    pub fn launch_in(lb: &Netns, files: &[(&str, String)], interfaces: &[&str]) -> Result<Self> {
        let interfaces: Vec<String> = interfaces.iter().map(|&i| i.to_owned()).collect();
        Self::spawn_in(lb, files, &interfaces, None)
    }

    /// Waits (up to 20 s) until an agent of [`Agent::launch_in`] answers, as
    /// [`Agent::start`] does.
    ///
    /// # Errors
    ///
    /// As [`Agent::start`].
    pub fn wait_answering(&mut self) -> Result<()> {
        self.wait_ready(Duration::from_secs(20))
    }

    fn spawn_in_mode(
        topo: &Topology,
        files: &[(&str, String)],
        interfaces: &[String],
        mode: Option<&str>,
    ) -> Result<Self> {
        Self::spawn_in(topo.lb(), files, interfaces, mode)
    }

    fn spawn_in(
        lb: &Netns,
        files: &[(&str, String)],
        interfaces: &[String],
        mode: Option<&str>,
    ) -> Result<Self> {
        let mut agent = Self::prepare(lb, files, interfaces, mode)?;
        agent.launch()?;
        Ok(agent)
    }

    /// An agent not started yet: its config directory of `files` written.
    fn prepare(
        lb: &Netns,
        files: &[(&str, String)],
        interfaces: &[String],
        mode: Option<&str>,
    ) -> Result<Self> {
        let config_dir = temp_dir("config")?;
        let state_dir = config_dir.with_extension("state");
        for (name, text) in files {
            fs::write(config_dir.join(name), with_state_dir(text, &state_dir))?;
        }
        let log = config_dir.with_extension("log");
        let agent = Self {
            child: None,
            lb: lb.clone(),
            interfaces: interfaces.to_vec(),
            pin_path: switchyard::cli::pin_path(&config_dir),
            config_dir,
            log,
            bin: binary()?,
            mode: mode.map(str::to_owned),
        };
        Ok(agent)
    }

    /// Starts `switchyard attach` on this agent's interfaces and config directory, appending
    /// to its log.
    fn launch(&mut self) -> Result<()> {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.lb.path().display()))
            .arg(&self.bin)
            .arg("attach");
        for i in &self.interfaces {
            cmd.args(["--iface", i]);
        }
        if let Some(mode) = &self.mode {
            cmd.args(["--mode", mode]);
        }
        cmd.arg("--config-dir").arg(&self.config_dir);
        self.run_child(cmd)
    }

    /// Starts `cmd` (which must exec the agent, so that its pid is the agent's) as the agent,
    /// appending its output to the log.
    fn run_child(&mut self, mut cmd: Command) -> Result<()> {
        // One open file for both streams, so they share an offset and never overwrite each
        // other.
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting switchyard attach")?;
        self.child = Some(child);
        Ok(())
    }

    /// Stops the agent (SIGTERM: the program stays attached with its pinned maps) and starts
    /// it again on the same config directory, which it may have changed in between; the new
    /// agent adopts the pinned maps and links. Waits until it answers.
    ///
    /// # Errors
    ///
    /// When the running agent cannot be signalled or reaped, the new one cannot be started,
    /// or it exits or does not answer within 20 s (the error carries its log).
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        self.launch()?;
        self.wait_ready(Duration::from_secs(20))
    }

    /// Waits until the agent answers `status`, then (up to 5 s more) until it has a next-hop
    /// verdict for every backend and its running version is recorded: a test's first packets
    /// then meet the agent's published state, as an operator's do once `status` shows every
    /// next hop and the version (the history records it on its own thread, a moment after
    /// the maps are live).
    fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if self.status().is_ok() {
                let _ = self.wait_for(Duration::from_secs(5), |s| {
                    no_backend_resolving(s) && s.running.version.is_some()
                });
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(code) = child.try_wait()?
            {
                bail!("switchyard attach exited with {code}:\n{}", self.log_text());
            }
            if start.elapsed() > limit {
                bail!(
                    "the agent did not answer within {limit:?}:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The agent's log so far.
    #[must_use]
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs the `switchyard` CLI in the lb namespace with `args` and returns its stdout;
    /// fails with its stderr unless it exits 0.
    ///
    /// # Errors
    ///
    /// When `nsenter` cannot be run, or the CLI exits non-zero (the error carries its
    /// stderr).
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.lb.path().display()))
            .arg(&self.bin)
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!(
                "switchyard {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `switchyard status --json`, parsed.
    ///
    /// # Errors
    ///
    /// As [`Agent::cli`], or when its output does not parse as a [`Status`].
    pub fn status(&self) -> Result<Status> {
        let dir = self.config_dir.display().to_string();
        let text = self.cli(&["status", "--json", "--config-dir", &dir])?;
        Ok(serde_json::from_str(&text)?)
    }

    /// Polls `status` until `pred` holds (every 20 ms, up to `limit`); returns the time taken.
    ///
    /// # Errors
    ///
    /// When `pred` has not held within `limit` (the error carries the agent's log); a
    /// `status` that fails meanwhile is polled again.
    pub fn wait_for(&self, limit: Duration, pred: impl Fn(&Status) -> bool) -> Result<Duration> {
        let start = Instant::now();
        loop {
            if let Ok(s) = self.status()
                && pred(&s)
            {
                return Ok(start.elapsed());
            }
            if start.elapsed() > limit {
                bail!(
                    "condition not reached within {limit:?}; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GET path` on the agent's local API (`agent.api`, default [`API`]) from inside the lb
    /// namespace, whose loopback it listens on; returns the body. Fails unless the answer is
    /// 200. Plain HTTP/1.0 over a std socket, so the body is never chunked.
    ///
    /// # Errors
    ///
    /// When the lb namespace cannot be entered, the API cannot be reached or read within 3 s,
    /// its answer is malformed, or its status is not 200.
    pub fn api_get(&self, path: &str) -> Result<String> {
        let addr = switchyard::cli::agent_settings(&self.config_dir).api;
        let path = path.to_owned();
        self.lb.run(move || -> Result<String> {
            let timeout = Duration::from_secs(3);
            let mut stream = TcpStream::connect_timeout(&addr, timeout)
                .with_context(|| format!("connect to the agent API at {addr}"))?;
            stream.set_read_timeout(Some(timeout))?;
            write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
            let mut response = String::new();
            stream.read_to_string(&mut response)?;
            let (head, body) = response
                .split_once("\r\n\r\n")
                .with_context(|| format!("malformed answer from {addr}{path}"))?;
            let status = head.lines().next().unwrap_or_default();
            if status.split_whitespace().nth(1) != Some("200") {
                bail!("GET {addr}{path}: {status}");
            }
            Ok(body.to_owned())
        })?
    }

    /// Polls `status` (up to 5 s) until no backend's next hop is still resolving; for a test
    /// that adds backends and sends to them at once.
    ///
    /// # Errors
    ///
    /// When a backend's next hop is still resolving after 5 s.
    pub fn wait_next_hops(&self) -> Result<Duration> {
        self.wait_for(Duration::from_secs(5), no_backend_resolving)
    }

    /// Whether `address` in `pool` is healthy according to the agent.
    #[must_use]
    pub fn healthy(status: &Status, pool: &str, address: &str) -> Option<bool> {
        let p = status.pools.iter().find(|p| p.name == pool)?;
        p.backends
            .iter()
            .find(|b| b.address == address)
            .map(|b| b.healthy)
    }

    /// Sends SIGHUP (reload the config directory).
    ///
    /// # Errors
    ///
    /// When the agent is not running or cannot be signalled.
    pub fn reload(&self) -> Result<()> {
        self.signal(libc::SIGHUP)
    }

    fn signal(&self, sig: i32) -> Result<()> {
        let Some(child) = self.child.as_ref() else {
            bail!("not running")
        };
        // nsenter execs the binary, so the child's pid is the agent's.
        // SAFETY: plain kill(2) on our own child.
        let pid = libc::pid_t::try_from(child.id())?;
        if unsafe { libc::kill(pid, sig) } != 0 {
            bail!("kill: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Stops the agent (SIGTERM) without detaching; the program stays attached. Returns how it
    /// exited (`None` if it was not running); one that ignores SIGTERM for 5 s is killed.
    ///
    /// # Errors
    ///
    /// When the agent cannot be signalled or waited for.
    pub fn stop(&mut self) -> Result<Option<ExitStatus>> {
        if self.child.is_some() {
            self.signal(libc::SIGTERM)?;
        }
        let Some(mut child) = self.child.take() else {
            return Ok(None);
        };
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(Some(status));
            }
            if start.elapsed() > Duration::from_secs(5) {
                let _ = child.kill();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Writes (or replaces) the fragment `name` in the config directory; [`Agent::reload`]
    /// applies it.
    ///
    /// # Errors
    ///
    /// When the file cannot be written.
    pub fn write_file(&self, name: &str, text: &str) -> Result<()> {
        let text = with_state_dir(text, &self.state_dir());
        Ok(fs::write(self.config_dir.join(name), text)?)
    }

    /// The versioned directory the agent pins its maps and links in (`PIN_PATH/vN`).
    #[must_use]
    pub fn pin_dir(&self) -> PathBuf {
        switchyard::dataplane::load::pin_dir(&self.pin_path)
    }

    /// Whether the pin path is a [`unique_pin_path`], which the harness may clean up.
    fn owns_pin_path(&self) -> bool {
        self.pin_path
            .to_str()
            .is_some_and(|p| p.starts_with(TEST_PIN_PREFIX) || p.starts_with(DEMO_PIN_PREFIX))
    }

    /// The config directory's path.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.config_dir
    }

    /// The `switchyard` binary the next launch runs ([`binary`] unless set).
    #[must_use]
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Makes the next launch run `bin`: a new build installed while the agent is stopped.
    pub fn set_bin(&mut self, bin: PathBuf) {
        self.bin = bin;
    }

    /// The executable the running agent's process runs (`/proc/PID/exe`), `None` when it is
    /// not running.
    #[must_use]
    pub fn running_exe(&self) -> Option<PathBuf> {
        let pid = self.child.as_ref()?.id();
        // `nsenter` execs the agent, so the child's pid is the agent's.
        fs::read_link(format!("/proc/{pid}/exe")).ok()
    }

    /// The agent's `state_dir` (history store, audit log), beside the config directory.
    #[must_use]
    pub fn state_dir(&self) -> PathBuf {
        self.config_dir.with_extension("state")
    }
}

impl Drop for Agent {
    /// Stops the agent, detaches the program and removes the pins — only under a
    /// [`unique_pin_path`], never a default or an operator's path — the agent's record
    /// (`switchyard::record`) and the config directory.
    /// Detaching is done here, by unpinning the links: it needs no config (the test may have
    /// left a broken one) and no namespace.
    fn drop(&mut self) {
        let _ = self.stop();
        if self.owns_pin_path() {
            let pin_dir = self.pin_dir();
            for i in &self.interfaces {
                let _ = switchyard::dataplane::attach::detach(&pin_dir, i, false);
            }
            let _ = fs::remove_dir_all(&self.pin_path);
        }
        // The record an agent that was killed left behind (an orderly exit removes its own).
        switchyard::record::remove(Path::new(switchyard::record::RUN_DIR), &self.config_dir);
        let _ = fs::remove_dir_all(&self.config_dir);
        let _ = fs::remove_dir_all(self.state_dir());
        let _ = fs::remove_file(&self.log);
    }
}

/// `text` with `agent.state_dir: STATE` added after its `pin_path` line, unless it sets a
/// state directory itself: every test agent keeps its history and audit log in its own
/// temporary directory, never in `/var/lib/switchyard`.
#[must_use]
pub fn with_state_dir(text: &str, state: &Path) -> String {
    if text.contains("state_dir:") {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.lines() {
        out.push_str(line);
        out.push('\n');
        if let Some(rest) = line.strip_suffix(line.trim_start())
            && line.trim_start().starts_with("pin_path:")
        {
            let _ = writeln!(out, "{rest}state_dir: {}", state.display());
        }
    }
    out
}

/// Crash and start again, for the hitless tests.
impl Agent {
    /// Kills the agent with SIGKILL — no cleanup of any kind runs — and reaps it. The program
    /// stays attached through its pinned links. Returns how it ended (`None` if it was not
    /// running).
    ///
    /// # Errors
    ///
    /// When the agent cannot be signalled or reaped.
    pub fn kill(&mut self) -> Result<Option<ExitStatus>> {
        if self.child.is_some() {
            self.signal(libc::SIGKILL)?;
        }
        match self.child.take() {
            Some(mut child) => Ok(Some(child.wait()?)),
            None => Ok(None),
        }
    }

    /// Starts `switchyard attach` again on the same interfaces and config directory (which may
    /// have changed meanwhile) after [`Agent::stop`] or [`Agent::kill`], and waits up to 20 s
    /// until it answers. Fails if one is still running.
    ///
    /// # Errors
    ///
    /// When an agent is still running, `switchyard attach` cannot be started, or it exits or
    /// does not answer within 20 s (the error carries its log).
    pub fn relaunch(&mut self) -> Result<()> {
        if self.child.is_some() {
            bail!("the agent is still running");
        }
        self.launch()?;
        self.wait_ready(Duration::from_secs(20))
    }
}

/// Whether every backend in `status` has a next-hop verdict (resolved, or unresolved for a
/// reason other than still resolving).
#[must_use]
pub fn no_backend_resolving(status: &Status) -> bool {
    status
        .pools
        .iter()
        .flat_map(|p| p.backends.iter())
        .all(|b| b.next_hop.as_ref().is_none_or(NextHopStatus::decided))
}

/// The agent as a service manager starts it, for the service test.
impl Agent {
    /// Writes `files` into a new config directory and runs the command `command` builds from
    /// that directory's path as the agent attached to `interfaces` of `lb` — a unit's
    /// `ExecStart`, under `nsenter --net=` of `lb`; it must exec the agent, so that its pid is
    /// the agent's — without waiting for it. Stopped and cleaned up like any [`Agent`].
    ///
    /// # Errors
    ///
    /// When the config directory cannot be written, or the command cannot be started.
    pub fn launch_command_in(
        lb: &Netns,
        files: &[(&str, String)],
        interfaces: &[&str],
        command: impl FnOnce(&Path) -> Command,
    ) -> Result<Self> {
        let interfaces: Vec<String> = interfaces.iter().map(|&i| i.to_owned()).collect();
        let mut agent = Self::prepare(lb, files, &interfaces, None)?;
        let cmd = command(&agent.config_dir);
        agent.run_child(cmd)?;
        Ok(agent)
    }

    /// Sends `sig` to the running agent.
    ///
    /// # Errors
    ///
    /// When the agent is not running or cannot be signalled.
    pub fn send_signal(&self, sig: i32) -> Result<()> {
        self.signal(sig)
    }
}
