//! Client classes in the maps (decision 0036): the prefix set of `CLIENT_CLASSES`, the class
//! words of a decision slot in `CLASS_DECISIONS`, and the classifier's answers in
//! `CLIENT_ANSWERS`. Helpers the publisher calls; what they write comes from the config (class
//! ids: classes sorted by name, from 1) and the decision groups.
//!
//! Order, so the program never reads a word or a class that is not there yet:
//! - a decision slot's class words ([`write_class_words`]) are written before the service flag
//!   `SVC_F_CLASSES` that makes the program read them (an unwritten word is zero: pool 0);
//! - a prefix set is replaced new-first ([`replace_class_prefixes`]): the prefixes to add or
//!   change, then the ones to remove, so a client whose class stays never meets a trie without
//!   its prefix.

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

use router_common::{
    ClientAddr, ClientAnswer, FAMILY_V4, FAMILY_V6, MAX_CLASS_PREFIXES, MAX_CLASSES,
    class_decision_index, maps, ticks,
};

use crate::dataplane::{Dataplane, DataplaneError};

/// A client prefix of a class: an address with its host bits zero, and its length in bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientPrefix {
    addr: IpAddr,
    bits: u8,
}

impl ClientPrefix {
    /// `addr/bits`, its host bits cleared; `None` when `bits` is longer than the family's
    /// address (32 or 128).
    #[must_use]
    pub fn new(addr: IpAddr, bits: u8) -> Option<Self> {
        let addr = match addr {
            IpAddr::V4(a) if bits <= 32 => {
                let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) if bits <= 128 => {
                let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
            _ => return None,
        };
        Some(Self { addr, bits })
    }

    /// The network address (host bits zero).
    #[must_use]
    pub const fn addr(self) -> IpAddr {
        self.addr
    }

    /// The prefix length, bits.
    #[must_use]
    pub const fn bits(self) -> u8 {
        self.bits
    }

    /// The prefix of a `CLIENT_CLASSES` entry read back (`bits` not counting the family word);
    /// `None` for an entry no agent writes (another family, or too long).
    #[must_use]
    pub fn from_key(addr: &ClientAddr, bits: u32) -> Option<Self> {
        let bits = u8::try_from(bits).ok()?;
        let ip = ip_of(addr)?;
        Self::new(ip, bits).filter(|p| p.addr == ip)
    }
}

impl std::fmt::Display for ClientPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

/// The `ClientAddr` of `addr` (the key of `CLIENT_ANSWERS`, the data of a `CLIENT_CLASSES`
/// key).
#[must_use]
pub fn client_addr(addr: IpAddr) -> ClientAddr {
    let mut out = [0u8; 16];
    let family = match addr {
        IpAddr::V4(a) => {
            out[..4].copy_from_slice(&a.octets());
            FAMILY_V4
        }
        IpAddr::V6(a) => {
            out = a.octets();
            FAMILY_V6
        }
    };
    ClientAddr {
        family: u32::from(family),
        addr: out,
    }
}

/// The address of a `ClientAddr`, or `None` for a family that is neither IPv4 nor IPv6.
#[must_use]
pub fn ip_of(addr: &ClientAddr) -> Option<IpAddr> {
    let a = addr.addr;
    match u8::try_from(addr.family).ok()? {
        FAMILY_V4 => Some(IpAddr::from([a[0], a[1], a[2], a[3]])),
        FAMILY_V6 => Some(IpAddr::from(a)),
        _ => None,
    }
}

/// What [`replace_class_prefixes`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixDiff {
    /// Prefixes added.
    pub added: usize,
    /// Prefixes kept with another class.
    pub changed: usize,
    /// Prefixes removed.
    pub removed: usize,
}

/// The prefix set `CLIENT_CLASSES` holds (what an earlier agent left), for the first
/// [`replace_class_prefixes`]. Entries no agent writes are left out (and so removed by it only
/// if they decode).
#[must_use]
pub fn read_class_prefixes(dp: &(impl Dataplane + ?Sized)) -> BTreeMap<ClientPrefix, u32> {
    dp.read_class_prefixes()
        .into_iter()
        .filter_map(|(addr, bits, class)| Some((ClientPrefix::from_key(&addr, bits)?, class)))
        .collect()
}

/// Makes `CLIENT_CLASSES` hold `wanted` (prefix → class id, 1..=`MAX_CLASSES`), given that it
/// holds `published`: writes the prefixes that are new or changed class, then removes the ones
/// `wanted` lacks. `published` follows every write, so after an error it still says what the
/// map holds, and the next call finishes the job.
///
/// # Errors
///
/// [`DataplaneError::Unrepresentable`] before any write when `wanted` has more than
/// `MAX_CLASS_PREFIXES` prefixes or a class outside 1..=`MAX_CLASSES`; the first failing
/// write's error otherwise.
pub fn replace_class_prefixes(
    dp: &mut (impl Dataplane + ?Sized),
    published: &mut BTreeMap<ClientPrefix, u32>,
    wanted: &BTreeMap<ClientPrefix, u32>,
) -> Result<PrefixDiff, DataplaneError> {
    if wanted.len() > MAX_CLASS_PREFIXES as usize {
        return Err(DataplaneError::Unrepresentable {
            name: maps::CLIENT_CLASSES,
            what: format!(
                "{} client prefixes (the map holds {MAX_CLASS_PREFIXES})",
                wanted.len()
            ),
        });
    }
    if let Some((p, c)) = wanted.iter().find(|(_, c)| !(1..=MAX_CLASSES).contains(*c)) {
        return Err(DataplaneError::Unrepresentable {
            name: maps::CLIENT_CLASSES,
            what: format!("prefix {p}: class id {c} is not in 1..={MAX_CLASSES}"),
        });
    }
    let mut diff = PrefixDiff::default();
    for (prefix, class) in wanted {
        let before = published.get(prefix).copied();
        if before == Some(*class) {
            continue;
        }
        dp.set_class_prefix(
            client_addr(prefix.addr),
            u32::from(prefix.bits),
            Some(*class),
        )?;
        published.insert(*prefix, *class);
        if before.is_some() {
            diff.changed += 1;
        } else {
            diff.added += 1;
        }
    }
    let gone: Vec<ClientPrefix> = published
        .keys()
        .filter(|p| !wanted.contains_key(*p))
        .copied()
        .collect();
    for prefix in gone {
        dp.set_class_prefix(client_addr(prefix.addr), u32::from(prefix.bits), None)?;
        published.remove(&prefix);
        diff.removed += 1;
    }
    Ok(diff)
}

/// Writes the class words of decision slot `slot`: `words[c - 1]` is class `c`'s (a class the
/// action does not name gets the `default`'s word). Call before setting `SVC_F_CLASSES` on a
/// service of the slot.
///
/// # Errors
///
/// The first failing write's error (`slot` past `MAX_DECISIONS`, or the kernel refuses it);
/// the words before it are written.
pub fn write_class_words(
    dp: &mut (impl Dataplane + ?Sized),
    slot: u32,
    words: &[u64; MAX_CLASSES as usize],
) -> Result<(), DataplaneError> {
    for (class, word) in (1..=MAX_CLASSES).zip(words) {
        dp.set_class_decision(class_decision_index(slot, class), *word)?;
    }
    Ok(())
}

/// Writes the classifier's answer for `client`: class `class` (0..=`MAX_CLASSES`, 0 meaning
/// the `default`) for `ttl` from `now` (ticks of the program's clock,
/// [`crate::dataplane::clock`]). A `ttl` of zero writes an answer that is already expired; one
/// past about 12 days is cut to that (`router_common::MAX_TIMEOUT_TICKS`). Returns the entry
/// written.
///
/// # Errors
///
/// [`DataplaneError::Unrepresentable`] for a class past `MAX_CLASSES` (nothing written); the
/// write's error.
pub fn set_client_answer(
    dp: &mut (impl Dataplane + ?Sized),
    client: IpAddr,
    class: u32,
    ttl: Duration,
    now: u32,
) -> Result<ClientAnswer, DataplaneError> {
    if class > MAX_CLASSES {
        return Err(DataplaneError::Unrepresentable {
            name: maps::CLIENT_ANSWERS,
            what: format!("{client}: class id {class} is not in 0..={MAX_CLASSES}"),
        });
    }
    let answer = ClientAnswer {
        class,
        expires: now.wrapping_add(ticks(ttl)),
    };
    dp.set_client_answer(client_addr(client), Some(answer))?;
    Ok(answer)
}

/// Removes the answer for `client` (a missing one is not an error).
///
/// # Errors
///
/// The removal's error.
pub fn remove_client_answer(dp: &mut impl Dataplane, client: IpAddr) -> Result<(), DataplaneError> {
    dp.set_client_answer(client_addr(client), None)
}

#[cfg(test)]
mod tests {
    use router_common::{MAX_DECISIONS, answer_live};

    use super::*;
    use crate::dataplane::memory::{MemoryDataplane, Write};

    fn p(s: &str) -> ClientPrefix {
        let (a, b) = s.split_once('/').unwrap();
        ClientPrefix::new(a.parse().unwrap(), b.parse().unwrap()).unwrap()
    }

    #[test]
    fn a_prefix_drops_its_host_bits_and_refuses_a_length_past_its_family() {
        assert_eq!(p("198.18.5.77/24").to_string(), "198.18.5.0/24");
        assert_eq!(p("198.18.5.77/0").to_string(), "0.0.0.0/0");
        assert_eq!(p("2001:db8:5:1::9/48").to_string(), "2001:db8:5::/48");
        assert_eq!(ClientPrefix::new("198.18.0.1".parse().unwrap(), 33), None);
        assert_eq!(ClientPrefix::new("::1".parse().unwrap(), 129), None);
        let k = client_addr("198.18.5.0".parse().unwrap());
        assert_eq!(k.family, 4);
        assert_eq!(&k.addr[..4], &[198, 18, 5, 0]);
        assert_eq!(ClientPrefix::from_key(&k, 24), Some(p("198.18.5.0/24")));
        assert_eq!(ClientPrefix::from_key(&k, 16), None, "host bits set");
    }

    #[test]
    fn replacing_the_set_writes_new_and_changed_prefixes_before_removing_gone_ones() {
        let mut dp = MemoryDataplane::default();
        let mut published = BTreeMap::new();
        let first: BTreeMap<_, _> = [
            (p("198.18.0.0/16"), 1),
            (p("198.18.6.0/24"), 2),
            (p("2001:db8:5::/48"), 1),
        ]
        .into();
        let d = replace_class_prefixes(&mut dp, &mut published, &first).unwrap();
        assert_eq!(
            d,
            PrefixDiff {
                added: 3,
                changed: 0,
                removed: 0
            }
        );
        assert_eq!(published, first);
        assert_eq!(read_class_prefixes(&dp), first, "the map holds the set");

        dp.log.clear();
        let second: BTreeMap<_, _> = [
            (p("198.18.0.0/16"), 1),
            (p("198.18.6.0/24"), 3),
            (p("198.18.7.0/24"), 2),
        ]
        .into();
        let d = replace_class_prefixes(&mut dp, &mut published, &second).unwrap();
        assert_eq!(
            d,
            PrefixDiff {
                added: 1,
                changed: 1,
                removed: 1
            }
        );
        assert_eq!(read_class_prefixes(&dp), second);
        // The unchanged /16 is not rewritten; the removal comes last.
        assert_eq!(dp.log.len(), 3, "{:?}", dp.log);
        assert!(matches!(dp.log[2], Write::ClassPrefix(_, 48, None)));
        // The same set again writes nothing.
        dp.log.clear();
        let d = replace_class_prefixes(&mut dp, &mut published, &second).unwrap();
        assert_eq!(d, PrefixDiff::default());
        assert!(dp.log.is_empty());
    }

    #[test]
    fn a_set_with_a_class_out_of_range_is_refused_before_any_write() {
        let mut dp = MemoryDataplane::default();
        let mut published = BTreeMap::new();
        for bad in [0, MAX_CLASSES + 1] {
            let wanted: BTreeMap<_, _> =
                [(p("198.18.0.0/16"), 1), (p("198.18.9.0/24"), bad)].into();
            let e = replace_class_prefixes(&mut dp, &mut published, &wanted).unwrap_err();
            assert!(e.to_string().contains("198.18.9.0/24"), "{e}");
        }
        assert!(dp.log.is_empty() && published.is_empty());
    }

    #[test]
    fn class_words_go_to_their_slot_s_entries_only() {
        let mut dp = MemoryDataplane::default();
        let words: [u64; MAX_CLASSES as usize] = std::array::from_fn(|i| 100 + i as u64);
        write_class_words(&mut dp, 3, &words).unwrap();
        assert_eq!(dp.class_decisions.len(), MAX_CLASSES as usize);
        assert_eq!(dp.class_decisions[&(3 * 16 + 1)], 100);
        assert_eq!(dp.class_decisions[&(3 * 16 + 15)], 114);
        assert!(
            !dp.class_decisions.contains_key(&(3 * 16)),
            "class 0 reads DECISIONS"
        );
        write_class_words(&mut dp, MAX_DECISIONS - 1, &words).unwrap();
        assert!(
            dp.class_decisions
                .keys()
                .all(|i| *i < router_common::CLASS_DECISIONS_SIZE)
        );
    }

    #[test]
    fn an_answer_lives_for_its_ttl_in_the_program_s_ticks() {
        let mut dp = MemoryDataplane::default();
        let client: IpAddr = "198.18.6.9".parse().unwrap();
        let now = u32::MAX - 100;
        let a = set_client_answer(&mut dp, client, 2, Duration::from_secs(10), now).unwrap();
        assert_eq!(dp.client_answers[&client_addr(client)], a);
        assert!(answer_live(a.expires, now));
        assert!(answer_live(
            a.expires,
            now.wrapping_add(ticks(Duration::from_secs(9)))
        ));
        assert!(!answer_live(
            a.expires,
            now.wrapping_add(ticks(Duration::from_secs(10)))
        ));
        let zero = set_client_answer(&mut dp, client, 2, Duration::ZERO, now).unwrap();
        assert!(
            !answer_live(zero.expires, now),
            "a zero TTL is expired at once"
        );
        assert!(
            set_client_answer(&mut dp, client, MAX_CLASSES + 1, Duration::from_secs(1), 0).is_err()
        );
        remove_client_answer(&mut dp, client).unwrap();
        assert!(dp.client_answers.is_empty());
        remove_client_answer(&mut dp, client).unwrap();
    }
}
