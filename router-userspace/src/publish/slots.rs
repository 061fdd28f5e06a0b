//! Round-robin slot allocation: a freed slot is reused as late as possible, so a conntrack
//! entry that still names a removed backend's slot sees it down (and re-selects) rather than
//! meeting a new backend there.

use super::PublishError;

/// Slots `0..limit` of one kind (service, pool or backend).
#[derive(Debug)]
pub(super) struct Slots {
    pub(super) used: Vec<bool>,
    pub(super) next: usize,
}

impl Slots {
    pub(super) fn new(limit: u32) -> Self {
        Self {
            used: vec![false; limit as usize],
            next: 0,
        }
    }

    /// The next free slot after the last one taken.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a slot is below the limit `new` was given, a u32"
    )]
    pub(super) fn take(&mut self, what: &'static str) -> Result<u32, PublishError> {
        let n = self.used.len();
        for i in 0..n {
            let at = (self.next + i) % n;
            if let Some(slot) = self.used.get_mut(at).filter(|u| !**u) {
                *slot = true;
                self.next = (at + 1) % n;
                return Ok(at as u32);
            }
        }
        Err(PublishError::Full(what))
    }

    pub(super) fn free_count(&self) -> usize {
        self.used.iter().filter(|u| !**u).count()
    }

    pub(super) fn free(&mut self, slot: u32) {
        if let Some(u) = self.used.get_mut(slot as usize) {
            *u = false;
        }
    }
}
