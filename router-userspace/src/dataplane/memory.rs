//! An in-memory [`Dataplane`] for tests: it records every write in order, so tests can check
//! both the final state and that no write exposed a half-built state.

use std::collections::HashMap;

use router_common::{
    Backend, ClientAddr, ClientAnswer, Config, MAGLEV_SIZE, NextHop, Pool, Service, ServiceKey,
    Vip, VipKey,
};

use super::{Dataplane, DataplaneError};

/// One recorded write.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// `set_backend(slot, …)`.
    Backend(u32, Backend),
    /// `set_next_hop(slot, …)`.
    NextHop(u32, NextHop),
    /// `write_table(pool, half, …)`.
    Table(u32, u32),
    /// `set_pool(slot, …)`.
    Pool(u32, Pool),
    /// `set_decision(slot, word)`.
    Decision(u32, u64),
    /// `set_service(key, …)`.
    Service(ServiceKey, Service),
    /// `remove_service(key)`.
    RemoveService(ServiceKey),
    /// `free_service_slot(slot)`.
    FreeServiceSlot(u32),
    /// `set_filter_word(index, word)`.
    Filter(u32, u64),
    /// `set_config(…)`.
    Config(Config),
    /// `set_vip(key, …)`.
    Vip(VipKey, Option<Vip>),
    /// `set_class_prefix(addr, bits, class)`.
    ClassPrefix(ClientAddr, u32, Option<u32>),
    /// `set_class_decision(index, word)`.
    ClassDecision(u32, u64),
    /// `set_client_answer(addr, …)`.
    ClientAnswer(ClientAddr, Option<ClientAnswer>),
}

/// Maps as plain collections.
#[derive(Clone, Default, Debug)]
pub struct MemoryDataplane {
    /// Backend slots written.
    pub backends: HashMap<u32, Backend>,
    /// Next hops written, by backend slot.
    pub next_hops: HashMap<u32, NextHop>,
    /// Tables by (pool, half).
    pub tables: HashMap<(u32, u32), Vec<u32>>,
    /// Pool slots written.
    pub pools: HashMap<u32, Pool>,
    /// Decision words written.
    pub decisions: HashMap<u32, u64>,
    /// Services present.
    pub services: HashMap<ServiceKey, Service>,
    /// Service slots written and not freed.
    pub service_slots: HashMap<u32, (ServiceKey, Service)>,
    /// Filter words written (absent: zero).
    pub filter: HashMap<u32, u64>,
    /// Last generation word.
    pub config: Config,
    /// Virtual IPs present.
    pub vips: HashMap<VipKey, Vip>,
    /// Client class prefixes present, by (address, bits).
    pub class_prefixes: HashMap<(ClientAddr, u32), u32>,
    /// Class decision words written, by index.
    pub class_decisions: HashMap<u32, u64>,
    /// Client answers present.
    pub client_answers: HashMap<ClientAddr, ClientAnswer>,
    /// Every write, in order.
    pub log: Vec<Write>,
}

impl MemoryDataplane {
    /// The live table of pool `slot`, as the program would read it.
    #[must_use]
    pub fn live_table(&self, slot: u32) -> Option<&Vec<u32>> {
        let pool = self.pools.get(&slot)?;
        self.tables.get(&(slot, pool.active))
    }
}

impl Dataplane for MemoryDataplane {
    fn set_backend(&mut self, slot: u32, backend: Backend) -> Result<(), DataplaneError> {
        self.backends.insert(slot, backend);
        self.log.push(Write::Backend(slot, backend));
        Ok(())
    }

    fn set_next_hop(&mut self, slot: u32, hop: NextHop) -> Result<(), DataplaneError> {
        self.next_hops.insert(slot, hop);
        self.log.push(Write::NextHop(slot, hop));
        Ok(())
    }

    fn write_table(&mut self, pool: u32, half: u32, table: &[u32]) -> Result<(), DataplaneError> {
        assert_eq!(
            table.len(),
            MAGLEV_SIZE as usize,
            "a table is MAGLEV_SIZE entries"
        );
        self.tables.insert((pool, half), table.to_vec());
        self.log.push(Write::Table(pool, half));
        Ok(())
    }

    fn set_pool(&mut self, slot: u32, pool: Pool) -> Result<(), DataplaneError> {
        self.pools.insert(slot, pool);
        self.log.push(Write::Pool(slot, pool));
        Ok(())
    }

    fn set_decision(&mut self, slot: u32, word: u64) -> Result<(), DataplaneError> {
        self.decisions.insert(slot, word);
        self.log.push(Write::Decision(slot, word));
        Ok(())
    }

    fn set_service(&mut self, key: ServiceKey, service: Service) -> Result<(), DataplaneError> {
        self.service_slots.insert(service.id, (key, service));
        self.services.insert(key, service);
        self.log.push(Write::Service(key, service));
        Ok(())
    }

    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), DataplaneError> {
        self.services.remove(key);
        self.log.push(Write::RemoveService(*key));
        Ok(())
    }

    fn free_service_slot(&mut self, slot: u32) -> Result<(), DataplaneError> {
        self.service_slots.remove(&slot);
        self.log.push(Write::FreeServiceSlot(slot));
        Ok(())
    }

    fn set_filter_word(&mut self, index: u32, word: u64) -> Result<(), DataplaneError> {
        self.filter.insert(index, word);
        self.log.push(Write::Filter(index, word));
        Ok(())
    }

    fn set_config(&mut self, config: Config) -> Result<(), DataplaneError> {
        self.config = config;
        self.log.push(Write::Config(config));
        Ok(())
    }

    fn set_vip(&mut self, key: VipKey, vip: Option<Vip>) -> Result<(), DataplaneError> {
        match vip {
            Some(v) => self.vips.insert(key, v),
            None => self.vips.remove(&key),
        };
        self.log.push(Write::Vip(key, vip));
        Ok(())
    }

    fn read_vips(&self) -> Vec<(VipKey, Vip)> {
        self.vips.iter().map(|(k, v)| (*k, *v)).collect()
    }

    fn set_class_prefix(
        &mut self,
        addr: ClientAddr,
        bits: u32,
        class: Option<u32>,
    ) -> Result<(), DataplaneError> {
        match class {
            Some(c) => self.class_prefixes.insert((addr, bits), c),
            None => self.class_prefixes.remove(&(addr, bits)),
        };
        self.log.push(Write::ClassPrefix(addr, bits, class));
        Ok(())
    }

    fn read_class_prefixes(&self) -> Vec<(ClientAddr, u32, u32)> {
        self.class_prefixes
            .iter()
            .map(|((a, bits), c)| (*a, *bits, *c))
            .collect()
    }

    fn set_class_decision(&mut self, index: u32, word: u64) -> Result<(), DataplaneError> {
        self.class_decisions.insert(index, word);
        self.log.push(Write::ClassDecision(index, word));
        Ok(())
    }

    fn set_client_answer(
        &mut self,
        addr: ClientAddr,
        answer: Option<ClientAnswer>,
    ) -> Result<(), DataplaneError> {
        match answer {
            Some(a) => self.client_answers.insert(addr, a),
            None => self.client_answers.remove(&addr),
        };
        self.log.push(Write::ClientAnswer(addr, answer));
        Ok(())
    }
}

impl super::Readback for MemoryDataplane {
    fn read_filter(&self) -> Option<Vec<u64>> {
        Some(
            (0..router_common::FILTER_ENTRIES)
                .map(|i| self.filter.get(&i).copied().unwrap_or(0))
                .collect(),
        )
    }

    fn read_config(&self) -> Result<Config, DataplaneError> {
        Ok(self.config)
    }

    fn read_services(&self) -> Vec<(ServiceKey, Service)> {
        self.services.iter().map(|(k, v)| (*k, *v)).collect()
    }

    fn read_backend(&self, slot: u32) -> Result<Backend, DataplaneError> {
        Ok(self.backends.get(&slot).copied().unwrap_or_default())
    }

    fn read_next_hop(&self, slot: u32) -> Result<NextHop, DataplaneError> {
        Ok(self.next_hops.get(&slot).copied().unwrap_or_default())
    }

    fn read_pool(&self, slot: u32) -> Result<Pool, DataplaneError> {
        Ok(self.pools.get(&slot).copied().unwrap_or_default())
    }

    fn read_decision(&self, slot: u32) -> Result<u64, DataplaneError> {
        Ok(self.decisions.get(&slot).copied().unwrap_or_default())
    }

    fn read_table(&self, pool: u32, half: u32) -> Option<Vec<u32>> {
        Some(
            self.tables
                .get(&(pool, half))
                .cloned()
                .unwrap_or_else(|| vec![0; MAGLEV_SIZE as usize]),
        )
    }
}
