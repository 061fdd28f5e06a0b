//! Checking `hooks:`: each hook's name (unique), exactly one of `command` and `url`, its
//! `events` and its `timeout`.

use std::collections::HashMap;

use super::{Field, leaf, required};
use crate::config::{
    model::{DEFAULT_HOOK_TIMEOUT, HOOK_TIMEOUT_RANGE, Hook, HookEvent, HookTarget},
    report::{Item, Report, index_path},
    spec::HookSpec,
    values::{self, Bad},
};

/// Every hook, in file order; `None` when something was reported.
pub(super) fn hooks(items: &[Item<HookSpec>], report: &mut Report) -> Option<Vec<Hook>> {
    let drafts: Vec<(Option<String>, Option<Hook>)> =
        items.iter().map(|it| hook(it, report)).collect();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, (it, (name, _))) in items.iter().zip(&drafts).enumerate() {
        let Some(name) = name.as_deref() else {
            continue;
        };
        match seen.get(name).and_then(|&j| items.get(j)) {
            Some(first) => {
                let hint = format!("first defined at {}", first.location(report, "name"));
                it.err(
                    report,
                    "name",
                    format!("duplicate hook name {name:?}"),
                    Some(hint),
                );
            }
            None => {
                seen.insert(name, i);
            }
        }
    }
    drafts.into_iter().map(|(_, hook)| hook).collect()
}

/// One hook: its name when it has a valid one (for the uniqueness check), and the hook when
/// nothing in it was reported.
fn hook(it: &Item<HookSpec>, report: &mut Report) -> (Option<String>, Option<Hook>) {
    let s = &it.spec;
    let name = required(it, report, s.name.as_deref(), "", "name", values::name);
    let target = target(it, report);
    let events = events(it, report);
    let timeout = leaf(it, report, s.timeout.as_deref(), "timeout", |v| {
        let (min, max) = HOOK_TIMEOUT_RANGE;
        values::duration_within(v, "timeout", min, max)
    })
    .or(DEFAULT_HOOK_TIMEOUT);
    let hook = match (&name, target, events, timeout) {
        (Some(name), Some(target), Some(events), Some(timeout)) => Some(Hook {
            name: name.clone(),
            target,
            events,
            timeout,
        }),
        _ => None,
    };
    (name, hook)
}

/// Exactly one of `command` (a program and its arguments) and `url` (`http://`).
fn target(it: &Item<HookSpec>, report: &mut Report) -> Option<HookTarget> {
    let s = &it.spec;
    if it.is_broken("command") || it.is_broken("url") {
        return None;
    }
    match (&s.command, &s.url) {
        (Some(_), Some(_)) => {
            let message = "a hook has either command or url, not both".to_owned();
            let hint = Some("write a second hook for the other".to_owned());
            it.err(report, "url", message, hint);
            None
        }
        (None, None) => {
            let message = "missing command or url: what the hook runs".to_owned();
            let hint =
                Some("command: [PROGRAM, ARGS...], or url: http://HOST:PORT/PATH".to_owned());
            it.err(report, "", message, hint);
            None
        }
        (Some(argv), None) => {
            if argv.first().is_none_or(|c| c.trim().is_empty()) {
                let message = "command needs a program to run".to_owned();
                let hint = Some("such as [\"/usr/local/bin/page-oncall\", \"--team\", \"lb\"]");
                it.err(report, "command", message, hint.map(str::to_owned));
                return None;
            }
            Some(HookTarget::Command(argv.clone()))
        }
        (None, Some(text)) => {
            let Field::Ok(url) = leaf(it, report, Some(text), "url", url) else {
                return None;
            };
            Some(HookTarget::Url(url))
        }
    }
}

/// An `http://` URL with a host: hooks post over plain HTTP.
fn url(s: &str) -> Result<String, Bad> {
    let hint = Some("such as http://127.0.0.1:8099/switchyard".to_owned());
    let parsed =
        reqwest::Url::parse(s).map_err(|e| (format!("{s:?} is not a URL: {e}"), hint.clone()))?;
    if parsed.scheme() != "http" {
        return Err((
            format!(
                "{s:?}: a hook posts over plain HTTP, not {}",
                parsed.scheme()
            ),
            Some("write an http:// URL (a local relay can forward over TLS)".to_owned()),
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err((format!("{s:?} names no host"), hint));
    }
    Ok(s.to_owned())
}

/// `events`: some of `switch`, `health`, `config_rejected`, each once (default all).
fn events(it: &Item<HookSpec>, report: &mut Report) -> Option<Vec<HookEvent>> {
    let list = match &it.spec.events {
        _ if it.is_broken("events") => return None,
        None => return Some(HookEvent::ALL.to_vec()),
        Some(list) => list,
    };
    if list.is_empty() {
        let message = "events lists no event".to_owned();
        let hint = Some("leave events out for all of switch, health, config_rejected".to_owned());
        it.err(report, "events", message, hint);
        return None;
    }
    let choices = HookEvent::ALL.map(|e| (e.name(), e));
    let mut ok = true;
    let mut read: Vec<(usize, HookEvent)> = Vec::new();
    for (i, text) in list.iter().enumerate() {
        let rel = index_path("events", i);
        let Field::Ok(event) = leaf(it, report, Some(text), &rel, |v| {
            values::choice(v, "event", &choices, &[])
        }) else {
            ok = false;
            continue;
        };
        if let Some((first, _)) = read.iter().find(|(_, e)| *e == event) {
            let first = index_path("events", *first);
            let hint = format!("first listed at {}", it.location(report, &first));
            it.err(
                report,
                &rel,
                format!("duplicate event {:?}", event.name()),
                Some(hint),
            );
            ok = false;
        } else {
            read.push((i, event));
        }
    }
    let mut events: Vec<HookEvent> = read.into_iter().map(|(_, e)| e).collect();
    events.sort_unstable();
    ok.then_some(events)
}
