//! Client classes on a new flow (decision 0036): the class of the flow's client (its source
//! address) from the longest prefix in `CLIENT_CLASSES`, else from a live `CLIENT_ANSWERS`
//! entry; a client with neither, on a service that asks for it, is reported in
//! `UNKNOWN_CLIENTS`. Only `select` calls this, and only for services with `SVC_F_CLASSES` or
//! `SVC_F_CLASSIFY`: a tracked packet, and a new flow of any other service, pays nothing.
//!
//! The report's limits, so that a flood of spoofed sources costs little:
//! - at most `UNKNOWN_BURST` records per CPU per `RATE_WINDOW_TICKS` window (`UNKNOWN_LIMIT`,
//!   per CPU, so no two CPUs share a counter);
//! - a reported client gets a class-0 placeholder in `CLIENT_ANSWERS`, written before its
//!   record (so a classifier's answer, which comes after the record, is never overwritten by
//!   it), that lives `UNKNOWN_HOLD_TICKS`: its next flows are not reported again until it
//!   expires or the classifier answers. Only reported clients get one, so placeholders come at
//!   the records' rate and cannot flush the answers out of the LRU faster.

use aya_ebpf::btf_maps::lpm_trie::Key;
use router_common::{
    CLASS_STAT_ANSWER, CLASS_STAT_RING_FULL, CLASS_STAT_RING_LIMITED, CLASS_STAT_RING_SENT,
    CLASS_STAT_UNKNOWN, ClientAddr, ClientAnswer, FlowKey, MAX_CLASSES, RATE_WINDOW_TICKS,
    UNKNOWN_BURST, UNKNOWN_HOLD_TICKS, UnknownClient, answer_live, class_prefix_len,
};

use crate::maps::{CLASS_STATS, CLIENT_ANSWERS, CLIENT_CLASSES, UNKNOWN_CLIENTS, UNKNOWN_LIMIT};

/// The class of `flow`'s client at `now` (ticks): its static class (the longest prefix of
/// `CLIENT_CLASSES` holding its address), else a live answer's, else 0. A class past
/// `MAX_CLASSES` (no agent writes one) is 0. With `count`, a class taken from an answer, and a
/// client with neither, are counted in `CLASS_STATS` (`bytes`: the packet's length); with
/// `report` too, such a client is reported ([`report`]).
#[inline(always)]
pub fn of(flow: &FlowKey, now: u32, count: bool, report: bool, bytes: u64) -> u32 {
    let client = ClientAddr {
        family: u32::from(flow.family),
        addr: flow.src,
    };
    // The whole key: a prefix of an IPv4 address is 32 + up to 32 bits, and the zero bytes past
    // it match no longer IPv4 prefix.
    let key = Key::new(class_prefix_len(128), client);
    // Lookups take the key by reference: a key passed by value is copied to the stack again,
    // and the verifier then tracks both copies (some 15,000 more instructions).
    let client = &client;
    if let Some(class) = CLIENT_CLASSES.get(&key) {
        return bounded(*class);
    }
    // SAFETY: a map value, copied out.
    if let Some(answer) = unsafe { CLIENT_ANSWERS.get(client) }.copied()
        && answer_live(answer.expires, now)
    {
        if count {
            add(CLASS_STAT_ANSWER, bytes);
        }
        return bounded(answer.class);
    }
    if count {
        add(CLASS_STAT_UNKNOWN, bytes);
        if report {
            self::report(flow, client, now, bytes);
        }
    }
    0
}

/// `class` if it names a class (0..=`MAX_CLASSES`), else 0.
#[inline(always)]
fn bounded(class: u32) -> u32 {
    if class > MAX_CLASSES { 0 } else { class }
}

/// Reports `flow`'s client (`client`) in `UNKNOWN_CLIENTS`, within this CPU's burst of the
/// window, after a placeholder answer that keeps it from being reported again for
/// `UNKNOWN_HOLD_TICKS`. A record the ring has no room for takes its placeholder back.
#[inline(always)]
fn report(flow: &FlowKey, client: &ClientAddr, now: u32, bytes: u64) {
    let Some(limit) = UNKNOWN_LIMIT.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a per-CPU value: no other writer while this program runs on this CPU.
    let allowed = unsafe {
        let [start, sent] = *limit;
        if now.wrapping_sub(start) >= RATE_WINDOW_TICKS {
            *limit = [now, 1];
            true
        } else if sent < UNKNOWN_BURST {
            (*limit)[1] = sent + 1;
            true
        } else {
            false
        }
    };
    if !allowed {
        add(CLASS_STAT_RING_LIMITED, bytes);
        return;
    }
    let placeholder = ClientAnswer {
        class: 0,
        expires: now.wrapping_add(UNKNOWN_HOLD_TICKS),
    };
    let _ = CLIENT_ANSWERS.insert(client, placeholder, 0);
    let record = UnknownClient {
        family: flow.family,
        proto: flow.proto,
        port: flow.dport,
        addr: flow.src,
        vip: flow.dst,
    };
    let record = &record;
    if UNKNOWN_CLIENTS.output(record, 0).is_ok() {
        add(CLASS_STAT_RING_SENT, bytes);
    } else {
        let _ = CLIENT_ANSWERS.remove(client);
        add(CLASS_STAT_RING_FULL, bytes);
    }
}

/// Counts one packet of `bytes` in `CLASS_STATS[index]` on this CPU.
#[inline(always)]
pub fn add(index: u32, bytes: u64) {
    if let Some(t) = CLASS_STATS.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot: no other writer while this program runs on this CPU.
        unsafe {
            (*t).packets += 1;
            (*t).bytes += bytes;
        }
    }
}
