//! BIRD 2 in test namespaces, and the fleet topology: a router running BIRD with ECMP
//! multipath toward N balancers, each running BIRD and a real `switchyard attach`, DSR
//! backends on a segment all balancers share, and a client behind the router.
//!
//! ```text
//!   client ──c0── router ──lb1── [up] balancer 1 [down] ──┐
//!   198.18.10.2   (BIRD,  ──lb2── [up] balancer 2 [down] ──┤ switch (bridge br0)
//!                 ECMP)   ──lb3── [up] balancer 3 [down] ──┤   198.18.20.0/24
//!                    └──sw───────────────────────────────────┤
//!                                            backends b1, b2 ┘ (VIP on lo, DSR)
//! ```
//!
//! Router link N: 198.18.1N.0/24 (router .1, balancer .2); the backend segment 198.18.20.0/24
//! (router .1, balancer N .1N, backend I .10I). The router forwards and hashes flows over the
//! balancers by their 5-tuple (`fib_multipath_hash_policy=1`); backends reply to the client
//! through the router (DSR). The BIRD configurations are [`balancer_config`] and
//! [`router_config`], which the README's "Announce VIPs over BGP" section gives operators.
//! IPv4 only. Dropping a [`Fleet`] deletes its namespaces; dropping a [`Bird`] kills it.

use std::fmt::Write as _;
use std::fs;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::agent::temp_dir;
use crate::netns::{Netns, unique_tag};
use crate::xdp_pass;

/// The router's AS.
pub const ROUTER_AS: u32 = 65000;
/// The balancers' AS (all of them: their routes are equal for ECMP).
pub const BALANCER_AS: u32 = 65001;
/// The balancer's interface toward the router.
pub const UP_IF: &str = "uplink";
/// The balancer's interface on the backend segment.
pub const DOWN_IF: &str = "downlink";
/// The client's interface.
pub const CLIENT_IF: &str = "eth0";
/// A backend's interface.
pub const BACKEND_IF: &str = "eth0";

/// The router's address on its link to balancer `n` (1-based).
#[must_use]
pub fn router_side(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 10 + octet(n), 1)
}

/// Balancer `n`'s address on its link to the router.
#[must_use]
pub fn balancer_up(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 10 + octet(n), 2)
}

/// Balancer `n`'s address on the backend segment.
#[must_use]
pub fn balancer_down(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 20, 10 + octet(n))
}

/// Backend `i`'s address (1-based).
#[must_use]
pub fn backend(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 20, 100 + octet(i))
}

/// The client's address.
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 10, 2);
/// The router's address toward the client.
pub const ROUTER_CLIENT_SIDE: Ipv4Addr = Ipv4Addr::new(198, 18, 10, 1);
/// The router's address on the backend segment (the backends' default gateway).
pub const ROUTER_BACKEND_SIDE: Ipv4Addr = Ipv4Addr::new(198, 18, 20, 1);

fn octet(n: usize) -> u8 {
    u8::try_from(n).unwrap_or(u8::MAX)
}

/// BFD timers of both ends: 100 ms × 3, a silent peer is down after 300 ms.
pub const BFD_INTERVAL_MS: u32 = 100;
/// BFD detection multiplier.
pub const BFD_MULTIPLIER: u32 = 3;

/// The BIRD configuration of a balancer, as the README gives it: BGP to the router with BFD,
/// exporting the host routes the agent adds on `dummy` with route protocol `protocol`
/// (`announce:` defaults: `switchyard0`, 83), learnt from the kernel's main table.
#[must_use]
pub fn balancer_config(
    local: Ipv4Addr,
    router: Ipv4Addr,
    up_if: &str,
    dummy: &str,
    protocol: u8,
) -> String {
    format!(
        r#"router id {local};

protocol device {{
}}

# The agent's announcement routes: host routes of protocol {protocol} on {dummy}.
protocol kernel switchyard {{
    learn;
    ipv4 {{
        import where krt_source = {protocol} && ifname = "{dummy}";
        export none;
    }};
}}

protocol bfd {{
    interface "{up_if}" {{
        min rx interval {BFD_INTERVAL_MS} ms;
        min tx interval {BFD_INTERVAL_MS} ms;
        multiplier {BFD_MULTIPLIER};
    }};
}}

protocol bgp uplink {{
    local {local} as {BALANCER_AS};
    neighbor {router} as {ROUTER_AS};
    bfd on;
    ipv4 {{
        import none;
        export where proto = "switchyard";
    }};
}}
"#
    )
}

/// The BIRD configuration of the router, as the README gives it: a BGP session with BFD to
/// each balancer (`neighbors`), host routes inside `vip_range` (`198.18.0.0/24`) accepted, and
/// equal routes merged into one multipath kernel route.
#[must_use]
pub fn router_config(router_id: Ipv4Addr, neighbors: &[Ipv4Addr], vip_range: &str) -> String {
    let mut text = format!(
        r#"router id {router_id};

protocol device {{
}}

protocol kernel {{
    merge paths on;
    ipv4 {{
        import none;
        export all;
    }};
}}

protocol bfd {{
    interface "*" {{
        min rx interval {BFD_INTERVAL_MS} ms;
        min tx interval {BFD_INTERVAL_MS} ms;
        multiplier {BFD_MULTIPLIER};
    }};
}}

template bgp balancer {{
    local as {ROUTER_AS};
    bfd on;
    ipv4 {{
        import where net ~ [ {vip_range}{{32,32}} ];
        export none;
    }};
}}
"#
    );
    for (k, n) in neighbors.iter().enumerate() {
        let _ = writeln!(
            text,
            "\nprotocol bgp lb{} from balancer {{\n    neighbor {n} as {BALANCER_AS};\n}}",
            k + 1
        );
    }
    text
}

/// A BIRD daemon in a namespace, in the foreground; dropping it kills it and removes its
/// directory.
#[derive(Debug)]
pub struct Bird {
    ns: Netns,
    child: Option<Child>,
    dir: PathBuf,
}

impl Bird {
    /// Starts `bird -f` in `ns` with `config` and waits until `birdc` answers (up to 5 s).
    ///
    /// # Errors
    ///
    /// When the directory cannot be written, BIRD cannot be started, exits (a config error:
    /// the error carries its output) or does not answer in time.
    pub fn start(ns: &Netns, config: &str) -> Result<Self> {
        let dir = temp_dir("bird")?;
        let conf = dir.join("bird.conf");
        fs::write(&conf, config)?;
        let log = fs::File::create(dir.join("bird.out"))?;
        let child = Command::new("ip")
            .args(["netns", "exec", ns.name(), "bird", "-f", "-c"])
            .arg(&conf)
            .arg("-s")
            .arg(dir.join("bird.ctl"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting bird")?;
        let mut bird = Self {
            ns: ns.clone(),
            child: Some(child),
            dir,
        };
        let start = Instant::now();
        loop {
            if bird.birdc(&["show", "status"]).is_ok() {
                return Ok(bird);
            }
            if let Some(child) = bird.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bird.child = None;
                bail!("bird exited with {status}: {}", bird.output());
            }
            if start.elapsed() > Duration::from_secs(5) {
                bail!("bird does not answer: {}", bird.output());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What BIRD wrote to stdout and stderr.
    #[must_use]
    pub fn output(&self) -> String {
        fs::read_to_string(self.dir.join("bird.out")).unwrap_or_default()
    }

    /// Runs `birdc -s SOCKET args…` and returns its output.
    ///
    /// # Errors
    ///
    /// When `birdc` cannot run or fails.
    pub fn birdc(&self, args: &[&str]) -> Result<String> {
        let socket = self.dir.join("bird.ctl");
        let socket = socket.to_string_lossy();
        let mut command = vec!["birdc", "-s", &socket];
        command.extend_from_slice(args);
        self.ns.exec(&command)
    }

    /// Kills BIRD with SIGKILL (no BGP notification is sent) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Bird {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The fleet topology (see the module documentation); dropping it deletes its namespaces.
#[derive(Debug)]
pub struct Fleet {
    /// The router.
    pub router: Netns,
    /// The client.
    pub client: Netns,
    /// The switch of the backend segment (a bridge).
    pub switch: Netns,
    /// The balancers, 1 to N.
    pub balancers: Vec<Netns>,
    /// The backends, 1 to M.
    pub backends: Vec<Netns>,
    created: Vec<Netns>,
}

impl Fleet {
    /// Creates the namespaces, links, addresses, routes and sysctls for `nodes` balancers and
    /// `backends` backends; deletes what it created if a step fails.
    ///
    /// # Errors
    ///
    /// When a command fails.
    pub fn build(nodes: usize, backends: usize) -> Result<Self> {
        let tag = unique_tag();
        let ns = |role: &str| Netns::new(format!("{tag}-{role}"));
        let mut fleet = Self {
            router: ns("rt"),
            client: ns("c"),
            switch: ns("sw"),
            balancers: (1..=nodes).map(|k| ns(&format!("lb{k}"))).collect(),
            backends: (1..=backends).map(|i| ns(&format!("b{i}"))).collect(),
            created: Vec::new(),
        };
        let all: Vec<Netns> = [&fleet.router, &fleet.client, &fleet.switch]
            .into_iter()
            .chain(&fleet.balancers)
            .chain(&fleet.backends)
            .cloned()
            .collect();
        for ns in all {
            ns_add(&ns)?;
            fleet.created.push(ns);
        }
        fleet.configure()?;
        Ok(fleet)
    }

    fn configure(&self) -> Result<()> {
        let (rt, c, sw) = (&self.router, &self.client, &self.switch);
        // The router forwards, hashes flows by their 5-tuple over equal next hops, and
        // accepts the backends' DSR replies (source: the VIP it routes to the balancers).
        rt.sysctl(&[
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv4.fib_multipath_hash_policy", "1"),
            ("net.ipv4.conf.all.rp_filter", "2"),
        ])?;
        for b in &self.backends {
            b.sysctl(&[
                ("net.ipv4.conf.all.arp_ignore", "1"),
                ("net.ipv4.conf.all.arp_announce", "2"),
                ("net.ipv4.conf.all.rp_filter", "2"),
            ])?;
        }
        sw.ip_batch(&[
            "link set lo up".to_owned(),
            "link add br0 type bridge".to_owned(),
            "link set br0 up".to_owned(),
        ])?;
        let mut r = vec![
            "link set lo up".to_owned(),
            format!(
                "link add c0 type veth peer name {CLIENT_IF} netns {}",
                c.name()
            ),
            format!("addr add {ROUTER_CLIENT_SIDE}/24 dev c0"),
            "link set c0 up".to_owned(),
            format!("link add sw type veth peer name rt netns {}", sw.name()),
            format!("addr add {ROUTER_BACKEND_SIDE}/24 dev sw"),
            "link set sw up".to_owned(),
        ];
        for k in 1..=self.balancers.len() {
            let lb = &self.balancers[k - 1];
            r.push(format!(
                "link add lb{k} type veth peer name {UP_IF} netns {}",
                lb.name()
            ));
            r.push(format!("addr add {}/24 dev lb{k}", router_side(k)));
            r.push(format!("link set lb{k} up"));
        }
        rt.ip_batch(&r)?;
        c.ip_batch(&[
            "link set lo up".to_owned(),
            format!("addr add {CLIENT}/24 dev {CLIENT_IF}"),
            format!("link set {CLIENT_IF} up"),
            format!("route add default via {ROUTER_CLIENT_SIDE}"),
        ])?;
        // The client's frames cross a balancer's XDP program: complete checksums.
        c.exec(&["ethtool", "-K", CLIENT_IF, "tx", "off"])?;
        let mut ports = vec!["rt".to_owned()];
        for (k, lb) in self.balancers.iter().enumerate() {
            let k = k + 1;
            lb.ip_batch(&[
                "link set lo up".to_owned(),
                format!(
                    "link add {DOWN_IF} type veth peer name lb{k} netns {}",
                    sw.name()
                ),
                format!("addr add {}/24 dev {UP_IF}", balancer_up(k)),
                format!("addr add {}/24 dev {DOWN_IF}", balancer_down(k)),
                format!("link set {UP_IF} up"),
                format!("link set {DOWN_IF} up"),
            ])?;
            ports.push(format!("lb{k}"));
        }
        for (i, b) in self.backends.iter().enumerate() {
            let i = i + 1;
            // Created from the backend, the peer straight into the switch.
            b.ip_batch(&[
                "link set lo up".to_owned(),
                format!(
                    "link add {BACKEND_IF} type veth peer name b{i} netns {}",
                    sw.name()
                ),
                format!("addr add {}/24 dev {BACKEND_IF}", backend(i)),
                format!("addr add {}/32 dev lo", crate::addrs::VIP_V4),
                format!("link set {BACKEND_IF} up"),
                format!("route add default via {ROUTER_BACKEND_SIDE}"),
            ])?;
            ports.push(format!("b{i}"));
        }
        let mut s = Vec::new();
        for p in &ports {
            s.push(format!("link set {p} master br0"));
            s.push(format!("link set {p} up"));
        }
        sw.ip_batch(&s)?;
        // Frames a balancer's program redirects into `down` arrive on the switch port, and
        // frames it sends back out of `up` on the router's port: both need XDP (crate::xdp_pass).
        let prog = xdp_pass::load().context("loading XDP_PASS")?;
        for k in 1..=self.balancers.len() {
            xdp_pass::attach(sw, &format!("lb{k}"), &prog)?;
            xdp_pass::attach(rt, &format!("lb{k}"), &prog)?;
        }
        Ok(())
    }

    /// The next hops (balancers' `up` addresses) of the router's kernel route to `vip`, in
    /// the order `ip route` gives them; empty when it has none.
    ///
    /// # Errors
    ///
    /// When `ip route` fails.
    pub fn router_next_hops(&self, vip: Ipv4Addr) -> Result<Vec<Ipv4Addr>> {
        let text = self
            .router
            .ip(&["-4", "route", "show", &format!("{vip}/32")])?;
        let words: Vec<&str> = text.split_whitespace().collect();
        Ok(words
            .windows(2)
            .filter(|w| w[0] == "via")
            .filter_map(|w| w[1].parse().ok())
            .collect())
    }

    /// Polls (every 2 ms, up to `limit`) until the router's next hops to `vip` satisfy
    /// `pred`; returns them and the time taken.
    ///
    /// # Errors
    ///
    /// When `pred` does not hold within `limit` (the error gives the last next hops).
    pub fn wait_router(
        &self,
        vip: Ipv4Addr,
        limit: Duration,
        pred: impl Fn(&[Ipv4Addr]) -> bool,
    ) -> Result<(Vec<Ipv4Addr>, Duration)> {
        let start = Instant::now();
        loop {
            let hops = self.router_next_hops(vip)?;
            if pred(&hops) {
                return Ok((hops, start.elapsed()));
            }
            if start.elapsed() > limit {
                bail!("the router's next hops to {vip} are {hops:?} after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Makes balancer `n` silent to the router, as a machine that died is: nftables in the
    /// router namespace drop everything from and to its link (BGP, BFD, forwarded traffic)
    /// while the link stays up, so only BFD can tell.
    ///
    /// # Errors
    ///
    /// When `nft` fails.
    pub fn silence(&self, n: usize) -> Result<()> {
        let ruleset = format!(
            "table inet fleet_silence {{\n\
             chain input {{ type filter hook input priority 0; iifname \"lb{n}\" drop; }}\n\
             chain output {{ type filter hook output priority 0; oifname \"lb{n}\" drop; }}\n\
             chain forward {{ type filter hook forward priority 0; oifname \"lb{n}\" drop; }}\n\
             }}\n"
        );
        self.router
            .exec_with_stdin(&["nft", "-f", "-"], Some(&ruleset))
            .map(drop)
    }

    /// Undoes [`Fleet::silence`]: the router hears the silenced balancer again (as a machine
    /// that came back).
    ///
    /// # Errors
    ///
    /// When `nft` fails (no balancer is silenced).
    pub fn heal(&self) -> Result<()> {
        self.router
            .exec(&["nft", "delete", "table", "inet", "fleet_silence"])
            .map(drop)
    }
}

fn ns_add(ns: &Netns) -> Result<()> {
    let out = Command::new("ip")
        .args(["netns", "add", ns.name()])
        .output()
        .context("ip netns add")?;
    if !out.status.success() {
        bail!(
            "ip netns add {}: {}",
            ns.name(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

impl Drop for Fleet {
    fn drop(&mut self) {
        while let Some(ns) = self.created.pop() {
            let _ = Command::new("ip")
                .args(["netns", "del", ns.name()])
                .output();
        }
    }
}
