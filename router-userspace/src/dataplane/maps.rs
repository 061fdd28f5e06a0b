//! Typed handles on the program's maps, and the kernel implementation of [`Dataplane`].

use std::{fs::File, os::fd::AsFd as _, path::Path};

use aya::{
    Ebpf,
    maps::{
        Array, HashMap, Map, MapData, PerCpuArray, RingBuf,
        lpm_trie::{Key, LpmTrie},
        xdp::DevMapHash,
    },
};
use memmap2::{MmapMut, MmapOptions};
use router_common::{
    Backend, BackendSignals, ClientAddr, ClientAnswer, Config, FlowEntry, FlowKey, MAGLEV_LANES,
    MAGLEV_SIZE, MAGLEV_VALUES, MAX_POOLS, NextHop, Pool, Service, ServiceKey, ServiceSlot,
    Traffic, Vip, VipKey, class_prefix_len, maglev_backend, maglev_entry, maglev_index, maps,
};

use super::{Dataplane, DataplaneError, unknown::UnknownClients};

/// Bytes of one entry of the mapped `MAGLEV` array. Its values, four entries each, are 8 bytes,
/// the kernel's stride between array values (`round_up(value_size, 8)`, kernel/bpf/arraymap.c),
/// so the entries lie side by side at `2 · maglev_index(…)`.
const MAGLEV_ENTRY_BYTES: usize = 2;
/// Bytes of the whole mapped `MAGLEV` array.
const MAGLEV_BYTES: usize = (MAX_POOLS as usize)
    * 2
    * (MAGLEV_VALUES as usize)
    * (MAGLEV_LANES as usize)
    * MAGLEV_ENTRY_BYTES;

/// Every map of the program, typed.
pub struct KernelMaps {
    services: HashMap<MapData, ServiceKey, Service>,
    service_slots: Array<MapData, ServiceSlot>,
    filter: Array<MapData, u64>,
    decisions: Array<MapData, u64>,
    pools: Array<MapData, Pool>,
    backends: Array<MapData, Backend>,
    next_hops: Array<MapData, NextHop>,
    config: Array<MapData, Config>,
    /// Redirect targets (ifindex → ifindex).
    pub tx_ports: DevMapHash<MapData>,
    /// Packets and bytes by reason.
    pub reason_stats: PerCpuArray<MapData, Traffic>,
    /// Packets and bytes by service and verdict.
    pub svc_stats: PerCpuArray<MapData, Traffic>,
    /// Packets and bytes by backend.
    pub backend_stats: PerCpuArray<MapData, Traffic>,
    /// Failure signals by backend.
    pub backend_signals: PerCpuArray<MapData, BackendSignals>,
    /// Connection tracking (read for status and tests).
    pub conntrack: HashMap<MapData, FlowKey, FlowEntry>,
    /// Virtual IPs.
    pub vips: HashMap<MapData, VipKey, Vip>,
    /// Client classes by prefix.
    client_classes: LpmTrie<MapData, ClientAddr, u32>,
    /// Decision words of client classes.
    class_decisions: Array<MapData, u64>,
    /// Classifier answers (and the program's placeholders), by client address.
    pub client_answers: HashMap<MapData, ClientAddr, ClientAnswer>,
    /// New flows by class and side; answer and ring counters.
    pub class_stats: PerCpuArray<MapData, Traffic>,
    /// The ring of unknown clients, until [`KernelMaps::take_unknown_clients`] takes it.
    unknown_clients: Option<RingBuf<MapData>>,
    /// The `MAGLEV` array, mapped (`BPF_F_MMAPABLE`).
    maglev: MmapMut,
}

fn typed<T>(name: &'static str, map: Map) -> Result<T, DataplaneError>
where
    T: TryFrom<Map, Error = aya::maps::MapError>,
{
    T::try_from(map).map_err(|e| DataplaneError::map(name, e))
}

fn mmap_maglev(data: &MapData) -> Result<MmapMut, DataplaneError> {
    let fd = data
        .fd()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| DataplaneError::Io {
            what: "duplicating the fd of map",
            path: maps::MAGLEV.into(),
            source,
        })?;
    let file = File::from(fd);
    // SAFETY: the mapping covers exactly the array's memory (BPF_F_MMAPABLE arrays are
    // page-aligned and at least this long); the program only reads it, and this process is its
    // only writer.
    unsafe { MmapOptions::new().len(MAGLEV_BYTES).map_mut(&file) }.map_err(|source| {
        DataplaneError::Io {
            what: "mapping",
            path: maps::MAGLEV.into(),
            source,
        }
    })
}

impl KernelMaps {
    /// Takes the maps out of a loaded object.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::MissingMap`] for a map the object lacks (or a `MAGLEV` that is not an
    /// array), [`DataplaneError::Map`] for one of another type than its handle,
    /// [`DataplaneError::Io`] when `MAGLEV` cannot be memory-mapped.
    pub fn take(ebpf: &mut Ebpf) -> Result<Self, DataplaneError> {
        let mut take =
            |name: &'static str| ebpf.take_map(name).ok_or(DataplaneError::MissingMap(name));
        let maglev = match take(maps::MAGLEV)? {
            Map::Array(data) => mmap_maglev(&data)?,
            _ => return Err(DataplaneError::MissingMap(maps::MAGLEV)),
        };
        Ok(Self {
            services: typed(maps::SERVICES, take(maps::SERVICES)?)?,
            service_slots: typed(maps::SERVICE_SLOTS, take(maps::SERVICE_SLOTS)?)?,
            filter: typed(maps::SERVICE_FILTER, take(maps::SERVICE_FILTER)?)?,
            decisions: typed(maps::DECISIONS, take(maps::DECISIONS)?)?,
            pools: typed(maps::POOLS, take(maps::POOLS)?)?,
            backends: typed(maps::BACKENDS, take(maps::BACKENDS)?)?,
            next_hops: typed(maps::NEXT_HOPS, take(maps::NEXT_HOPS)?)?,
            config: typed(maps::CONFIG, take(maps::CONFIG)?)?,
            tx_ports: typed(maps::TX_PORTS, take(maps::TX_PORTS)?)?,
            reason_stats: typed(maps::REASON_STATS, take(maps::REASON_STATS)?)?,
            svc_stats: typed(maps::SVC_STATS, take(maps::SVC_STATS)?)?,
            backend_stats: typed(maps::BACKEND_STATS, take(maps::BACKEND_STATS)?)?,
            backend_signals: typed(maps::BACKEND_SIGNALS, take(maps::BACKEND_SIGNALS)?)?,
            conntrack: typed(maps::CONNTRACK, take(maps::CONNTRACK)?)?,
            vips: typed(maps::VIPS, take(maps::VIPS)?)?,
            client_classes: typed(maps::CLIENT_CLASSES, take(maps::CLIENT_CLASSES)?)?,
            class_decisions: typed(maps::CLASS_DECISIONS, take(maps::CLASS_DECISIONS)?)?,
            client_answers: typed(maps::CLIENT_ANSWERS, take(maps::CLIENT_ANSWERS)?)?,
            class_stats: typed(maps::CLASS_STATS, take(maps::CLASS_STATS)?)?,
            unknown_clients: Some(typed(maps::UNKNOWN_CLIENTS, take(maps::UNKNOWN_CLIENTS)?)?),
            maglev,
        })
    }

    /// Opens the maps pinned in `dir` (read-mostly users: `status`, tests).
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] for a map that is not pinned in `dir` or cannot be opened or
    /// typed, [`DataplaneError::Io`] when `MAGLEV` cannot be memory-mapped.
    pub fn open_pinned(dir: &Path) -> Result<Self, DataplaneError> {
        let open = |name: &'static str| -> Result<MapData, DataplaneError> {
            MapData::from_pin(dir.join(name)).map_err(|e| DataplaneError::map(name, e))
        };
        let map = |name: &'static str, f: fn(MapData) -> Map| open(name).map(f);
        let maglev = mmap_maglev(&open(maps::MAGLEV)?)?;
        Ok(Self {
            services: typed(maps::SERVICES, map(maps::SERVICES, Map::HashMap)?)?,
            service_slots: typed(maps::SERVICE_SLOTS, map(maps::SERVICE_SLOTS, Map::Array)?)?,
            filter: typed(maps::SERVICE_FILTER, map(maps::SERVICE_FILTER, Map::Array)?)?,
            decisions: typed(maps::DECISIONS, map(maps::DECISIONS, Map::Array)?)?,
            pools: typed(maps::POOLS, map(maps::POOLS, Map::Array)?)?,
            backends: typed(maps::BACKENDS, map(maps::BACKENDS, Map::Array)?)?,
            next_hops: typed(maps::NEXT_HOPS, map(maps::NEXT_HOPS, Map::Array)?)?,
            config: typed(maps::CONFIG, map(maps::CONFIG, Map::Array)?)?,
            tx_ports: typed(maps::TX_PORTS, map(maps::TX_PORTS, Map::DevMapHash)?)?,
            reason_stats: typed(
                maps::REASON_STATS,
                map(maps::REASON_STATS, Map::PerCpuArray)?,
            )?,
            svc_stats: typed(maps::SVC_STATS, map(maps::SVC_STATS, Map::PerCpuArray)?)?,
            backend_stats: typed(
                maps::BACKEND_STATS,
                map(maps::BACKEND_STATS, Map::PerCpuArray)?,
            )?,
            backend_signals: typed(
                maps::BACKEND_SIGNALS,
                map(maps::BACKEND_SIGNALS, Map::PerCpuArray)?,
            )?,
            conntrack: typed(maps::CONNTRACK, map(maps::CONNTRACK, Map::LruHashMap)?)?,
            vips: typed(maps::VIPS, map(maps::VIPS, Map::HashMap)?)?,
            client_classes: typed(
                maps::CLIENT_CLASSES,
                map(maps::CLIENT_CLASSES, Map::LpmTrie)?,
            )?,
            class_decisions: typed(
                maps::CLASS_DECISIONS,
                map(maps::CLASS_DECISIONS, Map::Array)?,
            )?,
            client_answers: typed(
                maps::CLIENT_ANSWERS,
                map(maps::CLIENT_ANSWERS, Map::LruHashMap)?,
            )?,
            class_stats: typed(maps::CLASS_STATS, map(maps::CLASS_STATS, Map::PerCpuArray)?)?,
            // A reader of the ring consumes its records: only the agent that loaded the
            // program reads it.
            unknown_clients: None,
            maglev,
        })
    }

    /// The reader of `UNKNOWN_CLIENTS`, once (`None` after the first call, and for maps
    /// opened from their pins: a reader consumes the records, so the agent that loaded the
    /// program is the only one).
    pub fn take_unknown_clients(&mut self) -> Option<UnknownClients> {
        self.unknown_clients.take().map(UnknownClients::new)
    }

    /// The static class of client `addr`: the longest prefix of `CLIENT_CLASSES` that holds it
    /// (the kernel's lookup of a trie is a longest-prefix match), if any.
    #[must_use]
    pub fn client_class(&self, addr: &ClientAddr) -> Option<u32> {
        self.client_classes
            .get(&Key::new(class_prefix_len(128), *addr), 0)
            .ok()
    }

    /// The `CLIENT_ANSWERS` entry of client `addr`, live or not, if the map holds one.
    #[must_use]
    pub fn client_answer(&self, addr: &ClientAddr) -> Option<ClientAnswer> {
        self.client_answers.get(addr, 0).ok()
    }

    /// Word `index` of `CLASS_DECISIONS` ([`router_common::class_decision_index`]).
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the lookup fails (`index` past the map's end).
    pub fn class_decision(&self, index: u32) -> Result<u64, DataplaneError> {
        self.class_decisions
            .get(&index, 0)
            .map_err(|e| DataplaneError::map(maps::CLASS_DECISIONS, e))
    }

    /// The generation word.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `CONFIG` lookup fails.
    pub fn config(&self) -> Result<Config, DataplaneError> {
        self.config
            .get(&0, 0)
            .map_err(|e| DataplaneError::map(maps::CONFIG, e))
    }

    /// Services currently in the map.
    pub fn services(&self) -> Vec<(ServiceKey, Service)> {
        self.services.iter().filter_map(Result::ok).collect()
    }

    /// The `SERVICES` entry of `key`, if the map holds one.
    #[must_use]
    pub fn service(&self, key: &ServiceKey) -> Option<Service> {
        self.services.get(key, 0).ok()
    }

    /// Service slot `slot` (`None` past the array's end).
    #[must_use]
    pub fn service_slot(&self, slot: u32) -> Option<ServiceSlot> {
        self.service_slots.get(&slot, 0).ok()
    }

    /// The `SERVICE_SLOTS` entries that hold a service (a key other than all zero), by slot.
    #[must_use]
    pub fn held_service_slots(&self) -> Vec<(u32, ServiceSlot)> {
        (0..self.service_slots.len())
            .filter_map(|i| Some((i, self.service_slots.get(&i, 0).ok()?)))
            .filter(|(_, s)| s.key != ServiceKey::default())
            .collect()
    }

    /// Backend slot `slot`.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `BACKENDS` lookup fails (`slot` past the map's end).
    pub fn backend(&self, slot: u32) -> Result<Backend, DataplaneError> {
        self.backends
            .get(&slot, 0)
            .map_err(|e| DataplaneError::map(maps::BACKENDS, e))
    }

    /// Backend slot `slot`'s next hop.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `NEXT_HOPS` lookup fails (`slot` past the map's end).
    pub fn next_hop(&self, slot: u32) -> Result<NextHop, DataplaneError> {
        self.next_hops
            .get(&slot, 0)
            .map_err(|e| DataplaneError::map(maps::NEXT_HOPS, e))
    }

    /// Pool slot `slot`.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `POOLS` lookup fails (`slot` past the map's end).
    pub fn pool(&self, slot: u32) -> Result<Pool, DataplaneError> {
        self.pools
            .get(&slot, 0)
            .map_err(|e| DataplaneError::map(maps::POOLS, e))
    }

    /// Decision word `slot`.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the `DECISIONS` lookup fails (`slot` past the map's end).
    pub fn decision(&self, slot: u32) -> Result<u64, DataplaneError> {
        self.decisions
            .get(&slot, 0)
            .map_err(|e| DataplaneError::map(maps::DECISIONS, e))
    }

    /// The backend slot entry `entry` of half `half` of pool `pool`'s Maglev table names
    /// ([`router_common::NO_BACKEND`] for none).
    #[must_use]
    pub fn table_entry(&self, pool: u32, half: u32, entry: u32) -> Option<u32> {
        let at = maglev_index(pool, half, entry) as usize * MAGLEV_ENTRY_BYTES;
        let b = self.maglev.get(at..at + MAGLEV_ENTRY_BYTES)?;
        Some(maglev_backend(u16::from_ne_bytes([b[0], b[1]])))
    }
}

impl Dataplane for KernelMaps {
    fn set_backend(&mut self, slot: u32, backend: Backend) -> Result<(), DataplaneError> {
        self.backends
            .set(slot, backend, 0)
            .map_err(|e| DataplaneError::map(maps::BACKENDS, e))
    }

    fn set_next_hop(&mut self, slot: u32, hop: NextHop) -> Result<(), DataplaneError> {
        self.next_hops
            .set(slot, hop, 0)
            .map_err(|e| DataplaneError::map(maps::NEXT_HOPS, e))
    }

    fn write_table(&mut self, pool: u32, half: u32, table: &[u32]) -> Result<(), DataplaneError> {
        let start = maglev_index(pool, half, 0) as usize * MAGLEV_ENTRY_BYTES;
        let end = start + table.len().min(MAGLEV_SIZE as usize) * MAGLEV_ENTRY_BYTES;
        // Every entry is checked before the first is written: a table is copied whole or not
        // at all.
        let entries = table
            .iter()
            .map(|&id| {
                maglev_entry(id).ok_or_else(|| DataplaneError::Unrepresentable {
                    name: maps::MAGLEV,
                    what: format!("backend slot {id} does not fit a 16-bit Maglev entry"),
                })
            })
            .collect::<Result<Vec<u16>, _>>()?;
        let Some(dst) = self.maglev.get_mut(start..end) else {
            return Err(DataplaneError::map(
                maps::MAGLEV,
                aya::maps::MapError::OutOfBounds {
                    index: pool,
                    max_entries: MAX_POOLS,
                },
            ));
        };
        for (chunk, entry) in dst.chunks_exact_mut(MAGLEV_ENTRY_BYTES).zip(entries) {
            chunk.copy_from_slice(&entry.to_ne_bytes());
        }
        Ok(())
    }

    fn set_pool(&mut self, slot: u32, pool: Pool) -> Result<(), DataplaneError> {
        // The update syscall orders the table stores above before the flip becomes visible.
        self.pools
            .set(slot, pool, 0)
            .map_err(|e| DataplaneError::map(maps::POOLS, e))
    }

    fn set_decision(&mut self, slot: u32, word: u64) -> Result<(), DataplaneError> {
        self.decisions
            .set(slot, word, 0)
            .map_err(|e| DataplaneError::map(maps::DECISIONS, e))
    }

    fn set_service(&mut self, key: ServiceKey, service: Service) -> Result<(), DataplaneError> {
        self.service_slots
            .set(service.id, ServiceSlot { key, service }, 0)
            .map_err(|e| DataplaneError::map(maps::SERVICE_SLOTS, e))?;
        self.services
            .insert(key, service, 0)
            .map_err(|e| DataplaneError::map(maps::SERVICES, e))
    }

    fn free_service_slot(&mut self, slot: u32) -> Result<(), DataplaneError> {
        self.service_slots
            .set(slot, ServiceSlot::default(), 0)
            .map_err(|e| DataplaneError::map(maps::SERVICE_SLOTS, e))
    }

    fn set_filter_word(&mut self, index: u32, word: u64) -> Result<(), DataplaneError> {
        self.filter
            .set(index, word, 0)
            .map_err(|e| DataplaneError::map(maps::SERVICE_FILTER, e))
    }

    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), DataplaneError> {
        match self.services.remove(key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(DataplaneError::map(maps::SERVICES, e)),
        }
    }

    fn set_config(&mut self, config: Config) -> Result<(), DataplaneError> {
        self.config
            .set(0, config, 0)
            .map_err(|e| DataplaneError::map(maps::CONFIG, e))
    }

    fn set_vip(&mut self, key: VipKey, vip: Option<Vip>) -> Result<(), DataplaneError> {
        match vip {
            Some(v) => self
                .vips
                .insert(key, v, 0)
                .map_err(|e| DataplaneError::map(maps::VIPS, e)),
            None => match self.vips.remove(&key) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
                Err(e) => Err(DataplaneError::map(maps::VIPS, e)),
            },
        }
    }

    fn read_vips(&self) -> Vec<(VipKey, Vip)> {
        self.vips.iter().filter_map(Result::ok).collect()
    }

    fn set_class_prefix(
        &mut self,
        addr: ClientAddr,
        bits: u32,
        class: Option<u32>,
    ) -> Result<(), DataplaneError> {
        let key = Key::new(class_prefix_len(bits), addr);
        match class {
            Some(c) => self
                .client_classes
                .insert(&key, c, 0)
                .map_err(|e| DataplaneError::map(maps::CLIENT_CLASSES, e)),
            None => match self.client_classes.remove(&key) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
                Err(e) => Err(DataplaneError::map(maps::CLIENT_CLASSES, e)),
            },
        }
    }

    fn read_class_prefixes(&self) -> Vec<(ClientAddr, u32, u32)> {
        self.client_classes
            .iter()
            .filter_map(Result::ok)
            .map(|(key, class)| {
                let (len, addr) = (key.prefix_len(), key.data());
                (addr, len.saturating_sub(class_prefix_len(0)), class)
            })
            .collect()
    }

    fn set_class_decision(&mut self, index: u32, word: u64) -> Result<(), DataplaneError> {
        self.class_decisions
            .set(index, word, 0)
            .map_err(|e| DataplaneError::map(maps::CLASS_DECISIONS, e))
    }

    fn set_client_answer(
        &mut self,
        addr: ClientAddr,
        answer: Option<ClientAnswer>,
    ) -> Result<(), DataplaneError> {
        match answer {
            Some(a) => self
                .client_answers
                .insert(addr, a, 0)
                .map_err(|e| DataplaneError::map(maps::CLIENT_ANSWERS, e)),
            None => match self.client_answers.remove(&addr) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
                Err(e) => Err(DataplaneError::map(maps::CLIENT_ANSWERS, e)),
            },
        }
    }
}

impl super::Readback for KernelMaps {
    fn read_filter(&self) -> Option<Vec<u64>> {
        (0..router_common::FILTER_ENTRIES)
            .map(|i| self.filter.get(&i, 0).ok())
            .collect()
    }

    fn read_config(&self) -> Result<Config, DataplaneError> {
        self.config()
    }

    fn read_services(&self) -> Vec<(ServiceKey, Service)> {
        self.services()
    }

    fn read_backend(&self, slot: u32) -> Result<Backend, DataplaneError> {
        self.backend(slot)
    }

    fn read_pool(&self, slot: u32) -> Result<Pool, DataplaneError> {
        self.pool(slot)
    }

    fn read_next_hop(&self, slot: u32) -> Result<NextHop, DataplaneError> {
        self.next_hop(slot)
    }

    fn read_decision(&self, slot: u32) -> Result<u64, DataplaneError> {
        self.decision(slot)
    }

    fn read_table(&self, pool: u32, half: u32) -> Option<Vec<u32>> {
        (0..MAGLEV_SIZE)
            .map(|entry| self.table_entry(pool, half, entry))
            .collect()
    }
}
