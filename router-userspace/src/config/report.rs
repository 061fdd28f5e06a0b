//! Collecting problems and locating them: key paths, the position index of an item, and the
//! [`Item`] every check reports through.

use std::collections::HashMap;

use marked_yaml::{Marker, Node};

use super::Problem;

/// A 1-based line and column in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Pos {
    pub line: usize,
    pub column: usize,
}

impl Pos {
    pub fn of(marker: &Marker) -> Self {
        Self {
            line: marker.line(),
            column: marker.column(),
        }
    }
}

/// Every problem found so far, each with the index of its file (for ordering).
pub(crate) struct Report {
    files: Vec<String>,
    problems: Vec<(usize, Problem)>,
}

impl Report {
    pub fn new(files: Vec<String>) -> Self {
        Self {
            files,
            problems: Vec::new(),
        }
    }

    /// The name of file `file`.
    pub fn file_name(&self, file: usize) -> &str {
        self.files.get(file).map_or("?", String::as_str)
    }

    /// `FILE:LINE`, or `FILE` where the line is unknown: how a hint names another location.
    pub fn location(&self, file: usize, at: Option<Pos>) -> String {
        match at {
            Some(at) => format!("{}:{}", self.file_name(file), at.line),
            None => self.file_name(file).to_owned(),
        }
    }

    pub fn add(
        &mut self,
        file: usize,
        at: Option<Pos>,
        path: String,
        message: String,
        hint: Option<String>,
    ) {
        let problem = Problem {
            file: self.file_name(file).to_owned(),
            line: at.map(|p| p.line),
            column: at.map(|p| p.column),
            path,
            message,
            hint,
        };
        self.problems.push((file, problem));
    }

    pub fn is_empty(&self) -> bool {
        self.problems.is_empty()
    }

    /// The problems in file order, then line and column order (stable: problems at one place
    /// keep the order they were found in).
    pub fn into_problems(mut self) -> Vec<Problem> {
        self.problems
            .sort_by_key(|(file, p)| (*file, p.line.unwrap_or(0), p.column.unwrap_or(0)));
        self.problems.into_iter().map(|(_, p)| p).collect()
    }
}

/// `base` and `rel` joined into one key path (`services[0]` + `to.pool`).
pub(crate) fn join(base: &str, rel: &str) -> String {
    if rel.is_empty() {
        base.to_owned()
    } else if base.is_empty() || rel.starts_with('[') {
        format!("{base}{rel}")
    } else {
        format!("{base}.{rel}")
    }
}

/// The path of key `key` under `rel`.
pub(crate) fn key_path(rel: &str, key: &str) -> String {
    if rel.is_empty() {
        key.to_owned()
    } else {
        format!("{rel}.{key}")
    }
}

/// The path of element `index` under `rel`.
pub(crate) fn index_path(rel: &str, index: usize) -> String {
    format!("{rel}[{index}]")
}

/// The path one level up (`to.split[1]` → `to.split` → `to` → the empty path).
fn parent(rel: &str) -> &str {
    let cut = if rel.ends_with(']') {
        rel.rfind('[')
    } else {
        rel.rfind('.')
    };
    cut.and_then(|i| rel.get(..i)).unwrap_or("")
}

/// Where each key path of an item starts: the key of a mapping entry, the element of a
/// sequence, and the item itself at the empty path.
pub(crate) type PosIndex = HashMap<String, Pos>;

/// Builds the position index of `node`, an item of a fragment.
pub(crate) fn index(node: &Node) -> PosIndex {
    let mut out = PosIndex::new();
    let start = node.span().start().map(Pos::of);
    index_into(node, String::new(), start, &mut out);
    out
}

fn index_into(node: &Node, rel: String, at: Option<Pos>, out: &mut PosIndex) {
    match node {
        Node::Mapping(map) => {
            for (key, value) in map.iter() {
                let at = key.span().start().map(Pos::of);
                index_into(value, key_path(&rel, key.as_str()), at, out);
            }
        }
        Node::Sequence(seq) => {
            for (i, value) in seq.iter().enumerate() {
                let elem = value.span().start().map(Pos::of).or(at);
                index_into(value, index_path(&rel, i), elem, out);
            }
        }
        Node::Scalar(_) => {}
    }
    if let Some(at) = at {
        out.insert(rel, at);
    }
}

/// The paths of every quoted scalar in `node`.
pub(crate) fn quoted(node: &Node) -> Vec<String> {
    fn walk(node: &Node, rel: String, out: &mut Vec<String>) {
        match node {
            Node::Mapping(map) => {
                for (key, value) in map.iter() {
                    walk(value, key_path(&rel, key.as_str()), out);
                }
            }
            Node::Sequence(seq) => {
                for (i, value) in seq.iter().enumerate() {
                    walk(value, index_path(&rel, i), out);
                }
            }
            Node::Scalar(s) if !s.may_coerce() => out.push(rel),
            Node::Scalar(_) => {}
        }
    }
    let mut out = Vec::new();
    walk(node, String::new(), &mut out);
    out
}

/// One item of a fragment (the agent, a service, a pool) deserialized into its spec, with what
/// is needed to report problems at the right place.
pub(crate) struct Item<T> {
    /// Index of the file it came from.
    pub file: usize,
    /// Its key path in the file: `agent`, `services[2]`.
    pub base: String,
    /// The deserialized item.
    pub spec: T,
    /// Where its keys are.
    pub pos: PosIndex,
    /// Paths whose values had the wrong shape: already reported, and read as absent without
    /// another complaint.
    pub broken: Vec<String>,
    /// Paths of scalars written in quotes (`"false"` is a string, `false` a bool).
    pub quoted: Vec<String>,
}

impl<T> Item<T> {
    /// The full key path of `rel`.
    pub fn path(&self, rel: &str) -> String {
        join(&self.base, rel)
    }

    /// The position of `rel`, or of its nearest ancestor that has one.
    pub fn at(&self, rel: &str) -> Option<Pos> {
        let mut rel = rel;
        loop {
            if let Some(pos) = self.pos.get(rel) {
                return Some(*pos);
            }
            if rel.is_empty() {
                return None;
            }
            rel = parent(rel);
        }
    }

    /// Whether `rel` or an ancestor had the wrong shape (and so is already reported).
    pub fn is_broken(&self, rel: &str) -> bool {
        self.broken.iter().any(|b| {
            b.is_empty()
                || rel == b
                || rel
                    .strip_prefix(b.as_str())
                    .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
        })
    }

    /// Reports a problem at `rel`.
    pub fn err(&self, report: &mut Report, rel: &str, message: String, hint: Option<String>) {
        report.add(self.file, self.at(rel), self.path(rel), message, hint);
    }

    /// `FILE:LINE` of `rel`, for naming this place in a problem found elsewhere.
    pub fn location(&self, report: &Report, rel: &str) -> String {
        report.location(self.file, self.at(rel))
    }
}
