//! The flow hash, computed the same way by the XDP program and the agent.
//!
//! `MurmurHash3`'s 32-bit mixing (Appleby) over the key's 32-bit words with a fixed seed: cheap
//! (a few instructions a word, no loops the verifier has to bound beyond the fixed word count),
//! well distributed, and identical on every balancer node, so with identical Maglev tables a
//! flow lands on the same backend whichever node receives it (Maglev paper §3.3).
#![expect(
    clippy::inline_always,
    reason = "the XDP program hashes each new flow with these: inlined, they cost no BPF-to-BPF call"
)]

use crate::FlowKey;

const SEED: u32 = 0x5717_c4a1;

#[inline(always)]
const fn mix_word(h: u32, word: u32) -> u32 {
    let mut k = word.wrapping_mul(0xcc9e_2d51);
    k = k.rotate_left(15);
    k = k.wrapping_mul(0x1b87_3593);
    let h = (h ^ k).rotate_left(13);
    h.wrapping_mul(5).wrapping_add(0xe654_6b64)
}

#[inline(always)]
const fn finish(mut h: u32, len: u32) -> u32 {
    h ^= len;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

#[inline(always)]
const fn word(b: &[u8; 16], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

#[inline(always)]
const fn mix_addr(h: u32, a: &[u8; 16]) -> u32 {
    let h = mix_word(h, word(a, 0));
    let h = mix_word(h, word(a, 4));
    let h = mix_word(h, word(a, 8));
    mix_word(h, word(a, 12))
}

/// Hash of a flow's 5-tuple (addresses, ports, protocol) and family (every field of the key
/// but its padding). A first fragment hashes like its flow's whole datagrams.
#[must_use]
#[inline(always)]
pub const fn flow_hash(key: &FlowKey) -> u32 {
    let h = mix_addr(SEED, &key.src);
    let h = mix_addr(h, &key.dst);
    let ports = (key.sport as u32) | ((key.dport as u32) << 16);
    let h = mix_word(h, ports);
    let h = mix_word(h, key.proto as u32 | ((key.family as u32) << 8));
    finish(h, 40)
}

/// Hash of the source address alone (`hash: source_ip`): every flow of one client address
/// picks the same backend.
#[must_use]
#[inline(always)]
pub const fn source_hash(src: &[u8; 16]) -> u32 {
    finish(mix_addr(SEED, src), 16)
}

/// The bit of `SERVICE_FILTER` that stands for `(addr, port, proto, family)` under `salt`
/// ([`FILTER_SERVICE`](crate::FILTER_SERVICE) or [`FILTER_NAT_REPLY`](crate::FILTER_NAT_REPLY)),
/// in `0..FILTER_WORDS·64`. `port` holds network-order bytes, as in the keys.
#[must_use]
#[inline(always)]
pub const fn filter_bit(addr: &[u8; 16], port: u16, proto: u8, family: u8, salt: u32) -> u32 {
    filter_bit_words(addr_pair(addr), port, proto, family, salt)
}

/// An address as two little-endian 64-bit words, as the program loads it.
#[must_use]
pub const fn addr_pair(a: &[u8; 16]) -> [u64; 2] {
    [
        u64::from_le_bytes([a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]]),
        u64::from_le_bytes([a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]]),
    ]
}

/// [`filter_bit`] of an address given as its two little-endian 64-bit words ([`addr_pair`];
/// the program loads them as words). Multiply-shift hashing (Dietzfelbinger et al.): the words
/// are folded, multiplied by odd constants, and the bit taken from the top of the last product,
/// which depends on every bit below it. Half a dozen instructions, since every packet pays it.
#[must_use]
#[inline(always)]
pub const fn filter_bit_words(addr: [u64; 2], port: u16, proto: u8, family: u8, salt: u32) -> u32 {
    let tail =
        (port as u64) | ((proto as u64) << 16) | ((family as u64) << 24) | ((salt as u64) << 32);
    let h = (addr[0] ^ addr[1].rotate_left(32)).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ tail;
    let h = h.wrapping_mul(0xd6e8_feb8_6659_fd93);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the shift leaves log2(FILTER_WORDS · 64) bits"
    )]
    let bit = (h >> (64 - (crate::FILTER_WORDS * 64).trailing_zeros())) as u32;
    bit
}

/// The flow cache set of a flow (`0..FLOW_CACHE_SETS`), from its key as five native-order
/// 64-bit words ([`flow_words`]; the program loads them as words). Three multiplications by
/// odd constants, the set taken from the top bits of the last product, which depend on every
/// bit before them: a dozen instructions on the path of every tracked packet. Not seeded: flows
/// crafted to share a set only fall back to the conntrack lookup.
#[must_use]
#[inline(always)]
pub const fn flow_cache_set(w: [u64; 5]) -> u32 {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the shift leaves log2(FLOW_CACHE_SETS) bits"
    )]
    let set = (words_hash(w) >> (64 - crate::FLOW_CACHE_SETS.trailing_zeros())) as u32;
    set
}

/// The hash whose low bits pick an `ipip` flow's outer source from its service's range
/// ([`encap_source`](crate::encap_source)): the top 32 bits of the flow cache's product, from
/// the key as five native-order 64-bit words ([`flow_words`]). Stable per flow, spread across
/// flows; a dozen instructions, where the Maglev flow hash takes some sixty.
#[must_use]
#[inline(always)]
pub const fn encap_hash(w: [u64; 5]) -> u32 {
    (words_hash(w) >> 32) as u32
}

/// Multiply-shift over the five words of a flow key: each product's top bits depend on every
/// bit below them.
#[inline(always)]
const fn words_hash(w: [u64; 5]) -> u64 {
    let mut h = (w[0] ^ w[1].rotate_left(32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h = (h ^ w[2] ^ w[3].rotate_left(32)).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    (h ^ w[4]).wrapping_mul(0x1656_67b1_9e37_79f9)
}

/// A flow key as the five native-order 64-bit words of its 40 bytes (what the program loads;
/// the padding is zero in every key).
#[must_use]
pub const fn flow_words(key: &FlowKey) -> [u64; 5] {
    let (s, d) = (&key.src, &key.dst);
    let (sp, dp) = (key.sport.to_ne_bytes(), key.dport.to_ne_bytes());
    [
        u64::from_ne_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]),
        u64::from_ne_bytes([s[8], s[9], s[10], s[11], s[12], s[13], s[14], s[15]]),
        u64::from_ne_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]),
        u64::from_ne_bytes([d[8], d[9], d[10], d[11], d[12], d[13], d[14], d[15]]),
        u64::from_ne_bytes([sp[0], sp[1], dp[0], dp[1], key.proto, key.family, 0, 0]),
    ]
}

/// Where a flow falls in a split, `0..SPLIT_SCALE`: a remix of its hash, so the choice of pool is
/// independent of the Maglev slot the same hash selects.
#[must_use]
#[inline(always)]
pub const fn split_point(hash: u32) -> u32 {
    finish(mix_word(SEED, hash), 4) % crate::SPLIT_SCALE as u32
}

/// Seed of [`client_split_point`]: another than the flow hash's, so that under
/// `hash: source_ip` the pool a client's split point picks and the backend its source hash picks
/// within that pool are independent.
const CLIENT_SEED: u32 = 0x2c1b_3c6d;

/// Where a client falls in a split (`SVC_F_SPLIT_CLIENT`), `0..SPLIT_SCALE`: a hash of its
/// address `src` (network order, IPv4 in the first four bytes, `v6` for IPv6), or with `prefix`
/// (`SVC_F_SPLIT_PREFIX`) of its /24 (IPv4) or /48 (IPv6). The same for every flow of the client
/// (or network), on every node, in the program and in the agent's `trace`. The decision word's
/// threshold ([`Decision::pick_at`](crate::Decision::pick_at)) then keeps a client on its side
/// while the weights are unchanged.
#[must_use]
#[inline(always)]
pub const fn client_split_point(src: &[u8; 16], v6: bool, prefix: bool) -> u32 {
    let (w0, w1, w2, w3) = (word(src, 0), word(src, 4), word(src, 8), word(src, 12));
    // The words are little-endian loads of network-order bytes: the first byte is the low one.
    let (w0, w1, w2, w3) = if !prefix {
        (w0, w1, w2, w3)
    } else if v6 {
        (w0, w1 & 0x0000_ffff, 0, 0)
    } else {
        (w0 & 0x00ff_ffff, 0, 0, 0)
    };
    let h = mix_word(CLIENT_SEED, w0);
    let h = mix_word(h, w1);
    let h = mix_word(h, w2);
    let h = mix_word(h, w3);
    finish(h, 16) % crate::SPLIT_SCALE as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(sport: u16) -> FlowKey {
        FlowKey {
            src: [198, 18, 1, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            dst: [198, 19, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            sport: sport.to_be(),
            dport: 5000u16.to_be(),
            proto: 17,
            family: 4,
            _pad: [0; 2],
        }
    }

    #[test]
    fn flows_of_one_client_spread_over_the_flow_cache() {
        // 1,024 flows differing only in their source port, into 4,096 sets: about 906 sets
        // are expected to be taken (4096 · (1 − e^-0.25)), and no set should hold more than
        // a few flows.
        let mut per_set = [0u32; crate::FLOW_CACHE_SETS as usize];
        for port in 10_000..11_024 {
            let set = flow_cache_set(flow_words(&flow(port)));
            per_set[set as usize] += 1;
        }
        let taken = per_set.iter().filter(|n| **n > 0).count();
        assert!(taken > 850, "{taken} sets taken");
        assert!(per_set.iter().all(|n| *n <= 5));
    }

    #[test]
    fn flow_words_are_the_key_in_memory_order() {
        let w = flow_words(&flow(10_000));
        assert_eq!(w[0].to_ne_bytes()[..4], [198, 18, 1, 10]);
        assert_eq!(w[2].to_ne_bytes()[..4], [198, 19, 0, 10]);
        assert_eq!(w[4].to_ne_bytes(), [0x27, 0x10, 0x13, 0x88, 17, 4, 0, 0]);
    }

    #[test]
    fn golden_values_pin_the_hash() {
        // The hash is part of the ABI: nodes and agents of one version must agree on it.
        let key = FlowKey {
            src: [198, 18, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            dst: [198, 18, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            sport: 40000u16.to_be(),
            dport: 80u16.to_be(),
            proto: 6,
            family: 4,
            _pad: [0; 2],
        };
        assert_eq!(flow_hash(&key), GOLDEN_FLOW);
        assert_eq!(source_hash(&key.src), GOLDEN_SOURCE);
        // So is a client's split point: the agent's trace computes it as the program does.
        assert_eq!(client_split_point(&key.src, false, false), 2_293);
        assert_eq!(client_split_point(&key.src, false, true), 7_655);
        let v6 = [0x20, 0x01, 0x0d, 0xb8, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        assert_eq!(client_split_point(&v6, true, true), 3_228);
    }

    const GOLDEN_FLOW: u32 = 3_053_668_919;

    #[test]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the counter's bytes make the client addresses"
    )]
    fn a_client_s_split_point_is_its_address_s_or_its_network_s() {
        let v4 = |c: u8, d: u8| {
            let mut a = [0u8; 16];
            a[..4].copy_from_slice(&[198, 18, c, d]);
            a
        };
        let p = client_split_point(&v4(7, 1), false, false);
        assert!(p < u32::from(crate::SPLIT_SCALE));
        assert_eq!(p, client_split_point(&v4(7, 1), false, false));
        // A /24 shares one point; another /24 has its own.
        let net = client_split_point(&v4(7, 1), false, true);
        assert_eq!(net, client_split_point(&v4(7, 200), false, true));
        assert_ne!(net, client_split_point(&v4(8, 1), false, true));
        // IPv6: the /48 is the first six bytes.
        let mut a = [0x20, 0x01, 0x0d, 0xb8, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let net6 = client_split_point(&a, true, true);
        a[6] = 0xff;
        a[15] = 9;
        assert_eq!(net6, client_split_point(&a, true, true));
        assert_ne!(
            client_split_point(&a, true, false),
            client_split_point(&[0; 16], true, false)
        );
        // Points of many clients spread evenly: a 5 % threshold takes about 5 % of them.
        let below = (0..20_000u32)
            .filter(|i| client_split_point(&v4((i >> 8) as u8, *i as u8), false, false) < 500)
            .count();
        assert!((850..=1_150).contains(&below), "{below} of 20000 below 500");
    }
    const GOLDEN_SOURCE: u32 = 4_190_574_561;

    #[test]
    fn ports_change_the_flow_hash_but_not_the_source_hash() {
        let a = FlowKey {
            sport: 1,
            ..FlowKey::default()
        };
        let b = FlowKey {
            sport: 2,
            ..FlowKey::default()
        };
        assert_ne!(flow_hash(&a), flow_hash(&b));
        assert_eq!(source_hash(&a.src), source_hash(&b.src));
    }

    #[test]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the counters' bytes make the fixture addresses and ports"
    )]
    fn the_filter_has_about_the_false_positive_rate_it_documents() {
        // 10,000 keys (services on 2,500 addresses, 4 ports each), then 100,000 other
        // destinations: the documented rate is about one in a hundred.
        extern crate std;
        let mut bits = std::vec![0u64; crate::FILTER_WORDS as usize];
        let key = |i: u32| {
            let mut a = [0u8; 16];
            a[..4].copy_from_slice(&[198, 18, (i >> 8) as u8, i as u8]);
            a
        };
        for i in 0..2_500u32 {
            for port in [80u16, 443, 8080, 53] {
                let b = filter_bit(&key(i), port.to_be(), 6, 4, crate::FILTER_SERVICE);
                bits[(b / 64) as usize] |= 1 << (b % 64);
            }
        }
        let mut hits = 0;
        for i in 0..100_000u32 {
            let a = [
                198,
                19,
                (i >> 8) as u8,
                i as u8,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
            ];
            let b = filter_bit(&a, (i as u16).to_be(), 17, 4, crate::FILTER_SERVICE);
            if bits[(b / 64) as usize] & (1 << (b % 64)) != 0 {
                hits += 1;
            }
        }
        assert!(hits < 2_000, "{hits} false positives in 100000");
    }

    #[test]
    fn the_filter_bit_of_words_is_the_bit_of_bytes_and_salts_differ() {
        let a = [
            0x20, 0x01, 0x0d, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
        ];
        let w = addr_pair(&a);
        let port = 80u16.to_be();
        assert_eq!(
            filter_bit(&a, port, 6, 6, crate::FILTER_SERVICE),
            filter_bit_words(w, port, 6, 6, crate::FILTER_SERVICE)
        );
        assert_ne!(
            filter_bit(&a, port, 6, 6, crate::FILTER_SERVICE),
            filter_bit(&a, port, 6, 6, crate::FILTER_NAT_REPLY)
        );
    }
}
