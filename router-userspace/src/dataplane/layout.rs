//! The map layout: what each pinned map holds, field by field (for `switchyard maps`), and the
//! checks that maps already pinned are the ones this binary's program declares, made before
//! anything adopts them.
//!
//! aya reuses a pinned map by name without comparing its shape, and the kernel accepts a
//! program whose map is larger than it expects, so without these checks an agent or an
//! `upgrade` of another layout would read and write the pinned maps with the wrong shape
//! (decision 0007).

use std::{collections::HashMap, fmt, path::Path};

use aya::maps::{Array, Map, MapData, MapInfo};
use router_common::{ABI_VERSION, Config, maps};

use super::{DataplaneError, object};

/// One field of a key or value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Field name, as in `router_common` (and in the BTF `bpftool` prints).
    pub name: &'static str,
    /// Rust type, e.g. `[u8; 16]` or `u16`.
    pub ty: &'static str,
    /// Offset in the record, bytes.
    pub offset: usize,
    /// Size, bytes.
    pub size: usize,
    /// What the bytes mean when the type does not say it (byte order, allowed values); may be
    /// empty.
    pub note: &'static str,
}

/// The layout of a map key or value: a record of [`Field`]s, or a scalar (no fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Type name: a `router_common` struct, or a scalar type such as `u32`.
    pub name: &'static str,
    /// Size, bytes.
    pub size: usize,
    /// Fields in offset order; empty for a scalar.
    pub fields: Vec<Field>,
    /// What a scalar means; empty for a record.
    pub note: &'static str,
}

impl Layout {
    /// A scalar of type `T` that means `note`.
    fn scalar<T>(note: &'static str) -> Self {
        Self {
            name: std::any::type_name::<T>(),
            size: std::mem::size_of::<T>(),
            fields: Vec::new(),
            note,
        }
    }
}

impl fmt::Display for Layout {
    /// `ServiceKey (20 B) {addr [u8; 16] (network order), port u16 (…), …}`, or
    /// `u32 (backend slot)` for a scalar.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.fields.is_empty() {
            write!(f, "{}", self.name)?;
            if !self.note.is_empty() {
                write!(f, " ({})", self.note)?;
            }
            return Ok(());
        }
        write!(f, "{} ({} B) {{", self.name, self.size)?;
        for (i, field) in self.fields.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{} {}", field.name, field.ty)?;
            if !field.note.is_empty() {
                write!(f, " ({})", field.note)?;
            }
        }
        write!(f, "}}")
    }
}

/// One map of the ABI: its kind, size, key and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapLayout {
    /// Map name (`router_common::maps`).
    pub name: &'static str,
    /// Map type as `bpftool` names it (`hash`, `array`, `lru_hash`, `percpu_array`, …).
    pub kind: &'static str,
    /// Maximum entries.
    pub entries: u32,
    /// Key.
    pub key: Layout,
    /// Value (per CPU for the `percpu_*` kinds).
    pub value: Layout,
}

/// The layout of a `router_common` struct, with its field types, offsets and sizes taken from
/// the type itself (so a renamed, retyped or moved field changes the description or fails to
/// compile), and a note per field where the type alone does not say what the bytes mean.
macro_rules! record {
    (@note) => { "" };
    (@note $note:literal) => { $note };
    ($ty:ident { $($field:ident $(: $note:literal)?),* $(,)? }) => {{
        let v = <router_common::$ty>::default();
        Layout {
            name: stringify!($ty),
            size: std::mem::size_of::<router_common::$ty>(),
            fields: vec![$(Field {
                name: stringify!($field),
                ty: std::any::type_name_of_val(&v.$field).trim_start_matches("router_common::"),
                offset: std::mem::offset_of!(router_common::$ty, $field),
                size: std::mem::size_of_val(&v.$field),
                note: record!(@note $($note)?),
            }),*],
            note: "",
        }
    }};
}

/// The key and value of every map in `router_common::maps::ALL`, in that order.
#[must_use]
#[expect(
    clippy::too_many_lines,
    reason = "a table: one description per map, in ABI order"
)]
pub fn all() -> Vec<MapLayout> {
    use router_common::{
        CLASS_DECISIONS_SIZE, CLASS_STATS_ENTRIES, CLIENT_ANSWERS_SIZE, CONNTRACK_SIZE, ClientAddr,
        FILTER_ENTRIES, FRAGMENT_SIZE, MAGLEV_VALUES, MAX_BACKENDS, MAX_CLASS_PREFIXES,
        MAX_DECISIONS, MAX_POOLS, MAX_SERVICES, MAX_TX_PORTS, Reason, UNKNOWN_CLIENTS_BYTES,
        Verdict,
    };
    let client_addr = || {
        record!(ClientAddr {
            family: "4 or 6",
            addr: "network order, IPv4 in the first 4 bytes",
        })
    };
    let flow_key = || {
        record!(FlowKey {
            src: "network order",
            dst: "network order",
            sport: "network-order bytes",
            dport: "network-order bytes",
            proto: "6 TCP, 17 UDP",
            family: "4 or 6",
            _pad,
        })
    };
    let traffic = || record!(Traffic { packets, bytes });
    vec![
        MapLayout {
            name: maps::SERVICES,
            kind: "hash",
            entries: MAX_SERVICES,
            key: record!(ServiceKey {
                addr: "network order, IPv4 in the first 4 bytes",
                port: "network-order bytes",
                proto: "6 TCP, 17 UDP",
                family: "4 or 6",
            }),
            value: record!(Service {
                id: "service slot",
                decision: "index into DECISIONS",
                flags: "SVC_F_NAT 1, SVC_F_HASH_SOURCE 2, SVC_F_IPIP 4, SVC_F_VIP_LIMIT 8, SVC_F_CLASSES 16, SVC_F_CLASSIFY 32, SVC_F_SPLIT_CLIENT 64, SVC_F_SPLIT_PREFIX 128",
                encap_mask: "ipip: host bits of the outer source range's last 32-bit word, host order",
                encap_src: "ipip: the outer source range's network address, network order",
            }),
        },
        MapLayout {
            name: maps::SERVICE_SLOTS,
            kind: "array",
            entries: MAX_SERVICES,
            key: Layout::scalar::<u32>("service slot"),
            value: record!(ServiceSlot {
                key: "the service's SERVICES key; all zero for a free slot",
                service: "the service's SERVICES value",
            }),
        },
        MapLayout {
            name: maps::SERVICE_FILTER,
            kind: "array",
            entries: FILTER_ENTRIES,
            key: Layout::scalar::<u32>("word: filter bit / 64; 16384 = the flag word"),
            value: Layout::scalar::<u64>(
                "64 filter bits: service keys and NAT reply sources (router_common::hash::filter_bit); \
                 flag word: 1 = NAT reply bits present",
            ),
        },
        MapLayout {
            name: maps::DECISIONS,
            kind: "array",
            entries: MAX_DECISIONS,
            key: Layout::scalar::<u32>("decision slot"),
            value: Layout::scalar::<u64>(
                "decision word: bits 0-15 pool A, 16-31 pool B, 32-47 share of new flows to B \
                 in 1/10000, 48-63 fallback pool; 65535 = none",
            ),
        },
        MapLayout {
            name: maps::POOLS,
            kind: "array",
            entries: MAX_POOLS,
            key: Layout::scalar::<u32>("pool slot"),
            value: record!(Pool {
                active: "live Maglev half, 0 or 1",
                flags: "POOL_F_ALL_DOWN_PASS 1",
            }),
        },
        MapLayout {
            name: maps::MAGLEV,
            kind: "array (mmapable)",
            entries: MAX_POOLS * 2 * MAGLEV_VALUES,
            key: Layout::scalar::<u32>("(pool·2 + half)·16385 + entry / 4"),
            value: Layout::scalar::<[u16; 4]>(
                "backend slot of each entry, lane entry % 4; 65535 = none",
            ),
        },
        MapLayout {
            name: maps::BACKENDS,
            kind: "array",
            entries: MAX_BACKENDS,
            key: Layout::scalar::<u32>("backend slot"),
            value: record!(Backend {
                addr: "network order, IPv4 in the first 4 bytes",
                family: "4 or 6",
                state: "low byte: 0 down, 1 up, 2 draining, 3 evicted (a drain's timeout passed); flags: 256 keep tracked flows, 512 reset them (TCP RST), 1024 re-select them",
                hop: "live NEXT_HOPS half, 0 or 1",
                generation: "changes with the slot's state or address",
            }),
        },
        MapLayout {
            name: maps::NEXT_HOPS,
            kind: "array",
            entries: MAX_BACKENDS * 2,
            key: Layout::scalar::<u32>("backend slot·2 + half (BACKENDS hop)"),
            value: record!(NextHop {
                ifindex: "egress interface",
                flags: "NH_F_RESOLVED 1; 0 = no next hop (packets dropped: no_next_hop)",
                macs: "destination MAC (backend or gateway), then the egress interface's MAC",
                mtu: "the egress interface's MTU, bytes (ipip's too-big check)",
            }),
        },
        MapLayout {
            name: maps::CONNTRACK,
            kind: "lru_hash",
            entries: CONNTRACK_SIZE,
            key: flow_key(),
            value: record!(FlowEntry {
                backend: "backend slot",
                service: "service slot",
                seen: "last packet, ticks of the program's clock (2^20 ns of CLOCK[0] + CLOCK[1])",
                state: "0 TCP SYN, 1 TCP open, 2 TCP closing, 3 UDP; +128 a first packet's record",
                _pad,
            }),
        },
        MapLayout {
            name: maps::NAT_REVERSE,
            kind: "lru_hash",
            entries: CONNTRACK_SIZE,
            key: flow_key(),
            value: record!(NatEntry {
                vip: "network order",
                service: "service slot",
                ifindex: "interface the request came in on, where the reply leaves",
                macs: "reply's destination MAC (the request's source), then its source MAC",
                backend: "backend slot the request went to",
            }),
        },
        MapLayout {
            name: maps::FRAGMENTS,
            kind: "lru_hash",
            entries: FRAGMENT_SIZE,
            key: record!(FragKey {
                src: "network order",
                dst: "network order",
                id: "IP identification, host order",
                proto: "IPv4 protocol; 0 for IPv6",
                family: "4 or 6",
                _pad,
            }),
            value: record!(FragEntry {
                backend: "backend slot; 4294967295 for a NAT reply",
                service: "service slot",
                flags: "the service's SVC_F_* bits, or FRAG_F_NAT_REPLY 65536",
                ifindex: "a NAT reply's egress interface",
                vip: "a NAT reply's virtual IP (restored as source); an ipip request's outer source; network order",
                macs: "a NAT reply's destination then source MAC",
            }),
        },
        MapLayout {
            name: maps::TX_PORTS,
            kind: "devmap_hash",
            entries: MAX_TX_PORTS,
            key: Layout::scalar::<u32>("ifindex"),
            // The kernel's `struct bpf_devmap_val`, not a router_common type.
            value: Layout {
                name: "bpf_devmap_val",
                size: 8,
                fields: vec![
                    Field {
                        name: "ifindex",
                        ty: "u32",
                        offset: 0,
                        size: 4,
                        note: "redirect target",
                    },
                    Field {
                        name: "bpf_prog",
                        ty: "u32",
                        offset: 4,
                        size: 4,
                        note: "program fd, 0 = none",
                    },
                ],
                note: "",
            },
        },
        MapLayout {
            name: maps::REASON_STATS,
            kind: "percpu_array",
            entries: Reason::COUNT,
            key: Layout::scalar::<u32>("Reason"),
            value: traffic(),
        },
        MapLayout {
            name: maps::SVC_STATS,
            kind: "percpu_array",
            entries: MAX_SERVICES * Verdict::COUNT,
            key: Layout::scalar::<u32>("service slot·4 + verdict (drop, pass, tx, redirect)"),
            value: traffic(),
        },
        MapLayout {
            name: maps::BACKEND_STATS,
            kind: "percpu_array",
            entries: MAX_BACKENDS,
            key: Layout::scalar::<u32>("backend slot"),
            value: traffic(),
        },
        MapLayout {
            name: maps::IPIP_TX,
            kind: "prog_array",
            entries: 1,
            key: Layout::scalar::<u32>("always 0"),
            value: Layout::scalar::<u32>(
                "the switchyard_ipip program (tail-called for ipip services), written at load",
            ),
        },
        MapLayout {
            name: maps::CONFIG,
            kind: "array",
            entries: 1,
            key: Layout::scalar::<u32>("always 0"),
            value: record!(Config {
                generation: "applied config, +1 per apply; 0 = never written",
                abi_version: "map layout version of the agent that wrote it",
                _pad,
                timeouts: "idle timeout by flow state (TCP SYN, open, closing, UDP), ticks; 0 = default",
            }),
        },
        MapLayout {
            name: maps::VIPS,
            kind: "hash",
            entries: router_common::MAX_VIPS,
            key: record!(VipKey {
                addr: "network order, IPv4 in the first 4 bytes",
                family: "4 or 6",
                _pad,
            }),
            value: record!(Vip {
                flags: "VIP_F_ECHO 1 (answer echo requests), VIP_F_LIVE 2 (a service has a usable backend)",
                host_ports: "passed to the host: port (network-order bytes) | protocol << 16; 0 unused",
                new_flows: "new flows per window of 1024 ticks (about a second); 0 no limit",
                window: "the program's: tick the current window began",
                _pad,
                count: "the program's: new flows counted in the window",
            }),
        },
        MapLayout {
            name: maps::CLOCK,
            kind: "array",
            entries: router_common::CLOCK_ENTRIES,
            key: Layout::scalar::<u32>("0: the agent's time, 1: an offset added to it"),
            value: Layout::scalar::<u64>(
                "ns; the agent advances 0 every 100 ms while it runs, 1 is 0 unless a test ages flows",
            ),
        },
        MapLayout {
            name: maps::BACKEND_SIGNALS,
            kind: "percpu_array",
            entries: MAX_BACKENDS,
            key: Layout::scalar::<u32>("backend slot"),
            value: record!(BackendSignals {
                rsts: "RSTs from the backend on the NAT reply path",
                syn_retransmits: "SYNs retransmitted to the backend",
            }),
        },
        MapLayout {
            name: maps::CLIENT_CLASSES,
            kind: "lpm_trie",
            entries: MAX_CLASS_PREFIXES,
            // aya's `lpm_trie::Key<ClientAddr>`: the prefix length, then the data.
            key: Layout {
                name: "Key<ClientAddr>",
                size: 4 + std::mem::size_of::<ClientAddr>(),
                fields: vec![
                    Field {
                        name: "prefix_len",
                        ty: "u32",
                        offset: 0,
                        size: 4,
                        note: "bits: 32 (the family word) + the CIDR's",
                    },
                    Field {
                        name: "family",
                        ty: "u32",
                        offset: 4,
                        size: 4,
                        note: "4 or 6",
                    },
                    Field {
                        name: "addr",
                        ty: "[u8; 16]",
                        offset: 8,
                        size: 16,
                        note: "network order, IPv4 in the first 4 bytes",
                    },
                ],
                note: "",
            },
            value: Layout::scalar::<u32>("class id, 1..=15 (classes sorted by name)"),
        },
        MapLayout {
            name: maps::CLASS_DECISIONS,
            kind: "array",
            entries: CLASS_DECISIONS_SIZE,
            key: Layout::scalar::<u32>("decision slot·16 + class (1..=15)"),
            value: Layout::scalar::<u64>(
                "decision word of the class, as in DECISIONS (class 0 reads DECISIONS)",
            ),
        },
        MapLayout {
            name: maps::CLIENT_ANSWERS,
            kind: "lru_hash",
            entries: CLIENT_ANSWERS_SIZE,
            key: client_addr(),
            value: record!(ClientAnswer {
                class: "class id; 0 = no class (the program's placeholder for a reported client)",
                expires: "ticks of the program's clock; used while ahead of it",
            }),
        },
        MapLayout {
            name: maps::UNKNOWN_CLIENTS,
            kind: "ringbuf",
            entries: UNKNOWN_CLIENTS_BYTES,
            key: Layout::scalar::<()>("none: a ring of records"),
            value: record!(UnknownClient {
                family: "4 or 6",
                proto: "6 TCP, 17 UDP",
                port: "the service's port, network-order bytes",
                addr: "the client, network order",
                vip: "the virtual IP, network order",
            }),
        },
        MapLayout {
            name: maps::CLASS_STATS,
            kind: "percpu_array",
            entries: CLASS_STATS_ENTRIES,
            key: Layout::scalar::<u32>(
                "class·2 + side (0 pool A, 1 pool B) of new flows; 32 classed by an answer, \
                 33 neither class nor answer, 34 records sent, 35 records over the burst, \
                 36 records the full ring refused",
            ),
            value: traffic(),
        },
    ]
}

/// What the kernel knows of a map's shape: everything that must match for a pinned map to be
/// adopted by a program that declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// `bpf_map_type`.
    pub map_type: u32,
    /// Key size, bytes.
    pub key_size: u32,
    /// Value size, bytes (per CPU for per-CPU maps).
    pub value_size: u32,
    /// Maximum entries.
    pub max_entries: u32,
    /// `BPF_F_*` creation flags.
    pub flags: u32,
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "type {}, key {} B, value {} B, {} entries, flags {:#x}",
            self.map_type, self.key_size, self.value_size, self.max_entries, self.flags
        )
    }
}

/// The shape of every map the embedded program declares, by name (from the object's BTF map
/// definitions, as the loader would create them).
///
/// # Errors
///
/// [`DataplaneError::StubObject`] for a stub build, [`DataplaneError::Io`] when the embedded
/// object does not parse.
pub fn declared() -> Result<HashMap<String, Shape>, DataplaneError> {
    let obj = aya_obj::Object::parse(object::bytes()?).map_err(|e| DataplaneError::Io {
        what: "parsing the embedded XDP object:",
        path: "router".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(obj
        .maps
        .iter()
        .map(|(name, m)| {
            (
                name.clone(),
                Shape {
                    map_type: m.map_type(),
                    key_size: m.key_size(),
                    value_size: m.value_size(),
                    max_entries: m.max_entries(),
                    flags: m.map_flags() & !ACCESS_FLAGS,
                },
            )
        })
        .collect())
}

/// `BPF_F_RDONLY_PROG | BPF_F_WRONLY_PROG`: access flags the loader adds on its own (aya
/// makes device maps read-only to programs), not part of the layout.
const ACCESS_FLAGS: u32 = (1 << 7) | (1 << 8);

/// The shape of the map pinned at `path` (creation flags without [`ACCESS_FLAGS`]).
///
/// # Errors
///
/// [`DataplaneError::Map`] (for `name`) when nothing is pinned at `path`, the pin is not a
/// map, or its type is not one aya knows.
pub fn pinned(name: &'static str, path: &Path) -> Result<Shape, DataplaneError> {
    let info = MapInfo::from_pin(path).map_err(|e| DataplaneError::map(name, e))?;
    let map_type = info.map_type().map_err(|e| DataplaneError::map(name, e))?;
    Ok(Shape {
        map_type: map_type as u32,
        key_size: info.key_size(),
        value_size: info.value_size(),
        max_entries: info.max_entries(),
        flags: info.map_flags() & !ACCESS_FLAGS,
    })
}

/// Checks the maps pinned in `pin_dir` (those of `router_common::maps::ALL` that exist) before
/// they are adopted: each must have the shape this binary's program declares
/// ([`DataplaneError::LayoutMismatch`]), and the `CONFIG` map, once an agent wrote it
/// (generation > 0), must carry this binary's `ABI_VERSION` ([`DataplaneError::AbiMismatch`]).
/// Reads only; nothing is changed, whatever the outcome.
///
/// # Errors
///
/// The first map found wrong, in `router_common::maps::ALL` order:
/// [`DataplaneError::LayoutMismatch`] for another shape, [`DataplaneError::MissingMap`] for a
/// map the program does not declare; then [`DataplaneError::AbiMismatch`]. Also the errors of
/// [`declared`], and [`DataplaneError::Map`] for a pin that cannot be read.
pub fn check_pins(pin_dir: &Path) -> Result<(), DataplaneError> {
    let declared = declared()?;
    for name in maps::ALL {
        let path = pin_dir.join(name);
        if !path.exists() {
            continue;
        }
        let want = declared
            .get(name)
            .copied()
            .ok_or(DataplaneError::MissingMap(name))?;
        let have = pinned(name, &path)?;
        if have != want {
            return Err(DataplaneError::LayoutMismatch {
                map: name,
                path,
                pinned: have.to_string(),
                declared: want.to_string(),
            });
        }
    }
    if let Some(config) = pinned_config(pin_dir)?
        && config.generation > 0
        && config.abi_version != ABI_VERSION
    {
        return Err(DataplaneError::AbiMismatch {
            pin_dir: pin_dir.to_owned(),
            pinned: config.abi_version,
            ours: ABI_VERSION,
        });
    }
    Ok(())
}

/// The value of the `CONFIG` map pinned in `pin_dir`, or `None` when it is not pinned. Call
/// after its shape was checked.
///
/// # Errors
///
/// [`DataplaneError::Map`] when the pin cannot be opened, is not an array of `Config`, or its
/// entry cannot be read.
pub fn pinned_config(pin_dir: &Path) -> Result<Option<Config>, DataplaneError> {
    let path = pin_dir.join(maps::CONFIG);
    if !path.exists() {
        return Ok(None);
    }
    let data = MapData::from_pin(&path).map_err(|e| DataplaneError::map(maps::CONFIG, e))?;
    let array: Array<MapData, Config> =
        Array::try_from(Map::Array(data)).map_err(|e| DataplaneError::map(maps::CONFIG, e))?;
    array
        .get(&0, 0)
        .map(Some)
        .map_err(|e| DataplaneError::map(maps::CONFIG, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_map_is_described_once_in_abi_order() {
        let names: Vec<&str> = all().iter().map(|m| m.name).collect();
        assert_eq!(names, maps::ALL);
    }

    /// A description that skipped a field or invented padding would say the wrong offsets.
    #[test]
    fn fields_are_contiguous_and_cover_the_record() {
        for m in all() {
            for layout in [&m.key, &m.value] {
                if layout.fields.is_empty() {
                    continue;
                }
                let mut at = 0;
                for f in &layout.fields {
                    assert_eq!(f.offset, at, "{}: {}.{}", m.name, layout.name, f.name);
                    at += f.size;
                }
                assert_eq!(at, layout.size, "{}: {} has a gap", m.name, layout.name);
            }
        }
    }

    #[test]
    fn a_record_prints_its_fields_types_and_notes() {
        let services = &all()[0];
        assert_eq!(
            services.key.to_string(),
            "ServiceKey (20 B) {addr [u8; 16] (network order, IPv4 in the first 4 bytes), \
             port u16 (network-order bytes), proto u8 (6 TCP, 17 UDP), family u8 (4 or 6)}"
        );
        assert_eq!(
            all()[1].key.to_string(),
            "u32 (service slot)",
            "a scalar prints its type and meaning"
        );
    }

    /// The descriptions match what the embedded program declares (skipped in a stub build,
    /// which carries no program).
    #[test]
    fn descriptions_match_the_program_s_declared_maps() {
        let declared = match declared() {
            Ok(d) => d,
            Err(DataplaneError::StubObject) => return,
            Err(e) => panic!("{e}"),
        };
        for m in all() {
            let shape = declared
                .get(m.name)
                .unwrap_or_else(|| panic!("the program declares no {}", m.name));
            if m.kind == "ringbuf" {
                // A ring has neither key nor value: its records are described instead.
                assert_eq!((shape.key_size, shape.value_size), (0, 0), "{}", m.name);
            } else {
                assert_eq!(shape.key_size as usize, m.key.size, "{} key", m.name);
                assert_eq!(shape.value_size as usize, m.value.size, "{} value", m.name);
            }
            assert_eq!(shape.max_entries, m.entries, "{} entries", m.name);
            // bpf_map_type numbers (include/uapi/linux/bpf.h).
            let kind = match shape.map_type {
                1 => "hash",
                2 => "array",
                3 => "prog_array",
                6 => "percpu_array",
                9 => "lru_hash",
                11 => "lpm_trie",
                25 => "devmap_hash",
                27 => "ringbuf",
                other => panic!("{}: map type {other} is not described", m.name),
            };
            assert!(
                m.kind.starts_with(kind),
                "{}: {} is a {kind}",
                m.name,
                m.kind
            );
        }
    }
}
