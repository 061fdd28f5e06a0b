//! Checking decision groups on their own, then state variables and groups together with the
//! whole configuration: every expression compiled against the schema of
//! [`crate::config::schema`], references to pools, groups and variables, derived-variable
//! cycles, and the address families of the services that share a group.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
};

use rules::{
    Compiled, Schema, Type,
    engine::{Action, DEFAULT_CLASS},
};

use super::{Field, ServiceDraft, leaf, missing, pool, required, state, unique_names};
use crate::config::{
    load::Parsed,
    model::{CanaryRamp, DecisionGroup, DecisionRule, SplitBy, SwitchPolicy},
    report::{Item, Report, index_path, key_path},
    schema,
    spec::{ActionSpec, CanarySpec, DecisionGroupSpec},
    values::{self, did_you_mean},
};

/// What could be read of one decision group.
pub(super) struct Draft {
    /// Its name.
    pub name: Option<String>,
    /// Pools its actions name: (path, pool).
    pub refs: Vec<(String, String)>,
    /// Client classes its `by_class` actions name: (path of the class's key, class); never
    /// `default`.
    pub classes: Vec<(String, String)>,
    /// The group, when every key of it is right.
    pub value: Option<DecisionGroup>,
}

/// Checks one `decisions[]` item on its own.
#[expect(
    clippy::too_many_lines,
    reason = "the keys of a group in turn (name, rules, default, switch), each reporting its own \
              problems"
)]
pub(super) fn group(it: &Item<DecisionGroupSpec>, report: &mut Report) -> Draft {
    let g = &it.spec;
    let name = required(it, report, g.name.as_deref(), "", "name", values::name);
    let mut refs = Vec::new();
    let mut classes = Vec::new();
    let rules = match &g.rules {
        _ if it.is_broken("rules") => None,
        None => {
            missing(it, report, "", "rules");
            None
        }
        Some(list) if list.is_empty() => {
            let message = "a decision group needs at least one rule".to_owned();
            it.err(report, "rules", message, None);
            None
        }
        Some(list) => {
            let mut out = Some(Vec::new());
            let mut ids: HashMap<String, usize> = HashMap::new();
            for (i, r) in list.iter().enumerate() {
                let rel = index_path("rules", i);
                let id = required(it, report, r.id.as_deref(), &rel, "id", values::name);
                if let Some(id) = &id {
                    if let Some(&first) = ids.get(id) {
                        let first = key_path(&index_path("rules", first), "id");
                        let hint = format!("first used at {}", it.location(report, &first));
                        let message = format!("duplicate rule id {id:?} in this group");
                        it.err(report, &key_path(&rel, "id"), message, Some(hint));
                        out = None;
                    } else {
                        ids.insert(id.clone(), i);
                    }
                }
                let priority = leaf(
                    it,
                    report,
                    r.priority.as_deref(),
                    &key_path(&rel, "priority"),
                    |v| {
                        v.parse::<i64>().map_err(|_| {
                            (format!("priority must be a whole number, not {v:?}"), None)
                        })
                    },
                )
                .or(0);
                let when = required(it, report, r.when.as_deref(), &rel, "when", |v| {
                    Ok(v.to_owned())
                });
                let then = match &r.then {
                    _ if it.is_broken(&key_path(&rel, "then")) => None,
                    None => {
                        missing(it, report, &rel, "then");
                        None
                    }
                    Some(a) => {
                        let rel = key_path(&rel, "then");
                        action(it, report, &rel, a, (&mut refs, &mut classes))
                    }
                };
                match (id, priority, when, then, out.as_mut()) {
                    (Some(id), Some(priority), Some(when), Some(then), Some(out)) => {
                        out.push(DecisionRule {
                            id,
                            priority,
                            when,
                            then,
                        });
                    }
                    _ => out = None,
                }
            }
            out
        }
    };
    let default = match &g.default {
        _ if it.is_broken("default") => Field::Bad,
        None => Field::Absent,
        Some(a) => match action(it, report, "default", a, (&mut refs, &mut classes)) {
            Some(a) => Field::Ok(Some(a)),
            None => Field::Bad,
        },
    };
    let switch = match &g.switch {
        _ if it.is_broken("switch") => None,
        None => Some(SwitchPolicy::default()),
        Some(s) => {
            let d = |v: Option<&str>, key: &str, report: &mut Report| {
                leaf(it, report, v, &key_path("switch", key), |v| {
                    state::zero_or_duration(v, key)
                })
                .or(std::time::Duration::ZERO)
            };
            let stable_for = d(s.stable_for.as_deref(), "stable_for", report);
            let cooldown = d(s.cooldown.as_deref(), "cooldown", report);
            let failback_after = d(s.failback_after.as_deref(), "failback_after", report);
            (|| {
                Some(SwitchPolicy {
                    stable_for: stable_for?,
                    cooldown: cooldown?,
                    failback_after: failback_after?,
                })
            })()
        }
    };
    let on_failback = super::flow_policy(it, report, g.on_failback.as_deref(), "on_failback");
    let canary = match &g.canary {
        _ if it.is_broken("canary") => Field::Bad,
        None => Field::Absent,
        Some(c) => match canary(it, report, c, &mut refs) {
            Some(c) => Field::Ok(Some(c)),
            None => Field::Bad,
        },
    };
    let split_by = leaf(it, report, g.split_by.as_deref(), "split_by", |v| {
        let choices = [
            ("flow", SplitBy::Flow),
            ("client", SplitBy::Client),
            ("client_prefix", SplitBy::ClientPrefix),
        ];
        values::choice(v, "split_by", &choices, &[])
    })
    .or(SplitBy::Flow);
    let value = (|| {
        Some(DecisionGroup {
            name: name.clone()?,
            rules: rules?,
            default: default.or(None)?,
            switch: switch?,
            require: g.require.clone(),
            automatic: g.automatic.clone(),
            on_failback: on_failback?,
            canary: canary.or(None)?,
            split_by: split_by?,
        })
    })();
    Draft {
        name,
        refs,
        classes,
        value,
    }
}

/// `canary:`: the pool (a reference like an action's), the steps, the hold. `rollback_when` is
/// compiled with the group's other expressions.
fn canary<S>(
    it: &Item<S>,
    report: &mut Report,
    c: &CanarySpec,
    refs: &mut Vec<(String, String)>,
) -> Option<CanaryRamp> {
    let pool = required(it, report, c.pool.as_deref(), "canary", "pool", |v| {
        if v.is_empty() {
            Err(("pool name must not be empty".to_owned(), None))
        } else {
            Ok(v.to_owned())
        }
    });
    if let Some(p) = &pool {
        refs.push((key_path("canary", "pool"), p.clone()));
    }
    let hold = required(it, report, c.hold.as_deref(), "canary", "hold", |v| {
        values::duration(v, "hold")
    });
    let steps_rel = key_path("canary", "steps");
    let steps = match &c.steps {
        _ if it.is_broken(&steps_rel) => None,
        None => {
            missing(it, report, "canary", "steps");
            None
        }
        Some(list) if list.is_empty() => {
            let message = "a canary ramp needs at least one step".to_owned();
            let hint = Some("for example [5%, 25%, 50%, 100%]".to_owned());
            it.err(report, &steps_rel, message, hint);
            None
        }
        Some(list) => {
            let mut out = Some(Vec::new());
            let mut previous: Option<(u32, &str)> = None;
            for (i, text) in list.iter().enumerate() {
                let rel = index_path(&steps_rel, i);
                let Some(share) = leaf(it, report, Some(text.as_str()), &rel, step_share).or(0)
                else {
                    out = None;
                    continue;
                };
                if let Some((before, before_text)) = previous
                    && share <= before
                {
                    let message =
                        format!("canary steps must increase: {text} follows {before_text}");
                    it.err(report, &rel, message, None);
                    out = None;
                }
                previous = Some((share, text.as_str()));
                if let Some(out) = out.as_mut() {
                    out.push(share);
                }
            }
            out
        }
    };
    Some(CanaryRamp {
        pool: pool?,
        steps: steps?,
        hold: hold?,
        rollback_when: c.rollback_when.clone(),
    })
}

/// A canary step: a percentage with at most two decimals (`5%`, `0.5%`) above 0 and at most
/// 100, in units of 1/[`rules::engine::SHARE_SCALE`].
fn step_share(v: &str) -> Result<u32, values::Bad> {
    let bad = || {
        (
            format!("a canary step must be a percentage like 5% or 0.5%, not {v:?}"),
            None,
        )
    };
    let number = v.trim().strip_suffix('%').ok_or_else(bad)?.trim();
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || fraction.len() > 2 || !digits(whole) || !digits(fraction) {
        return Err(bad());
    }
    let whole: u32 = whole.parse().map_err(|_| bad())?;
    let fraction: u32 = format!("{fraction:0<2}").parse().map_err(|_| bad())?;
    let share = whole
        .checked_mul(100)
        .and_then(|w| w.checked_add(fraction))
        .ok_or_else(bad)?;
    if share == 0 || share > rules::engine::SHARE_SCALE {
        return Err((
            format!("a canary step must be above 0% and at most 100%, not {v:?}"),
            None,
        ));
    }
    Ok(share)
}

/// What an action names, each with its path: pools (`.0`) and client classes (`.1`).
type Refs<'a> = (&'a mut Vec<(String, String)>, &'a mut Vec<(String, String)>);

/// `then:` or `default:` at `rel`: exactly one of `pool`, `split`, `by_class`. The pools and
/// classes it names go to `refs`.
fn action<S>(
    it: &Item<S>,
    report: &mut Report,
    rel: &str,
    a: &ActionSpec,
    refs: Refs<'_>,
) -> Option<Action> {
    let (refs, class_refs) = refs;
    let pool_rel = key_path(rel, "pool");
    let split_rel = key_path(rel, "split");
    let by_class_rel = key_path(rel, "by_class");
    if a.by_class.is_some() || it.is_broken(&by_class_rel) {
        if a.pool.is_some() || a.split.is_some() {
            let message = "give exactly one of pool, split, by_class".to_owned();
            it.err(report, rel, message, None);
            return None;
        }
        let classes = a
            .by_class
            .as_ref()
            .filter(|_| !it.is_broken(&by_class_rel))?;
        return by_class(it, report, &by_class_rel, classes, (refs, class_refs));
    }
    match (&a.pool, &a.split) {
        (Some(_), Some(_)) => {
            let message = "give exactly one of pool, split".to_owned();
            it.err(report, rel, message, None);
            None
        }
        (Some(p), None) if p.is_empty() => {
            let message = "pool name must not be empty".to_owned();
            it.err(report, &pool_rel, message, None);
            None
        }
        (Some(p), None) => {
            refs.push((pool_rel, p.clone()));
            Some(Action::Pool(p.clone()))
        }
        (None, Some(_)) if it.is_broken(&split_rel) => None,
        (None, Some(split)) => super::split(it, report, &split_rel, split, refs)
            .map(|v| Action::Split(v.into_iter().map(|s| (s.pool, s.weight)).collect())),
        (None, None) if it.is_broken(&pool_rel) || it.is_broken(&split_rel) => None,
        (None, None) => {
            let message = "an action needs one of pool, split, by_class".to_owned();
            let hint = Some("for example `{ pool: dc1 }`".to_owned());
            it.err(report, rel, message, hint);
            None
        }
    }
}

/// `by_class:` at `rel`: class name → a pool or split action, with `default` required. Class
/// names are checked against `classes:` with the whole configuration.
fn by_class<S>(
    it: &Item<S>,
    report: &mut Report,
    rel: &str,
    classes: &std::collections::BTreeMap<String, ActionSpec>,
    refs: Refs<'_>,
) -> Option<Action> {
    let (refs, class_refs) = refs;
    let mut out = Some(std::collections::BTreeMap::new());
    for (class, spec) in classes {
        let class_rel = key_path(rel, class);
        if class != DEFAULT_CLASS {
            class_refs.push((class_rel.clone(), class.clone()));
        }
        if spec.by_class.is_some() {
            let message = format!("the action of class {class:?} is itself by_class");
            let hint = Some("give each class a pool or a split".to_owned());
            it.err(report, &key_path(&class_rel, "by_class"), message, hint);
            out = None;
            continue;
        }
        match action(it, report, &class_rel, spec, (&mut *refs, &mut *class_refs)) {
            Some(a) => {
                if let Some(out) = out.as_mut() {
                    out.insert(class.clone(), a);
                }
            }
            None => out = None,
        }
    }
    if !classes.contains_key(DEFAULT_CLASS) {
        let message =
            "by_class needs a default: the action of clients of no class it names".to_owned();
        let hint = Some("for example `default: { pool: stable }`".to_owned());
        it.err(report, rel, message, hint);
        return None;
    }
    out.map(Action::ByClass)
}

/// Everything drafted so far.
pub(super) struct Whole<'a> {
    pub parsed: &'a Parsed,
    pub state: &'a [state::Draft],
    pub groups: &'a [Draft],
    pub pools: &'a [pool::Draft],
    pub services: &'a [ServiceDraft],
}

/// Every expression of a configuration that validation compiled, by its source text, with the
/// schema they were compiled against: what [`crate::config::compiled::from_checked`] assembles
/// the configuration's rules from, so nothing is compiled twice.
pub(crate) struct Checked {
    /// The schema of the finished configuration.
    pub schema: Schema,
    /// Each expression's compiled form, by source text.
    pub exprs: HashMap<String, Compiled>,
}

/// The checks that need the whole configuration. Returns what was compiled.
pub(super) fn check(w: &Whole<'_>, report: &mut Report) -> Checked {
    unique_state_names(w, report);
    unique_names(
        "decision group",
        &w.parsed.decisions,
        w.groups.iter().map(|g| g.name.as_deref()),
        report,
    );
    let schema = schema_of(w);
    let mut exprs = HashMap::new();
    let derived = expressions(w, &schema, report, &mut exprs);
    cycles(w, &derived, report);
    metrics(w, report);
    pool_refs(w, report);
    group_refs(w, report);
    Checked { schema, exprs }
}

fn unique_state_names(w: &Whole<'_>, report: &mut Report) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, (name, it)) in w.parsed.state.iter().enumerate() {
        match seen.get(name.as_str()).and_then(|&j| w.parsed.state.get(j)) {
            Some((_, first)) => {
                let hint = format!("first defined at {}", first.location(report, ""));
                let message = format!("duplicate state variable {name:?}");
                it.err(report, "", message, Some(hint));
            }
            None => {
                seen.insert(name, i);
            }
        }
    }
}

/// The schema of what could be read: what `config::schema::build` gives for the finished
/// configuration (names that could not be read are left out; duplicates are reported
/// elsewhere).
fn schema_of(w: &Whole<'_>) -> Schema {
    let mut s = Schema::new();
    for v in w.state.iter().filter(|v| v.name_ok) {
        if let Some(ty) = v.ty {
            let _ = s.define(&v.name, ty);
        }
    }
    let pools: Vec<(&str, Vec<IpAddr>)> = w
        .pools
        .iter()
        .filter_map(|p| Some((p.name.as_deref()?, p.backends.iter().map(|b| b.1).collect())))
        .collect();
    let services: Vec<&str> = w
        .services
        .iter()
        .filter_map(|s| s.name.as_deref())
        .collect();
    for (name, ty) in schema::builtins(&pools, &services) {
        let _ = s.define(&name, ty);
    }
    s
}

/// Compiles one expression at `rel` of `it` into `exprs`; returns the names it reads.
fn compile<S>(
    it: &Item<S>,
    report: &mut Report,
    rel: &str,
    (source, schema): (&str, &Schema),
    target_ok: bool,
    exprs: &mut HashMap<String, Compiled>,
) -> Option<Vec<String>> {
    match rules::compile(source, schema) {
        Err(e) => {
            it.err(report, rel, format!("invalid expression: {e}"), None);
            None
        }
        Ok(c) => {
            let reads: Vec<String> = c.read_names().map(|(n, _)| n.to_owned()).collect();
            if let Some(t) = reads
                .iter()
                .find(|n| n.starts_with("target."))
                .filter(|_| !target_ok)
            {
                let message = format!("{t} can be read only in `require`");
                let hint = Some("`target` is the pool a switch would go to".to_owned());
                it.err(report, rel, message, hint);
                return None;
            }
            exprs.insert(source.to_owned(), c);
            Some(reads)
        }
    }
}

/// Compiles every expression into `exprs`; returns, per derived variable, the names it reads.
fn expressions(
    w: &Whole<'_>,
    schema: &Schema,
    report: &mut Report,
    exprs: &mut HashMap<String, Compiled>,
) -> HashMap<String, Vec<String>> {
    let mut derived = HashMap::new();
    for ((name, it), draft) in w.parsed.state.iter().zip(w.state) {
        if let Some(e) = &draft.expr
            && let Some(reads) = compile(it, report, "expr", (e, schema), false, exprs)
        {
            derived.entry(name.clone()).or_insert(reads);
        }
    }
    for it in &w.parsed.decisions {
        let g = &it.spec;
        for (i, r) in g.rules.iter().flatten().enumerate() {
            if let Some(when) = &r.when {
                let rel = key_path(&index_path("rules", i), "when");
                compile(it, report, &rel, (when, schema), false, exprs);
            }
        }
        if let Some(require) = &g.require {
            compile(it, report, "require", (require, schema), true, exprs);
        }
        if let Some(rollback) = g.canary.as_ref().and_then(|c| c.rollback_when.as_ref()) {
            let rel = key_path("canary", "rollback_when");
            compile(it, report, &rel, (rollback, schema), false, exprs);
        }
        if let Some(gate) = &g.automatic {
            match schema.get(gate) {
                Some((_, Type::Bool)) if !gate.starts_with("target.") => {}
                Some((_, ty)) => {
                    let message = format!("automatic must name a bool variable; {gate:?} is {ty}");
                    it.err(report, "automatic", message, None);
                }
                None => {
                    let message = format!("unknown variable {gate:?}");
                    let hint = schema.closest(gate).map(|c| format!("did you mean {c:?}?"));
                    it.err(report, "automatic", message, hint);
                }
            }
        }
    }
    derived
}

/// Rejects derived variables that read themselves, directly or through others.
fn cycles(w: &Whole<'_>, derived: &HashMap<String, Vec<String>>, report: &mut Report) {
    let mut reported: HashSet<String> = HashSet::new();
    for (name, it) in &w.parsed.state {
        if reported.contains(name) || !derived.contains_key(name) {
            continue;
        }
        if let Some(path) = cycle_from(name, derived) {
            reported.extend(path.iter().cloned());
            let message = format!("derived variables form a cycle: {}", path.join(" → "));
            let hint = Some("an expr may not read itself, directly or through others".to_owned());
            it.err(report, "expr", message, hint);
        }
    }
}

/// A path `start → … → start` through `derived`, if there is one.
fn cycle_from(start: &str, derived: &HashMap<String, Vec<String>>) -> Option<Vec<String>> {
    // Depth-first with an explicit stack of (name, next read to follow).
    let mut stack: Vec<(&str, usize)> = vec![(start, 0)];
    let mut seen: HashSet<&str> = HashSet::new();
    while let Some((name, next)) = stack.last_mut() {
        let reads = derived.get(*name).map_or(&[][..], Vec::as_slice);
        let Some(read) = reads.get(*next) else {
            stack.pop();
            continue;
        };
        *next += 1;
        if read == start {
            let mut path: Vec<String> = stack.iter().map(|(n, _)| (*n).to_owned()).collect();
            path.push(start.to_owned());
            return Some(path);
        }
        if derived.contains_key(read) && seen.insert(read.as_str()) {
            stack.push((read.as_str(), 0));
        }
    }
    None
}

/// `metric.of` names a configured service or backend rate.
fn metrics(w: &Whole<'_>, report: &mut Report) {
    let services: Vec<&str> = w
        .services
        .iter()
        .filter_map(|s| s.name.as_deref())
        .collect();
    let backends: Vec<IpAddr> = w
        .pools
        .iter()
        .flat_map(|p| p.backends.iter().map(|b| b.1))
        .collect();
    for (_, it) in &w.parsed.state {
        let Some(of) = it.spec.metric.as_ref().and_then(|m| m.of.as_ref()) else {
            continue;
        };
        if let Err((message, hint)) = state::metric_of_ok(of, &services, &backends) {
            it.err(report, "metric.of", message, hint);
        }
    }
}

/// Every pool a group's action names exists.
fn pool_refs(w: &Whole<'_>, report: &mut Report) {
    let names: Vec<&str> = w.pools.iter().filter_map(|p| p.name.as_deref()).collect();
    for (it, g) in w.parsed.decisions.iter().zip(w.groups) {
        for (rel, pool) in &g.refs {
            if !names.contains(&pool.as_str()) {
                it.err(
                    report,
                    rel,
                    format!("unknown pool {pool:?}"),
                    did_you_mean(pool, &names),
                );
            }
        }
    }
}

/// Every `decide` names a group; the services of one group share an address family, and the
/// group's pools have it.
fn group_refs(w: &Whole<'_>, report: &mut Report) {
    let names: Vec<&str> = w.groups.iter().filter_map(|g| g.name.as_deref()).collect();
    let family = |ip: IpAddr| if ip.is_ipv4() { "IPv4" } else { "IPv6" };
    // Per group: the services using it, (index, name, vip).
    let mut users: HashMap<&str, Vec<(usize, &str, IpAddr)>> = HashMap::new();
    for (i, (it, s)) in w.parsed.services.iter().zip(w.services).enumerate() {
        let Some(group) = it.spec.to.as_ref().and_then(|t| t.decide.as_deref()) else {
            continue;
        };
        if !names.contains(&group) {
            let message = format!("unknown decision group {group:?}");
            it.err(report, "to.decide", message, did_you_mean(group, &names));
            continue;
        }
        if let (Some(name), Some(vip)) = (s.name.as_deref(), s.vip) {
            users.entry(group).or_default().push((i, name, vip));
        }
    }
    for (it, g) in w.parsed.decisions.iter().zip(w.groups) {
        let Some(users) = g.name.as_deref().and_then(|n| users.get(n)) else {
            continue;
        };
        let Some(&(_, first, first_vip)) = users.first() else {
            continue;
        };
        let location = |i: usize| {
            w.parsed
                .services
                .get(i)
                .map(|s| s.location(report, "to.decide"))
                .unwrap_or_default()
        };
        if let Some(&(i, other, vip)) = users.iter().find(|u| u.2.is_ipv4() != first_vip.is_ipv4())
        {
            let message = format!(
                "used by services of different address families: {first:?} ({} {first_vip}) and \
                 {other:?} ({} {vip}, at {})",
                family(first_vip),
                family(vip),
                location(i)
            );
            let hint = Some(
                "every pool of a group must serve each service using it; use one group per \
                 address family"
                    .to_owned(),
            );
            it.err(report, "name", message, hint);
            continue;
        }
        let mut wrong: Vec<&str> = Vec::new();
        for (_, pool) in &g.refs {
            let bad = w
                .pools
                .iter()
                .find(|p| p.name.as_deref() == Some(pool))
                .is_some_and(|p| {
                    p.backends
                        .iter()
                        .any(|b| b.1.is_ipv4() != first_vip.is_ipv4())
                });
            if bad && !wrong.contains(&pool.as_str()) {
                wrong.push(pool);
            }
        }
        if !wrong.is_empty() {
            let message = format!(
                "pools {} have backends that are not {} like service {first:?} ({first_vip}) \
                 that uses this group",
                wrong.join(", "),
                family(first_vip)
            );
            let hint = Some(format!(
                "service {first:?} is at {}",
                location(users.first().map_or(0, |u| u.0))
            ));
            it.err(report, "name", message, hint);
        }
    }
}
