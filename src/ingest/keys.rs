//! Change detection by natural key: the key index and the classification of each loaded row.
//!
//! Keys are the first 128 bits of `natural_key_fingerprint`; versions are compared by the first
//! 64 bits of `row_hash` (the hex digits are uniform, so prefixes behave like random numbers; a
//! collision among 128-bit prefixes needs about 2^64 keys). A row is, in order of precedence:
//! a member of a conflicting key (`Conflict`), a repeat of its key in this file (`Unchanged`), a
//! new key (`Inserted`), a new version (`Updated`) or the current version again (`Unchanged`).
//!
//! Two classifiers implement that: [`InMemory`] holds every key of the source and the file (32
//! bytes each, in an open-addressing table) and learns conflicts as it goes; [`Planned`] answers from row sets computed
//! beforehand by the bounded-memory planner in [`super::spill`].

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use datafusion::arrow::compute::nullif;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::ingest::pass::Hashers;
use crate::spec::contract::Contract;
use crate::table::bronze::RunFileWriter;
use crate::table::evolve::{StoredRun, hash_layout};
use crate::table::lake::{Lake, layout};

/// 128-bit prefix of a fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fp(pub u64, pub u64);

pub use crate::hash::hex_u64;

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

/// The columns change detection reads of a version: its fingerprint, its row hash (null on a
/// tombstone) and `is_deleted`. Also the schema of a row-hash cache file.
fn versions_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("natural_key_fingerprint", DataType::Utf8, true),
        Field::new("row_hash", DataType::Utf8, true),
        Field::new(crate::table::bronze::IS_DELETED, DataType::Boolean, true),
    ]))
}

/// Stream the versions of one committed bronze file, in file order: the fingerprint and the
/// row-hash prefix, or `None` for a tombstone (`is_deleted`; files from before deletions have no
/// such column and no tombstones). The scan runs on `cluster` when given (see [`crate::engine::exec`]).
pub async fn scan_versions(
    ctx: &SessionContext,
    cluster: Option<&str>,
    url: &str,
    mut f: impl FnMut(Fp, Option<u64>) -> Result<()>,
) -> Result<()> {
    let df = ctx.read_table(crate::engine::catalog::table_over(
        vec![url.to_string()],
        versions_schema(),
    )?)?;
    let mut stream = crate::engine::exec::stream(cluster, df, "ingest: committed versions").await?;
    while let Some(batch) = stream.next().await {
        visit_versions(&batch?, url, &mut f)?;
    }
    Ok(())
}

/// Call `f` for each version of `batch` (columns as [`versions_schema`]) read from `url`.
fn visit_versions(batch: &RecordBatch, url: &str, f: &mut impl FnMut(Fp, Option<u64>) -> Result<()>) -> Result<()> {
    let fps = StrColumn::new(batch.column(0)).ok_or_else(|| bad_column(url, "natural_key_fingerprint"))?;
    let rhs = StrColumn::new(batch.column(1)).ok_or_else(|| bad_column(url, "row_hash"))?;
    let deleted = batch.column(2).as_boolean_opt();
    for i in 0..batch.num_rows() {
        let tombstone = deleted.is_some_and(|d| d.is_valid(i) && d.value(i));
        let Some(fp) = batch.column(0).is_valid(i).then(|| fp_key(fps.value(i))).flatten() else {
            return Err(bad_column(url, "natural_key_fingerprint"));
        };
        if tombstone {
            f(fp, None)?;
            continue;
        }
        let Some(rh) = batch
            .column(1)
            .is_valid(i)
            .then(|| hex_u64(rhs.value(i).as_bytes()))
            .flatten()
        else {
            return Err(bad_column(url, "row_hash"));
        };
        f(fp, Some(rh))?;
    }
    Ok(())
}

/// [`scan_versions`] of a committed run under the current contract: when its stored `row_hash`
/// covers other fields than the contract's ([`StoredRun::rehash`]: a field added, dropped,
/// reordered, made volatile or not, a type that writes other text), the hash is recomputed from
/// the stored values read under the contract, so contract evolution marks no unchanged record
/// updated. The recomputed hashes are kept in a cache file per run and contract
/// ([`layout::row_hash_cache`]), so the cost is paid once per contract change; a cache that cannot
/// be read is computed again.
pub async fn scan_stored(
    ctx: &SessionContext,
    cluster: Option<&str>,
    lake: &Lake,
    contract: &Contract,
    hashers: &Hashers,
    stored: &StoredRun,
    mut f: impl FnMut(Fp, Option<u64>) -> Result<()>,
) -> Result<()> {
    if !stored.rehash(contract) {
        return scan_versions(ctx, cluster, &stored.url, f).await;
    }
    let cache = layout::row_hash_cache(&stored.source, &hash_layout(contract), &stored.run_id);
    if lake.exists(&cache).await? {
        match scan_versions(ctx, cluster, &lake.url(&cache), &mut f).await {
            Ok(()) => return Ok(()),
            Err(e) => crate::tell!("{cache}: {e}; computing the row hashes again"),
        }
    }
    let url = &stored.url;
    let fields = contract.fields_schema();
    let mut select: Vec<&str> = fields.fields().iter().map(|f| f.name().as_str()).collect();
    select.extend(["natural_key_fingerprint", crate::table::bronze::IS_DELETED]);
    let df = crate::table::evolve::read_stored(ctx, contract, &[stored])?.select_columns(&select)?;
    let mut stream = crate::engine::exec::stream(cluster, df, "ingest: committed versions").await?;
    let n_fields = fields.fields().len();
    let mut writer = RunFileWriter::new(lake, cache.clone(), versions_schema());
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let columns = fields
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| datafusion::arrow::compute::cast(batch.column(i), f.data_type()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let rhs = hashers.row_hashes(&RecordBatch::try_new(fields.clone(), columns)?)?;
        // the versions as the cache keeps them: no row hash on a tombstone
        let gone = match batch.column(n_fields + 1).as_boolean_opt() {
            Some(d) => BooleanArray::from_iter(d.iter().map(|v| Some(v == Some(true)))),
            None => BooleanArray::from(vec![false; batch.num_rows()]),
        };
        let versions = RecordBatch::try_new(
            versions_schema(),
            vec![
                datafusion::arrow::compute::cast(batch.column(n_fields), &DataType::Utf8)?,
                nullif(&rhs, &gone)?,
                Arc::new(gone),
            ],
        )?;
        visit_versions(&versions, url, &mut f)?;
        writer.write(&versions).await?;
    }
    writer.finish().await?;
    Ok(())
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

pub trait Classifier: Send {
    fn classify(&mut self, key: Fp, row_hash: u64, row_number: u64) -> Fate;
    /// A hint that `key` will be classified soon (lets the index fetch its memory early).
    fn prefetch(&self, _key: Fp) {}
    /// Conflicts found during the pass that the pass did not know about: the pass must be
    /// redone with them known (in-memory mode only).
    fn discovered(&self) -> bool;
    /// A rejected record of the file whose key could be computed: its key counts as delivered
    /// (a `delivery: full` file does not delete a record because today's row for it was bad).
    fn mark_present(&mut self, _key: Fp) {}
    /// After the pass of a `delivery: full` file: is `key` a current record the file did not
    /// have? True once per key (the caller writes its tombstone).
    fn take_deletion(&mut self, _key: Fp) -> bool {
        false
    }
    /// The number of records current before the run (the base of `hold.max_delete_fraction`).
    fn current_records(&self) -> u64 {
        0
    }
}

/// Slot flags, kept in the four low bits of the second key word (keys are compared without them:
/// 124 bits still need about 2^62 keys for a collision). A slot without flags is empty.
/// The source has a live current version of the key (its row hash is the slot's third word).
const HAS_CURRENT: u64 = 1;
/// A valid record of the file has the key (its first row hash is the slot's fourth word).
const IN_FILE: u64 = 2;
/// The key's latest committed version is a tombstone (so it is not current).
const DELETED: u64 = 4;
/// The file has the key in a record that is not loaded (rejected with a computable key, or a
/// natural-key conflict), or a tombstone was already written for it: never delete it.
const PRESENT: u64 = 8;
const FLAGS: u64 = HAS_CURRENT | IN_FILE | DELETED | PRESENT;

/// A key as the index compares it (without the flag bits): what [`InMemory::absent_keys`] yields.
pub fn index_key(key: Fp) -> Fp {
    Fp(key.0, key.1 & !FLAGS)
}

/// One slot: `[key.0, key.1 & !FLAGS | flags, current row hash, first row hash in the file]`.
type Slot = [u64; 4];

/// Open addressing with linear probing over 32-byte slots (two a cache line), at most 7/8 full.
/// The slot array asks for transparent huge pages: lookups are random over hundreds of MiB, and
/// with 4 KiB pages nearly every one would also miss the TLB.
struct KeyTable {
    slots: Vec<Slot>,
    mask: usize,
    len: usize,
}

impl KeyTable {
    fn with_capacity(keys: usize) -> KeyTable {
        let n = (keys.max(8) * 8 / 7 + 1).next_power_of_two();
        let slots = vec![[0u64; 4]; n];
        advise_huge_pages(&slots);
        KeyTable {
            slots,
            mask: n - 1,
            len: 0,
        }
    }

    fn home(&self, key: Fp) -> usize {
        // Fingerprint bits are uniform; the spill partitions use the leading bits of key.0.
        (key.0 as usize) & self.mask
    }

    fn prefetch(&self, key: Fp) {
        #[cfg(target_arch = "x86_64")]
        {
            let p = self.slots.as_ptr().wrapping_add(self.home(key)) as *const i8;
            // SAFETY: prefetching is a hint and never faults, whatever the address.
            unsafe { std::arch::x86_64::_mm_prefetch(p, std::arch::x86_64::_MM_HINT_T0) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = key;
    }

    /// The slot of `key`, created (with no flags) when absent; callers set a flag at once.
    fn slot(&mut self, key: Fp) -> &mut Slot {
        if (self.len + 1) * 8 > self.slots.len() * 7 {
            self.grow();
        }
        let k1 = key.1 & !FLAGS;
        let mut i = self.home(key);
        loop {
            let s = self.slots[i];
            if s[1] & FLAGS == 0 {
                self.len += 1;
                self.slots[i] = [key.0, k1, 0, 0];
                return &mut self.slots[i];
            }
            if s[0] == key.0 && s[1] & !FLAGS == k1 {
                return &mut self.slots[i];
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The slot of `key`, if present.
    fn find(&mut self, key: Fp) -> Option<&mut Slot> {
        let k1 = key.1 & !FLAGS;
        let mut i = self.home(key);
        loop {
            let s = self.slots[i];
            if s[1] & FLAGS == 0 {
                return None;
            }
            if s[0] == key.0 && s[1] & !FLAGS == k1 {
                return Some(&mut self.slots[i]);
            }
            i = (i + 1) & self.mask;
        }
    }

    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots);
        *self = KeyTable::with_capacity(old.len());
        for s in old.into_iter().filter(|s| s[1] & FLAGS != 0) {
            *self.slot(Fp(s[0], s[1])) = s;
        }
    }

    /// Keep only the slots `keep` returns true for (after it may have changed them).
    fn retain(&mut self, mut keep: impl FnMut(&mut Slot) -> bool) {
        let old = std::mem::take(&mut self.slots);
        *self = KeyTable::with_capacity(self.len);
        for mut s in old.into_iter().filter(|s| s[1] & FLAGS != 0) {
            if keep(&mut s) {
                *self.slot(Fp(s[0], s[1])) = s;
            }
        }
    }
}

/// Ask the kernel for transparent huge pages under `v` (a hint; ignored where unsupported).
fn advise_huge_pages<T>(v: &[T]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = v.as_ptr() as usize;
        let end = start + std::mem::size_of_val(v);
        let first = start.next_multiple_of(HUGE);
        let last = end - end % HUGE;
        if last > first {
            // SAFETY: the range lies inside `v`'s allocation; MADV_HUGEPAGE changes no contents.
            unsafe {
                libc::madvise(first as *mut libc::c_void, last - first, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

/// Every key of the source and of the file in one hash table.
pub struct InMemory {
    table: KeyTable,
    /// Conflicting keys known before the pass.
    pub known: hashbrown::HashSet<Fp>,
    /// Conflicting keys found during the pass.
    pub found: hashbrown::HashSet<Fp>,
}

impl InMemory {
    pub fn new(capacity: usize) -> InMemory {
        InMemory {
            table: KeyTable::with_capacity(capacity),
            known: Default::default(),
            found: Default::default(),
        }
    }

    /// Fold a committed version into the index (later calls win); `None` is a tombstone.
    pub fn add_current(&mut self, key: Fp, row_hash: Option<u64>) {
        let s = self.table.slot(key);
        match row_hash {
            Some(rh) => {
                s[1] = (s[1] & !DELETED) | HAS_CURRENT;
                s[2] = rh;
            }
            None => s[1] = (s[1] & !HAS_CURRENT) | DELETED,
        }
    }

    /// The live current versions folded in so far (key without flag bits, row-hash prefix): what a
    /// key state keeps ([`crate::ingest::keystate`]).
    pub fn current_versions(&self) -> impl Iterator<Item = (Fp, u64)> + '_ {
        self.table
            .slots
            .iter()
            .filter(|s| s[1] & HAS_CURRENT != 0)
            .map(|s| (Fp(s[0], s[1] & !FLAGS), s[2]))
    }

    /// Prepare a second pass that knows the conflicting keys found by the first.
    pub fn rerun_with_found(&mut self) {
        self.known.extend(self.found.drain());
        self.table.retain(|s| {
            s[1] &= !(IN_FILE | PRESENT);
            s[1] & HAS_CURRENT != 0
        });
    }

    /// The current keys the file did not have (after the pass): the deletions of a full delivery.
    pub fn absent_keys(&self) -> impl Iterator<Item = Fp> + '_ {
        self.table
            .slots
            .iter()
            .filter(|s| s[1] & FLAGS & !DELETED == HAS_CURRENT)
            .map(|s| Fp(s[0], s[1] & !FLAGS))
    }
}

impl Classifier for InMemory {
    /// A repeat of a key in this file is `Unchanged` (a conflict when its row hash differs from
    /// the key's first version in the file); otherwise new key, new version or same version.
    fn classify(&mut self, key: Fp, row_hash: u64, _row_number: u64) -> Fate {
        if !self.known.is_empty() && self.known.contains(&key) {
            self.table.slot(key)[1] |= PRESENT;
            return Fate::Conflict;
        }
        let s = self.table.slot(key);
        if s[1] & IN_FILE != 0 {
            if s[3] != row_hash {
                self.found.insert(key);
            }
            return Fate::Unchanged;
        }
        s[1] |= IN_FILE;
        s[3] = row_hash;
        if s[1] & HAS_CURRENT == 0 {
            Fate::Inserted
        } else if s[2] != row_hash {
            Fate::Updated
        } else {
            Fate::Unchanged
        }
    }

    fn prefetch(&self, key: Fp) {
        self.table.prefetch(key);
    }

    fn discovered(&self) -> bool {
        !self.found.is_empty()
    }

    fn mark_present(&mut self, key: Fp) {
        self.table.slot(key)[1] |= PRESENT;
    }

    fn take_deletion(&mut self, key: Fp) -> bool {
        match self.table.find(key) {
            Some(s) if s[1] & FLAGS & !DELETED == HAS_CURRENT => {
                s[1] |= PRESENT;
                true
            }
            _ => false,
        }
    }

    fn current_records(&self) -> u64 {
        self.table.slots.iter().filter(|s| s[1] & HAS_CURRENT != 0).count() as u64
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
    /// Keys to delete (a full delivery), sorted; 16 bytes each.
    pub deletions: Vec<Fp>,
    /// Which of `deletions` got their tombstone already (by position).
    pub deleted: RowSet,
    /// Records current before the run (summed over the partitions).
    pub current: u64,
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

    fn take_deletion(&mut self, key: Fp) -> bool {
        match self.deletions.binary_search(&index_key(key)) {
            Ok(i) if !self.deleted.contains(i as u64) => {
                self.deleted.insert(i as u64);
                true
            }
            _ => false,
        }
    }

    fn current_records(&self) -> u64 {
        self.current
    }
}
