//! Checking `announce:`: the dummy interface's name, the route protocol and table, and the
//! interfaces of `garp`; set in one file at most.

use super::{Field, leaf};
use crate::config::{
    model::Announce,
    report::{Item, Report, index_path},
    spec::AnnounceSpec,
    values::{self, Bad},
};

/// The announcement settings: `None` inside when there is no `announce:`; the outer `None` when
/// something was reported.
#[expect(
    clippy::option_option,
    reason = "the outer Option is validation's (None: reported), the inner the config's"
)]
pub(super) fn announces(
    items: &[Item<AnnounceSpec>],
    report: &mut Report,
) -> Option<Option<Announce>> {
    let mut result = Some(None);
    let mut first: Option<String> = None;
    for it in items {
        let announce = announce(it, report);
        match &first {
            None => {
                first = Some(it.location(report, ""));
                result = announce.map(Some);
            }
            Some(first) => {
                let hint = format!("first set at {first}; set it in one file");
                let message = "announce is set in more than one file".to_owned();
                it.err(report, "", message, Some(hint));
            }
        }
    }
    result
}

fn announce(it: &Item<AnnounceSpec>, report: &mut Report) -> Option<Announce> {
    let defaults = Announce::default();
    let s = &it.spec;
    let interface = leaf(it, report, s.interface.as_deref(), "interface", |v| {
        interface_name(v, "interface")
    })
    .or(defaults.interface);
    let protocol = leaf(it, report, s.protocol.as_deref(), "protocol", |v| {
        values::number(v, "protocol", 5, 255).map(|n| u8::try_from(n).unwrap_or(u8::MAX))
    })
    .or(defaults.protocol);
    let table = leaf(it, report, s.table.as_deref(), "table", table).or(defaults.table);
    let garp = garp(it, report);
    let interface = interface?;
    if garp.as_ref().is_some_and(|g| g.contains(&interface)) {
        let message =
            format!("garp lists {interface:?}, the dummy interface the announcement routes are on");
        let hint = Some("list the interfaces that face the router's segment".to_owned());
        it.err(report, "garp", message, hint);
        return None;
    }
    Some(Announce {
        interface,
        protocol: protocol?,
        table: table?,
        garp: garp?,
    })
}

/// `garp`: different interface names (default none).
fn garp(it: &Item<AnnounceSpec>, report: &mut Report) -> Option<Vec<String>> {
    let list = match &it.spec.garp {
        _ if it.is_broken("garp") => return None,
        None => return Some(Vec::new()),
        Some(list) => list,
    };
    let mut ok = true;
    let mut read: Vec<(usize, String)> = Vec::new();
    for (i, text) in list.iter().enumerate() {
        let rel = index_path("garp", i);
        let Field::Ok(name) = leaf(it, report, Some(text), &rel, |v| interface_name(v, "garp"))
        else {
            ok = false;
            continue;
        };
        if let Some((first, _)) = read.iter().find(|(_, n)| *n == name) {
            let first = index_path("garp", *first);
            let hint = format!("first listed at {}", it.location(report, &first));
            it.err(
                report,
                &rel,
                format!("duplicate interface {name:?}"),
                Some(hint),
            );
            ok = false;
        } else {
            read.push((i, name));
        }
    }
    ok.then(|| read.into_iter().map(|(_, n)| n).collect())
}

/// A Linux interface name: 1 to 15 bytes (`IFNAMSIZ` - 1), none of them `/`, `:`, white space
/// or a control character, and not `.` or `..`.
fn interface_name(s: &str, what: &str) -> Result<String, Bad> {
    let bad = s.is_empty()
        || s.len() > 15
        || s == "."
        || s == ".."
        || s.chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control());
    if bad {
        return Err((
            format!("{s:?} is not an interface name ({what})"),
            Some(
                "a Linux interface name is 1 to 15 characters, without '/', ':' or spaces"
                    .to_owned(),
            ),
        ));
    }
    Ok(s.to_owned())
}

/// A routing table number: 1 to 2^32-1, not 253 (`default`) or 255 (`local`), or `main`.
fn table(s: &str) -> Result<u32, Bad> {
    if s == "main" {
        return Ok(254);
    }
    let hint = Some("write main (254) or a table number from 1 to 4294967295".to_owned());
    let n: u32 = s
        .parse()
        .map_err(|_| (format!("{s:?} is not a table number"), hint.clone()))?;
    match n {
        0 => Err((
            "table 0 is not a table (the kernel reads it as main)".to_owned(),
            hint,
        )),
        253 | 255 => Err((
            format!("table {n} is the kernel's own (default or local)"),
            hint,
        )),
        n => Ok(n),
    }
}
