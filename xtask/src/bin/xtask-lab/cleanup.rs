//! Leaving nothing behind: Ctrl-C handling and sweeps of what a demo creates.
//!
//! A demo owns, by name: network namespaces `sy<pid hex>-…` (the harness's naming), the pin
//! directory [`pin_path`] and temporary folders `switchyard-*-<pid>-*`. Its guards (the
//! [`router_tests::netns::Topology`] and the [`router_tests::agent::Agent`]) remove them on
//! drop, including on errors; [`sweep_own`] then checks and removes anything still there.
//!
//! On the first Ctrl-C (SIGINT, also SIGTERM or SIGHUP) the demo finishes its current step,
//! which takes at most a few seconds, and unwinds through those guards. On a second one, a
//! watcher thread sweeps at once and exits with status 130.

use std::{
    fs,
    path::PathBuf,
    process::{Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use router_tests::netns::{self, NAME_PREFIX};

/// Signals received so far.
static SIGNALS: AtomicUsize = AtomicUsize::new(0);
/// Where demo pins go: `/sys/fs/bpf/switchyard-demo-<pid>`.
const PIN_PREFIX: &str = router_tests::agent::DEMO_PIN_PREFIX;

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

/// Installs the signal handlers and the watcher thread.
pub fn install() -> Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler only
        // performs an atomic store. SA_RESTART keeps blocking calls in other threads going.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&raw mut action.sa_mask);
            libc::sigaction(sig, &raw const action, std::ptr::null_mut())
        };
        if rc != 0 {
            bail!("sigaction: {}", std::io::Error::last_os_error());
        }
    }
    thread::Builder::new()
        .name("signal-watch".into())
        .spawn(|| {
            let mut told = false;
            loop {
                thread::sleep(Duration::from_millis(50));
                match SIGNALS.load(Ordering::SeqCst) {
                    1 if !told => {
                        told = true;
                        eprintln!(
                            "\n*** interrupted: finishing the current step, then removing \
                             everything (Ctrl-C again to remove it at once) ***"
                        );
                    }
                    0 | 1 => {}
                    _ => {
                        eprintln!("\n*** interrupted twice: removing everything now ***");
                        // The main thread keeps running meanwhile and may still create a
                        // namespace or pin: sweep until a pass finds nothing. Whatever still
                        // slips through is removed by the next demo's sweep_stale.
                        for _ in 0..5 {
                            let removed = sweep_own();
                            if removed.is_empty() {
                                break;
                            }
                            for line in removed {
                                eprintln!("  removed {line}");
                            }
                            thread::sleep(Duration::from_millis(100));
                        }
                        std::process::exit(130);
                    }
                }
            }
        })?;
    Ok(())
}

/// Whether a signal arrived.
pub fn interrupted() -> bool {
    SIGNALS.load(Ordering::SeqCst) > 0
}

/// Fails with "interrupted" once a signal arrived: call it between steps.
pub fn checkpoint() -> Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

/// This process's pin directory (`agent.pin_path` of the demo's config).
pub fn pin_path() -> PathBuf {
    PathBuf::from(format!("{PIN_PREFIX}{}", std::process::id()))
}

fn own_namespace_prefix(pid: u32) -> String {
    format!("{NAME_PREFIX}{pid:x}-")
}

/// Removes whatever this process created that is still there, in an order that leaves
/// nothing running: processes inside its namespaces (the agent) first, then its pins (which
/// detaches the program), its namespaces and its temporary folders. Returns what it removed.
pub fn sweep_own() -> Vec<String> {
    let pid = std::process::id();
    let prefix = own_namespace_prefix(pid);
    let ours: Vec<String> = netns::list_namespaces()
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    let mut removed = Vec::new();
    for ns in &ours {
        for p in stop_processes_in(ns, pid) {
            removed.push(format!("process {p} in namespace {ns}"));
        }
    }
    let pins = pin_path();
    if pins.exists() && fs::remove_dir_all(&pins).is_ok() {
        removed.push(format!("pins {}", pins.display()));
    }
    for ns in ours {
        if run_quiet("ip", &["netns", "del", &ns]) {
            removed.push(format!("namespace {ns}"));
        }
    }
    let tmp = std::env::temp_dir();
    let marker = format!("-{pid}-");
    for entry in fs::read_dir(&tmp).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("switchyard-") && name.contains(&marker) {
            let path = entry.path();
            let gone = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            if gone.is_ok() {
                removed.push(path.display().to_string());
            }
        }
    }
    removed
}

/// Removes what earlier demos (and test runs) left when they were killed before cleaning up:
/// harness namespaces and demo pin directories whose process is gone. Returns their names.
pub fn sweep_stale() -> Vec<String> {
    let mut removed = netns::sweep_stale().unwrap_or_default();
    let dir = PathBuf::from(PIN_PREFIX);
    let (Some(parent), Some(stem)) = (dir.parent(), dir.file_name()) else {
        return removed;
    };
    let stem = stem.to_string_lossy().into_owned();
    for entry in fs::read_dir(parent).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(&stem).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !PathBuf::from(format!("/proc/{pid}")).exists()
            && fs::remove_dir_all(entry.path()).is_ok()
        {
            removed.push(entry.path().display().to_string());
        }
    }
    removed
}

/// Stops the processes running in namespace `ns` (only this process's children run there):
/// SIGTERM, then SIGKILL after 3 s. Never signals `own_pid`. Returns the pids it signalled.
fn stop_processes_in(ns: &str, own_pid: u32) -> Vec<u32> {
    let pids = |ns: &str| -> Vec<u32> {
        let out = Command::new("ip")
            .args(["netns", "pids", ns])
            .stderr(Stdio::null())
            .output();
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .filter(|&p| p != own_pid)
                .collect()
        })
        .unwrap_or_default()
    };
    let first = pids(ns);
    for &p in &first {
        signal(p, libc::SIGTERM);
    }
    let start = Instant::now();
    while !pids(ns).is_empty() && start.elapsed() < Duration::from_secs(3) {
        thread::sleep(Duration::from_millis(50));
    }
    for p in pids(ns) {
        // It ignored SIGTERM for 3 s.
        signal(p, libc::SIGKILL);
    }
    first
}

/// Sends `sig` to process `pid`. A pid that does not fit a `pid_t` is skipped: cast, it would
/// turn negative and name a process group.
fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: plain kill(2) on a pid found inside a namespace this process created.
        unsafe { libc::kill(pid, sig) };
    }
}

fn run_quiet(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
