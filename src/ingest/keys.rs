//! Change detection by natural key: the key index and the classification of each loaded row.
//!
//! Keys are the first 128 bits of `natural_key_fingerprint`; versions are compared by the first
//! 64 bits of `row_hash` (the hex digits are uniform, so prefixes behave like random numbers; a
//! collision among 128-bit prefixes needs about 2^64 keys). A row is, in order of precedence:
//! a member of a conflicting key (`Conflict`), a repeat of its key in this file (`Unchanged`), a
//! new key (`Inserted`), a new version (`Updated`) or the current version again (`Unchanged`).
//!
//! Two classifiers implement that: [`InMemory`] holds every key of the source and the file (40
//! bytes each) and learns conflicts as it goes; [`Planned`] answers from row sets computed
//! beforehand by the bounded-memory planner in [`super::spill`].

use std::hash::{BuildHasherDefault, Hash, Hasher};

use datafusion::arrow::array::{ArrayRef, AsArray};
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use crate::error::{Error, Result};

/// 128-bit prefix of a fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Fp(pub u64, pub u64);

impl Hash for Fp {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0 ^ self.1.rotate_left(17));
    }
}

/// Passes the (already uniform) key bits through as the hash.
#[derive(Default)]
pub struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ *b as u64;
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

pub type KeyMap<V> = hashbrown::HashMap<Fp, V, BuildHasherDefault<WordHasher>>;

/// The first 16 hex digits of `s` as a number.
pub fn hex_u64(s: &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for &c in s.get(..16)? {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        v = (v << 4) | d as u64;
    }
    Some(v)
}

pub fn fp_key(hex: &str) -> Option<Fp> {
    let b = hex.as_bytes();
    Some(Fp(hex_u64(b)?, hex_u64(b.get(16..)?)?))
}

/// A string column read back from Parquet: DataFusion may hand it out as Utf8 or Utf8View.
pub enum StrColumn<'a> {
    Utf8(&'a datafusion::arrow::array::StringArray),
    View(&'a datafusion::arrow::array::StringViewArray),
}

impl<'a> StrColumn<'a> {
    pub fn new(array: &'a ArrayRef) -> Option<StrColumn<'a>> {
        if let Some(a) = array.as_string_opt::<i32>() {
            return Some(StrColumn::Utf8(a));
        }
        array.as_string_view_opt().map(StrColumn::View)
    }

    pub fn value(&self, i: usize) -> &'a str {
        match self {
            StrColumn::Utf8(a) => a.value(i),
            StrColumn::View(a) => a.value(i),
        }
    }
}

fn bad_column(url: &str, col: &str) -> Error {
    Error::RunFailed(format!(
        "{url}: column {col} is not a 64-character hex string; the bronze file is damaged"
    ))
}

/// Stream the (fingerprint, row-hash) pairs of one committed bronze file, in file order.
pub async fn scan_versions(ctx: &SessionContext, url: &str, mut f: impl FnMut(Fp, u64) -> Result<()>) -> Result<()> {
    let df = ctx
        .read_parquet(url, Default::default())
        .await?
        .select_columns(&["natural_key_fingerprint", "row_hash"])?;
    let mut stream = df.execute_stream().await?;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let fps = StrColumn::new(batch.column(0)).ok_or_else(|| bad_column(url, "natural_key_fingerprint"))?;
        let rhs = StrColumn::new(batch.column(1)).ok_or_else(|| bad_column(url, "row_hash"))?;
        for i in 0..batch.num_rows() {
            let (Some(fp), Some(rh)) = (fp_key(fps.value(i)), hex_u64(rhs.value(i).as_bytes())) else {
                return Err(bad_column(url, "natural_key_fingerprint/row_hash"));
            };
            f(fp, rh)?;
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, Default)]
pub struct KeyState {
    /// Row-hash prefix of the current committed version, when `has_current`.
    pub current: u64,
    /// Row-hash prefix of this file's first version of the key, when `in_file`.
    pub file: u64,
    pub has_current: bool,
    pub in_file: bool,
}

/// What happens to a valid row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Inserted,
    Updated,
    Unchanged,
    /// The key has different versions in this file: the row is rejected.
    Conflict,
}

impl KeyState {
    /// Classify one more row of this key in the file (conflicts are decided by the caller).
    pub fn classify(&mut self, row_hash: u64) -> (Fate, bool) {
        if self.in_file {
            return (Fate::Unchanged, self.file != row_hash);
        }
        self.in_file = true;
        self.file = row_hash;
        let fate = if !self.has_current {
            Fate::Inserted
        } else if self.current != row_hash {
            Fate::Updated
        } else {
            Fate::Unchanged
        };
        (fate, false)
    }
}

pub trait Classifier: Send {
    fn classify(&mut self, key: Fp, row_hash: u64, row_number: u64) -> Fate;
    /// Conflicts found during the pass that the pass did not know about: the pass must be
    /// redone with them known (in-memory mode only).
    fn discovered(&self) -> bool;
}

/// Every key of the source and of the file in one hash map.
pub struct InMemory {
    pub map: KeyMap<KeyState>,
    /// Conflicting keys known before the pass.
    pub known: hashbrown::HashSet<Fp>,
    /// Conflicting keys found during the pass.
    pub found: hashbrown::HashSet<Fp>,
}

impl InMemory {
    pub fn new(capacity: usize) -> InMemory {
        InMemory {
            map: KeyMap::with_capacity_and_hasher(capacity, Default::default()),
            known: Default::default(),
            found: Default::default(),
        }
    }

    /// Fold a committed version into the index (later calls win).
    pub fn add_current(&mut self, key: Fp, row_hash: u64) {
        let e = self.map.entry(key).or_default();
        e.current = row_hash;
        e.has_current = true;
    }

    /// Prepare a second pass that knows the conflicting keys found by the first.
    pub fn rerun_with_found(&mut self) {
        self.known.extend(self.found.drain());
        self.map.retain(|_, s| {
            s.in_file = false;
            s.has_current
        });
    }
}

impl Classifier for InMemory {
    fn classify(&mut self, key: Fp, row_hash: u64, _row_number: u64) -> Fate {
        if !self.known.is_empty() && self.known.contains(&key) {
            return Fate::Conflict;
        }
        let (fate, conflict) = self.map.entry(key).or_default().classify(row_hash);
        if conflict {
            self.found.insert(key);
        }
        fate
    }

    fn discovered(&self) -> bool {
        !self.found.is_empty()
    }
}

/// A set of record numbers (1-based), one bit each.
#[derive(Debug, Default, Clone)]
pub struct RowSet {
    words: Vec<u64>,
    len: u64,
}

impl RowSet {
    pub fn insert(&mut self, row: u64) {
        let w = (row / 64) as usize;
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        let bit = 1u64 << (row % 64);
        if self.words[w] & bit == 0 {
            self.words[w] |= bit;
            self.len += 1;
        }
    }

    pub fn contains(&self, row: u64) -> bool {
        self.words
            .get((row / 64) as usize)
            .is_some_and(|w| w & (1u64 << (row % 64)) != 0)
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Fates decided beforehand, by record number.
#[derive(Debug, Default)]
pub struct Planned {
    pub inserted: RowSet,
    pub updated: RowSet,
    pub conflicts: RowSet,
}

impl Classifier for Planned {
    fn classify(&mut self, _key: Fp, _row_hash: u64, row_number: u64) -> Fate {
        if self.inserted.contains(row_number) {
            Fate::Inserted
        } else if self.updated.contains(row_number) {
            Fate::Updated
        } else if self.conflicts.contains(row_number) {
            Fate::Conflict
        } else {
            Fate::Unchanged
        }
    }

    fn discovered(&self) -> bool {
        false
    }
}
