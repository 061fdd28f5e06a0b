//! The program's clock (decision 0021): the agent's time in `CLOCK[CLOCK_AGENT]`, in ns,
//! advanced every [`STEP`]. The program reads it with two array loads instead of a clock helper
//! call on every packet; flow timeouts count time while an agent runs.
//!
//! A run resumes from the value it finds in the pinned map, so the clock never jumps: time
//! while no agent ran does not count, and a flow idle then is not expired by a restart. It
//! never runs backwards on these maps either (one agent per pin directory).

use std::time::{Duration, Instant};

use aya::maps::{Array, MapData};
use router_common::{CLOCK_AGENT, CLOCK_OFFSET, maps};

use super::DataplaneError;

/// How often the agent advances the clock: the program's time is at most this far behind.
/// A tenth of `router_common::SEEN_REFRESH` and of the shortest flow timeout's granularity.
pub const STEP: Duration = Duration::from_millis(100);

/// The agent's side of the `CLOCK` map: the time it resumed from and when.
pub struct Clock {
    map: Array<MapData, u64>,
    base: u64,
    since: Instant,
}

impl Clock {
    /// Takes `CLOCK` from a loaded object and resumes from the time it holds (0 on new maps).
    ///
    /// # Errors
    ///
    /// [`DataplaneError::MissingMap`] when the object has no `CLOCK`;
    /// [`DataplaneError::Map`] when it cannot be read.
    pub fn take(ebpf: &mut aya::Ebpf) -> Result<Self, DataplaneError> {
        let map = ebpf
            .take_map(maps::CLOCK)
            .ok_or(DataplaneError::MissingMap(maps::CLOCK))?;
        let map: Array<MapData, u64> =
            Array::try_from(map).map_err(|e| DataplaneError::map(maps::CLOCK, e))?;
        let base = map
            .get(&CLOCK_AGENT, 0)
            .map_err(|e| DataplaneError::map(maps::CLOCK, e))?;
        Ok(Self {
            map,
            base,
            since: Instant::now(),
        })
    }

    /// Writes the agent's time now: the resumed value plus the time since.
    ///
    /// # Errors
    ///
    /// [`DataplaneError::Map`] when the write fails; the program's clock then stands still.
    pub fn advance(&mut self) -> Result<(), DataplaneError> {
        let ns = resumed(self.base, self.since.elapsed());
        self.map
            .set(CLOCK_AGENT, ns, 0)
            .map_err(|e| DataplaneError::map(maps::CLOCK, e))
    }

    /// Advances the clock every [`STEP`] until the task is aborted. A failed write is logged
    /// once, until a write succeeds again.
    pub async fn run(mut self) {
        let mut every = tokio::time::interval(STEP);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut failing = false;
        loop {
            every.tick().await;
            match self.advance() {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    log::warn!("the program's clock stands still: {e}");
                    failing = true;
                }
                Err(_) => {}
            }
        }
    }
}

/// The agent's time `elapsed` after resuming from `base` ns.
fn resumed(base: u64, elapsed: Duration) -> u64 {
    base.wrapping_add(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX))
}

/// The program's time, in ticks, from a `CLOCK` map's two values (agent time, offset): the
/// same sum and shift as the program's `now`, as a wrapping `u32`.
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    reason = "the program's clock is the low 32 bits of the tick count: it wraps"
)]
pub const fn ticks(agent: u64, offset: u64) -> u32 {
    (agent.wrapping_add(offset) >> router_common::TICK_SHIFT) as u32
}

/// The program's time, in ticks, read from a pinned `CLOCK` map.
///
/// # Errors
///
/// When either value cannot be read.
pub fn pinned_ticks(map: &Array<MapData, u64>) -> Result<u32, aya::maps::MapError> {
    Ok(ticks(map.get(&CLOCK_AGENT, 0)?, map.get(&CLOCK_OFFSET, 0)?))
}

/// The program's time, in ticks, read from the `CLOCK` map pinned in `pin_dir`.
///
/// # Errors
///
/// When the map is not pinned there, or cannot be read.
pub fn pinned_now(pin_dir: &std::path::Path) -> Result<u32, aya::maps::MapError> {
    let data = MapData::from_pin(pin_dir.join(maps::CLOCK))?;
    pinned_ticks(&Array::try_from(aya::maps::Map::Array(data))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_common::TICK_SHIFT;

    #[test]
    fn a_run_resumes_from_the_time_it_finds() {
        assert_eq!(resumed(0, Duration::from_millis(250)), 250_000_000);
        let before_restart = resumed(0, Duration::from_secs(3));
        // The next run starts from that value: no jump, whatever time passed in between.
        assert_eq!(
            resumed(before_restart, Duration::from_millis(100)),
            3_100_000_000
        );
    }

    #[test]
    fn ticks_are_the_sum_shifted_and_wrap_at_32_bits() {
        assert_eq!(ticks(3 << TICK_SHIFT, 0), 3);
        assert_eq!(ticks(1 << TICK_SHIFT, 2 << TICK_SHIFT), 3);
        assert_eq!(ticks((1 << TICK_SHIFT) - 1, 0), 0);
        assert_eq!(ticks((1u64 << (32 + TICK_SHIFT)) + (5 << TICK_SHIFT), 0), 5);
    }
}
