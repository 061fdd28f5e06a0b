//! A set of fragments as text: what one version of the configuration is made of, before it is
//! parsed. Its content hash names it and its merged text shows it whole.

use std::fmt::Write as _;

use sha2::{Digest as _, Sha256};

use super::{Config, ConfigError, load::load_files};

/// Tag hashed ahead of the fragments, so a hash of fragments can never equal a hash of anything
/// else we might hash with SHA-256 later; `v1` names the framing below.
const HASH_DOMAIN: &[u8] = b"switchyard fragments v1\0";

/// The fragments of one configuration as `(file name, text)`, in the order they are merged
/// ([`super::read_dir`] gives name order).
///
/// Two sets are the same configuration text exactly when their [`Fragments::hash`]es are equal:
/// same names, same texts, same order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fragments {
    files: Vec<(String, String)>,
}

impl Fragments {
    /// The fragments `files`, `(file name, text)`, kept in the order given.
    #[must_use]
    pub fn new(files: Vec<(String, String)>) -> Self {
        Self { files }
    }

    /// `(file name, text)` in merge order.
    #[must_use]
    pub fn files(&self) -> &[(String, String)] {
        &self.files
    }

    /// The `(file name, text)` pairs, in merge order.
    #[must_use]
    pub fn into_files(self) -> Vec<(String, String)> {
        self.files
    }

    /// The file names in merge order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.files.iter().map(|(name, _)| name.as_str())
    }

    /// Whether there is no fragment (the empty configuration: defaults only).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The content hash: SHA-256, as 64 lowercase hex digits, over the names and texts in
    /// order.
    ///
    /// Each name and text is hashed after its length (8 bytes, little-endian), and the count of
    /// fragments first, so no two different sets frame into the same bytes (`a` + `bc` and
    /// `ab` + `c` differ).
    #[must_use]
    pub fn hash(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(HASH_DOMAIN);
        hasher.update((self.files.len() as u64).to_le_bytes());
        for (name, text) in &self.files {
            for part in [name, text] {
                hasher.update((part.len() as u64).to_le_bytes());
                hasher.update(part.as_bytes());
            }
        }
        let mut hex = String::with_capacity(64);
        for byte in hasher.finalize() {
            // Writing to a String cannot fail.
            let _ = write!(hex, "{byte:02x}");
        }
        hex
    }

    /// The fragments as one text, for people: each preceded by a `# --- <name> ---` line and
    /// ended by a newline (added when its text has none). The empty set gives the empty text.
    ///
    /// It is a YAML comment line, so a single fragment's merged text still parses as that
    /// fragment; several fragments usually do not merge into one valid YAML document (each may
    /// have its own `services:`), so load [`Fragments::files`], not this.
    #[must_use]
    pub fn merged(&self) -> String {
        let size: usize = self.files.iter().map(|(n, t)| n.len() + t.len() + 16).sum();
        let mut out = String::with_capacity(size);
        for (name, text) in &self.files {
            out.push_str("# --- ");
            out.push_str(name);
            out.push_str(" ---\n");
            out.push_str(text);
            if !text.is_empty() && !text.ends_with('\n') {
                out.push('\n');
            }
        }
        out
    }

    /// The node-local fragments ([`super::is_node_local`]: `local.yaml`, `*.local.yaml`), in
    /// order.
    #[must_use]
    pub fn local(&self) -> Self {
        self.filtered(true)
    }

    /// The fragments a fleet shares through etcd: every one that is not node-local, in order.
    #[must_use]
    pub fn shared(&self) -> Self {
        self.filtered(false)
    }

    fn filtered(&self, local: bool) -> Self {
        Self::new(
            self.files
                .iter()
                .filter(|(name, _)| super::is_node_local(name) == local)
                .cloned()
                .collect(),
        )
    }

    /// This node's `local` fragments with a fleet's `shared` ones, in name order (the order
    /// [`super::read_dir`] gives a directory holding them all).
    #[must_use]
    pub fn combine(local: &Self, shared: &Self) -> Self {
        let mut files: Vec<(String, String)> =
            local.files.iter().chain(&shared.files).cloned().collect();
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Self::new(files)
    }

    /// Parses and validates the fragments: [`load_files`] on [`Fragments::files`].
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] with every problem found.
    pub fn load(&self) -> Result<Config, ConfigError> {
        load_files(&self.files)
    }
}

impl From<Vec<(String, String)>> for Fragments {
    fn from(files: Vec<(String, String)>) -> Self {
        Self::new(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(files: &[(&str, &str)]) -> Fragments {
        Fragments::new(
            files
                .iter()
                .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn the_hash_is_sha256_hex_and_stable() {
        let hash = set(&[("10-web.yaml", "services: []\n")]).hash();
        assert_eq!(hash.len(), 64);
        assert!(
            hash.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_eq!(hash, set(&[("10-web.yaml", "services: []\n")]).hash());
        // Pinned (computed independently, with Python's hashlib): the framing is part of what
        // a stored version's hash means, so changing it must be deliberate.
        assert_eq!(
            Fragments::default().hash(),
            "19f63387b9c2ca84b3243e37d3f68c8b1a3fa1f6860044db975b6497ec8b7757"
        );
        assert_eq!(
            set(&[
                ("10-web.yaml", "services: []\n"),
                ("20-pools.yaml", "pools: []\n")
            ])
            .hash(),
            "78ffe85543c116c9308c2b99c719578a27c11418668e618ccc9b6a91cddb5775"
        );
    }

    #[test]
    fn the_hash_tells_every_framing_apart() {
        let sets = [
            set(&[]),
            set(&[("a", "")]),
            set(&[("", "a")]),
            set(&[("a", "bc")]),
            set(&[("ab", "c")]),
            set(&[("a", "b"), ("c", "d")]),
            set(&[("c", "d"), ("a", "b")]),
            set(&[("a", "bc"), ("d", "")]),
            set(&[("a", "b"), ("cd", "")]),
            set(&[("", ""), ("", "")]),
            set(&[("", "")]),
        ];
        let hashes: std::collections::BTreeSet<String> = sets.iter().map(Fragments::hash).collect();
        assert_eq!(hashes.len(), sets.len());
    }

    #[test]
    fn local_and_shared_split_by_name_and_combine_in_name_order() {
        let all = set(&[
            ("10-web.yaml", "a"),
            ("local.yaml", "b"),
            ("lb1.local.yaml", "c"),
            ("zz.yaml", "d"),
        ]);
        let local = all.local();
        let shared = all.shared();
        assert_eq!(
            local.names().collect::<Vec<_>>(),
            ["local.yaml", "lb1.local.yaml"]
        );
        assert_eq!(
            shared.names().collect::<Vec<_>>(),
            ["10-web.yaml", "zz.yaml"]
        );
        assert_eq!(
            Fragments::combine(&local, &shared)
                .names()
                .collect::<Vec<_>>(),
            ["10-web.yaml", "lb1.local.yaml", "local.yaml", "zz.yaml"]
        );
    }

    #[test]
    fn the_merged_text_heads_each_fragment_with_its_name() {
        let merged = set(&[
            ("10-web.yaml", "a: 1\n"),
            ("20-pools.yaml", "b: 2"),
            ("30-empty.yaml", ""),
        ])
        .merged();
        assert_eq!(
            merged,
            "# --- 10-web.yaml ---\na: 1\n# --- 20-pools.yaml ---\nb: 2\n# --- 30-empty.yaml ---\n"
        );
        assert_eq!(Fragments::default().merged(), "");
    }
}
