//! `switchyard`: attach the XDP load balancer to interfaces, validate rule files, and inspect
//! the running system.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context as _, Result, bail};
use clap::{CommandFactory as _, Parser, Subcommand};
use switchyard::{
    agent::{self, Options},
    cli, config,
    dataplane::{attach, attach::Mode, decap, load, upgrade},
    service,
};

/// Kernel-level L4 failover load balancer (eBPF/XDP).
#[derive(Parser)]
#[command(name = "switchyard", version, about)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

const DEFAULT_DIR: &str = "/etc/switchyard";

#[derive(Subcommand)]
enum FleetCmd {
    /// Show every node of the fleet and how far behind it is.
    Status {
        /// Directory of `*.yaml` fragments whose `fleet:` names the etcd cluster.
        #[arg(long, default_value = DEFAULT_DIR)]
        config_dir: PathBuf,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum Cmd {
    /// Load the program, attach it to interfaces, apply the config and keep running (probes,
    /// metrics, local API). The program stays attached when the agent exits. SIGHUP applies the
    /// config directory again; under systemd it tells the service manager when it is ready.
    Attach {
        /// Interface to attach to; repeat for several (e.g. the client side and each backend side).
        /// Without it, the names in $SWITCHYARD_IFACES (separated by spaces or commas; the
        /// service sets it from /etc/default/switchyard); with neither, it exits with status 2.
        #[expect(
            clippy::doc_markdown,
            reason = "this doc comment is the option's --help text, printed as written"
        )]
        #[arg(long = "iface")]
        interfaces: Vec<String>,
        /// XDP mode of a new attachment: native (driver; the default) or generic (skb).
        /// Falling back is never automatic. A program already attached is adopted in the mode
        /// it runs in; when that is not the mode given here, the log and `status` warn.
        #[arg(long, value_enum)]
        mode: Option<Mode>,
        /// Directory of `*.yaml` fragments.
        #[arg(long, default_value = DEFAULT_DIR)]
        config_dir: PathBuf,
    },
    /// Detach the program from interfaces (removes the pinned link).
    Detach {
        /// Interface to detach from; repeat for several.
        #[arg(long = "iface", required = true)]
        interfaces: Vec<String>,
        /// Keep the pinned maps (for a later `attach` to adopt).
        #[arg(long)]
        keep_maps: bool,
        /// Directory of `*.yaml` fragments (for `agent.pin_path`).
        #[arg(long, default_value = DEFAULT_DIR)]
        config_dir: PathBuf,
    },
    /// Replace the running XDP program on interfaces with the one in this binary, in one
    /// atomic step per interface (bpf_link update): the pinned maps are kept, no packet meets
    /// a missing program, and a running agent keeps working. Refuses, changing nothing, when
    /// the pinned maps have another layout.
    #[expect(
        clippy::doc_markdown,
        reason = "this doc comment is the command's --help text, printed as written"
    )]
    Upgrade {
        /// Interface whose program to replace; repeat for several.
        #[arg(long = "iface", required = true)]
        interfaces: Vec<String>,
        /// Directory of `*.yaml` fragments (for `agent.pin_path`).
        #[arg(long, default_value = DEFAULT_DIR)]
        config_dir: PathBuf,
    },
    /// Check a config directory: every error with file, line and key path, then lint warnings
    /// about decision groups. Exit 1 on errors (warnings alone exit 0).
    Validate {
        /// Directory of `*.yaml` fragments (default /etc/switchyard).
        dir: Option<PathBuf>,
        /// The same directory, spelled as every other command takes it.
        #[arg(long, value_name = "DIR", conflicts_with = "dir")]
        config_dir: Option<PathBuf>,
    },
    /// Show the running agent: interfaces, services, pools, backend health, generation.
    Status {
        /// Directory of `*.yaml` fragments: the agent running for it is found through the
        /// record it keeps in /run/switchyard, else through the directory's `agent.api`.
        #[arg(long, default_value = DEFAULT_DIR)]
        config_dir: PathBuf,
        /// The agent's API, e.g. http://127.0.0.1:9900 (overrides the record and the config).
        #[expect(
            clippy::doc_markdown,
            reason = "this doc comment is the option's --help text, printed as written"
        )]
        #[arg(long)]
        api: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// A fleet's convergence, read from etcd (`fleet:` of the directory): every node, the
    /// decision revision and generation it runs, and how far behind it is.
    Fleet {
        #[command(subcommand)]
        cmd: FleetCmd,
    },
    /// Operator commands over the local API: state, overrides, decisions, explain, what-if;
    /// config versions, diff, rollback, apply.
    Ctl {
        /// Directory of `*.yaml` fragments: the agent running for it is found through the
        /// record it keeps in /run/switchyard, else through the directory's `agent.api`.
        /// Accepted before or after the command.
        #[arg(long, default_value = DEFAULT_DIR, global = true)]
        config_dir: PathBuf,
        /// The agent's API, e.g. http://127.0.0.1:9900 (overrides the record and the config).
        #[expect(
            clippy::doc_markdown,
            reason = "this doc comment is the option's --help text, printed as written"
        )]
        #[arg(long, global = true)]
        api: Option<String>,
        /// Print the agent's answer as its API sent it (JSON) instead of a table or sentence.
        /// Accepted before or after the command.
        #[arg(long, global = true)]
        json: bool,
        /// The command.
        #[command(subcommand)]
        cmd: cli::ctl::Ctl,
    },
    /// On a backend of a `forward: ipip` service: attach the IP-in-IP decapsulator to an
    /// interface (it strips the outer header of IPv4-in-IPv4 and IPv6-in-IPv6 packets, so the
    /// inner packet reaches the VIP on lo with no tunnel device or ipip module). It stays
    /// attached after the command exits (a pinned link), until `--detach`.
    Decap {
        /// Interface the encapsulated packets arrive on; repeat for several.
        #[arg(long = "iface", required = true)]
        interfaces: Vec<String>,
        /// Remove the decapsulator instead.
        #[arg(long)]
        detach: bool,
        /// XDP mode: native (driver, the default) or generic (skb). A decapsulator already
        /// attached keeps the mode it runs in.
        #[arg(long, value_enum)]
        mode: Option<Mode>,
        /// bpffs directory; the links are pinned in its `decap/` subdirectory.
        #[arg(long, default_value = config::DEFAULT_PIN_PATH)]
        pin_path: PathBuf,
    },
    /// A live view of the running agent, refreshed every second from its API: services with
    /// pps and bps; pools with backends, health, weights and flows; decision groups with the
    /// active rule and the last switches; drops by reason. Keys: q or Esc quits (exit 0), s
    /// sorts, / filters, c clears the filter, p pauses. When the agent is lost (its connection
    /// refused, its token refused, or 3 polls in a row failed) it restores the terminal, says
    /// why and exits 1.
    Top {
        /// Directory of `*.yaml` fragments: the agent running for it is found through the
        /// record it keeps in /run/switchyard, else through the directory's `agent.api`; its
        /// `agent.api_token_file` is read for the token.
        #[arg(long, default_value = DEFAULT_DIR)]
        config_dir: PathBuf,
        /// The agent's API, e.g. http://127.0.0.1:9900 (overrides the record and the config).
        #[expect(
            clippy::doc_markdown,
            reason = "this doc comment is the option's --help text, printed as written"
        )]
        #[arg(long)]
        api: Option<String>,
    },
    /// List the pinned maps, what each holds, and the bpftool command that dumps it.
    Maps {
        /// Directory of `*.yaml` fragments (for `agent.pin_path`).
        #[arg(long, default_value = DEFAULT_DIR)]
        config_dir: PathBuf,
    },
    /// List the tracked flows (connection tracking), filtered by virtual IP, service, backend
    /// or client prefix: client, virtual IP, service, pool, backend, state and idle time. With
    /// --purge, delete them instead: their next packets are new flows, selected afresh.
    Flows(cli::flows::FlowsArgs),
    /// Where a new flow from CLIENT to VIP would go and why, from the live maps: the service,
    /// its decision word and the active rule, the pool, the Maglev slot, the backend, and
    /// whether a tracked flow overrides that.
    Trace(cli::flows::TraceArgs),
    /// Print the shell completion script for SHELL (the package installs bash, zsh and fish).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the manual pages (switchyard.1 and one per command, roff) into DIR.
    Man {
        /// Directory to write them to; created if missing.
        dir: PathBuf,
    },
}

/// Exit status of a usage error (as clap's): the service does not restart on it.
const USAGE: u8 = 2;

fn require_root(what: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("{what} needs root (CAP_BPF and CAP_NET_ADMIN); run it with sudo");
    }
    Ok(())
}

/// Printing commands die quietly on a closed pipe (`switchyard maps | head`) like other Unix
/// tools, instead of panicking in `println!`. Not for the agent: its sockets rely on EPIPE.
fn default_sigpipe() {
    // SAFETY: resetting a signal disposition to its default before any thread is started.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// `switchyard attach`: runs the agent until SIGINT or SIGTERM.
fn attach_command(opts: Options) -> Result<()> {
    require_root("attach")?;
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    // The event loop runs as a task on the runtime's workers, not on this thread: a command
    // from an API handler then wakes it on the handler's own worker, instead of waking a
    // parked thread.
    rt.block_on(async { tokio::spawn(agent::run(opts)).await })
        .context("the agent's event loop stopped")??;
    Ok(())
}

/// `switchyard fleet status`: reads the fleet's keys from the etcd that `fleet:` of `dir` names.
fn fleet_status(dir: &Path, json: bool) -> Result<()> {
    let cfg = config::load_dir(dir)?;
    let Some(fleet) = cfg.fleet else {
        bail!("{}: no fleet: section", dir.display());
    };
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    let view = rt
        .block_on(switchyard::fleet::view(&fleet))
        .map_err(anyhow::Error::msg)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", cli::fleet_text(&view));
    }
    Ok(())
}

fn run(args: Args) -> Result<ExitCode> {
    if !matches!(args.cmd, Cmd::Attach { .. }) {
        default_sigpipe();
    }
    match args.cmd {
        Cmd::Attach {
            interfaces,
            mode,
            config_dir,
        } => {
            let Some(interfaces) = attach_interfaces(interfaces) else {
                return Ok(ExitCode::from(USAGE));
            };
            attach_command(Options {
                interfaces,
                mode,
                config_dir,
            })?;
        }
        Cmd::Detach {
            interfaces,
            keep_maps,
            config_dir,
        } => detach_command(&interfaces, keep_maps, &config_dir)?,
        Cmd::Upgrade {
            interfaces,
            config_dir,
        } => {
            require_root("upgrade")?;
            let pin_path = cli::pin_path(&config_dir);
            for u in upgrade::upgrade(&pin_path, &interfaces)? {
                println!(
                    "{}: link {} now runs program {} (was {}); maps kept",
                    u.iface, u.link_id, u.new_program, u.old_program
                );
            }
        }
        Cmd::Validate { dir, config_dir } => {
            let dir = config_dir
                .or(dir)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
            match config::load_dir(&dir) {
                Ok(cfg) => {
                    for warning in config::lint(&cfg) {
                        println!("warning: {warning}");
                    }
                    println!(
                        "{}: valid ({} services, {} pools, {} state variables, {} decision groups)",
                        dir.display(),
                        cfg.services.len(),
                        cfg.pools.len(),
                        cfg.state.len(),
                        cfg.decisions.len()
                    );
                }
                Err(e) => {
                    eprintln!("{e}");
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        Cmd::Fleet {
            cmd: FleetCmd::Status { config_dir, json },
        } => fleet_status(&config_dir, json)?,
        Cmd::Status {
            config_dir,
            api,
            json,
        } => {
            let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
            rt.block_on(cli::status(&config_dir, api.as_deref(), json))?;
        }
        Cmd::Decap {
            interfaces,
            detach,
            mode,
            pin_path,
        } => decap_command(&interfaces, detach, mode, &pin_path)?,
        Cmd::Maps { config_dir } => cli::maps(&config_dir),
        Cmd::Completions { shell } => clap_complete::generate(
            shell,
            &mut Args::command(),
            "switchyard",
            &mut std::io::stdout(),
        ),
        Cmd::Man { dir } => write_man(&dir)?,
        Cmd::Top { config_dir, api } => cli::top::run(&config_dir, api.as_deref())?,
        Cmd::Ctl {
            config_dir,
            api,
            json,
            cmd,
        } => {
            let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
            rt.block_on(cli::ctl::run(&config_dir, api.as_deref(), json, cmd))?;
        }
        Cmd::Flows(args) => cli::flows::run_flows(args)?,
        Cmd::Trace(args) => cli::flows::run_trace(&args)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The interfaces `attach` attaches to: `given` (`--iface`), else those of
/// `$SWITCHYARD_IFACES`; `None`, with the error printed, when neither names one.
fn attach_interfaces(given: Vec<String>) -> Option<Vec<String>> {
    if !given.is_empty() {
        return Some(given);
    }
    let named = service::interfaces_from(&std::env::var(service::IFACES_ENV).unwrap_or_default());
    if named.is_empty() {
        eprintln!(
            "{}switchyard attach: no interface to attach to: give --iface IFACE (repeat for \
             several) or set {} (the service reads it from /etc/default/switchyard)",
            service::stderr_prefix(log::Level::Error),
            service::IFACES_ENV
        );
        return None;
    }
    Some(named)
}

/// `switchyard man DIR`: one roff page per command (`switchyard.1`, `switchyard-attach.1`, …).
fn write_man(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    clap_mangen::generate_to(Args::command(), dir)
        .with_context(|| format!("writing the manual pages into {}", dir.display()))
}

/// `switchyard decap`: attaches (or with `detach`, removes) the decapsulator on each
/// interface.
fn decap_command(
    interfaces: &[String],
    detach: bool,
    asked: Option<Mode>,
    pin_path: &Path,
) -> Result<()> {
    let mode = asked.unwrap_or(Mode::Native);
    require_root("decap")?;
    // Every interface must exist before the first is changed: a missing one changes nothing.
    for iface in interfaces {
        attach::ifindex(iface)?;
    }
    for iface in interfaces {
        if detach {
            decap::detach(iface, pin_path)?;
            println!("{iface}: decapsulator detached");
            continue;
        }
        match decap::attach(iface, mode, pin_path)? {
            attach::Attached::Adopted(running) => {
                println!("{iface}: decapsulator already attached ({running} mode)");
                if let Some(m) = attach::ModeMismatch::of(asked, running) {
                    println!(
                        "{iface}: --mode {} was asked for; it keeps running in {running} mode \
                         (to change it: switchyard decap --detach --iface {iface}, then attach \
                         again)",
                        m.asked.name()
                    );
                }
            }
            attach::Attached::New => {
                println!("{iface}: decapsulator attached ({})", mode.name());
            }
            attach::Attached::Replaced(why) => println!(
                "{iface}: decapsulator attached ({}), replacing a defunct link ({why})",
                mode.name()
            ),
        }
    }
    Ok(())
}

/// The error and its causes, each cause once: library errors already quote their cause in
/// their message, so a cause is appended only when the text so far does not contain it.
fn report(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}

fn main() -> ExitCode {
    service::init_logging();
    // Before any HTTP client is built (reqwest's TLS needs a process-wide rustls provider).
    switchyard::probe::protocols::install_crypto_provider();
    match run(Args::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!(
                "{}switchyard: {}",
                service::stderr_prefix(log::Level::Error),
                report(&e)
            );
            ExitCode::FAILURE
        }
    }
}

/// Withdraws the announcement routes `announce:` of the directory names (`switchyard detach`),
/// printing what it did; the settings, to withdraw again after the detach. A directory that
/// cannot be read or has no `announce:` withdraws nothing.
fn withdraw_announcements(config_dir: &std::path::Path) -> Option<switchyard::config::Announce> {
    let settings = match config::load_dir(config_dir) {
        Ok(cfg) => cfg.announce?,
        Err(e) => {
            eprintln!(
                "warning: {}: {e}; announcement routes (announce:) not withdrawn",
                config_dir.display()
            );
            return None;
        }
    };
    withdraw_routes(&settings);
    Some(settings)
}

/// Withdraws the routes of `settings`, printing how many.
fn withdraw_routes(settings: &switchyard::config::Announce) {
    let done = tokio::runtime::Runtime::new()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            rt.block_on(switchyard::announce::withdraw(settings))
                .map_err(|e| e.to_string())
        });
    match done {
        Ok(0) => {}
        Ok(n) => println!("{}: withdrew {n} announcement routes", settings.interface),
        Err(e) => eprintln!("warning: withdrawing the announcement routes: {e}"),
    }
}

/// `switchyard detach`: withdraws the announcement routes, unpins the links of `interfaces`
/// (keeping the maps with `keep_maps`), and withdraws again.
fn detach_command(
    interfaces: &[String],
    keep_maps: bool,
    config_dir: &std::path::Path,
) -> Result<()> {
    require_root("detach")?;
    let pin_dir = load::pin_dir(&cli::pin_path(config_dir));
    // The announcement goes before the program: the router stops sending the virtual
    // IPs here first. A running agent sees the links gone and announces nothing more;
    // withdrawn again after the detach for one that announced in between.
    let announce = withdraw_announcements(config_dir);
    for iface in interfaces {
        let done = attach::detach(&pin_dir, iface, keep_maps)?;
        if let Some(why) = &done.defunct {
            println!("{iface}: removed the defunct link ({why}); nothing ran on {iface} here");
        } else if done.dir == pin_dir {
            println!("{iface}: detached");
        } else {
            println!(
                "{iface}: detached (a program of another layout, {})",
                done.dir.display()
            );
        }
    }
    if let Some(settings) = &announce {
        withdraw_routes(settings);
    }
    Ok(())
}
