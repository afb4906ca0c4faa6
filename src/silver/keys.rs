//! Compact record keys of a silver build: which current bronze record to process, which row of
//! the previous snapshot to keep, and the build's state, without joining on 64-character hex
//! fingerprints.
//!
//! A record is named by the first 16 bytes of its `natural_key_fingerprint` (a `u128` read from
//! the first 32 hex characters; SHA-256 makes two records sharing one astronomically unlikely)
//! and a version by the bronze run that wrote it: a run holds at most one row per fingerprint, so
//! `(fingerprint, run)` names a version exactly and a record's current version is the one of the
//! latest committed run (highest commit slot: the order of `bronze.<source>_current`) that has
//! it.
//!
//! [`Keys`] holds the build's decisions per record; the UDFs ([`pick_udf`], [`in_set_udf`],
//! [`fp128_udf`]) let plans filter by them.

use std::collections::{HashMap, HashSet};
use std::hash::Hasher;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Int64Type};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::exec_err;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use crate::error::Result;
pub use crate::hash::fp::{Fp, FpBuild, FpSet, for_each_fp, fp_of_hex, fp128_udf, in_set_udf};

/// No run (not current / not in the previous state).
pub const NONE: u32 = u32::MAX;

/// In the previous state's place: the record is processed whatever its state says (a decision
/// on one of its conflicts was recorded or withdrawn since the previous build).
pub const FORCED: u32 = u32::MAX - 2;

/// While the current runs are read: the record's latest version is a tombstone (it is not
/// current, and older versions must not make it so). [`Keys::forget_deleted`] turns it into
/// [`NONE`].
const DELETED: u32 = u32::MAX - 1;

/// Outcomes of a record in a build's state.
pub const PASSED: u8 = 1;
pub const REJECTED: u8 = 2;
pub const FILTERED: u8 = 3;

pub fn outcome_name(o: u8) -> &'static str {
    match o {
        PASSED => "passed",
        REJECTED => "rejected",
        _ => "filtered",
    }
}

pub fn outcome_of(name: &str) -> u8 {
    match name {
        "passed" => PASSED,
        "rejected" => REJECTED,
        _ => FILTERED,
    }
}

/// What the build knows of one record.
#[derive(Debug)]
pub struct Entry {
    /// Index (in [`Keys::runs`]) of the run holding its current version, or [`NONE`].
    pub cur: u32,
    /// Index of the run the previous build's state names, or [`NONE`].
    pub prev: u32,
    /// Rules version of the previous state.
    pub version: i32,
    /// Outcome in the previous state (0 when none).
    pub outcome: u8,
}

/// What a build does with the records, decided per [`Entry`].
#[derive(Debug, Clone)]
pub enum Mode {
    /// Every current record is processed, nothing is kept.
    Full,
    /// New and changed records, and the records another rules version rejected or filtered.
    Incremental { version: i32 },
    /// The records whose state's rules version is in `matching`.
    Rebuild { matching: HashSet<i32> },
}

/// The records of one build; see the module documentation.
///
/// Memory: about 32 bytes per record plus the hash table's slack (~300 MB for 6M records),
/// reserved in the session's memory pool so that sorts spill earlier instead of overshooting it.
///
/// [`Keys`] maps every record the build deals with to an [`Entry`]: the current run
/// (from one pass over the fingerprint column of every bronze run, newest first) and what the
/// previous build's state says (run, outcome, rules version). From that and the [`Mode`] follow
/// which records are processed, which snapshot rows are kept and which state rows carried over.
/// The UDFs here ([`pick_udf`], [`in_set_udf`], [`fp128_udf`]) let DataFusion plans
/// filter by those decisions; they hold the map read-only.
pub struct Keys {
    pub map: HashMap<Fp, Entry, FpBuild>,
    /// Run ids by index: the source's committed runs with data, newest first, then run ids that
    /// only the previous state names (undone runs).
    pub runs: Vec<String>,
    /// Number of current runs (the first entries of `runs`).
    pub current_runs: usize,
    pub mode: Mode,
    /// Records whose latest version is a tombstone (dropped from `map` by [`Keys::forget_deleted`]).
    pub tombstones: FpSet,
    /// A table with several sources: per current combination (an entry's `cur`, the run id of
    /// `runs` being the combination's id), each source's run index or [`NONE`]
    /// ([`crate::silver::sources`]); empty for one source.
    pub combos: Vec<Vec<u32>>,
}

impl Keys {
    pub fn new(runs: Vec<String>, capacity: usize) -> Keys {
        let current_runs = runs.len();
        Keys {
            map: HashMap::with_capacity_and_hasher(capacity, FpBuild::default()),
            runs,
            current_runs,
            mode: Mode::Full,
            tombstones: FpSet::default(),
            combos: Vec::new(),
        }
    }

    /// Approximate bytes held (for the memory pool).
    pub fn bytes(&self) -> usize {
        self.map.capacity() * (std::mem::size_of::<(Fp, Entry)>() + 1)
    }

    /// Record that run `run` (newest first) has `fp`, as a tombstone when `deleted`: its current
    /// version unless a newer run had it.
    pub fn see_current(&mut self, fp: Fp, run: u32, deleted: bool) {
        let e = self.map.entry(fp).or_insert_with(|| Entry {
            cur: NONE,
            prev: NONE,
            version: 0,
            outcome: 0,
        });
        if e.cur == NONE {
            e.cur = if deleted { DELETED } else { run };
        }
    }

    /// After the current runs were read: records whose latest version is a tombstone are not
    /// current (and are dropped unless the previous state names them).
    pub fn forget_deleted(&mut self) {
        let tombstones = &mut self.tombstones;
        self.map.retain(|fp, e| {
            if e.cur == DELETED {
                tombstones.insert(*fp);
            }
            e.cur != DELETED
        });
    }

    /// Index of a run id, interning ids the current runs do not have.
    pub fn run_index(&mut self, run: &str, index: &mut HashMap<String, u32>) -> u32 {
        if let Some(i) = index.get(run) {
            return *i;
        }
        let i = self.runs.len() as u32;
        self.runs.push(run.to_string());
        index.insert(run.to_string(), i);
        i
    }

    /// Record a row of the previous build's state.
    pub fn see_previous(&mut self, fp: Fp, run: u32, version: i32, outcome: u8) {
        let e = self.map.entry(fp).or_insert_with(|| Entry {
            cur: NONE,
            prev: NONE,
            version: 0,
            outcome: 0,
        });
        e.prev = run;
        e.version = version;
        e.outcome = outcome;
    }

    /// Is the record's current version transformed by this build?
    pub fn process(&self, e: &Entry) -> bool {
        if e.cur == NONE {
            return false;
        }
        match &self.mode {
            Mode::Full => true,
            Mode::Incremental { version } => e.prev != e.cur || (e.outcome != PASSED && e.version != *version),
            Mode::Rebuild { matching } => e.prev != NONE && (e.prev == FORCED || matching.contains(&e.version)),
        }
    }

    /// Is the previous snapshot's row of this record kept (byte-for-byte but for its flags)?
    pub fn keep_row(&self, e: &Entry) -> bool {
        match &self.mode {
            Mode::Full => false,
            Mode::Incremental { .. } => e.cur != NONE && e.prev == e.cur && e.outcome == PASSED && !self.process(e),
            Mode::Rebuild { matching } => {
                e.prev != NONE && e.prev != FORCED && e.outcome == PASSED && !matching.contains(&e.version)
            }
        }
    }

    /// Does the previous state's row of this record carry over into the new state?
    pub fn carry(&self, e: &Entry) -> bool {
        match &self.mode {
            Mode::Full => false,
            Mode::Incremental { .. } => e.cur != NONE && e.prev != NONE && !self.process(e),
            Mode::Rebuild { .. } => e.prev != NONE && !self.process(e),
        }
    }

    pub fn get(&self, fp: &Fp) -> Option<&Entry> {
        self.map.get(fp)
    }

    /// Several sources: the number of sources with a current candidate of the record.
    pub fn candidates(&self, e: &Entry) -> usize {
        self.combos
            .get(e.cur as usize)
            .map_or(0, |c| c.iter().filter(|r| **r != NONE).count())
    }
}

// ---- UDFs ---------------------------------------------------------------------------------------

/// Which rows a boolean key UDF keeps.
#[derive(Clone)]
enum Test {
    /// The record's current version is in run `.0` and is processed.
    Pick(Arc<Keys>, u32),
    /// The row's group (its arguments, the `by` columns) is in the set.
    InGroups(Arc<GroupSet>),
    /// Several sources: the record is processed and its candidate of source `.1` is in that
    /// source's run `.2`.
    PickSource(Arc<Keys>, u32, u32),
}

/// A boolean UDF over a fingerprint column ([`pick_udf`]) or group columns
/// ([`in_groups_udf`]).
struct KeyTest {
    name: String,
    test: Test,
    signature: Signature,
}

impl std::fmt::Debug for KeyTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyTest").field("name", &self.name).finish()
    }
}

impl PartialEq for KeyTest {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && match (&self.test, &other.test) {
                (Test::Pick(a, x), Test::Pick(b, y)) => Arc::ptr_eq(a, b) && x == y,
                (Test::InGroups(a), Test::InGroups(b)) => Arc::ptr_eq(a, b),
                (Test::PickSource(a, s, x), Test::PickSource(b, t, y)) => Arc::ptr_eq(a, b) && s == t && x == y,
                _ => false,
            }
    }
}

impl Eq for KeyTest {}

impl std::hash::Hash for KeyTest {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        let p = match &self.test {
            Test::Pick(a, x) => Arc::as_ptr(a) as usize ^ (*x as usize),
            Test::InGroups(a) => Arc::as_ptr(a) as usize,
            Test::PickSource(a, s, x) => Arc::as_ptr(a) as usize ^ ((*s as usize) << 32) ^ (*x as usize),
        };
        p.hash(state);
    }
}

impl ScalarUDFImpl for KeyTest {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> datafusion::error::Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn return_field_from_args(&self, _: ReturnFieldArgs) -> datafusion::error::Result<FieldRef> {
        Ok(Arc::new(Field::new(self.name(), DataType::Boolean, false)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> datafusion::error::Result<ColumnarValue> {
        if let Test::InGroups(set) = &self.test {
            if args.args.len() != set.types.len() {
                return exec_err!("{} takes {} arguments", self.name, set.types.len());
            }
            let mut cols = Vec::with_capacity(args.args.len());
            for (a, t) in args.args.iter().zip(&set.types) {
                let a = a.to_array(args.number_rows)?;
                cols.push(if a.data_type() == t {
                    a
                } else {
                    datafusion::arrow::compute::cast(&a, t)?
                });
            }
            return Ok(ColumnarValue::Array(Arc::new(set.contains(&cols)?)));
        }
        let [arg] = args.args.as_slice() else {
            return exec_err!("{} takes 1 argument", self.name);
        };
        let array = arg.to_array(args.number_rows)?;
        let mut out = vec![false; array.len()];
        let test = |fp: Fp| -> bool {
            match &self.test {
                Test::Pick(keys, run) => keys.get(&fp).is_some_and(|e| e.cur == *run && keys.process(e)),
                Test::PickSource(keys, source, run) => keys.get(&fp).is_some_and(|e| {
                    keys.process(e)
                        && keys.combos.get(e.cur as usize).and_then(|c| c.get(*source as usize)) == Some(run)
                }),
                Test::InGroups(_) => false, // answered above
            }
        };
        for_each_fp(&array, |i, fp| out[i] = fp.is_some_and(test))
            .map_err(|e| datafusion::error::DataFusionError::Execution(e.to_string()))?;
        Ok(ColumnarValue::Array(Arc::new(BooleanArray::from(out))))
    }
}

fn key_test(name: &str, test: Test) -> ScalarUDF {
    ScalarUDF::from(KeyTest {
        name: name.to_string(),
        test,
        signature: Signature::any(1, Volatility::Immutable),
    })
}

/// `__ingot_pick_source(fp)`: the row (of run `run` of source `source`, both indexes) is the
/// current candidate of a record to process.
pub fn pick_source_udf(keys: Arc<Keys>, source: u32, run: u32) -> ScalarUDF {
    key_test("__ingot_pick_source", Test::PickSource(keys, source, run))
}

/// `__ingot_pick(fp)`: the row (of run `run`) is the current version of a record to process.
pub fn pick_udf(keys: Arc<Keys>, run: u32) -> ScalarUDF {
    key_test("__ingot_pick", Test::Pick(keys, run))
}

/// A set of group values (the `by` columns of a window anomaly): the groups an incremental build
/// re-windows. One integer-like column (integers, dates, times, timestamps) is kept as `i64`s;
/// anything else as arrow's row format. Every row of the previous snapshot is looked up once,
/// so the lookup avoids per-row row encoding and byte comparisons where it can.
#[derive(Debug)]
pub struct GroupSet {
    types: Vec<DataType>,
    keys: GroupKeys,
}

#[derive(Debug)]
enum GroupKeys {
    /// One integer-like column: its values, and whether the null group is in the set.
    Ints {
        values: hashbrown::HashSet<i64>,
        null: bool,
    },
    /// The groups in arrow's row format.
    Rows(hashbrown::HashSet<Box<[u8]>>),
}

/// Whether a single `by` column of type `t` is kept as `i64`s (every value converts exactly).
fn int_like(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::Date32
            | DataType::Date64
            | DataType::Time32(_)
            | DataType::Time64(_)
            | DataType::Timestamp(_, _)
    )
}

/// The values of an integer-like array (see [`int_like`]) as an `Int64Array`.
fn as_i64(a: &ArrayRef) -> datafusion::error::Result<ArrayRef> {
    use datafusion::arrow::compute::cast;
    Ok(match a.data_type() {
        DataType::Date32 | DataType::Time32(_) => cast(&cast(a, &DataType::Int32)?, &DataType::Int64)?,
        _ => cast(a, &DataType::Int64)?,
    })
}

impl GroupSet {
    pub fn new(types: Vec<DataType>) -> GroupSet {
        let keys = match types.as_slice() {
            [t] if int_like(t) => GroupKeys::Ints {
                values: hashbrown::HashSet::new(),
                null: false,
            },
            _ => GroupKeys::Rows(hashbrown::HashSet::new()),
        };
        GroupSet { types, keys }
    }

    fn converter(&self) -> datafusion::error::Result<RowConverter> {
        Ok(RowConverter::new(
            self.types.iter().map(|t| SortField::new(t.clone())).collect(),
        )?)
    }

    /// Add the groups of the rows of `cols` (one array per `by` column, of the set's types) for
    /// which `take(row)` holds.
    pub fn insert(&mut self, cols: &[ArrayRef], take: impl Fn(usize) -> bool) -> Result<()> {
        let rows = match &mut self.keys {
            GroupKeys::Ints { values, null } => {
                let a = as_i64(&cols[0])?;
                let a = a.as_primitive::<Int64Type>();
                for i in (0..a.len()).filter(|&i| take(i)) {
                    if a.is_null(i) {
                        *null = true;
                    } else {
                        values.insert(a.value(i));
                    }
                }
                return Ok(());
            }
            GroupKeys::Rows(_) => self.converter()?.convert_columns(cols)?,
        };
        if let GroupKeys::Rows(set) = &mut self.keys {
            for i in (0..rows.num_rows()).filter(|&i| take(i)) {
                set.insert(rows.row(i).as_ref().into());
            }
        }
        Ok(())
    }

    /// For each row of `cols`: whether its group is in the set.
    fn contains(&self, cols: &[ArrayRef]) -> datafusion::error::Result<BooleanArray> {
        Ok(match &self.keys {
            GroupKeys::Ints { values, null } => {
                let a = as_i64(&cols[0])?;
                let a = a.as_primitive::<Int64Type>();
                (0..a.len())
                    .map(|i| {
                        Some(if a.is_null(i) {
                            *null
                        } else {
                            values.contains(&a.value(i))
                        })
                    })
                    .collect()
            }
            GroupKeys::Rows(set) => {
                let rows = self.converter()?.convert_columns(cols)?;
                (0..rows.num_rows())
                    .map(|i| Some(set.contains(rows.row(i).as_ref())))
                    .collect()
            }
        })
    }

    pub fn len(&self) -> usize {
        match &self.keys {
            GroupKeys::Ints { values, null } => values.len() + usize::from(*null),
            GroupKeys::Rows(set) => set.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `__ingot_in_groups(by...)` over `set`: the row's group is in the set.
pub fn in_groups_udf(set: Arc<GroupSet>) -> ScalarUDF {
    ScalarUDF::from(KeyTest {
        name: "__ingot_in_groups".to_string(),
        test: Test::InGroups(set),
        signature: Signature::variadic_any(Volatility::Immutable),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_like_the_hex_text() {
        let a = "00ff".repeat(16);
        let b = "0100".repeat(16);
        assert!(fp_of_hex(&a).unwrap() < fp_of_hex(&b).unwrap());
        assert!(a < b);
        assert_eq!(fp_of_hex("zz"), None);
        assert_eq!(fp_of_hex(&"f".repeat(64)), Some(u128::MAX));
    }

    /// A deterministic stream of pseudo-random numbers (xorshift).
    fn rng(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    #[test]
    fn heads_never_rule_out_a_key_of_the_set_and_rule_out_most_others() {
        let mut next = rng(7);
        let hex = |fp: Fp| format!("{fp:032x}{:032x}", fp.rotate_left(17));
        let set: FpSet = (0..5000).map(|_| ((next() as u128) << 64) | next() as u128).collect();
        let heads = crate::hash::fp::Heads::of(&set);
        for fp in &set {
            assert!(heads.may_contain_hex(hex(*fp).as_bytes()), "{fp:x}");
        }
        let others: Vec<Fp> = (0..20000).map(|_| ((next() as u128) << 64) | next() as u128).collect();
        let passed = others
            .iter()
            .filter(|fp| heads.may_contain_hex(hex(**fp).as_bytes()))
            .count();
        assert!(passed < 200, "{passed} of 20000 not ruled out");
        // text that is not hex is left to the full parse
        assert!(heads.may_contain_hex(b"zz"));
        assert!(heads.may_contain_hex(b"0000g0"));
    }

    #[test]
    fn integer_groups_answer_like_row_format_groups() {
        use datafusion::arrow::array::{Date32Array, Int64Array};
        let mut next = rng(11);
        let mut values = |n: usize| -> Vec<Option<i64>> {
            (0..n)
                .map(|_| {
                    let v = next();
                    (!v.is_multiple_of(17)).then_some((v % 300) as i64 - 150)
                })
                .collect()
        };
        let (ins, probe) = (values(400), values(2000));
        for ty in [DataType::Int64, DataType::Date32] {
            let arr = |v: &[Option<i64>]| -> ArrayRef {
                match ty {
                    DataType::Date32 => Arc::new(Date32Array::from_iter(v.iter().map(|x| x.map(|x| x as i32)))),
                    _ => Arc::new(Int64Array::from(v.to_vec())),
                }
            };
            let mut ints = GroupSet::new(vec![ty.clone()]);
            assert!(matches!(ints.keys, GroupKeys::Ints { .. }));
            let mut rows = GroupSet {
                types: vec![ty.clone()],
                keys: GroupKeys::Rows(hashbrown::HashSet::new()),
            };
            for g in [&mut ints, &mut rows] {
                g.insert(&[arr(&ins)], |i| i % 3 != 0).unwrap();
            }
            assert_eq!(ints.len(), rows.len(), "{ty}");
            let got = ints.contains(&[arr(&probe)]).unwrap();
            assert_eq!(got, rows.contains(&[arr(&probe)]).unwrap(), "{ty}");
            assert!(got.true_count() > 100 && got.false_count() > 100, "{ty}: {got:?}");
        }
    }
}
