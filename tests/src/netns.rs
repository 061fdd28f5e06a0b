//! Named network namespaces and the standard test topology, torn down by a guard.
//!
//! [`Topology::builder`] creates the namespaces and veths drawn in [`crate::addrs`]; dropping
//! the [`Topology`] (also while a test panics) deletes every namespace it created, which
//! destroys their veths, routes, nftables rules and XDP attachments with them. The harness
//! only ever runs `ip netns add/del` in the root namespace: every other command is scoped to a
//! test namespace (`ip -n NS …`, `ip netns exec NS …`), and veth peers are created directly
//! inside their namespaces, so the host's interfaces and routes are never touched.
//!
//! Names are `sy<pid hex>-<counter hex>-<role>` (roles `c`, `lb`, `rt`, `b1`…), at most 15
//! characters, unique per process and across processes; [`sweep_stale`] removes namespaces a
//! killed test process left behind (those whose pid is gone).
//!
//! # What the topology arranges, and why
//!
//! The lb namespace keeps the kernel's defaults: IP forwarding off, an empty neighbour table,
//! default offloads, no sysctls. Switchyard must work there as on a freshly installed
//! balancer. The client and the backends are configured only as the README ("Attach to a
//! real NIC") tells an operator to configure theirs: backends hold the VIPs on `lo` and never
//! answer ARP for them, announce a MAC change (`arp_notify`, `ndisc_notify`), send DSR
//! replies through their own router (the client namespace, over a return link) and NAT
//! replies, by a policy rule on their own source address, through the balancer; the client
//! and the backends filter reverse paths loosely, because DSR routes are asymmetric. The
//! optional router namespace forwards, as a router does. Addresses use `nodad`, so they work
//! at once without touching `accept_dad`.
//!
//! # Veth facts the topology handles (checked on Linux 6.18 by the `veth_facts_…` test)
//!
//! - A frame that the lb's XDP program sends into a veth with `XDP_TX` or `XDP_REDIRECT` is
//!   dropped unless the receiving end has an XDP program (only then does it run NAPI). The
//!   client's veth to the lb, every backend's veth to its gateway and the router's veth to
//!   the lb get a native-mode `XDP_PASS` program ([`crate::xdp_pass`]), attached through
//!   rtnetlink; the lb's own veths are left free for Switchyard.
//! - A veth leaves TCP/UDP checksums to "hardware" (`CHECKSUM_PARTIAL`); a frame forwarded by
//!   native XDP loses that skb state and arrives with a bad checksum. The client's and the
//!   backends' veths towards the lb run with `ethtool -K IF tx off` (the client's traffic
//!   crosses the lb's program; backend replies cross it in NAT mode). Return links carry no
//!   XDP-forwarded traffic and keep their offloads.

use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsFd as _, AsRawFd as _};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::addrs::{LB_CLIENT_IF, LB_ROUTER_IF, MAX_BACKENDS, lb_backend_if};
use crate::setup;

/// Prefix of every namespace the harness creates.
pub const NAME_PREFIX: &str = "sy";
/// Longest namespace name the harness creates (IFNAMSIZ - 1, so a name fits anywhere).
pub const MAX_NAME_LEN: usize = 15;
/// Where `ip netns` keeps its namespace handles.
pub const NETNS_DIR: &str = "/var/run/netns";

/// A named network namespace, `/var/run/netns/NAME`. A handle only: [`Topology`] owns them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// A handle for the namespace called `name` (which need not exist yet).
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }

    /// The namespace's name, as `ip netns list` shows it.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's handle file, `/var/run/netns/NAME`.
    #[must_use]
    pub fn path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.name)
    }

    /// Runs `ip netns exec NAME argv…` and returns its stdout; fails, with its stderr, unless
    /// it exits 0.
    ///
    /// # Errors
    ///
    /// As [`Netns::exec_with_stdin`].
    pub fn exec(&self, argv: &[&str]) -> Result<String> {
        self.exec_with_stdin(argv, None)
    }

    /// Like [`Netns::exec`], feeding `stdin` to the command.
    ///
    /// # Errors
    ///
    /// When `ip` cannot be started or fed, or the command exits non-zero (the error carries
    /// its stderr and the input).
    pub fn exec_with_stdin(&self, argv: &[&str], stdin: Option<&str>) -> Result<String> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).args(argv);
        run_checked(cmd, stdin)
    }

    /// Runs `ip netns exec NAME argv…` and returns its output whatever its exit status.
    ///
    /// # Errors
    ///
    /// When `ip` cannot be started.
    pub fn exec_output(&self, argv: &[&str]) -> Result<Output> {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(argv)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run `ip netns exec {} {argv:?}`", self.name))
    }

    /// Runs `ip -n NAME args…` and returns its stdout.
    ///
    /// # Errors
    ///
    /// When `ip` cannot be started, or exits non-zero (the error carries its stderr).
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut cmd = Command::new("ip");
        cmd.args(["-n", &self.name]).args(args);
        run_checked(cmd, None)
    }

    /// Runs `ip -n NAME -batch -` over `lines` (one `ip` command each, without the `ip`); stops
    /// at the first failing line.
    ///
    /// # Errors
    ///
    /// When `ip` cannot be started or fed, or a line fails (the error carries its stderr and
    /// the input).
    pub fn ip_batch(&self, lines: &[String]) -> Result<()> {
        let mut cmd = Command::new("ip");
        cmd.args(["-n", &self.name, "-batch", "-"]);
        run_checked(cmd, Some(&(lines.join("\n") + "\n"))).map(drop)
    }

    /// Sets sysctls inside the namespace (`sysctl -qw key=value …`).
    ///
    /// # Errors
    ///
    /// As [`Netns::exec`]: `sysctl` fails for an unknown key or a value it refuses.
    pub fn sysctl(&self, settings: &[(&str, &str)]) -> Result<()> {
        let pairs: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut argv = vec!["sysctl", "-qw"];
        argv.extend(pairs.iter().map(String::as_str));
        self.exec(&argv).map(drop)
    }

    /// Runs `f` on a fresh thread that has entered this namespace, and returns its result.
    ///
    /// Sockets opened in `f` belong to this namespace for their whole life, wherever they are
    /// used afterwards, so `f` may return them. A panic in `f` is resumed on the caller.
    ///
    /// # Errors
    ///
    /// When the thread cannot be spawned or cannot enter the namespace; `f` then does not run.
    pub fn run<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> Result<T> {
        let path = self.path();
        thread::scope(|s| {
            let handle = thread::Builder::new()
                .name(format!("in-{}", self.name))
                .spawn_scoped(s, move || -> Result<T> {
                    enter_netns_path(&path)?;
                    Ok(f())
                })
                .context("cannot spawn a thread")?;
            handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Spawns a long-running thread inside this namespace; returns once it has entered it.
    /// Threads that `f` spawns stay in the namespace too.
    ///
    /// # Errors
    ///
    /// When the thread cannot be spawned or cannot enter the namespace; `f` then does not run.
    pub fn spawn<T, F>(&self, f: F) -> Result<JoinHandle<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let path = self.path();
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<()>>(1);
        let handle = thread::Builder::new()
            .name(format!("in-{}", self.name))
            .spawn(move || {
                let entered = enter_netns_path(&path);
                let ok = entered.is_ok();
                // The receiver waits for exactly this message; it cannot be gone yet.
                let _ = tx.send(entered);
                if !ok {
                    // Never run `f` in the wrong namespace. The caller already has the error,
                    // so unwind without the panic hook's message.
                    std::panic::resume_unwind(Box::new(()));
                }
                f()
            })
            .context("cannot spawn a thread")?;
        match rx.recv() {
            Ok(Ok(())) => Ok(handle),
            Ok(Err(e)) => {
                let _ = handle.join();
                Err(e)
            }
            Err(_) => bail!("namespace thread for {} died", self.name),
        }
    }

    /// The kernel id of the XDP program on `iface` ([`Netns::xdp_program`]'s second word).
    ///
    /// # Errors
    ///
    /// As [`Netns::xdp_program`].
    pub fn xdp_program_id(&self, iface: &str) -> Result<Option<u32>> {
        Ok(self
            .xdp_program(iface)?
            .and_then(|p| p.split_whitespace().nth(1).and_then(|id| id.parse().ok())))
    }

    /// The XDP program attached to `iface` in this namespace, as `ip -d link` names it
    /// (`id 42 name switchyard`), or `None` when the interface has none.
    ///
    /// # Errors
    ///
    /// As [`Netns::ip`] (no such interface).
    pub fn xdp_program(&self, iface: &str) -> Result<Option<String>> {
        let text = self.ip(&["-d", "link", "show", "dev", iface])?;
        Ok(text.lines().find_map(|l| {
            let rest = l.trim().strip_prefix("prog/xdp ")?;
            let words: Vec<&str> = rest.split_whitespace().take(4).collect();
            Some(words.join(" "))
        }))
    }

    /// Whether `/var/run/netns/NAME` exists.
    #[must_use]
    pub fn exists(&self) -> bool {
        self.path().exists()
    }
}

/// Moves the *calling thread* into the namespace `name` (setns(2) on `/var/run/netns/NAME`).
/// Prefer [`Netns::run`], which does this on a thread of its own.
///
/// # Errors
///
/// When the namespace's handle file cannot be opened, or `setns` refuses.
pub fn enter_netns(name: &str) -> Result<()> {
    enter_netns_path(&Netns::new(name).path())
}

fn enter_netns_path(path: &std::path::Path) -> Result<()> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: setns only reads the descriptor, which `file` keeps open for the call; a network
    // namespace switch is allowed in a multi-threaded process and affects this thread only.
    let rc = unsafe { libc::setns(file.as_fd().as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("setns({}) failed", path.display()));
    }
    Ok(())
}

fn run_checked(mut cmd: Command, stdin: Option<&str>) -> Result<String> {
    let shown = format!("{cmd:?}");
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("cannot run {shown}"))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .with_context(|| format!("cannot write to {shown}"))?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            stdin.map(|s| format!("\ninput:\n{s}")).unwrap_or_default()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The names `ip netns list` shows.
///
/// # Errors
///
/// When `ip netns list` cannot be run or fails.
pub fn list_namespaces() -> Result<Vec<String>> {
    let out = run_checked(
        {
            let mut c = Command::new("ip");
            c.args(["netns", "list"]);
            c
        },
        None,
    )?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

/// The pid encoded in a name this harness generated (`sy<pid hex>-<counter hex>-<role>`).
fn harness_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let mut parts = rest.splitn(3, '-');
    let pid = u32::from_str_radix(parts.next()?, 16).ok()?;
    u32::from_str_radix(parts.next()?, 16).ok()?;
    let role = parts.next()?;
    let known = role == "c"
        || role == "et"
        || role == "lb"
        || role == "rt"
        || role == "sw"
        || role
            .strip_prefix("lb")
            .is_some_and(|n| n.parse::<u8>().is_ok())
        || role
            .strip_prefix('b')
            .is_some_and(|n| n.parse::<u8>().is_ok());
    known.then_some(pid)
}

/// Deletes namespaces that a harness process left behind when it was killed before its
/// guards ran (names in the harness format whose pid no longer exists). Returns their names.
/// Assumes every harness process on the machine shares this PID namespace (no containers).
///
/// # Errors
///
/// When the namespaces cannot be listed; one that cannot be deleted is left, and not
/// reported.
pub fn sweep_stale() -> Result<Vec<String>> {
    let mut swept = Vec::new();
    for name in list_namespaces()? {
        let Some(pid) = harness_pid(&name) else {
            continue;
        };
        if PathBuf::from(format!("/proc/{pid}")).exists() {
            continue;
        }
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "del", &name]);
        if run_checked(cmd, None).is_ok() {
            swept.push(name);
        }
    }
    Ok(swept)
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh tag for a set of namespaces, `sy<pid hex>-<counter hex>`, after sweeping what dead
/// harness processes left. Every harness that names namespaces takes its tag here, so two
/// topologies of one process never share a name (whatever their kind).
#[must_use]
pub fn unique_tag() -> String {
    // Best effort: a sweep failure must not stop this test.
    let _ = sweep_stale();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) % 0x100;
    format!("{NAME_PREFIX}{:x}-{n:x}", std::process::id())
}

/// How long [`TopologyBuilder::build`] waits for duplicate address detection to finish.
const LINK_LOCAL_LIMIT: Duration = Duration::from_secs(10);

/// Builds a [`Topology`]; see [`crate::addrs`] for what it creates.
#[derive(Debug, Clone)]
pub struct TopologyBuilder {
    backends: usize,
    routed: usize,
    router_return: bool,
    tag: Option<String>,
}

impl TopologyBuilder {
    /// Number of backend namespaces `b1..bN` attached directly to the lb (default 2; with a
    /// [`TopologyBuilder::routed_backend`], at most [`MAX_BACKENDS`] in all).
    #[must_use]
    pub fn backends(mut self, n: usize) -> Self {
        self.backends = n;
        self
    }

    /// Adds one backend behind a router namespace (`rt`): lb → router → backend, so the lb's
    /// next hop for it is the router. It is numbered after the directly attached backends
    /// (with `.backends(2)` it is `b3`) and has the same addresses and servers as any backend
    /// `I`; see [`crate::addrs`].
    #[must_use]
    pub fn routed_backend(mut self) -> Self {
        self.routed = 1;
        self
    }

    /// Like [`TopologyBuilder::routed_backend`], with `n` backends behind the router (each on
    /// its own link from it, numbered after the directly attached ones).
    #[must_use]
    pub fn routed_backends(mut self, n: usize) -> Self {
        self.routed = n;
        self
    }

    /// Gives the router a return link into the client namespace (the site's router, as each
    /// directly attached backend's return link is) and a host route to the client through it,
    /// so the routed backends' direct-server-return replies (source the VIP) reach the client
    /// without crossing the lb, which does not forward. The router filters reverse paths
    /// loosely then, as the README tells such a router to. NAT replies from routed backends
    /// would take that link too: a topology for DSR over IP-in-IP (`forward: ipip`).
    #[must_use]
    pub fn router_return_link(mut self) -> Self {
        self.router_return = true;
        self
    }

    /// Uses `tag` instead of the generated `sy<pid>-<n>` as the name prefix (e.g. a fixed one
    /// for the demo). It must start with `sy` and leave room for `-b<N>` within 15 characters.
    #[must_use]
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = Some(tag.into());
        self
    }

    /// Creates the namespaces, veths, addresses, routes, policy rules, sysctls and `XDP_PASS`
    /// programs, and waits until every IPv6 link-local address is usable (duplicate address
    /// detection done, up to about 2 s). On error, whatever was created is deleted again.
    ///
    /// # Errors
    ///
    /// When the backend count is out of range or the tag gives invalid names, or a step fails
    /// (an `ip` or `sysctl` command, an `XDP_PASS` attachment, addresses that do not become
    /// usable).
    pub fn build(self) -> Result<Topology> {
        let total = self.backends + self.routed;
        if self.backends == 0 || total > MAX_BACKENDS {
            bail!(
                "a topology needs 1..={MAX_BACKENDS} backends in all, at least one attached \
                 directly, not {} (+{} routed)",
                self.backends,
                self.routed
            );
        }
        if self.router_return && self.routed == 0 {
            bail!("a router return link needs a routed backend");
        }
        let tag = self.tag.unwrap_or_else(unique_tag);
        let ns = |role: &str| Netns::new(format!("{tag}-{role}"));
        let mut topo = Topology {
            client: ns("c"),
            lb: ns("lb"),
            router: (self.routed > 0).then(|| ns("rt")),
            router_return: self.router_return,
            direct: self.backends,
            backends: (1..=total).map(|i| ns(&format!("b{i}"))).collect(),
            tag,
            created: Vec::new(),
        };
        if !topo.tag.starts_with(NAME_PREFIX) {
            bail!(
                "namespace tag {:?} must start with {NAME_PREFIX:?}",
                topo.tag
            );
        }
        if let Some(long) = topo
            .namespaces()
            .into_iter()
            .find(|n| n.name().len() > MAX_NAME_LEN)
        {
            bail!(
                "namespace name {:?} is longer than {MAX_NAME_LEN}",
                long.name()
            );
        }
        topo.create()?;
        Ok(topo)
    }
}

/// The standard topology: a client, a load-balancer namespace and N backends, optionally one
/// more behind a router (see [`crate::addrs`] for the diagram). Dropping it deletes every
/// namespace it created.
#[derive(Debug)]
pub struct Topology {
    tag: String,
    client: Netns,
    lb: Netns,
    router: Option<Netns>,
    /// Whether the router has a return link into the client namespace.
    router_return: bool,
    /// How many of `backends` (the first ones) are attached directly to the lb.
    direct: usize,
    backends: Vec<Netns>,
    /// Namespaces that exist and are ours to delete, in creation order.
    created: Vec<Netns>,
}

impl Topology {
    /// A builder for a topology with 2 directly attached backends, no routed backend and a
    /// generated, unique tag.
    #[must_use]
    pub fn builder() -> TopologyBuilder {
        TopologyBuilder {
            backends: 2,
            routed: 0,
            router_return: false,
            tag: None,
        }
    }

    /// The prefix shared by this topology's namespace names.
    #[must_use]
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The client namespace.
    #[must_use]
    pub fn client(&self) -> &Netns {
        &self.client
    }

    /// The load-balancer namespace (where Switchyard or the nftables baseline runs).
    #[must_use]
    pub fn lb(&self) -> &Netns {
        &self.lb
    }

    /// Backend namespace `i`, 1-based like its name `bI`.
    ///
    /// # Panics
    /// If there is no backend `i`.
    #[must_use]
    pub fn backend(&self, i: usize) -> &Netns {
        assert!(
            (1..=self.backends.len()).contains(&i),
            "no backend {i} in a topology of {}",
            self.backends.len()
        );
        &self.backends[i - 1]
    }

    /// Number of backends, the routed one included.
    #[must_use]
    pub fn backend_count(&self) -> usize {
        self.backends.len()
    }

    /// Number of backends attached directly to the lb (`b1..bN`, the first ones).
    #[must_use]
    pub fn direct_backend_count(&self) -> usize {
        self.direct
    }

    /// The router namespace in front of the routed backend, if the topology has one.
    #[must_use]
    pub fn router(&self) -> Option<&Netns> {
        self.router.as_ref()
    }

    /// The index of the routed backend (the last one), if the topology has one.
    #[must_use]
    pub fn routed_backend(&self) -> Option<usize> {
        self.router.as_ref().map(|_| self.backends.len())
    }

    /// The indexes of the backends behind the router (empty without one).
    #[must_use]
    pub fn routed_backends(&self) -> std::ops::Range<usize> {
        if self.router.is_some() {
            self.direct + 1..self.backends.len() + 1
        } else {
            0..0
        }
    }

    /// The lb's interfaces, in the order an agent attaches to them: towards the client, each
    /// directly attached backend (`to-b1…`), then the router (`to-rt`) if there is one.
    pub fn lb_interfaces(&self) -> Vec<String> {
        let mut names = vec![LB_CLIENT_IF.to_owned()];
        names.extend((1..=self.direct).map(lb_backend_if));
        if self.router.is_some() {
            names.push(LB_ROUTER_IF.to_owned());
        }
        names
    }

    /// The backend namespaces, b1 first.
    #[must_use]
    pub fn backends(&self) -> &[Netns] {
        &self.backends
    }

    /// Every namespace of the topology: client, lb, the router if any, then the backends.
    #[must_use]
    pub fn namespaces(&self) -> Vec<&Netns> {
        [&self.client, &self.lb]
            .into_iter()
            .chain(&self.router)
            .chain(&self.backends)
            .collect()
    }

    /// Deletes the namespaces now and reports the first failure (dropping does the same and
    /// only logs failures).
    ///
    /// # Errors
    ///
    /// The first namespace that could not be deleted (the others are deleted all the same).
    pub fn teardown(mut self) -> Result<()> {
        self.delete_all()
    }

    fn delete_all(&mut self) -> Result<()> {
        let mut first_error = None;
        while let Some(ns) = self.created.pop() {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "del", ns.name()]);
            if let Err(e) = run_checked(cmd, None) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn create(&mut self) -> Result<()> {
        for ns in self.namespaces().into_iter().cloned().collect::<Vec<_>>() {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "add", ns.name()]);
            run_checked(cmd, None)?;
            self.created.push(ns);
        }
        setup::Plan {
            client: &self.client,
            lb: &self.lb,
            router: self.router.as_ref(),
            router_return: self.router_return,
            direct: &self.backends[..self.direct],
            routed: &self.backends[self.direct..],
        }
        .apply()?;
        self.wait_for_link_local_addresses(LINK_LOCAL_LIMIT)
    }

    /// Waits until no IPv6 address in any namespace is tentative. The kernel runs duplicate
    /// address detection on every link-local address (the topology's own addresses skip it
    /// with `nodad`; the lb's defaults are left alone), which takes up to about 2 s after a
    /// link comes up; until then a host cannot send neighbour solicitations from it, so IPv6
    /// next hops cannot be resolved. A real network's links have long been up.
    fn wait_for_link_local_addresses(&self, limit: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            let mut waiting = Vec::new();
            for ns in self.namespaces() {
                if !ns
                    .ip(&["-6", "addr", "show", "tentative"])?
                    .trim()
                    .is_empty()
                {
                    waiting.push(ns.name().to_owned());
                }
            }
            if waiting.is_empty() {
                return Ok(());
            }
            if start.elapsed() > limit {
                bail!("IPv6 addresses still tentative after {limit:?} in {waiting:?}");
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if let Err(e) = self.delete_all() {
            // Drop cannot fail; a leftover is also removed by the next sweep_stale().
            let _ = writeln!(std::io::stderr(), "topology {} teardown: {e:#}", self.tag);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harness_names_are_recognized_for_sweeping() {
        assert_eq!(harness_pid("sy1f2e-0-lb"), Some(0x1f2e));
        assert_eq!(harness_pid("sy3fffff-ff-b32"), Some(0x003f_ffff));
        assert_eq!(harness_pid("sy1f2e-0-c"), Some(0x1f2e));
        assert_eq!(harness_pid("sy1f2e-0-rt"), Some(0x1f2e));
        assert_eq!(harness_pid("sydemo-lb"), None);
        assert_eq!(harness_pid("sy1f2e-0-x"), None);
        assert_eq!(harness_pid("other"), None);
        assert!("sy3fffff-ff-b32".len() <= MAX_NAME_LEN);
    }
}
