//! Maglev lookup tables: which backend each of a pool's table slots names.
//!
//! This module owns the table *builder* (Maglev paper, Eisenbud et al., NSDI 2016, §3.4): a pure
//! function from a backend set to a table, with no I/O. The map writer copies the result into
//! the inactive half of the pool's double-buffered `MAGLEV` map; the XDP program picks slot
//! `flow_hash % size` for a new flow.
//!
//! # Algorithm
//!
//! Every backend has a permutation of the slots `0..size`, derived from its `key` alone:
//!
//! - `offset = XXH64(key, OFFSET_SEED) mod size`
//! - `skip = XXH64(key, SKIP_SEED) mod (size − 1) + 1`
//! - `permutation[j] = (offset + j · skip) mod size`
//!
//! (`XXH64` is xxHash's 64-bit hash of the key's UTF-8 bytes, from the `xxhash-rust` crate.)
//! Because `size` is prime and `1 ≤ skip < size`, each permutation visits every slot exactly
//! once. Backends then take turns, in order of `key`: on its turn a backend claims the next slot
//! of its permutation that is still empty, until the table is full. Permutations are walked
//! lazily (one cursor per backend), never materialised.
//!
//! Weights use per-round credit (the weighted variant used by Katran and Cilium): each round,
//! every backend gains credit equal to its weight, and a backend with at least `max_weight`
//! credit takes a turn and pays `max_weight`. Over `r` rounds a backend of weight `w` takes
//! `⌊r · w / max_weight⌋` turns, so entry counts are proportional to weight within one slot plus
//! the final, partial round. With equal weights this is exactly the unweighted algorithm.
//!
//! # Properties
//!
//! - **Deterministic across machines**: the table depends only on the set of `(key, id,
//!   weight)` and `size` — not on input order, platform or process — so balancer nodes behind
//!   ECMP build identical tables (paper §3.3).
//! - **Minimal disruption**: removing or adding one of `n` backends moves about `1/n` of the
//!   slots plus a small amount of churn among the others (paper §3.4, measured in the tests).
//! - **Cost**: `O(size · log size)` expected probe steps, plus one credit update per backend per
//!   round, with about `size · max_weight / Σ weight` rounds; one allocation for the table and
//!   two small ones (sorted references, cursors). Release build, this machine: ~1.1 ms for
//!   1,000 equal backends at 65,537 slots, ~20 ms for 999 of weight 1 and one of 65,535
//!   (`benches/maglev.rs`).

use router_common::NO_BACKEND;
use thiserror::Error;
use xxhash_rust::xxh64::xxh64;

/// Seed of the hash that gives a backend's permutation offset. Part of the table format: changing
/// it reshuffles every table, so nodes with different seeds disagree (the golden test pins it).
const OFFSET_SEED: u64 = 0x6d61_676c_6576_6f66; // "maglevof"
/// Seed of the hash that gives a backend's permutation skip. See [`OFFSET_SEED`].
const SKIP_SEED: u64 = 0x6d61_676c_6576_736b; // "maglevsk"

/// One backend as the table builder sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaglevBackend {
    /// The value written into the table slots this backend owns: its backend slot in the
    /// `BACKENDS` map. Must not be [`NO_BACKEND`].
    pub id: u32,
    /// Stable identity that places the backend in the table, e.g. its address text
    /// (`"10.0.1.11:8080"`). Unique within one build. The same key gets the same permutation on
    /// every node and across restarts, whatever its `id`.
    pub key: String,
    /// Relative weight: entry counts are proportional to it. `0` leaves the backend out of the
    /// table (draining), exactly as if it were absent.
    pub weight: u32,
}

/// Why a table could not be built. Each one is a caller's error, found before any work is done.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum MaglevError {
    /// The table size is not a prime (0 and 1 included): permutations would not visit every slot.
    #[error("Maglev table size {size} is not a prime number")]
    SizeNotPrime {
        /// The size asked for.
        size: u32,
    },
    /// More backends with a non-zero weight than the table has slots.
    #[error("{backends} weighted backends do not fit in a Maglev table of {size} slots")]
    TooManyBackends {
        /// Backends with weight > 0.
        backends: usize,
        /// The table size.
        size: u32,
    },
    /// Two backends share a key, so their placement would depend on input order.
    #[error("two Maglev backends have the same key {key:?}")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },
    /// A backend's id is [`NO_BACKEND`], the value that marks an empty slot.
    #[error("Maglev backend {key:?} has the reserved id {NO_BACKEND:#x}")]
    ReservedId {
        /// The backend's key.
        key: String,
    },
}

/// Builds a Maglev lookup table of `size` slots.
///
/// Returns `size` backend ids (`Vec::len() == size`), entry `i` naming the backend of table slot
/// `i`. Each backend with weight > 0 owns a share of the slots proportional to its weight; if no
/// backend has weight > 0 (or `backends` is empty), every entry is [`NO_BACKEND`]. Input order
/// does not matter: backends are placed in order of `key`.
///
/// `size` must be prime (the data plane uses [`router_common::MAGLEV_SIZE`], 65,537); the table
/// takes `4 · size` bytes.
///
/// # Errors
///
/// [`MaglevError`] when `size` is not prime, when more backends have weight > 0 than the table
/// has slots, when two backends share a key, or when an id is [`NO_BACKEND`].
pub fn build(backends: &[MaglevBackend], size: u32) -> Result<Vec<u32>, MaglevError> {
    if !is_prime(size) {
        return Err(MaglevError::SizeNotPrime { size });
    }

    let mut sorted: Vec<&MaglevBackend> = backends.iter().collect();
    sorted.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    let duplicate = sorted.windows(2).find_map(|pair| match pair {
        [a, b] if a.key == b.key => Some(a.key.clone()),
        _ => None,
    });
    if let Some(key) = duplicate {
        return Err(MaglevError::DuplicateKey { key });
    }
    if let Some(b) = sorted.iter().find(|b| b.id == NO_BACKEND) {
        return Err(MaglevError::ReservedId { key: b.key.clone() });
    }

    let mut cursors: Vec<Cursor> = sorted
        .iter()
        .filter(|b| b.weight > 0)
        .map(|b| Cursor::new(b, size))
        .collect();
    if cursors.len() > size as usize {
        return Err(MaglevError::TooManyBackends {
            backends: cursors.len(),
            size,
        });
    }

    let mut table = vec![NO_BACKEND; size as usize];
    let Some(max_weight) = cursors.iter().map(|c| c.weight).max() else {
        return Ok(table);
    };

    let mut filled: u32 = 0;
    'fill: loop {
        for cursor in &mut cursors {
            cursor.credit += cursor.weight;
            if cursor.credit < max_weight {
                continue;
            }
            cursor.credit -= max_weight;
            // An empty slot exists (filled < size) and the permutation visits every slot, and
            // each slot it skips is already taken: this loop ends within `size` steps.
            loop {
                let here = cursor.pos;
                cursor.pos = next_pos(here, cursor.skip, size);
                match table.get_mut(here as usize) {
                    Some(slot) if *slot == NO_BACKEND => {
                        *slot = cursor.id;
                        break;
                    }
                    _ => {}
                }
            }
            filled += 1;
            if filled == size {
                break 'fill;
            }
        }
    }
    Ok(table)
}

/// A backend's lazy walk along its permutation, and its weight credit.
struct Cursor {
    id: u32,
    /// The next permutation position to try, `< size`.
    pos: u32,
    /// `1..size`.
    skip: u32,
    weight: u64,
    /// `< 2 · max_weight`, so a `u64` cannot overflow.
    credit: u64,
}

impl Cursor {
    /// `size` is prime, so at least 2.
    fn new(backend: &MaglevBackend, size: u32) -> Self {
        let (offset, skip) = offset_skip(&backend.key, size);
        Self {
            id: backend.id,
            pos: offset,
            skip,
            weight: u64::from(backend.weight),
            credit: 0,
        }
    }
}

/// A key's permutation `(offset, skip)` in a table of `size ≥ 2` slots: `offset < size`,
/// `1 ≤ skip < size`.
#[expect(
    clippy::cast_possible_truncation,
    reason = "offset and skip are both below `size`, itself a u32"
)]
fn offset_skip(key: &str, size: u32) -> (u32, u32) {
    let size = u64::from(size);
    let offset = xxh64(key.as_bytes(), OFFSET_SEED) % size;
    let skip = xxh64(key.as_bytes(), SKIP_SEED) % (size - 1) + 1;
    (offset as u32, skip as u32)
}

/// `(pos + skip) mod size` for `pos, skip < size`, without overflow.
#[expect(
    clippy::inline_always,
    reason = "the step of the population loop, taken once per probe of every backend"
)]
#[inline(always)]
fn next_pos(pos: u32, skip: u32, size: u32) -> u32 {
    let room = size - pos;
    if skip < room { pos + skip } else { skip - room }
}

/// Trial division; at most 2^16 / 6 steps for any `u32`.
fn is_prime(n: u32) -> bool {
    if n < 4 {
        return n >= 2;
    }
    if n.is_multiple_of(2) || n.is_multiple_of(3) {
        return false;
    }
    let n = u64::from(n);
    let mut d: u64 = 5;
    while d * d <= n {
        if n.is_multiple_of(d) || n.is_multiple_of(d + 2) {
            return false;
        }
        d += 6;
    }
    true
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use router_common::MAGLEV_SIZE;

    use super::*;

    fn backend(id: u32, key: &str, weight: u32) -> MaglevBackend {
        MaglevBackend {
            id,
            key: key.to_owned(),
            weight,
        }
    }

    /// `n` backends of weight 1, ids `0..n`, keys `10.0.{i / 256}.{i % 256}:80`.
    fn equal(n: u32) -> Vec<MaglevBackend> {
        (0..n)
            .map(|i| backend(i, &format!("10.0.{}.{}:80", i / 256, i % 256), 1))
            .collect()
    }

    fn counts(table: &[u32]) -> BTreeMap<u32, usize> {
        let mut counts = BTreeMap::new();
        for &id in table {
            *counts.entry(id).or_insert(0) += 1;
        }
        counts
    }

    fn changed(a: &[u32], b: &[u32]) -> usize {
        a.iter().zip(b).filter(|(x, y)| x != y).count()
    }

    /// Asserts every backend's share is its weight's share of the table within 1 % of the table.
    #[expect(
        clippy::cast_precision_loss,
        reason = "weights and entry counts far below 2^52, compared as shares"
    )]
    fn assert_proportional(backends: &[MaglevBackend]) {
        let table = build(backends, MAGLEV_SIZE).unwrap();
        let counts = counts(&table);
        let total: u64 = backends.iter().map(|b| u64::from(b.weight)).sum();
        let size = f64::from(MAGLEV_SIZE);
        for b in backends {
            let expected = size * f64::from(b.weight) / total as f64;
            let got = counts.get(&b.id).copied().unwrap_or(0) as f64;
            assert!(
                (got - expected).abs() <= size / 100.0,
                "{}: {got} entries, expected {expected:.1}",
                b.key
            );
        }
        assert!(!counts.contains_key(&NO_BACKEND));
    }

    #[test]
    fn rejects_sizes_that_are_not_prime() {
        for size in [0, 1, 4, 9, 65_536, 65_535, u32::MAX] {
            assert_eq!(
                build(&equal(1), size),
                Err(MaglevError::SizeNotPrime { size })
            );
        }
        for size in [2, 3, 5, 7, 13, 251, MAGLEV_SIZE] {
            assert!(is_prime(size), "{size}");
        }
        assert!(is_prime(4_294_967_291)); // the largest u32 prime
    }

    #[test]
    fn rejects_more_weighted_backends_than_slots() {
        assert_eq!(
            build(&equal(8), 7),
            Err(MaglevError::TooManyBackends {
                backends: 8,
                size: 7
            })
        );
        // Draining backends take no slot, so they do not count.
        let mut backends = equal(7);
        backends.push(backend(7, "drained", 0));
        assert!(build(&backends, 7).is_ok());
    }

    #[test]
    fn rejects_duplicate_keys_and_the_reserved_id() {
        let dup = [backend(1, "a", 1), backend(2, "b", 1), backend(3, "a", 5)];
        assert_eq!(
            build(&dup, 13),
            Err(MaglevError::DuplicateKey { key: "a".into() })
        );
        let reserved = [backend(1, "a", 1), backend(NO_BACKEND, "b", 0)];
        assert_eq!(
            build(&reserved, 13),
            Err(MaglevError::ReservedId { key: "b".into() })
        );
    }

    #[test]
    fn no_weighted_backend_gives_an_empty_table() {
        let empty = build(&[], MAGLEV_SIZE).unwrap();
        assert_eq!(empty.len(), MAGLEV_SIZE as usize);
        assert!(empty.iter().all(|&e| e == NO_BACKEND));
        let drained = build(&[backend(1, "a", 0), backend(2, "b", 0)], 13).unwrap();
        assert_eq!(drained, vec![NO_BACKEND; 13]);
    }

    #[test]
    fn one_backend_owns_every_slot() {
        let table = build(&[backend(42, "only", 7)], MAGLEV_SIZE).unwrap();
        assert!(table.iter().all(|&e| e == 42));
    }

    #[test]
    fn as_many_equal_backends_as_slots_get_one_slot_each() {
        let table = build(&equal(13), 13).unwrap();
        let mut sorted = table.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..13).collect::<Vec<_>>());
        assert_eq!(build(&equal(2), 2).unwrap().len(), 2);
    }

    #[test]
    fn equal_weights_split_evenly() {
        assert_proportional(&equal(10));
        assert_proportional(&equal(1_000));
    }

    #[test]
    fn weights_1_2_1_are_proportional_within_one_percent() {
        assert_proportional(&[backend(0, "a", 1), backend(1, "b", 2), backend(2, "c", 1)]);
    }

    #[test]
    fn weights_100_100_50_10_are_proportional_within_one_percent() {
        assert_proportional(&[
            backend(0, "10.0.0.1:80", 100),
            backend(1, "10.0.0.2:80", 100),
            backend(2, "10.0.0.3:80", 50),
            backend(3, "10.0.0.4:80", 10),
        ]);
    }

    #[test]
    fn extreme_weights_are_proportional_and_terminate() {
        assert_proportional(&[backend(0, "heavy", u32::MAX), backend(1, "light", 1 << 24)]);
        let mut backends = equal(100);
        backends.push(backend(100, "heavy", 100));
        assert_proportional(&backends);
    }

    #[test]
    fn input_order_does_not_matter() {
        let backends = vec![
            backend(0, "10.0.0.1:80", 3),
            backend(1, "10.0.0.2:80", 1),
            backend(2, "[2001:db8::1]:80", 2),
            backend(3, "10.0.0.4:80", 1),
        ];
        let table = build(&backends, MAGLEV_SIZE).unwrap();
        let mut reversed = backends.clone();
        reversed.reverse();
        assert_eq!(build(&reversed, MAGLEV_SIZE).unwrap(), table);
        let mut rotated = backends;
        rotated.rotate_left(1);
        assert_eq!(build(&rotated, MAGLEV_SIZE).unwrap(), table);
    }

    #[test]
    fn a_drained_backend_is_as_if_absent() {
        let mut backends = equal(10);
        let without = build(&backends, MAGLEV_SIZE).unwrap();
        backends.insert(3, backend(99, "10.0.0.99:80", 0));
        assert_eq!(build(&backends, MAGLEV_SIZE).unwrap(), without);
    }

    #[test]
    fn next_pos_wraps_without_overflow() {
        let size = u32::MAX - 4; // 4294967291, prime
        assert_eq!(next_pos(size - 1, size - 1, size), size - 2);
        assert_eq!(next_pos(0, size - 1, size), size - 1);
        assert_eq!(next_pos(1, size - 1, size), 0);
        assert_eq!(next_pos(5, 3, 7), 1);
        assert_eq!(next_pos(3, 3, 7), 6);
    }

    /// The hash is the standard XXH64 (reference test vector), and pinned per key.
    #[test]
    fn permutation_hash_is_standard_xxh64() {
        assert_eq!(xxh64(b"", 0), 0xef46_db37_51d8_e999);
        let (offset, skip) = offset_skip("10.0.1.11:8080", MAGLEV_SIZE);
        assert_eq!(
            (u64::from(offset), u64::from(skip)),
            (
                xxh64(b"10.0.1.11:8080", OFFSET_SEED) % 65_537,
                xxh64(b"10.0.1.11:8080", SKIP_SEED) % 65_536 + 1
            )
        );
    }

    /// Pins the table format: any change to the hash, seeds, order or weighting shows up here,
    /// and would make nodes running different versions disagree.
    #[test]
    fn golden_table_for_three_backends() {
        let backends = [
            backend(0, "10.0.1.11:8080", 1),
            backend(1, "10.0.1.12:8080", 1),
            backend(2, "10.0.1.13:8080", 1),
        ];
        let table = build(&backends, MAGLEV_SIZE).unwrap();
        assert_eq!(
            table[..16],
            [2, 0, 2, 2, 1, 0, 0, 0, 2, 0, 1, 2, 0, 2, 2, 1]
        );
        assert_eq!(
            counts(&table).into_iter().collect::<Vec<_>>(),
            [(0, 21_846), (1, 21_846), (2, 21_845)]
        );
        let bytes: Vec<u8> = table.iter().flat_map(|e| e.to_le_bytes()).collect();
        assert_eq!(xxh64(&bytes, 0), 0xc7ee_89da_e8d3_b152);
    }

    /// Measures, for each of the 10 possible removals, the entries whose backend differs between
    /// the 10-backend and the 9-backend table — the removed backend's own ~10 % included. The
    /// total must stay within 11 % of the table, and the churn among the survivors (changed
    /// entries the removed backend did not own; about 0.2–0.3 % today) within 1 %.
    #[test]
    fn removing_one_of_ten_changes_at_most_11_percent() {
        let ten = equal(10);
        let before = build(&ten, MAGLEV_SIZE).unwrap();
        let size = MAGLEV_SIZE as usize;
        for removed in 0..10 {
            let nine: Vec<_> = ten.iter().filter(|b| b.id != removed).cloned().collect();
            let after = build(&nine, MAGLEV_SIZE).unwrap();
            let own = before.iter().filter(|&&e| e == removed).count();
            let total = changed(&before, &after);
            assert!(
                total * 100 <= size * 11,
                "removing {removed}: {total} changed"
            );
            assert!(
                (total - own) * 100 <= size,
                "removing {removed}: {} survivors' entries moved",
                total - own
            );
            assert!(!after.contains(&removed));
        }
    }

    /// As above for adding an 11th backend (five different keys): all changed entries, the new
    /// backend's ~9 % included, within 11 %; entries moved between old backends within 1 %.
    #[test]
    fn adding_an_eleventh_changes_at_most_11_percent() {
        let ten = equal(10);
        let before = build(&ten, MAGLEV_SIZE).unwrap();
        let size = MAGLEV_SIZE as usize;
        for k in 0..5 {
            let mut eleven = ten.clone();
            eleven.push(backend(10, &format!("10.0.9.{k}:80"), 1));
            let after = build(&eleven, MAGLEV_SIZE).unwrap();
            let own = after.iter().filter(|&&e| e == 10).count();
            let total = changed(&before, &after);
            assert!(total * 100 <= size * 11, "adding key {k}: {total} changed");
            assert!(
                (total - own) * 100 <= size,
                "adding key {k}: {} old entries moved between old backends",
                total - own
            );
        }
    }
}
