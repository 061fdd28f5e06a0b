//! Reading one value: names, addresses, numbers, durations, choices; and the wording shared by
//! every check (suggestions, "not supported yet").
//!
//! Each parser returns the value or the problem as `(message, hint)`.

use std::{net::IpAddr, time::Duration};

/// A problem's message and optional hint.
pub(crate) type Bad = (String, Option<String>);

/// Similarity (Jaro–Winkler) above which a candidate is offered as "did you mean".
const SIMILAR: f64 = 0.8;

/// The closest of `candidates` to `input`, if close enough to be a likely typo.
pub(crate) fn closest<'a, S: AsRef<str>>(input: &str, candidates: &'a [S]) -> Option<&'a str> {
    let mut best: Option<(&str, f64)> = None;
    for candidate in candidates {
        let candidate = candidate.as_ref();
        let score = if candidate.eq_ignore_ascii_case(input) {
            1.0
        } else {
            // Jaro–Winkler favours shared prefixes and misses short transpositions ("wbe" for
            // "web"); one edit (Damerau, or one per four characters) also counts as a typo.
            let edits = strsim::osa_distance(input, candidate);
            let typo = edits <= (candidate.len() / 4).max(1);
            let jw = strsim::jaro_winkler(input, candidate);
            if typo { jw.max(0.95) } else { jw }
        };
        if score > SIMILAR && best.is_none_or(|(_, b)| score > b) {
            best = Some((candidate, score));
        }
    }
    best.map(|(c, _)| c)
}

/// `did you mean "x"?`, or the list of what is accepted when nothing is close.
pub(crate) fn suggest<S: AsRef<str>>(input: &str, candidates: &[S]) -> Option<String> {
    if let Some(c) = closest(input, candidates) {
        return Some(format!("did you mean {c:?}?"));
    }
    match candidates {
        [] => None,
        [one] => Some(format!("expected {}", one.as_ref())),
        _ => {
            let all: Vec<&str> = candidates.iter().map(AsRef::as_ref).collect();
            Some(format!("expected one of: {}", all.join(", ")))
        }
    }
}

/// `did you mean "x"?` only: for references, where listing every name would be noise.
pub(crate) fn did_you_mean<S: AsRef<str>>(input: &str, candidates: &[S]) -> Option<String> {
    closest(input, candidates).map(|c| format!("did you mean {c:?}?"))
}

/// A feature of the failover design that is recognised but not implemented yet (none at the
/// moment: every key of the design is implemented).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Later {}

/// The problem for a feature that is not supported yet: says so, and says when it arrives.
pub(crate) fn not_yet(feature: Later) -> Bad {
    match feature {}
}

/// A fraction from 0 to 1 inclusive (a coefficient of `weights.adaptive`).
pub(crate) fn fraction(s: &str, what: &str) -> Result<f64, Bad> {
    match s.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err((
            format!("{what} must be a number from 0 to 1, not {s:?}"),
            None,
        )),
    }
}

/// A fraction from 0 to below 1 (`smoothing`, `tolerance`: 1 would freeze the weights).
pub(crate) fn fraction_below_one(s: &str, what: &str) -> Result<f64, Bad> {
    match s.parse::<f64>() {
        Ok(f) if (0.0..1.0).contains(&f) => Ok(f),
        _ => Err((
            format!("{what} must be a number from 0 to below 1, not {s:?}"),
            None,
        )),
    }
}

/// A finite number greater than 0 (`max_decrease_per_second`).
pub(crate) fn positive(s: &str, what: &str) -> Result<f64, Bad> {
    match s.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 => Ok(f),
        _ => Err((
            format!("{what} must be a number greater than 0, not {s:?}"),
            None,
        )),
    }
}

/// An address range `ADDRESS/PREFIX` (`encap_source`): an address a virtual IP could have
/// (see [`address`]), a prefix length of its family, and no host bits set.
pub(crate) fn range(s: &str) -> Result<(IpAddr, u8), Bad> {
    let example = "such as 198.18.250.0/24 or 2001:db8:250::/64";
    let Some((addr, len)) = s.split_once('/') else {
        return Err((
            format!("{s:?} is not an address range"),
            Some(format!("write ADDRESS/PREFIX, {example}")),
        ));
    };
    let ip = address(addr)?;
    let max: u8 = if ip.is_ipv4() { 32 } else { 128 };
    let prefix = match len.parse::<u8>() {
        Ok(p) if p <= max => p,
        _ => {
            return Err((
                format!("invalid prefix length {len:?} in {s:?}"),
                Some(format!(
                    "an IPv{} prefix length is 0 to {max}",
                    if max == 32 { 4 } else { 6 }
                )),
            ));
        }
    };
    let network = match ip {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::from(std::net::Ipv4Addr::from(u32::from(a) & mask))
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::from(std::net::Ipv6Addr::from(u128::from(a) & mask))
        }
    };
    if network != ip {
        return Err((
            format!("{s:?} has host bits set"),
            Some(format!("the range is {network}/{prefix}")),
        ));
    }
    Ok((network, prefix))
}

/// Longest name.
pub(crate) const NAME_MAX: usize = 64;

/// A service or pool name: 1–64 ASCII letters, digits, `-` or `_` (names appear in rule
/// expressions such as `pool.dc1.healthy_ratio` and in metric labels).
pub(crate) fn name(s: &str) -> Result<String, Bad> {
    let ok = !s.is_empty()
        && s.len() <= NAME_MAX
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(s.to_owned())
    } else if s.is_empty() {
        Err(("name must not be empty".to_owned(), None))
    } else {
        Err((
            format!("invalid name {s:?}"),
            Some(format!("use 1 to {NAME_MAX} letters, digits, '-' or '_'")),
        ))
    }
}

/// An address that can be a virtual IP or a backend: not unspecified, multicast, broadcast or
/// loopback, and not IPv6 link-local (which names a host only together with an interface, a
/// zone the configuration has no place for: the route lookup would pick any link's `fe80::/64`).
pub(crate) fn address(s: &str) -> Result<IpAddr, Bad> {
    let ip: IpAddr = s.parse().map_err(|_| {
        (
            format!("{s:?} is not an IP address"),
            Some("write an IPv4 or IPv6 address, such as 198.18.0.10 or 2001:db8::10".to_owned()),
        )
    })?;
    if ip.is_unspecified() || ip.is_multicast() {
        let kind = if ip.is_unspecified() {
            "an unspecified"
        } else {
            "a multicast"
        };
        return Err((format!("{ip} is {kind} address"), None));
    }
    let other = match ip {
        IpAddr::V4(v4) if v4.is_broadcast() => Some(("the broadcast address", None)),
        IpAddr::V4(v4) if v4.is_loopback() => Some(("a loopback address", None)),
        IpAddr::V6(v6) if v6.is_loopback() => Some(("the loopback address", None)),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Some((
            "an IPv6 link-local address",
            Some("use the host's global or unique-local address: a link-local one names no interface here".to_owned()),
        )),
        _ => None,
    };
    if let Some((kind, hint)) = other {
        return Err((format!("{ip} is {kind}"), hint));
    }
    Ok(ip)
}

/// A port, 1–65535.
pub(crate) fn port(s: &str) -> Result<u16, Bad> {
    match s.parse::<u16>() {
        Ok(p) if p >= 1 => Ok(p),
        _ => Err((
            format!("port must be a number from 1 to 65535, not {s:?}"),
            None,
        )),
    }
}

/// A whole number in `min..=max`; `what` names it in the message.
pub(crate) fn number(s: &str, what: &str, min: u32, max: u32) -> Result<u32, Bad> {
    match s.parse::<u32>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ if max == u32::MAX => Err((
            format!("{what} must be a whole number of at least {min}, not {s:?}"),
            None,
        )),
        _ => Err((
            format!("{what} must be a whole number from {min} to {max}, not {s:?}"),
            None,
        )),
    }
}

/// A duration with a unit (`100ms`, `1s`, `10m`), greater than zero.
pub(crate) fn duration(s: &str, what: &str) -> Result<Duration, Bad> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err((format!("{what} must be greater than 0"), None)),
        Ok(d) => Ok(d),
        Err(_) => Err((
            format!("{what} must be a duration with a unit, not {s:?}"),
            Some("for example 300ms, 1s or 10m".to_owned()),
        )),
    }
}

/// A duration with a unit from `min` to `max` inclusive; `what` names it in the message.
pub(crate) fn duration_within(
    s: &str,
    what: &str,
    min: Duration,
    max: Duration,
) -> Result<Duration, Bad> {
    match humantime::parse_duration(s) {
        Ok(d) if (min..=max).contains(&d) => Ok(d),
        Ok(_) => Err((
            format!(
                "{what} must be from {} to {}, not {s:?}",
                show(min),
                show(max)
            ),
            None,
        )),
        Err(_) => duration(s, what),
    }
}

/// A duration as written back in messages.
pub(crate) fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// One of a fixed set of words; `what` names the key (`protocol`). `later` lists words that are
/// recognised but not supported yet, with what to call them in the message.
pub(crate) fn choice<T: Copy>(
    s: &str,
    what: &str,
    choices: &[(&str, T)],
    later: &[(&str, Later)],
) -> Result<T, Bad> {
    if let Some((_, v)) = choices.iter().find(|(word, _)| *word == s) {
        return Ok(*v);
    }
    if let Some((_, feature)) = later.iter().find(|(word, _)| *word == s) {
        return Err(not_yet(*feature));
    }
    let words: Vec<&str> = choices.iter().map(|(w, _)| *w).collect();
    Err((format!("unknown {what} {s:?}"), suggest(s, &words)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_catch_typos_only() {
        assert_eq!(closest("intervall", &["tcp", "interval"]), Some("interval"));
        assert_eq!(closest("dc3", &["dc1-canary", "dc2"]), Some("dc2"));
        assert_eq!(closest("TCP", &["tcp", "udp"]), Some("tcp"));
        assert_eq!(closest("resolvers", &["dc1", "dc2"]), None);
        assert_eq!(
            suggest("zzz", &["tcp", "udp"]).as_deref(),
            Some("expected one of: tcp, udp")
        );
    }

    #[test]
    fn durations_need_a_unit_and_must_be_positive() {
        assert_eq!(
            duration("100ms", "interval"),
            Ok(Duration::from_millis(100))
        );
        assert_eq!(duration("10m", "interval"), Ok(Duration::from_mins(10)));
        assert!(duration("100", "interval").is_err());
        assert!(duration("0s", "interval").is_err());
        assert!(duration("-1s", "interval").is_err());
    }

    #[test]
    fn durations_within_bounds_include_both_ends() {
        let (min, max) = (Duration::from_secs(1), Duration::from_hours(168));
        assert_eq!(duration_within("1s", "udp", min, max), Ok(min));
        assert_eq!(duration_within("7d", "udp", min, max), Ok(max));
        assert_eq!(
            duration_within("999ms", "udp", min, max),
            Err((
                "udp must be from 1s to 7days, not \"999ms\"".to_owned(),
                None
            ))
        );
        assert!(duration_within("0s", "udp", min, max).is_err());
        assert!(duration_within("7d 1s", "udp", min, max).is_err());
        assert!(duration_within("60", "udp", min, max).is_err());
    }

    #[test]
    fn names_ports_and_numbers() {
        assert!(name("dc1-canary_2").is_ok());
        assert!(name("").is_err());
        assert!(name("a b").is_err());
        assert!(name("pool.dc1").is_err());
        assert!(name(&"x".repeat(NAME_MAX + 1)).is_err());
        assert_eq!(port("80"), Ok(80));
        assert!(port("0").is_err() && port("65536").is_err() && port("http").is_err());
        assert_eq!(number("0", "weight", 0, 65_535), Ok(0));
        assert!(number("65536", "weight", 0, 65_535).is_err());
        assert!(address("0.0.0.0").is_err() && address("ff02::1").is_err());
        for bad in [
            "255.255.255.255",
            "127.0.0.1",
            "::1",
            "fe80::1",
            "fe80::2:3",
        ] {
            assert!(address(bad).is_err(), "{bad} accepted");
        }
        assert!(address("198.18.11.11").is_ok() && address("2001:db8:11::11").is_ok());
        assert!(address("2001:db8::10").is_ok());
    }
}

#[cfg(test)]
mod typo_tests {
    #[test]
    fn a_transposition_in_a_short_name_is_a_typo() {
        assert_eq!(super::closest("wbe", &["web", "web6", "dns"]), Some("web"));
        assert_eq!(
            super::closest("dc3", &["dc1", "dc2"]).map(str::len),
            Some(3)
        );
        assert_eq!(super::closest("zzz", &["web", "dns"]), None);
    }
}
