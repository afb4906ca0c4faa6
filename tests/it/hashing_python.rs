//! Hashes recomputed by another system: thousands of random values hashed here and by
//! `tests/py/recompute_hashes.py` (Python's hashlib from the formulas in docs/formats.md#hashes)
//! must agree digest for digest, and so must the `file_hash` of random API pulls of them.

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Decimal256Array, Float32Array, Float64Array, Int8Array,
    Int16Array, Int32Array, Int64Array, LargeStringArray, StringArray, StringViewArray, TimestampMicrosecondArray,
    TimestampMillisecondArray, TimestampNanosecondArray, TimestampSecondArray, UInt8Array, UInt16Array, UInt32Array,
    UInt64Array,
};
use datafusion::arrow::datatypes::i256;
use ingot::hash::{fingerprint_array, row_hash_array};
use std::path::Path;
use std::process::Command;

use crate::hashing::*;
use crate::util::Rng;

const TYPES: &[&str] = &[
    "utf8",
    "large_utf8",
    "utf8_view",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float32",
    "float64",
    "decimal128",
    "decimal256",
    "boolean",
    "date32",
    "timestamp",
];

const CHARS: &[char] = &[
    'a', 'b', 'Z', '0', '9', ' ', '|', '\\', 'N', '\n', '"', ',', 'é', 'ß', 'Σ', '漢', '🦀', '\u{0}', '\u{3000}', '\t',
    '\u{301}',
];

fn random_string(rng: &mut Rng) -> String {
    let len = rng.below(9) as usize;
    (0..len)
        .map(|_| CHARS[rng.below(CHARS.len() as u64) as usize])
        .collect()
}

fn random_f64(rng: &mut Rng) -> f64 {
    match rng.below(6) {
        0 => f64::from_bits(rng.next()),
        1 => rng.range(-1000, 1000) as f64 / 8.0,
        2 => 10f64.powi(rng.range(-30, 30) as i32) * if rng.chance(50) { -1.0 } else { 1.0 },
        3 => format!("{}.{}", rng.range(-99_999, 99_999), rng.below(1_000_000))
            .parse()
            .unwrap(),
        4 => [
            0.0,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
        ][rng.below(8) as usize],
        _ => rng.next() as f64 / (rng.below(1000) + 1) as f64,
    }
}

fn random_f32(rng: &mut Rng) -> f32 {
    match rng.below(4) {
        0 => f32::from_bits(rng.next() as u32),
        1 => rng.range(-1000, 1000) as f32 / 8.0,
        2 => format!("{}.{}", rng.range(-999, 999), rng.below(10_000))
            .parse()
            .unwrap(),
        _ => [
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-45,
            0.1,
        ][rng.below(8) as usize],
    }
}

/// Random decimal digits of the given length, with a random sign.
fn random_digits(rng: &mut Rng, len: usize) -> String {
    let sign = if rng.chance(40) { "-" } else { "" };
    let digits: String = (0..len).map(|_| char::from(b'0' + rng.below(10) as u8)).collect();
    format!("{sign}{digits}")
}

/// One random column of `rows` values: the typed array and the JSON of each field.
fn random_column(rng: &mut Rng, kind: &str, rows: usize) -> (ArrayRef, Vec<serde_json::Value>) {
    use serde_json::json;
    let nulls: Vec<bool> = (0..rows).map(|_| rng.chance(15)).collect();
    let mut fields = Vec::with_capacity(rows);
    let null_field = || json!({"type": kind, "null": true});
    macro_rules! ints {
        ($array:ty, $native:ty) => {{
            let values: Vec<Option<$native>> = nulls
                .iter()
                .map(|null| (!null).then(|| rng.next() as $native))
                .collect();
            for v in &values {
                fields.push(match v {
                    Some(v) => json!({"type": kind, "value": v.to_string()}),
                    None => null_field(),
                });
            }
            arr(<$array>::from(values))
        }};
    }
    let array = match kind {
        "utf8" | "large_utf8" | "utf8_view" => {
            let values: Vec<Option<String>> = nulls.iter().map(|null| (!null).then(|| random_string(rng))).collect();
            for v in &values {
                fields.push(match v {
                    Some(v) => json!({"type": kind, "value": v}),
                    None => null_field(),
                });
            }
            match kind {
                "utf8" => arr(StringArray::from(values)),
                "large_utf8" => arr(LargeStringArray::from(values)),
                _ => arr(StringViewArray::from(values)),
            }
        }
        "int8" => ints!(Int8Array, i8),
        "int16" => ints!(Int16Array, i16),
        "int32" => ints!(Int32Array, i32),
        "int64" => ints!(Int64Array, i64),
        "uint8" => ints!(UInt8Array, u8),
        "uint16" => ints!(UInt16Array, u16),
        "uint32" => ints!(UInt32Array, u32),
        "uint64" => ints!(UInt64Array, u64),
        "float64" => {
            let values: Vec<Option<f64>> = nulls.iter().map(|null| (!null).then(|| random_f64(rng))).collect();
            for v in &values {
                fields.push(match v {
                    Some(v) => json!({"type": kind, "bits": format!("{:016x}", v.to_bits())}),
                    None => null_field(),
                });
            }
            arr(Float64Array::from(values))
        }
        "float32" => {
            let values: Vec<Option<f32>> = nulls.iter().map(|null| (!null).then(|| random_f32(rng))).collect();
            for v in &values {
                fields.push(match v {
                    Some(v) => json!({"type": kind, "bits": format!("{:08x}", v.to_bits())}),
                    None => null_field(),
                });
            }
            arr(Float32Array::from(values))
        }
        "decimal128" => {
            let precision = rng.range(1, 38) as u8;
            let scale = rng.range(-3, i64::from(precision)) as i8;
            let values: Vec<Option<i128>> = nulls
                .iter()
                .map(|null| {
                    let len = rng.range(1, i64::from(precision)) as usize;
                    (!null).then(|| random_digits(rng, len).parse().unwrap())
                })
                .collect();
            for v in &values {
                fields.push(match v {
                    Some(v) => {
                        json!({"type": "decimal", "unscaled": v.to_string(), "scale": scale})
                    }
                    None => json!({"type": "decimal", "null": true}),
                });
            }
            arr(Decimal128Array::from(values)
                .with_precision_and_scale(precision, scale)
                .unwrap())
        }
        "decimal256" => {
            let precision = rng.range(1, 76) as u8;
            let scale = rng.range(-3, i64::from(precision)) as i8;
            let values: Vec<Option<String>> = nulls
                .iter()
                .map(|null| {
                    let len = rng.range(1, i64::from(precision)) as usize;
                    (!null).then(|| random_digits(rng, len))
                })
                .collect();
            for v in &values {
                fields.push(match v {
                    Some(v) => json!({"type": "decimal", "unscaled": v, "scale": scale}),
                    None => json!({"type": "decimal", "null": true}),
                });
            }
            let values: Vec<Option<i256>> = values
                .iter()
                .map(|v| v.as_deref().map(|v| i256::from_string(v).unwrap()))
                .collect();
            arr(Decimal256Array::from(values)
                .with_precision_and_scale(precision, scale)
                .unwrap())
        }
        "boolean" => {
            let values: Vec<Option<bool>> = nulls.iter().map(|null| (!null).then(|| rng.chance(50))).collect();
            for v in &values {
                fields.push(match v {
                    Some(v) => json!({"type": kind, "value": v}),
                    None => null_field(),
                });
            }
            arr(BooleanArray::from(values))
        }
        "date32" => {
            // Python's datetime covers years 1..=9999; wider years are pinned against chrono.
            let values: Vec<Option<i32>> = nulls
                .iter()
                .map(|null| (!null).then(|| rng.range(-719_162, 2_932_896) as i32))
                .collect();
            for v in &values {
                fields.push(match v {
                    Some(v) => json!({"type": kind, "days": v}),
                    None => null_field(),
                });
            }
            arr(Date32Array::from(values))
        }
        "timestamp" => random_timestamps(rng, &nulls, &mut fields),
        other => panic!("unknown type {other}"),
    };
    (array, fields)
}

/// Timestamps of a random unit and zone within Python's datetime range.
fn random_timestamps(rng: &mut Rng, nulls: &[bool], fields: &mut Vec<serde_json::Value>) -> ArrayRef {
    use serde_json::json;
    let (unit, per_second) =
        [("s", 1i64), ("ms", 1_000), ("us", 1_000_000), ("ns", 1_000_000_000)][rng.below(4) as usize];
    let zone = [None, Some("UTC"), Some("+05:30"), Some("America/New_York")][rng.below(4) as usize];
    let values: Vec<Option<i64>> = nulls
        .iter()
        .map(|null| {
            let value = if unit == "ns" {
                rng.next() as i64
            } else {
                let seconds = rng.range(-62_135_596_800, 253_402_300_799);
                let fraction = match rng.below(3) {
                    0 => 0,
                    1 => rng.range(0, per_second - 1),
                    _ => rng.range(0, 9) * per_second / 10,
                };
                seconds * per_second + fraction
            };
            (!null).then_some(value)
        })
        .collect();
    for v in &values {
        fields.push(match v {
            Some(v) => json!({"type": "timestamp", "unit": unit, "value": v.to_string()}),
            None => json!({"type": "timestamp", "null": true}),
        });
    }
    match unit {
        "s" => arr(TimestampSecondArray::from(values).with_timezone_opt(zone)),
        "ms" => arr(TimestampMillisecondArray::from(values).with_timezone_opt(zone)),
        "us" => arr(TimestampMicrosecondArray::from(values).with_timezone_opt(zone)),
        _ => arr(TimestampNanosecondArray::from(values).with_timezone_opt(zone)),
    }
}

/// The JSON vectors (one per row) of a batch of columns, with the Rust results.
fn batch_vectors(version: i64, columns: &[ArrayRef], fields: &[Vec<serde_json::Value>]) -> Vec<serde_json::Value> {
    let row_hashes = strings(&row_hash_array(columns).unwrap());
    let fingerprints = strings(&fingerprint_array(version, columns).unwrap());
    let texts: Vec<_> = columns.iter().map(|c| canon(c.as_ref())).collect();
    (0..row_hashes.len())
        .map(|row| {
            serde_json::json!({
                "version": version,
                "fields": fields.iter().map(|f| f[row].clone()).collect::<Vec<_>>(),
                "canonical": texts.iter().map(|t| t[row].clone()).collect::<Vec<_>>(),
                "row_hash": row_hashes[row],
                "fingerprint": fingerprints[row],
            })
        })
        .collect()
}

#[test]
fn python_recomputes_every_vector() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut vectors = Vec::new();
    // Every type on its own, with plenty of rows.
    for kind in TYPES {
        let (array, fields) = random_column(&mut rng, kind, 300);
        vectors.extend(batch_vectors(1, &[array], &[fields]));
    }
    // Mixed rows of 1 to 6 fields.
    for _ in 0..150 {
        let width = rng.range(1, 6) as usize;
        let rows = rng.range(1, 30) as usize;
        let version = rng.range(1, 12);
        let (mut columns, mut fields) = (Vec::new(), Vec::new());
        for _ in 0..width {
            let kind = TYPES[rng.below(TYPES.len() as u64) as usize];
            let (array, f) = random_column(&mut rng, kind, rows);
            columns.push(array);
            fields.push(f);
        }
        vectors.extend(batch_vectors(version, &columns, &fields));
    }

    // Pulls of those records (some twice) and of rejected lines, added in a random order.
    let mut pulls = Vec::new();
    for _ in 0..60 {
        let mut records: Vec<usize> = (0..rng.range(0, 40))
            .map(|_| rng.below(vectors.len() as u64) as usize)
            .collect();
        if let Some(&first) = records.first()
            && rng.below(2) == 0
        {
            records.push(first);
        }
        let rejected: Vec<String> = (0..rng.range(0, 4))
            .map(|_| serde_json::json!({"id": random_string(&mut rng), "n": rng.below(1000)}).to_string())
            .collect();
        let mut order: Vec<Option<usize>> = records.iter().map(|&k| Some(k)).collect();
        order.extend(rejected.iter().map(|_| None));
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let mut h = ingot::hash::pull::PullHash::new();
        let mut next_rejected = rejected.iter();
        for item in order {
            match item {
                Some(k) => assert!(h.add(
                    vectors[k]["fingerprint"].as_str().unwrap(),
                    vectors[k]["row_hash"].as_str().unwrap()
                )),
                None => h.add_rejected(next_rejected.next().unwrap().as_bytes()),
            }
        }
        pulls.push(serde_json::json!({"records": records, "rejected": rejected, "hash": h.finish()}));
    }

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vectors.json");
    let body = serde_json::json!({ "vectors": vectors, "pulls": pulls });
    std::fs::write(&path, serde_json::to_vec(&body).unwrap()).unwrap();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/recompute_hashes.py");
    let output = Command::new("python3")
        .arg(&script)
        .arg(&path)
        .output()
        .expect("python3 must be installed to cross-check the hash formulas");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "python recomputation disagrees ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains(&format!(
            "checked {} vectors and {} pulls, 0 mismatches",
            vectors.len(),
            pulls.len()
        )),
        "{stdout}"
    );
}
