//! Compact keys of fingerprints: the first 16 bytes of a `natural_key_fingerprint` as a `u128`
//! (SHA-256 makes two records sharing one astronomically unlikely), read from hex text or from
//! 16-byte binary columns; sets of them; the UDFs `__ingot_fp128` (the key in a plan; stateless,
//! registered on cluster processes like the hashing UDFs) and `__ingot_in_set` (membership in a
//! set the client holds; never sent to a cluster).

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeBinaryArray, FixedSizeBinaryBuilder, StringArrayType,
};
use datafusion::arrow::buffer::{BooleanBuffer, Buffer, NullBuffer};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::{exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use crate::error::{Error, Result};
use crate::hash::{HEX_VALUE, hex_u64};

/// A record's key: the first 16 bytes of its fingerprint, big-endian (ordered as the hex text).
pub type Fp = u128;

/// The key of a fingerprint in hex: its first 32 hex characters (lowercase, as ingot writes them).
pub fn fp_of_hex(hex: &str) -> Option<Fp> {
    let b = hex.as_bytes();
    Some(((hex_u64(b)? as u128) << 64) | hex_u64(b.get(16..)?)? as u128)
}

/// Call `f(row, key)` for every row of a fingerprint column: hex text (Utf8, LargeUtf8,
/// Utf8View) or the 16-byte keys of a state file (FixedSizeBinary(16)). `None` for a null;
/// malformed text is an error.
pub fn for_each_fp(array: &ArrayRef, mut f: impl FnMut(usize, Option<Fp>)) -> Result<()> {
    match array.data_type() {
        DataType::Utf8 => each_hex(array.as_string::<i32>(), &mut f)?,
        DataType::LargeUtf8 => each_hex(array.as_string::<i64>(), &mut f)?,
        DataType::Utf8View => each_hex(array.as_string_view(), &mut f)?,
        DataType::FixedSizeBinary(16) => {
            let a = array.as_fixed_size_binary();
            for i in 0..a.len() {
                if a.is_null(i) {
                    f(i, None);
                } else {
                    let mut b = [0u8; 16];
                    b.copy_from_slice(a.value(i));
                    f(i, Some(u128::from_be_bytes(b)));
                }
            }
        }
        other => {
            return Err(Error::RunFailed(format!(
                "natural_key_fingerprint has type {other}, expected text"
            )));
        }
    }
    Ok(())
}

/// The 16-byte keys of a fingerprint column (any type [`for_each_fp`] reads), big-endian, null
/// where the fingerprint is null.
pub fn fixed_keys(array: &ArrayRef) -> Result<FixedSizeBinaryArray> {
    let mut b = FixedSizeBinaryBuilder::with_capacity(array.len(), 16);
    let mut failed = None;
    for_each_fp(array, |_, fp| match fp {
        Some(fp) => {
            if let Err(e) = b.append_value(fp.to_be_bytes()) {
                failed.get_or_insert(e);
            }
        }
        None => b.append_null(),
    })?;
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(b.finish()),
    }
}

/// The digest of a key index: the sum, wrapping at 2^128, of every key times `2 × position + 1`
/// (a null counts as 0). `acc` is the digest of the keys before `first`, the position of
/// `keys`' first row. A lost, added, changed or moved key changes it (this detects damage, not
/// forgery).
pub fn keys_digest(acc: u128, first: u64, keys: &FixedSizeBinaryArray) -> u128 {
    let bytes = keys.value_data();
    let mut acc = acc;
    for i in 0..keys.len() {
        if keys.is_null(i) {
            continue;
        }
        let mut k = [0u8; 16];
        if let Some(b) = bytes.get(i * 16..i * 16 + 16) {
            k.copy_from_slice(b);
        }
        let weight = 2 * (first as u128 + i as u128) + 1;
        acc = acc.wrapping_add(u128::from_be_bytes(k).wrapping_mul(weight));
    }
    acc
}

/// [`for_each_fp`] over a text column.
fn each_hex<'a>(a: impl StringArrayType<'a>, f: &mut impl FnMut(usize, Option<Fp>)) -> Result<()> {
    for (i, v) in a.iter().enumerate() {
        match v {
            None => f(i, None),
            Some(v) => f(
                i,
                Some(fp_of_hex(v).ok_or_else(|| {
                    Error::RunFailed(format!("natural_key_fingerprint \"{v}\" is not a SHA-256 in hex"))
                })?),
            ),
        }
    }
    Ok(())
}

/// `__ingot_fp128(fp)`: the 16-byte key of a hex fingerprint (FixedSizeBinary(16), ordered as the
/// hex text), a narrow sort key for window anomalies.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Fp128 {
    signature: Signature,
}

impl ScalarUDFImpl for Fp128 {
    fn name(&self) -> &str {
        "__ingot_fp128"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> datafusion::error::Result<DataType> {
        match arg_types {
            [_] => Ok(DataType::FixedSizeBinary(16)),
            _ => plan_err!("__ingot_fp128 takes 1 argument"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> datafusion::error::Result<ColumnarValue> {
        let [arg] = args.args.as_slice() else {
            return exec_err!("__ingot_fp128 takes 1 argument");
        };
        let array = arg.to_array(args.number_rows)?;
        let mut bytes = Vec::with_capacity(array.len() * 16);
        let mut valid = Vec::with_capacity(array.len());
        for_each_fp(&array, |_, fp| {
            bytes.extend_from_slice(&fp.unwrap_or_default().to_be_bytes());
            valid.push(fp.is_some());
        })
        .map_err(|e| datafusion::error::DataFusionError::Execution(e.to_string()))?;
        let nulls = valid.iter().any(|v| !v).then(|| NullBuffer::from(valid));
        let out: ArrayRef = Arc::new(FixedSizeBinaryArray::try_new(16, Buffer::from(bytes), nulls)?);
        Ok(ColumnarValue::Array(out))
    }
}

pub fn fp128_udf() -> ScalarUDF {
    ScalarUDF::from(Fp128 {
        signature: Signature::any(1, Volatility::Immutable),
    })
}

/// A hasher for keys that are already uniformly random (prefixes of SHA-256).
#[derive(Default)]
pub struct FpHasher(u64);

impl Hasher for FpHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = (v as u64) ^ ((v >> 64) as u64);
    }
}

pub type FpBuild = BuildHasherDefault<FpHasher>;
pub type FpSet = HashSet<Fp, FpBuild>;

/// `__ingot_in_set(fp)`: the record is in `set`.
pub fn in_set_udf(set: Arc<FpSet>) -> ScalarUDF {
    let heads = Arc::new(Heads::of(set.iter()));
    ScalarUDF::from(InSet {
        set,
        heads,
        signature: Signature::any(1, Volatility::Immutable),
    })
}

/// The UDF of [`in_set_udf`]; equal to another only over the same set.
struct InSet {
    set: Arc<FpSet>,
    heads: Arc<Heads>,
    signature: Signature,
}

impl std::fmt::Debug for InSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InSet").field("keys", &self.set.len()).finish()
    }
}

impl PartialEq for InSet {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.set, &other.set)
    }
}

impl Eq for InSet {}

impl std::hash::Hash for InSet {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.set) as usize).hash(state);
    }
}

impl ScalarUDFImpl for InSet {
    fn name(&self) -> &str {
        "__ingot_in_set"
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
        let [arg] = args.args.as_slice() else {
            return exec_err!("__ingot_in_set takes 1 argument");
        };
        let array = arg.to_array(args.number_rows)?;
        let mask = in_set_mask(&self.set, &self.heads, &array)
            .map_err(|e| datafusion::error::DataFusionError::Execution(e.to_string()))?;
        Ok(ColumnarValue::Array(Arc::new(mask)))
    }
}

/// Which rows of the fingerprint column `array` are in `set` (`heads`: [`Heads::of`] the set);
/// never null. What `__ingot_in_set` computes, for code that splits batches itself.
pub fn in_set_mask(set: &FpSet, heads: &Heads, array: &ArrayRef) -> Result<BooleanArray> {
    if set.is_empty() {
        return Ok(BooleanArray::new(BooleanBuffer::new_unset(array.len()), None));
    }
    if array.data_type() == &DataType::Utf8 {
        // most rows are ruled out after reading 6 hex characters (see [`Heads`])
        let a = array.as_string::<i32>();
        let out = BooleanBuffer::collect_bool(a.len(), |i| {
            a.is_valid(i) && {
                let v = a.value(i);
                heads.may_contain_hex(v.as_bytes()) && fp_of_hex(v).is_some_and(|fp| set.contains(&fp))
            }
        });
        return Ok(BooleanArray::new(out, None));
    }
    let mut out = vec![false; array.len()];
    for_each_fp(array, |i, fp| out[i] = fp.is_some_and(|fp| set.contains(&fp)))?;
    Ok(BooleanArray::from(out))
}

/// Bits of a key [`Heads`] looks at: its first 22 (a 512 KiB bitmap).
const HEAD_BITS: u32 = 22;

/// A bitmap of the first [`HEAD_BITS`] bits of a set's keys. A fingerprint whose bit is clear is
/// not in the set, decided from its first 6 hex characters without hashing; with the 1% of a
/// table a delta layer deletes (60,000 keys of 6M), 98.6% of the rows are decided so.
pub struct Heads(Vec<u64>);

impl Heads {
    pub fn of<'a>(keys: impl IntoIterator<Item = &'a Fp>) -> Heads {
        let mut bits = vec![0u64; 1 << (HEAD_BITS - 6)];
        for fp in keys {
            let h = (fp >> (128 - HEAD_BITS)) as usize;
            bits[h >> 6] |= 1 << (h & 63);
        }
        Heads(bits)
    }

    /// False when `fp` is certainly not in the set.
    pub fn may_contain(&self, fp: Fp) -> bool {
        let h = (fp >> (128 - HEAD_BITS)) as usize;
        self.0[h >> 6] & (1 << (h & 63)) != 0
    }

    /// False when the hex fingerprint `hex` is certainly not in the set (true also for text
    /// that is not hex: the caller's full parse decides).
    pub fn may_contain_hex(&self, hex: &[u8]) -> bool {
        let Some(head) = hex.get(..6) else {
            return true;
        };
        let mut v = 0u32;
        for &c in head {
            let d = HEX_VALUE[c as usize];
            if d > 0x0f {
                return true;
            }
            v = (v << 4) | d as u32;
        }
        let h = (v >> (24 - HEAD_BITS)) as usize;
        self.0[h >> 6] & (1 << (h & 63)) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(v: &[Option<u128>]) -> FixedSizeBinaryArray {
        let mut b = FixedSizeBinaryBuilder::new(16);
        for k in v {
            match k {
                Some(k) => b.append_value(k.to_be_bytes()).unwrap(),
                None => b.append_null(),
            }
        }
        b.finish()
    }

    #[test]
    fn a_key_index_digest_is_the_same_in_batches_and_tells_moved_lost_and_changed_keys() {
        let all = [Some(7u128 << 100), Some(3), None, Some(u128::MAX), Some(42)];
        let whole = keys_digest(0, 0, &keys(&all));
        let split = keys_digest(keys_digest(0, 0, &keys(&all[..2])), 2, &keys(&all[2..]));
        assert_eq!(whole, split, "read in batches");
        let mut swapped = all;
        swapped.swap(0, 1);
        assert_ne!(keys_digest(0, 0, &keys(&swapped)), whole, "two keys moved");
        assert_ne!(keys_digest(0, 0, &keys(&all[..4])), whole, "the last key lost");
        let mut changed = all;
        changed[4] = Some(43);
        assert_ne!(keys_digest(0, 0, &keys(&changed)), whole, "a key changed");
        // the keys of hex fingerprints, big-endian: ordered as the text
        let hex: ArrayRef = Arc::new(datafusion::arrow::array::StringArray::from(vec![
            Some("00000000000000000000000000000001ffff"),
            None,
        ]));
        let k = fixed_keys(&hex).unwrap();
        assert_eq!(k.value(0), 1u128.to_be_bytes());
        assert!(k.is_null(1));
    }
}
