//! The agent's side of the kernel: the embedded XDP object, loading and pinning, attaching to
//! interfaces, and typed access to the maps.
//!
//! Everything above this module writes maps through the [`Dataplane`] trait, which has a kernel
//! implementation ([`maps::KernelMaps`]) and an in-memory one ([`memory::MemoryDataplane`]) so
//! the publisher and the agent are tested without privileges.

pub mod attach;
pub mod clock;
pub mod counters;
pub mod decap;
pub mod layout;
pub mod link;
pub mod load;
pub mod maps;
pub mod memory;
pub mod object;
pub mod unknown;
pub mod upgrade;

use std::path::PathBuf;

use router_common::{
    Backend, ClientAddr, ClientAnswer, Config, NextHop, Pool, Service, ServiceKey, Vip, VipKey,
};

/// How to move from pinned maps of another layout to this binary's (decision 0007).
pub const UPGRADE_PATH: &str = "Upgrade path: drain the traffic, run `switchyard detach --iface \
     IF` for each interface (it removes the old program and its pins, whatever their layout \
     version), then `switchyard attach` with this binary; see \
     docs/decisions/0007-program-upgrade-and-map-layout.md";

/// Errors from loading, attaching and map access. Each says what was being done and to what.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// The binary was built with `AYA_BUILD_SKIP=1`.
    #[error(
        "this switchyard binary carries no XDP program (it was built with AYA_BUILD_SKIP=1); \
         rebuild it without AYA_BUILD_SKIP"
    )]
    StubObject,
    /// The object could not be parsed or a map could not be created or pinned.
    #[error("loading the XDP object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    /// The verifier or the kernel refused the program.
    #[error("loading the XDP program into the kernel: {0}")]
    Program(#[source] Box<aya::programs::ProgramError>),
    /// A map operation failed.
    #[error("map {name}: {source}")]
    Map {
        /// Map name.
        name: &'static str,
        /// Cause.
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// A value the map's layout cannot hold; nothing of it was written.
    #[error("map {name}: {what}")]
    Unrepresentable {
        /// Map name.
        name: &'static str,
        /// What does not fit.
        what: String,
    },
    /// A map the object should define is missing.
    #[error("the XDP object has no map {0}")]
    MissingMap(&'static str),
    /// No interface with this name.
    #[error("no interface named {0:?}")]
    NoSuchInterface(String),
    /// Another XDP program is attached to the interface.
    #[error(
        "interface {iface} already has another XDP program attached (see `bpftool net show dev \
         {iface}`); detach it first (`ip link set dev {iface} xdp off`) — switchyard changed \
         nothing"
    )]
    Busy {
        /// Interface.
        iface: String,
    },
    /// Attaching failed.
    #[error(
        "attaching to {iface} in {mode} mode: {source} (if the driver has no native XDP, \
         ask for it explicitly with --mode generic)"
    )]
    Attach {
        /// Interface.
        iface: String,
        /// `native` or `generic`.
        mode: &'static str,
        /// Cause.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// Another agent runs with the same pin directory.
    #[error(
        "another switchyard agent runs with pin path {0} (it holds the lock on it); stop it \
         first, or give this one another agent.pin_path"
    )]
    AnotherAgent(PathBuf),
    /// The pin directory is not on a BPF filesystem.
    #[error(
        "pin path {path} is not on a bpffs mount ({probe} is on {fs}); mount one with \
         `mount -t bpf bpf /sys/fs/bpf` or set agent.pin_path (`decap`: --pin-path) — switchyard \
         changed nothing. \
         (Under `ip netns exec`, /sys is remounted and the host's bpffs is hidden: enter the \
         namespace with `nsenter --net=/run/netns/NAME switchyard …` instead.)"
    )]
    NotBpffs {
        /// The pin path (or pin directory) asked for.
        path: PathBuf,
        /// Its nearest existing ancestor, whose file system was checked.
        probe: PathBuf,
        /// That file system's name (or its magic number).
        fs: String,
    },
    /// A pinned map's shape differs from what this binary's program declares.
    #[error(
        "map layout mismatch: map {map} pinned at {path} has {pinned}, but this binary's \
         program declares {declared}; it belongs to another build of switchyard and cannot be \
         adopted — switchyard changed nothing. {UPGRADE_PATH}"
    )]
    LayoutMismatch {
        /// Map name.
        map: &'static str,
        /// Its pin.
        path: PathBuf,
        /// The pinned map's shape.
        pinned: String,
        /// The declared shape.
        declared: String,
    },
    /// The pinned `CONFIG` map was written by an agent of another map layout version.
    #[error(
        "map layout mismatch: the maps pinned in {pin_dir} were written by an agent of map \
         layout version {pinned}; this binary uses version {ours} and cannot adopt them — \
         switchyard changed nothing. {UPGRADE_PATH}"
    )]
    AbiMismatch {
        /// The pin directory.
        pin_dir: PathBuf,
        /// `abi_version` found in `CONFIG`.
        pinned: u32,
        /// This binary's `ABI_VERSION`.
        ours: u32,
    },
    /// The interface runs a switchyard program of another map layout version.
    #[error(
        "{iface} runs a switchyard program of map layout version {theirs} (link pinned at \
         {link}); this binary uses version {ours} and cannot adopt its maps — switchyard \
         changed nothing. {UPGRADE_PATH}"
    )]
    OtherLayoutAttached {
        /// Interface.
        iface: String,
        /// The other version's pinned link.
        link: PathBuf,
        /// Its layout version.
        theirs: u32,
        /// This binary's `ABI_VERSION`.
        ours: u32,
    },
    /// `upgrade` found no pinned link for the interface.
    #[error(
        "{iface} has no switchyard program to upgrade (no pinned link at {link}); attach one \
         with `switchyard attach --iface {iface}` (or pass the --config-dir whose \
         agent.pin_path the agent uses)"
    )]
    NotAttached {
        /// Interface.
        iface: String,
        /// Where its link would be pinned.
        link: PathBuf,
    },
    /// `upgrade` found the interface's pinned link defunct: it runs on no interface of that
    /// name here, so there is no program to replace (the kernel refuses to update a link whose
    /// interface is gone).
    #[error(
        "{link} is defunct ({why}): no switchyard program runs on {iface} here to upgrade; \
         once {iface} exists again, restarting the agent attaches anew; or remove the link with \
         `switchyard detach --iface {iface}` — switchyard changed nothing"
    )]
    DefunctLink {
        /// Interface.
        iface: String,
        /// The pinned link.
        link: PathBuf,
        /// Why it is defunct.
        why: link::Defunct,
    },
    /// `upgrade` found a map of the ABI not pinned: it would have to create it.
    #[error(
        "the pins under {pin_dir} are incomplete (not pinned: {missing}); `switchyard upgrade` \
         reuses every pinned map and creates none (a new map is a layout change, see \
         docs/decisions/0007-program-upgrade-and-map-layout.md) — switchyard changed nothing"
    )]
    PinsIncomplete {
        /// The pin directory.
        pin_dir: PathBuf,
        /// The missing maps, comma-separated.
        missing: String,
    },
    /// A starting agent found the program attached through pinned links but one of its maps
    /// no longer pinned. A map created under that name would not be the one the running program
    /// reads: every change would be applied to a map nothing reads.
    #[error(
        "the pins under {pin_dir} are incomplete (not pinned: {missing}) while the program is \
         attached through them on {attached}: the running program still uses the unpinned \
         map(s), which cannot be opened again, and a new one would never reach it. The program \
         keeps forwarding with the running config; to take it over again run `switchyard detach \
         --iface IF` for each of those interfaces (new connections then meet no program until the \
         next attach; connection tracking starts empty) and start the agent again"
    )]
    AttachedPinsIncomplete {
        /// The pin directory.
        pin_dir: PathBuf,
        /// The missing maps, comma-separated.
        missing: String,
        /// Interfaces with a pinned link, comma-separated.
        attached: String,
    },
    /// Replacing the program behind a link failed.
    #[error(
        "replacing the program behind {link}: {source}{}",
        if done.is_empty() { String::new() } else {
            format!(" (already upgraded, and left running the new program: {done})")
        }
    )]
    Upgrade {
        /// The link.
        link: PathBuf,
        /// Interfaces upgraded before this one failed, comma-separated.
        done: String,
        /// Cause.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// A file-system operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Not running as root (or without `CAP_BPF`/`CAP_NET_ADMIN`).
    #[error("{0} needs root (CAP_BPF and CAP_NET_ADMIN); run it with sudo")]
    NotPrivileged(&'static str),
}

impl DataplaneError {
    pub(crate) fn map(name: &'static str, e: impl Into<aya::maps::MapError>) -> Self {
        Self::Map {
            name,
            source: Box::new(e.into()),
        }
    }
}

/// The map writes the publisher makes. Implementations apply each write at once; the caller
/// orders them so the program never sees a state that points at something not yet written.
pub trait Dataplane {
    /// Writes backend slot `slot`.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `BACKENDS` update fails (`slot` past the map's end, or
    /// the kernel refuses it).
    fn set_backend(&mut self, slot: u32, backend: Backend) -> Result<(), DataplaneError>;
    /// Writes backend slot `slot`'s next hop.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `NEXT_HOPS` update fails (`slot` past the map's end, or
    /// the kernel refuses it).
    fn set_next_hop(&mut self, slot: u32, hop: NextHop) -> Result<(), DataplaneError>;
    /// Writes half `half` (0 or 1) of pool `pool`'s Maglev table; `table` has
    /// `router_common::MAGLEV_SIZE` entries.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when that half lies outside the `MAGLEV` array (`pool` not
    /// below `router_common::MAX_POOLS`); nothing is written then.
    fn write_table(&mut self, pool: u32, half: u32, table: &[u32]) -> Result<(), DataplaneError>;
    /// Writes pool slot `slot` (its live half and flags): the flip that publishes a table.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `POOLS` update fails (`slot` past the map's end, or the
    /// kernel refuses it).
    fn set_pool(&mut self, slot: u32, pool: Pool) -> Result<(), DataplaneError>;
    /// Writes decision word `slot` (one 8-byte update).
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `DECISIONS` update fails (`slot` past the map's end, or
    /// the kernel refuses it).
    fn set_decision(&mut self, slot: u32, word: u64) -> Result<(), DataplaneError>;
    /// Inserts or replaces a service: its slot (`SERVICE_SLOTS[service.id]`, which its tracked
    /// flows are forwarded on) first, then its `SERVICES` entry (which new flows find it by).
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when either update fails (the map full, a slot past the array's
    /// end, or the kernel refuses it).
    fn set_service(&mut self, key: ServiceKey, service: Service) -> Result<(), DataplaneError>;
    /// Removes a service's `SERVICES` entry (its slot stays until [`free_service_slot`]).
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the kernel refuses the removal; removing an absent service
    /// is not an error.
    ///
    /// [`free_service_slot`]: Dataplane::free_service_slot
    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), DataplaneError>;
    /// Clears service slot `slot` (all zero: no flow's key matches it), which ends the tracked
    /// flows that name it.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `SERVICE_SLOTS` update fails (`slot` past its end).
    fn free_service_slot(&mut self, slot: u32) -> Result<(), DataplaneError>;
    /// Writes word `index` of `SERVICE_FILTER` (one 8-byte update).
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the update fails (`index` past the filter's end).
    fn set_filter_word(&mut self, index: u32, word: u64) -> Result<(), DataplaneError>;
    /// Writes the `CONFIG` value: the generation word and the flow timeouts.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `CONFIG` update fails.
    fn set_config(&mut self, config: Config) -> Result<(), DataplaneError>;
    /// Writes virtual IP `key`'s `VIPS` entry, or removes it (`None`; a missing one is not an
    /// error).
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the update or removal fails (the map is full).
    fn set_vip(&mut self, key: VipKey, vip: Option<Vip>) -> Result<(), DataplaneError>;
    /// The entries `VIPS` holds: what an earlier process left, for this one to keep or
    /// remove. Empty when unknown.
    fn read_vips(&self) -> Vec<(VipKey, Vip)> {
        Vec::new()
    }
    /// Writes prefix `addr`/`bits` (`bits` of the address, not counting the family word) of
    /// `CLIENT_CLASSES` with class `class`, or removes it (`None`; a missing one is not an
    /// error). `addr`'s bits past the prefix must be zero.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the update or removal fails (the trie is full);
    /// [`DataplaneError::MissingMap`] for a dataplane without client classes (the default).
    fn set_class_prefix(
        &mut self,
        addr: ClientAddr,
        bits: u32,
        class: Option<u32>,
    ) -> Result<(), DataplaneError> {
        let _ = (addr, bits, class);
        Err(DataplaneError::MissingMap(
            router_common::maps::CLIENT_CLASSES,
        ))
    }
    /// The prefixes `CLIENT_CLASSES` holds, as `(addr, bits, class)`: what an earlier process
    /// left. Empty when unknown.
    fn read_class_prefixes(&self) -> Vec<(ClientAddr, u32, u32)> {
        Vec::new()
    }
    /// Writes word `index` of `CLASS_DECISIONS` ([`router_common::class_decision_index`]; one
    /// 8-byte update).
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the update fails (`index` past the map's end);
    /// [`DataplaneError::MissingMap`] for a dataplane without client classes (the default).
    fn set_class_decision(&mut self, index: u32, word: u64) -> Result<(), DataplaneError> {
        let _ = (index, word);
        Err(DataplaneError::MissingMap(
            router_common::maps::CLASS_DECISIONS,
        ))
    }
    /// Writes the `CLIENT_ANSWERS` entry of `addr`, or removes it (`None`; a missing one is not
    /// an error).
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the update or removal fails;
    /// [`DataplaneError::MissingMap`] for a dataplane without client classes (the default).
    fn set_client_answer(
        &mut self,
        addr: ClientAddr,
        answer: Option<ClientAnswer>,
    ) -> Result<(), DataplaneError> {
        let _ = (addr, answer);
        Err(DataplaneError::MissingMap(
            router_common::maps::CLIENT_ANSWERS,
        ))
    }
}

/// Reading the maps back: what a restarted agent resumes from (see
/// [`Publisher::restore`](crate::publish::Publisher::restore)).
pub trait Readback {
    /// The generation word (zeroes before the first apply).
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `CONFIG` lookup fails.
    fn read_config(&self) -> Result<Config, DataplaneError>;
    /// Every service in the `SERVICES` map.
    fn read_services(&self) -> Vec<(ServiceKey, Service)>;
    /// Backend slot `slot`.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `BACKENDS` lookup fails (`slot` past the map's end).
    fn read_backend(&self, slot: u32) -> Result<Backend, DataplaneError>;
    /// Backend slot `slot`'s next hop.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `NEXT_HOPS` lookup fails (`slot` past the map's end).
    fn read_next_hop(&self, slot: u32) -> Result<NextHop, DataplaneError>;
    /// Pool slot `slot`.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `POOLS` lookup fails (`slot` past the map's end).
    fn read_pool(&self, slot: u32) -> Result<Pool, DataplaneError>;
    /// Decision word `slot`.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `DECISIONS` lookup fails (`slot` past the map's end).
    fn read_decision(&self, slot: u32) -> Result<u64, DataplaneError>;
    /// Half `half` of pool `pool`'s Maglev table ([`router_common::MAGLEV_SIZE`] backend
    /// slots), or `None` when it cannot be read.
    fn read_table(&self, pool: u32, half: u32) -> Option<Vec<u32>>;
    /// The `SERVICE_FILTER` words ([`router_common::FILTER_ENTRIES`]), or `None` when they
    /// cannot be read.
    fn read_filter(&self) -> Option<Vec<u64>>;
}
