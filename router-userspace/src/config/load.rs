//! Finding the fragments of a directory, parsing each with positions, and deserializing each item
//! (the agent, the conntrack timeouts, a service, a virtual IP's settings, a pool) into its spec.
//!
//! Items are deserialized one at a time, so a broken item does not hide the others. Within an
//! item, serde stops at the first unknown key or misshapen value; the loader reports it, removes
//! the key (or blanks the value and remembers its path as broken), and deserializes again, so
//! every such problem of the item is reported.

use std::{fs, path::Path};

use marked_yaml::{
    Error as SerdeError, LoadError, LoaderOptions, Marker, Node, from_node,
    types::{MarkedMappingNode, MarkedScalarNode},
};
use serde::de::DeserializeOwned;

use super::{
    Config, ConfigError, Fragments, Problem,
    report::{Item, Pos, Report, index, index_path, key_path, quoted},
    spec::{
        AgentSpec, AnnounceSpec, ClassSpec, ConntrackSpec, DecisionGroupSpec, FleetSpec, HookSpec,
        PoolSpec, ServiceSpec, StateVarSpec, TOP_LEVEL_KEYS, VipSpec,
    },
    validate::validate,
    values::{closest, suggest},
};

/// Loads the configuration of `dir`: every `*.yaml` file in it, in name order, merged.
///
/// Dotfiles and editor leftovers (`.#x.yaml`, `x.yaml~`, `x.yaml.swp`) are skipped; other files
/// are ignored. A directory with no fragment gives the empty configuration (defaults only).
/// The same as [`read_dir`] followed by [`DirFragments::load`].
///
/// # Errors
///
/// A [`ConfigError`] with every problem found: the directory cannot be read; a fragment cannot
/// be read or parsed; or the merged configuration is invalid.
pub fn load_dir(dir: &Path) -> Result<Config, ConfigError> {
    read_dir(dir)?.load().map(|(_, config)| config)
}

/// The fragments of a configuration directory as [`read_dir`] found them, in name order: each
/// with its text, or why it could not be read.
///
/// A fragment that cannot be read does not stop the others: [`DirFragments::load`] reports it
/// together with every problem of the readable ones, as [`load_dir`] always has. That is why
/// this is not simply a list of texts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirFragments {
    /// `(file name, text)`, or `(file name, Err(message))` for a fragment that cannot be read
    /// (`cannot read: not a regular file`, `cannot read: larger than 16 MiB`, an I/O error).
    /// An error while listing the directory part-way appears as an entry named after the
    /// directory.
    pub entries: Vec<(String, Result<String, String>)>,
}

impl DirFragments {
    /// The fragments' texts when every one was read.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] with one problem for each fragment that could not be read.
    pub fn fragments(&self) -> Result<Fragments, ConfigError> {
        let mut files = Vec::with_capacity(self.entries.len());
        let mut problems = Vec::new();
        for (name, text) in &self.entries {
            match text {
                Ok(text) => files.push((name.clone(), text.clone())),
                Err(message) => problems.push(Problem {
                    file: name.clone(),
                    line: None,
                    column: None,
                    path: String::new(),
                    message: message.clone(),
                    hint: None,
                }),
            }
        }
        if problems.is_empty() {
            Ok(Fragments::new(files))
        } else {
            Err(ConfigError { problems })
        }
    }

    /// Parses and validates the fragments, merged in order: the fragments as they were read
    /// (what to record in the history) and the configuration.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] with every problem found: each fragment that could not be read, and
    /// every problem of the others and of the merged configuration.
    pub fn load(&self) -> Result<(Fragments, Config), ConfigError> {
        let config = load(self.entries.iter().map(|(n, t)| (n, t.as_deref())))?;
        // Every entry was readable, or `load` would have reported it.
        let fragments = self.fragments()?;
        Ok((fragments, config))
    }
}

/// Reads the fragments of `dir`: every `*.yaml` file in it, in name order, with the rules of
/// [`load_dir`] (editor leftovers skipped; only regular files, at most 16 MiB each).
///
/// # Errors
///
/// A [`ConfigError`] with one problem (file: the directory) when the directory cannot be
/// opened. A fragment that cannot be read is not an error here: see [`DirFragments`].
pub fn read_dir(dir: &Path) -> Result<DirFragments, ConfigError> {
    let dir_name = dir.display().to_string();
    let entries = fs::read_dir(dir).map_err(|e| ConfigError {
        problems: vec![Problem {
            file: dir_name.clone(),
            line: None,
            column: None,
            path: String::new(),
            message: format!("cannot read the configuration directory: {e}"),
            hint: None,
        }],
    })?;
    let mut sources: Vec<(String, Result<String, String>)> = Vec::new();
    let mut names = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => {
                let name = entry.file_name().to_string_lossy().into_owned();
                if is_fragment(&name) {
                    names.push((name, entry.path()));
                }
            }
            Err(e) => sources.push((
                dir_name.clone(),
                Err(format!("cannot list the configuration directory: {e}")),
            )),
        }
    }
    names.sort();
    for (name, path) in names {
        sources.push((name, read_fragment(&path)));
    }
    Ok(DirFragments { entries: sources })
}

/// Loads a configuration from fragments given as `(file name, text)`, merged in the order given
/// ([`load_dir`] passes them in name order). The names are used only in problems.
///
/// # Errors
///
/// A [`ConfigError`] with every problem found in the fragments and in the merged configuration.
pub fn load_files(files: &[(String, String)]) -> Result<Config, ConfigError> {
    load(files.iter().map(|(n, t)| (n, Ok(t.as_str()))))
}

/// Largest fragment read: far more than the data plane's limits can use (a full configuration
/// is a few hundred kilobytes).
const MAX_FRAGMENT_BYTES: u64 = 16 << 20;

/// The text of one fragment. Only regular files (or links to them) are read: a FIFO would
/// block and a device (`/dev/zero`) never end, hanging a reload; nor more than
/// [`MAX_FRAGMENT_BYTES`].
fn read_fragment(path: &Path) -> Result<String, String> {
    use std::{io::Read as _, os::unix::fs::OpenOptionsExt as _};
    let not_regular = |meta: &fs::Metadata| {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        format!("cannot read: {kind}")
    };
    // Checked before opening: opening some devices has effects of its own.
    let meta = fs::metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    let too_big = || format!("cannot read: larger than {} MiB", MAX_FRAGMENT_BYTES >> 20);
    if meta.len() > MAX_FRAGMENT_BYTES {
        return Err(too_big());
    }
    // And checked again on what was opened: the name may have been swapped for a FIFO in
    // between (the open would block until a writer came). `O_NONBLOCK` makes that open return
    // at once, and changes nothing for a regular file.
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("cannot read: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot read: {e}"))?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    let mut text = String::new();
    file.take(MAX_FRAGMENT_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read: {e}"))?;
    if text.len() as u64 > MAX_FRAGMENT_BYTES {
        return Err(too_big());
    }
    Ok(text)
}

/// Whether a directory entry named `name` is a fragment: `*.yaml`, not a dotfile or an editor
/// leftover.
#[must_use]
#[expect(
    clippy::case_sensitive_file_extension_comparisons,
    reason = "a fragment is named `*.yaml` exactly, and the editor leftovers it skips too"
)]
pub fn is_fragment(name: &str) -> bool {
    name.ends_with(".yaml")
        && !name.starts_with('.') // dotfiles, Emacs lock files `.#x.yaml`, Vim `.x.yaml.swp`
        && !name.ends_with('~')
        && !name.ends_with(".swp")
}

/// Whether a fragment named `name` belongs to its node: `local.yaml` or `*.local.yaml`. With
/// `fleet:`, the node's identity and its own settings (`fleet:`, `agent:`, `announce:`) live in
/// such files and every other fragment is the fleet's shared config, written to etcd.
#[must_use]
pub fn is_node_local(name: &str) -> bool {
    name == "local.yaml" || name.ends_with(".local.yaml")
}

/// With `fleet:`, each of `fleet:`, `agent:` and `announce:` must be set in a node-local file
/// ([`is_node_local`]): the other fragments are shared by the whole fleet through etcd, and a
/// shared `agent:` would give every node one API address and pin path, a shared `fleet:` one
/// node name. Without `fleet:` any fragment may hold them.
fn node_local_sections(parsed: &Parsed, report: &mut Report) {
    if parsed.fleets.is_empty() {
        return;
    }
    let found = parsed
        .fleets
        .iter()
        .map(|i| (i.file, i.at(""), &i.base))
        .chain(parsed.agents.iter().map(|i| (i.file, i.at(""), &i.base)))
        .chain(parsed.announces.iter().map(|i| (i.file, i.at(""), &i.base)));
    let outside: Vec<_> = found
        .filter(|(file, _, _)| !is_node_local(report.file_name(*file)))
        .map(|(file, at, base)| (file, at, base.clone()))
        .collect();
    for (file, at, base) in outside {
        let message = format!(
            "{base} must be set in a node-local file when fleet is set: the other fragments \
             are the fleet's shared config"
        );
        let hint = Some("move it to local.yaml (or NAME.local.yaml) in this directory".to_owned());
        report.add(file, at, base, message, hint);
    }
}

fn load<'a>(
    sources: impl Iterator<Item = (&'a String, Result<&'a str, &'a String>)>,
) -> Result<Config, ConfigError> {
    let sources: Vec<_> = sources.collect();
    let mut report = Report::new(sources.iter().map(|(n, _)| (*n).clone()).collect());
    let mut parsed = Parsed::default();
    for (file, (_, text)) in sources.iter().enumerate() {
        match text {
            Ok(text) => parse_file(file, text, &mut parsed, &mut report),
            Err(message) => {
                report.add(file, None, String::new(), (*message).clone(), None);
                parsed.unparsed.push(file);
            }
        }
    }
    node_local_sections(&parsed, &mut report);
    let config = validate(&parsed, &mut report);
    match config {
        Some(config) if report.is_empty() => Ok(config),
        _ => {
            let mut problems = report.into_problems();
            if problems.is_empty() {
                // Unreachable by design (validate builds a Config whenever nothing was
                // reported), but a ConfigError must never be empty.
                problems.push(Problem {
                    file: String::new(),
                    line: None,
                    column: None,
                    path: String::new(),
                    message: "internal error: configuration rejected without a problem".to_owned(),
                    hint: None,
                });
            }
            Err(ConfigError { problems })
        }
    }
}

/// Every item of every fragment, deserialized, in file order.
#[derive(Default)]
pub(crate) struct Parsed {
    /// Each `agent:` (more than one is an error).
    pub agents: Vec<Item<AgentSpec>>,
    /// Each `fleet:` (more than one is an error).
    pub fleets: Vec<Item<FleetSpec>>,
    /// Each `conntrack:` (more than one is an error).
    pub conntracks: Vec<Item<ConntrackSpec>>,
    /// Each `announce:` (more than one is an error).
    pub announces: Vec<Item<AnnounceSpec>>,
    /// Each `services[]` item.
    pub services: Vec<Item<ServiceSpec>>,
    /// Each `vips[]` item.
    pub vips: Vec<Item<VipSpec>>,
    /// Each `pools[]` item.
    pub pools: Vec<Item<PoolSpec>>,
    /// Each `state.<name>` entry, with its name (the key).
    pub state: Vec<(String, Item<StateVarSpec>)>,
    /// Each `decisions[]` item.
    pub decisions: Vec<Item<DecisionGroupSpec>>,
    /// Each `hooks[]` item.
    pub hooks: Vec<Item<HookSpec>>,
    /// Each `classes.<name>` entry, with its name (the key).
    pub classes: Vec<(String, Item<ClassSpec>)>,
    /// Files that could not be read or parsed: names they define are unknown.
    pub unparsed: Vec<usize>,
}

/// A section that is one mapping (`agent:`, `fleet:`, `conntrack:`, `announce:`), positioned at
/// its key.
fn section<S: DeserializeOwned + Default>(
    file: usize,
    name: &str,
    at: Option<Pos>,
    value: &Node,
    report: &mut Report,
) -> Option<Item<S>> {
    let mut item = item::<S>(file, name, value, report)?;
    if let Some(at) = at {
        item.pos.insert(String::new(), at);
    }
    Some(item)
}

fn parse_file(file: usize, text: &str, parsed: &mut Parsed, report: &mut Report) {
    // A byte order mark may open a YAML stream (YAML 1.2 §5.2); some editors write one.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let options = LoaderOptions::default()
        .error_on_duplicate_keys(true)
        // Quoted scalars stay strings: a push default `"false"` is text, `false` a bool.
        .prevent_coercion(true)
        .toplevel_mapping();
    let mut root = match marked_yaml::parse_yaml_with_options(file, text, options) {
        Ok(root) => root,
        Err(e) => {
            let (at, message) = describe_load_error(&e);
            report.add(file, at, String::new(), message, None);
            parsed.unparsed.push(file);
            return;
        }
    };
    strip_nulls(&mut root);
    let Node::Mapping(top) = root else {
        let at = root.span().start().map(Pos::of);
        let message = "the top level must be a mapping of agent, services, pools".to_owned();
        report.add(file, at, String::new(), message, None);
        parsed.unparsed.push(file);
        return;
    };
    for (key, value) in top.iter() {
        let at = key.span().start().map(Pos::of);
        let name = key.as_str();
        match name {
            "agent" => parsed.agents.extend(section(file, name, at, value, report)),
            "fleet" => parsed.fleets.extend(section(file, name, at, value, report)),
            "conntrack" => parsed
                .conntracks
                .extend(section(file, name, at, value, report)),
            "announce" => parsed
                .announces
                .extend(section(file, name, at, value, report)),
            "services" => {
                for (i, node) in list(file, name, at, value, report).iter().enumerate() {
                    let base = index_path(name, i);
                    parsed.services.extend(item(file, &base, node, report));
                }
            }
            "vips" => {
                for (i, node) in list(file, name, at, value, report).iter().enumerate() {
                    let base = index_path(name, i);
                    parsed.vips.extend(item(file, &base, node, report));
                }
            }
            "pools" => {
                for (i, node) in list(file, name, at, value, report).iter().enumerate() {
                    let base = index_path(name, i);
                    parsed.pools.extend(item(file, &base, node, report));
                }
            }
            "state" => parsed.state.extend(named(file, name, at, value, report)),
            "decisions" => {
                for (i, node) in list(file, name, at, value, report).iter().enumerate() {
                    let base = index_path(name, i);
                    parsed.decisions.extend(item(file, &base, node, report));
                }
            }
            "hooks" => {
                for (i, node) in list(file, name, at, value, report).iter().enumerate() {
                    let base = index_path(name, i);
                    parsed.hooks.extend(item(file, &base, node, report));
                }
            }
            "classes" => parsed.classes.extend(named(file, name, at, value, report)),
            _ => {
                let message = format!("unknown key {name:?}");
                report.add(
                    file,
                    at,
                    name.to_owned(),
                    message,
                    suggest(name, TOP_LEVEL_KEYS),
                );
            }
        }
    }
}

/// The entries of a top-level mapping of names (`state`, `classes`), each positioned at its
/// name, or none after reporting that it is not a mapping.
fn named<S: DeserializeOwned + Default>(
    file: usize,
    name: &str,
    at: Option<Pos>,
    value: &Node,
    report: &mut Report,
) -> Vec<(String, Item<S>)> {
    let Node::Mapping(entries) = value else {
        let message = format!("expected a mapping of names, found {}", describe(value));
        report.add(file, at, name.to_owned(), message, None);
        return Vec::new();
    };
    let mut out = Vec::new();
    for (key, node) in entries.iter() {
        let base = key_path(name, key.as_str());
        if let Some(mut item) = item::<S>(file, &base, node, report) {
            if let Some(at) = key.span().start().map(Pos::of) {
                item.pos.insert(String::new(), at);
            }
            out.push((key.as_str().to_owned(), item));
        }
    }
    out
}

/// The elements of a top-level list (`services`, `vips`, `pools`), or none after reporting that it is
/// not a list.
fn list<'n>(
    file: usize,
    name: &str,
    at: Option<Pos>,
    value: &'n Node,
    report: &mut Report,
) -> &'n [Node] {
    match value {
        Node::Sequence(seq) => seq,
        other => {
            let message = format!("expected a list, found {}", describe(other));
            report.add(file, at, name.to_owned(), message, None);
            &[]
        }
    }
}

/// Most rounds of (deserialize, report, repair) for one item.
const MAX_ROUNDS: usize = 256;

/// Deserializes one item, reporting every unknown key and misshapen value in it.
fn item<T: DeserializeOwned + Default>(
    file: usize,
    base: &str,
    node: &Node,
    report: &mut Report,
) -> Option<Item<T>> {
    let at = node.span().start().map(Pos::of);
    if !matches!(node, Node::Mapping(_)) {
        let message = format!("expected a mapping, found {}", describe(node));
        report.add(file, at, base.to_owned(), message, None);
        return None;
    }
    let mut item = Item {
        file,
        base: base.to_owned(),
        spec: T::default(),
        pos: index(node),
        broken: Vec::new(),
        quoted: quoted(node),
    };
    let mut node = node.clone();
    for _ in 0..MAX_ROUNDS {
        let error = match from_node::<T>(&node) {
            Ok(spec) => {
                item.spec = spec;
                return Some(item);
            }
            Err(error) => error,
        };
        let mark = error.start_mark();
        let repaired = match (&*error, mark) {
            (SerdeError::UnknownFieldError(field, expected, _), Some(mark)) => {
                remove_key(&mut node, &mark, field, "").map(|rel| {
                    let message = format!("unknown key {field:?}");
                    item.err(report, &rel, message, suggest(field, expected));
                    // A misspelt key is not also missing under its right name.
                    if let Some(meant) = closest(field, expected) {
                        let parent = rel.strip_suffix(field.as_str()).unwrap_or("");
                        item.broken.push(format!("{parent}{meant}"));
                    }
                })
            }
            (other, Some(mark)) => {
                blank_value(&mut node, &mark, String::new()).map(|(rel, found)| {
                    let message = shape_message(&other.to_string(), &found);
                    item.err(report, &rel, message, None);
                    item.broken.push(rel);
                })
            }
            (_, None) => None,
        };
        if repaired.is_none() {
            // Not located: report it on the item and give up on the item's contents.
            item.err(report, "", error.to_string(), None);
            item.broken.push(String::new());
            return Some(item);
        }
    }
    item.err(
        report,
        "",
        "too many problems in this entry".to_owned(),
        None,
    );
    item.broken.push(String::new());
    Some(item)
}

/// Removes the mapping key `field` that starts at `mark`; returns its path.
fn remove_key(node: &mut Node, mark: &Marker, field: &str, rel: &str) -> Option<String> {
    match node {
        Node::Mapping(map) => {
            let hit = map
                .keys()
                .find(|k| k.as_str() == field && k.span().start() == Some(mark))
                .cloned();
            if let Some(key) = hit {
                map.remove(&key);
                return Some(key_path(rel, field));
            }
            map.iter_mut()
                .find_map(|(k, v)| remove_key(v, mark, field, &key_path(rel, k.as_str())))
        }
        Node::Sequence(seq) => seq
            .iter_mut()
            .enumerate()
            .find_map(|(i, v)| remove_key(v, mark, field, &index_path(rel, i))),
        Node::Scalar(_) => None,
    }
}

/// Replaces the value that starts at `mark` by an empty scalar (which every spec type accepts);
/// returns its path and what it was.
fn blank_value(node: &mut Node, mark: &Marker, rel: String) -> Option<(String, String)> {
    let is_empty = matches!(node, Node::Scalar(s) if s.as_str().is_empty());
    if node.span().start() == Some(mark) && !is_empty {
        let found = describe(node);
        *node = Node::Scalar(MarkedScalarNode::new_empty(*node.span()));
        return Some((rel, found));
    }
    match node {
        Node::Mapping(map) => map
            .iter_mut()
            .find_map(|(k, v)| blank_value(v, mark, key_path(&rel, k.as_str()))),
        Node::Sequence(seq) => seq
            .iter_mut()
            .enumerate()
            .find_map(|(i, v)| blank_value(v, mark, index_path(&rel, i))),
        Node::Scalar(_) => None,
    }
}

/// `expected a list, found "5"` from serde's `invalid type: string "5", expected a sequence`.
fn shape_message(serde_message: &str, found: &str) -> String {
    let Some(expected) = serde_message
        .strip_prefix("invalid type: ")
        .and_then(|rest| rest.rsplit_once(", expected "))
        .map(|(_, expected)| expected)
    else {
        return serde_message.to_owned();
    };
    let expected = match expected {
        "a string" => "a single value",
        "a sequence" => "a list",
        e if e.starts_with("struct ") || e == "a map" => "a mapping",
        e => e,
    };
    format!("expected {expected}, found {found}")
}

/// How a node reads in a message: `"5"`, `a list`, `a mapping`.
fn describe(node: &Node) -> String {
    match node {
        Node::Scalar(s) if s.as_str().is_empty() => "nothing".to_owned(),
        Node::Scalar(s) => format!("{:?}", s.as_str()),
        Node::Mapping(_) => "a mapping".to_owned(),
        Node::Sequence(_) => "a list".to_owned(),
    }
}

/// Drops mapping entries whose value is null (`key:`, `key: ~`, `key: null`): YAML's way of
/// saying the key has no value, read as absent.
fn strip_nulls(node: &mut Node) {
    match node {
        Node::Mapping(map) => strip_nulls_in(map),
        Node::Sequence(seq) => seq.iter_mut().for_each(strip_nulls),
        Node::Scalar(_) => {}
    }
}

fn strip_nulls_in(map: &mut MarkedMappingNode) {
    map.retain(|_, value| !matches!(value, Node::Scalar(s) if is_null(s)));
    map.iter_mut().for_each(|(_, value)| strip_nulls(value));
}

fn is_null(scalar: &MarkedScalarNode) -> bool {
    scalar.may_coerce() && matches!(scalar.as_str(), "" | "~" | "null" | "Null" | "NULL")
}

/// Where a YAML load error is, and what to say about it.
fn describe_load_error(error: &LoadError) -> (Option<Pos>, String) {
    let at = |m: &Marker| Some(Pos::of(m));
    match error {
        LoadError::ScanError(m, e) => (
            at(m),
            format!("invalid YAML at column {}: {}", m.column(), e.info()),
        ),
        LoadError::TopLevelMustBeMapping(m) | LoadError::TopLevelMustBeSequence(m) => (
            at(m),
            "the top level must be a mapping of agent, services, pools".to_owned(),
        ),
        LoadError::UnexpectedAnchor(m) => (
            at(m),
            "YAML anchors and aliases are not supported".to_owned(),
        ),
        LoadError::UnexpectedTag(m) => (at(m), "YAML tags (`!!type`) are not supported".to_owned()),
        LoadError::MappingKeyMustBeScalar(m) => {
            (at(m), "mapping keys must be plain text".to_owned())
        }
        LoadError::DuplicateKey(inner) => {
            let first = inner.prev_key.span().start().map(Pos::of);
            let message = match first {
                Some(first) => format!(
                    "duplicate key {:?} (first at line {})",
                    inner.key.as_str(),
                    first.line
                ),
                None => format!("duplicate key {:?}", inner.key.as_str()),
            };
            (inner.key.span().start().map(Pos::of), message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fragment swapped between a regular file and a FIFO while the directory is read over and
    /// over: a read that checked the name, then opened a FIFO put in its place, would block the
    /// agent's event loop for as long as no one writes to it. Each read must end.
    #[test]
    fn a_fragment_swapped_for_a_fifo_while_it_is_read_never_blocks() {
        use std::sync::{
            Arc,
            atomic::{AtomicBool, AtomicUsize, Ordering},
        };
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_owned();
        let target = dir.join("10-web.yaml");
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (dir, target, stop) = (dir.clone(), target.clone(), stop.clone());
            std::thread::spawn(move || {
                let fifo = dir.join(".fifo");
                let file = dir.join(".file");
                let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: mkfifo(3) on a NUL-terminated path.
                    unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
                    let _ = fs::rename(&fifo, &target);
                    let _ = fs::write(&file, "services: []\n");
                    let _ = fs::rename(&file, &target);
                }
            })
        };
        let done = Arc::new(AtomicUsize::new(0));
        let reader = {
            let (dir, done) = (dir.clone(), done.clone());
            std::thread::spawn(move || {
                for _ in 0..3000 {
                    let _ = read_dir(&dir);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let mut last = (0, std::time::Instant::now());
        let blocked = loop {
            if reader.is_finished() {
                break false;
            }
            let now = done.load(Ordering::Relaxed);
            if now != last.0 {
                last = (now, std::time::Instant::now());
            } else if last.1.elapsed() > std::time::Duration::from_secs(3) {
                break true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        // A blocked reader waits on a FIFO no path names any more: it is left behind.
        assert!(!blocked, "a read blocked on a FIFO after {} reads", last.0);
        reader.join().unwrap();
    }

    #[test]
    fn fragment_names_skip_dotfiles_and_editor_leftovers() {
        assert!(is_fragment("10-web.yaml"));
        for name in [
            ".10-web.yaml",
            ".#10-web.yaml",
            "10-web.yaml~",
            "10-web.yaml.swp",
            ".10-web.yaml.swp",
            "10-web.yml",
            "README",
        ] {
            assert!(!is_fragment(name), "{name}");
        }
    }

    #[test]
    fn shape_messages_speak_yaml() {
        assert_eq!(
            shape_message("invalid type: string \"5\", expected a sequence", "\"5\""),
            "expected a list, found \"5\""
        );
        assert_eq!(
            shape_message("invalid type: sequence, expected struct PoolSpec", "a list"),
            "expected a mapping, found a list"
        );
        assert_eq!(shape_message("something else", "x"), "something else");
    }

    const WEB: &str = "services:\n  - { name: web, vip: 198.18.0.10, port: 80, protocol: tcp, \
                       forward: dsr-l2, to: { pool: dc1 } }\n";
    const POOLS: &str = "pools:\n  - { name: dc1, backends: [ { address: 198.18.1.11 } ] }\n";

    #[test]
    fn read_dir_gives_the_fragments_in_name_order_and_load_gives_them_back() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("20-pools.yaml"), POOLS).unwrap();
        fs::write(tmp.path().join("10-web.yaml"), WEB).unwrap();
        fs::write(tmp.path().join("10-web.yaml~"), "junk: [").unwrap();
        fs::write(tmp.path().join("notes.txt"), "junk: [").unwrap();
        let read = read_dir(tmp.path()).unwrap();
        let expected = vec![
            ("10-web.yaml".to_owned(), WEB.to_owned()),
            ("20-pools.yaml".to_owned(), POOLS.to_owned()),
        ];
        let as_read: Vec<(String, Result<String, String>)> = expected
            .iter()
            .map(|(n, t)| (n.clone(), Ok(t.clone())))
            .collect();
        assert_eq!(read.entries, as_read);
        let (fragments, config) = read.load().unwrap();
        assert_eq!(fragments.files(), expected);
        assert_eq!(read.fragments().unwrap(), fragments);
        assert_eq!(config, load_files(&expected).unwrap());
        assert_eq!(load_dir(tmp.path()).unwrap(), config);
    }

    #[test]
    fn an_unreadable_fragment_is_reported_with_the_others_problems() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("10-web.yaml"), WEB.replace("dc1", "dc3")).unwrap();
        fs::write(tmp.path().join("20-pools.yaml"), POOLS).unwrap();
        fs::create_dir(tmp.path().join("30-dir.yaml")).unwrap();
        let read = read_dir(tmp.path()).unwrap();
        assert_eq!(read.entries.len(), 3);
        assert_eq!(
            read.entries[2],
            (
                "30-dir.yaml".to_owned(),
                Err("cannot read: a directory".to_owned())
            )
        );
        let files: Vec<String> = read
            .load()
            .unwrap_err()
            .problems
            .iter()
            .map(|p| format!("{}: {}", p.file, p.message))
            .collect();
        assert_eq!(
            files,
            [
                "10-web.yaml: unknown pool \"dc3\"",
                "30-dir.yaml: cannot read: a directory"
            ]
        );
        let e = read.fragments().unwrap_err();
        assert_eq!(e.to_string(), "30-dir.yaml: cannot read: a directory");
        assert_eq!(load_dir(tmp.path()).unwrap_err(), read.load().unwrap_err());
    }

    #[test]
    fn read_dir_of_a_missing_directory_is_one_problem() {
        let tmp = tempfile::tempdir().unwrap();
        let e = read_dir(&tmp.path().join("missing")).unwrap_err();
        assert_eq!(e.problems.len(), 1);
        assert!(
            e.problems[0]
                .message
                .starts_with("cannot read the configuration directory: "),
            "{e}"
        );
    }
}
