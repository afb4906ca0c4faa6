//! Hashing: canonical text, row_hash, natural_key_fingerprint, normalize steps and the SQL
//! UDFs (docs/formats.md#hashes).
//!
//! The hex digests below were computed once with Python's `hashlib` from the spec formulas
//! (not with this crate); `python_recomputes_every_vector` re-derives thousands more with
//! `tests/py/recompute_hashes.py`. A failing golden means the hash format changed: that
//! breaks every existing lake and is a bug, not a test to update.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Date32Array, Date64Array, Decimal32Array, Decimal64Array,
    Decimal128Array, Decimal256Array, DictionaryArray, Float32Array, Float64Array, Int8Array, Int16Array, Int32Array,
    Int64Array, LargeStringArray, ListArray, NullArray, RecordBatch, StringArray, StringViewArray, Time32SecondArray,
    TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray, TimestampSecondArray, UInt8Array,
    UInt16Array, UInt32Array, UInt64Array,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int32Type, i256};
use datafusion::prelude::SessionContext;
use ingot::hash::canonical::{CanonicalColumn, check_supported, write_canonical};
use ingot::hash::normalize::{normalize_array, normalize_into, parse_steps};
use ingot::hash::{NormalizeStep, fingerprint_array, hex_lower, register_udfs, row_hash_array, udfs};

// ---------------------------------------------------------------------------------------
// helpers

/// Canonical text of every row (None for null), through one `CanonicalColumn`.
pub(crate) fn canon(array: &dyn Array) -> Vec<Option<String>> {
    let column = CanonicalColumn::new(array).unwrap();
    (0..array.len())
        .map(|row| {
            let mut buf = Vec::new();
            column.write(row, &mut buf).then(|| String::from_utf8(buf).unwrap())
        })
        .collect()
}

/// Canonical text of every row, all expected non-null.
pub(crate) fn canon_all(array: &dyn Array) -> Vec<String> {
    canon(array).into_iter().map(|t| t.expect("non-null")).collect()
}

/// The values of a Utf8 result array.
pub(crate) fn strings(array: &ArrayRef) -> Vec<Option<String>> {
    let array = cast(array, &DataType::Utf8).unwrap();
    let array = array.as_any().downcast_ref::<StringArray>().unwrap();
    array.iter().map(|v| v.map(str::to_owned)).collect()
}

pub(crate) fn one_hash(array: &ArrayRef) -> String {
    let values = strings(array);
    assert_eq!(values.len(), 1);
    values[0].clone().unwrap()
}

pub(crate) fn arr(a: impl Array + 'static) -> ArrayRef {
    Arc::new(a)
}

pub(crate) fn utf8(values: &[Option<&str>]) -> ArrayRef {
    arr(StringArray::from(values.to_vec()))
}

/// One-row row_hash over one value per column.
pub(crate) fn row_hash_of(columns: Vec<ArrayRef>) -> String {
    one_hash(&row_hash_array(&columns).unwrap())
}

pub(crate) fn fingerprint_of(version: i64, columns: Vec<ArrayRef>) -> String {
    one_hash(&fingerprint_array(version, &columns).unwrap())
}

/// Every row of every column of a query result, as text.
pub(crate) async fn sql_rows(ctx: &SessionContext, query: &str) -> Vec<Vec<Option<String>>> {
    let batches = ctx.sql(query).await.unwrap().collect().await.unwrap();
    let mut rows = Vec::new();
    for batch in batches {
        let columns: Vec<_> = batch.columns().iter().map(strings).collect();
        for row in 0..batch.num_rows() {
            rows.push(columns.iter().map(|c| c[row].clone()).collect());
        }
    }
    rows
}

/// The error of a query that must fail, at planning or execution.
pub(crate) async fn sql_error(ctx: &SessionContext, query: &str) -> String {
    match ctx.sql(query).await {
        Err(e) => e.to_string(),
        Ok(df) => match df.collect().await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("query should have failed: {query}"),
        },
    }
}

pub(crate) fn context() -> SessionContext {
    let ctx = SessionContext::new();
    register_udfs(&ctx);
    ctx
}

pub(crate) const NS_2013: i64 = 1_357_020_000_250_000_000; // 2013-01-01T06:00:00.25Z

// ---------------------------------------------------------------------------------------
// canonical text

#[test]
pub(crate) fn float64_canonical_text_is_shortest_positional() {
    let values = [
        (1.0, "1"),
        (1.5, "1.5"),
        (-0.25, "-0.25"),
        (-0.0, "-0"),
        (0.0, "0"),
        (1e-7, "0.0000001"),
        (1e21, "1000000000000000000000"),
        (0.1, "0.1"),
        (1.0 / 3.0, "0.3333333333333333"),
        (123456789.125, "123456789.125"),
        (1.2345678901234568e20, "123456789012345680000"),
        (f64::NAN, "NaN"),
        (-f64::NAN, "NaN"),
        (f64::INFINITY, "inf"),
        (f64::NEG_INFINITY, "-inf"),
    ];
    let array = Float64Array::from(values.iter().map(|(v, _)| *v).collect::<Vec<_>>());
    let expected: Vec<_> = values.iter().map(|(_, t)| t.to_string()).collect();
    assert_eq!(canon_all(&array), expected);

    let extremes = canon_all(&Float64Array::from(vec![f64::MAX, 5e-324]));
    assert_eq!(extremes[0], format!("17976931348623157{}", "0".repeat(292)));
    assert_eq!(extremes[1], format!("0.{}5", "0".repeat(323)));
}

#[test]
pub(crate) fn float32_canonical_text_is_shortest_for_f32() {
    let array = Float32Array::from(vec![0.1f32, 1.5, -0.0, 16_777_216.0, 1e-7, f32::NAN]);
    assert_eq!(canon_all(&array), ["0.1", "1.5", "-0", "16777216", "0.0000001", "NaN"]);
}

#[test]
pub(crate) fn integers_canonical_text_is_plain_decimal() {
    assert_eq!(canon_all(&Int8Array::from(vec![i8::MIN, 0, 7])), ["-128", "0", "7"]);
    assert_eq!(canon_all(&Int16Array::from(vec![i16::MIN])), ["-32768"]);
    assert_eq!(canon_all(&Int32Array::from(vec![-42])), ["-42"]);
    assert_eq!(
        canon_all(&Int64Array::from(vec![i64::MIN, i64::MAX])),
        ["-9223372036854775808", "9223372036854775807"]
    );
    assert_eq!(canon_all(&UInt8Array::from(vec![u8::MAX])), ["255"]);
    assert_eq!(canon_all(&UInt16Array::from(vec![u16::MAX])), ["65535"]);
    assert_eq!(canon_all(&UInt32Array::from(vec![u32::MAX])), ["4294967295"]);
    assert_eq!(canon_all(&UInt64Array::from(vec![u64::MAX])), ["18446744073709551615"]);
}

#[test]
pub(crate) fn decimals_keep_exactly_the_declared_scale() {
    let d = |values: Vec<i128>, p, s| canon_all(&Decimal128Array::from(values).with_precision_and_scale(p, s).unwrap());
    assert_eq!(
        d(vec![1250, -5, 0, 5, -1250, 100, 99_999_999], 10, 2),
        ["12.50", "-0.05", "0.00", "0.05", "-12.50", "1.00", "999999.99"]
    );
    assert_eq!(d(vec![42, -42, 0], 5, 0), ["42", "-42", "0"]);
    assert_eq!(d(vec![1], 38, 38), [format!("0.{}1", "0".repeat(37))]);
    assert_eq!(d(vec![i128::MAX], 38, 10), ["17014118346046923173168730371.5884105727"]);
    assert_eq!(
        d(vec![i128::MIN + 1], 38, 0),
        ["-170141183460469231731687303715884105727"]
    );
    // Negative scale: the unscaled value times 10^-scale, as an integer.
    assert_eq!(d(vec![123, 0, -7], 5, -2), ["12300", "0", "-700"]);

    let d32 = Decimal32Array::from(vec![-1234])
        .with_precision_and_scale(9, 3)
        .unwrap();
    assert_eq!(canon_all(&d32), ["-1.234"]);
    let d64 = Decimal64Array::from(vec![5]).with_precision_and_scale(18, 4).unwrap();
    assert_eq!(canon_all(&d64), ["0.0005"]);
    let big = i256::from_string("-10000000000000000000000000000000000000000007").unwrap();
    let d256 = Decimal256Array::from(vec![big, i256::from_i128(1250)])
        .with_precision_and_scale(50, 4)
        .unwrap();
    assert_eq!(
        canon_all(&d256),
        ["-1000000000000000000000000000000000000000.0007", "0.1250"]
    );
}

#[test]
pub(crate) fn strings_booleans_and_nulls() {
    let strings = StringArray::from(vec![Some("a|b\\c"), Some(""), None, Some("漢🦀\u{0}")]);
    assert_eq!(
        canon(&strings),
        [
            Some("a|b\\c".into()),
            Some(String::new()),
            None,
            Some("漢🦀\u{0}".into())
        ]
    );
    let booleans = BooleanArray::from(vec![Some(true), Some(false), None]);
    assert_eq!(canon(&booleans), [Some("true".into()), Some("false".into()), None]);
    assert_eq!(canon(&NullArray::new(2)), [None, None]);

    // A null writes nothing; a value is appended after what the buffer holds.
    let mut buf = b"x".to_vec();
    assert!(!write_canonical(&booleans, 2, &mut buf));
    assert_eq!(buf, b"x");
    assert!(write_canonical(&booleans, 0, &mut buf));
    assert_eq!(buf, b"xtrue");
}

#[test]
pub(crate) fn dates_are_iso_with_expanded_years_outside_0000_9999() {
    let days = Date32Array::from(vec![
        0,
        -1,
        15_706,
        11_016,
        -719_162,
        2_932_896,
        -719_528,
        -719_529,
        2_932_897,
        i32::MIN,
        i32::MAX,
    ]);
    assert_eq!(
        canon_all(&days),
        [
            "1970-01-01",
            "1969-12-31",
            "2013-01-01",
            "2000-02-29",
            "0001-01-01",
            "9999-12-31",
            "0000-01-01",
            "-0001-12-31",
            "+10000-01-01",
            "-5877641-06-23",
            "+5881580-07-11",
        ]
    );
    let millis = Date64Array::from(vec![86_400_000, -1, 1_357_020_000_250]);
    assert_eq!(canon_all(&millis), ["1970-01-02", "1969-12-31", "2013-01-01"]);
}

#[test]
pub(crate) fn dates_match_chrono_across_its_range() {
    // chrono's `Display` uses the same expanded-year form; its range is about ±262,000 years.
    let mut days: Vec<i32> = (-800_000..3_000_000).step_by(3).collect();
    days.extend((-95_000_000..95_000_000).step_by(9_973));
    let array = Date32Array::from(days.clone());
    let column = CanonicalColumn::new(&array).unwrap();
    let mut buf = Vec::new();
    for (row, day) in days.iter().enumerate() {
        let expected = chrono::NaiveDate::from_num_days_from_ce_opt(day + 719_163).unwrap();
        buf.clear();
        assert!(column.write(row, &mut buf));
        assert_eq!(std::str::from_utf8(&buf).unwrap(), expected.to_string(), "day {day}");
    }
}

#[test]
pub(crate) fn timestamps_are_utc_with_trimmed_fraction() {
    let ns = TimestampNanosecondArray::from(vec![
        NS_2013,
        NS_2013 - 250_000_000,
        1,
        -1,
        i64::MIN,
        i64::MAX,
        123_456_789_000,
    ]);
    let expected = [
        "2013-01-01T06:00:00.25Z",
        "2013-01-01T06:00:00Z",
        "1970-01-01T00:00:00.000000001Z",
        "1969-12-31T23:59:59.999999999Z",
        "1677-09-21T00:12:43.145224192Z",
        "2262-04-11T23:47:16.854775807Z",
        "1970-01-01T00:02:03.456789Z",
    ];
    assert_eq!(canon_all(&ns), expected);
    // The stored value is the UTC instant: the zone does not change the text.
    assert_eq!(canon_all(&ns.clone().with_timezone("+05:30")), expected);
    assert_eq!(canon_all(&ns.with_timezone("America/New_York")), expected);

    let ms = TimestampMillisecondArray::from(vec![1_357_020_000_250, -1, 1_357_020_000_000]);
    assert_eq!(
        canon_all(&ms.with_timezone("UTC")),
        [
            "2013-01-01T06:00:00.25Z",
            "1969-12-31T23:59:59.999Z",
            "2013-01-01T06:00:00Z"
        ]
    );
    let us = TimestampMicrosecondArray::from(vec![1_357_020_000_250_000, 1_357_020_000_000_001]);
    assert_eq!(
        canon_all(&us),
        ["2013-01-01T06:00:00.25Z", "2013-01-01T06:00:00.000001Z"]
    );
    let s = TimestampSecondArray::from(vec![1_357_020_000, 253_402_300_799, -62_135_596_800]);
    assert_eq!(
        canon_all(&s),
        ["2013-01-01T06:00:00Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z"]
    );
}

#[test]
pub(crate) fn dictionary_and_sliced_arrays_read_the_right_rows() {
    let dict: DictionaryArray<Int32Type> = vec![Some("b|x"), None, Some("a"), Some("b|x")].into_iter().collect();
    assert_eq!(
        canon(&dict),
        [Some("b|x".into()), None, Some("a".into()), Some("b|x".into())]
    );
    let plain = utf8(&[Some("b|x"), None, Some("a"), Some("b|x")]);
    assert_eq!(
        strings(&row_hash_array(&[arr(dict.clone())]).unwrap()),
        strings(&row_hash_array(&[plain]).unwrap())
    );

    let ints = Int64Array::from(vec![Some(1), None, Some(3), Some(4)]);
    assert_eq!(canon(&ints.slice(1, 3)), [None, Some("3".into()), Some("4".into())]);
    let bools = BooleanArray::from(vec![Some(true), Some(true), None, Some(false)]);
    assert_eq!(canon(&bools.slice(2, 2)), [None, Some("false".into())]);
    let texts = StringArray::from(vec![Some("x"), Some("y"), None]);
    assert_eq!(canon(&texts.slice(1, 2)), [Some("y".into()), None]);
}

#[test]
pub(crate) fn unsupported_types_are_errors_that_list_the_supported_ones() {
    let list = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![Some(vec![Some(1)])]);
    let binary = BinaryArray::from(vec![b"x".as_ref()]);
    let time = Time32SecondArray::from(vec![1]);
    let half = cast(&Float64Array::from(vec![1.0]), &DataType::Float16).unwrap();
    for array in [arr(list), arr(binary), arr(time), half] {
        let err = check_supported(array.data_type()).unwrap_err().to_string();
        assert!(err.contains(&array.data_type().to_string()), "{err}");
        assert!(err.contains("Decimal128") && err.contains("Timestamp"), "{err}");
        assert!(CanonicalColumn::new(array.as_ref()).is_err());
        assert!(row_hash_array(std::slice::from_ref(&array)).is_err());
        let mut buf = Vec::new();
        assert!(!write_canonical(array.as_ref(), 0, &mut buf));
        assert!(buf.is_empty());
    }
}

// ---------------------------------------------------------------------------------------
// hashes

#[test]
pub(crate) fn hex_lower_writes_64_lowercase_chars() {
    let mut digest = [0u8; 32];
    digest[0] = 0xab;
    digest[31] = 0x0f;
    let mut out = [0u8; 64];
    hex_lower(&digest, &mut out);
    let text = std::str::from_utf8(&out).unwrap();
    assert_eq!(text, format!("ab{}0f", "0".repeat(60)));
}

#[test]
pub(crate) fn row_hash_golden_vectors() {
    // "1|a\|b|\N|1.5|2013-01-01T06:00:00.25Z"
    let row = vec![
        utf8(&[Some("a|b")]),
        arr(NullArray::new(1)),
        arr(Float64Array::from(vec![1.5])),
        arr(TimestampNanosecondArray::from(vec![NS_2013])),
    ];
    assert_eq!(
        row_hash_of(row),
        "680ac72da95ee900a07a9c74acdbf7b4536dd3b92adcec75ab8c6333a84791b8"
    );
    // "1|" and "1|\N": empty string and null differ.
    assert_eq!(
        row_hash_of(vec![utf8(&[Some("")])]),
        "f3c930da8b750575b149fc0b324db5912c370aae8331835bcb99cc4ce63e0e36"
    );
    assert_eq!(
        row_hash_of(vec![utf8(&[None])]),
        "1b9822e48b856533758fe775db02d5ab05166b24892a3b49c43cd753db096399"
    );
    // The string `\N` is "1|\\N", not a null.
    assert_eq!(
        row_hash_of(vec![utf8(&[Some("\\N")])]),
        "029286ef1e08f6d08afef0eece9f8ccf326e2a2f400645b11ded21785ea03c47"
    );
    // One value of every family:
    // "1|42|-7|1|1.5|-0|0.0000001|1000000000000000000000|NaN|inf|-inf|12.50|-0.05|true|false|2013-01-01|2013-01-01T06:00:00.25Z"
    let decimal = |v: i128| arr(Decimal128Array::from(vec![v]).with_precision_and_scale(10, 2).unwrap());
    let typed = vec![
        arr(Int64Array::from(vec![42])),
        arr(Int8Array::from(vec![-7])),
        arr(Float64Array::from(vec![1.0])),
        arr(Float64Array::from(vec![1.5])),
        arr(Float64Array::from(vec![-0.0])),
        arr(Float64Array::from(vec![1e-7])),
        arr(Float64Array::from(vec![1e21])),
        arr(Float64Array::from(vec![f64::NAN])),
        arr(Float32Array::from(vec![f32::INFINITY])),
        arr(Float64Array::from(vec![f64::NEG_INFINITY])),
        decimal(1250),
        decimal(-5),
        arr(BooleanArray::from(vec![true])),
        arr(BooleanArray::from(vec![false])),
        arr(Date32Array::from(vec![15_706])),
        arr(TimestampMillisecondArray::from(vec![1_357_020_000_250]).with_timezone("Europe/Paris")),
    ];
    assert_eq!(
        row_hash_of(typed),
        "bd04f41269eb736db8ac6ddd38b9b4c969223ed3460363982737a7582061e834"
    );
}

#[test]
pub(crate) fn row_hash_escaping_keeps_fields_apart() {
    // "1|a\|b|c" vs "1|a|b\|c"
    let left = row_hash_of(vec![utf8(&[Some("a|b")]), utf8(&[Some("c")])]);
    let right = row_hash_of(vec![utf8(&[Some("a")]), utf8(&[Some("b|c")])]);
    assert_eq!(left, "3510ce85a744210b708504f33518b8f4e957209d83ae3521014599295bfa67a1");
    assert_eq!(
        right,
        "36722244ee0bcaecc5c8fa83b49a0bdfc9aaec071cd059764063ec9d750df34c"
    );
    // Trailing backslash cannot swallow the separator.
    let a = row_hash_of(vec![utf8(&[Some("x\\")]), utf8(&[Some("y")])]);
    let b = row_hash_of(vec![utf8(&[Some("x")]), utf8(&[Some("\\y")])]);
    assert_ne!(a, b);
}

#[test]
pub(crate) fn row_hash_of_many_rows_hashes_each_row() {
    let column = utf8(&[Some(""), None, Some("\\N")]);
    let hashes = strings(&row_hash_array(&[column]).unwrap());
    assert_eq!(
        hashes,
        [
            Some("f3c930da8b750575b149fc0b324db5912c370aae8331835bcb99cc4ce63e0e36".into()),
            Some("1b9822e48b856533758fe775db02d5ab05166b24892a3b49c43cd753db096399".into()),
            Some("029286ef1e08f6d08afef0eece9f8ccf326e2a2f400645b11ded21785ea03c47".into()),
        ]
    );
    let uneven = row_hash_array(&[utf8(&[Some("a")]), utf8(&[Some("a"), Some("b")])]);
    assert!(uneven.unwrap_err().to_string().contains("differ in length"));
}

#[test]
pub(crate) fn fingerprint_golden_vectors() {
    assert_eq!(
        fingerprint_of(1, vec![utf8(&[Some("ann@x.com")])]),
        "fb585cf78b67c11e158b639fc209328f30c1b239fe13c8a313b5b19662d910da"
    );
    // Null is the empty string: "1|" (the JavaScript join of [null]).
    assert_eq!(
        fingerprint_of(1, vec![utf8(&[None])]),
        "f3c930da8b750575b149fc0b324db5912c370aae8331835bcb99cc4ce63e0e36"
    );
    assert_eq!(
        fingerprint_of(1, vec![utf8(&[Some("a")]), utf8(&[None]), utf8(&[Some("b")])]),
        "a6e6d4691c76417914cf843610e981c69dcbc27e4f2ef46ca093dda1deb66b7f"
    );
    // No escaping: "2|a|b|c" whichever field holds the pipe.
    let expected = "5dc6553e6e1f6246d5ea7493be2ae55bc6670fd4974969042caba22b5a814409";
    assert_eq!(
        fingerprint_of(2, vec![utf8(&[Some("a|b")]), utf8(&[Some("c")])]),
        expected
    );
    assert_eq!(
        fingerprint_of(2, vec![utf8(&[Some("a")]), utf8(&[Some("b|c")])]),
        expected
    );
    // "1|HTL01|AB-123"
    assert_eq!(
        fingerprint_of(1, vec![utf8(&[Some("HTL01")]), utf8(&[Some("AB-123")])]),
        "0b05a56e55e1475da5c4f1b67563d204bcc5c062464922ba06cc78e843b1c040"
    );
    // Typed fields use canonical text: "1|ann@x.com" is not special, "1|12.50" etc. are.
    let typed = fingerprint_of(
        2,
        vec![utf8(&[Some("a")]), arr(Int64Array::from(vec![1])), utf8(&[Some("c")])],
    );
    assert_eq!(typed, fingerprint_of(2, vec![utf8(&[Some("a|1|c")])]));
}

#[test]
pub(crate) fn string_types_hash_identically() {
    let values = vec![
        Some("a|b"),
        None,
        Some(""),
        Some("漢字 🦀"),
        Some("\\N"),
        Some("a long string over twelve bytes"),
    ];
    let columns: Vec<ArrayRef> = vec![
        arr(StringArray::from(values.clone())),
        arr(LargeStringArray::from(values.clone())),
        arr(StringViewArray::from(values.clone())),
    ];
    let row_hashes: Vec<_> = columns
        .iter()
        .map(|c| strings(&row_hash_array(std::slice::from_ref(c)).unwrap()))
        .collect();
    assert_eq!(row_hashes[0], row_hashes[1]);
    assert_eq!(row_hashes[0], row_hashes[2]);
    let fingerprints: Vec<_> = columns
        .iter()
        .map(|c| strings(&fingerprint_array(1, std::slice::from_ref(c)).unwrap()))
        .collect();
    assert_eq!(fingerprints[0], fingerprints[1]);
    assert_eq!(fingerprints[0], fingerprints[2]);
}

// ---------------------------------------------------------------------------------------
// normalize

pub(crate) fn normalize(steps: &[NormalizeStep], input: &str) -> String {
    let (mut out, mut scratch) = (String::new(), String::new());
    normalize_into(steps, input, &mut out, &mut scratch);
    out
}

#[test]
pub(crate) fn each_normalize_step() {
    use NormalizeStep::*;
    assert_eq!(normalize(&[], " As Is "), " As Is ");
    assert_eq!(normalize(&[Trim], " \t a b \n\u{3000}"), "a b");
    assert_eq!(normalize(&[Trim], "\u{a0}x\u{2003}"), "x");
    assert_eq!(normalize(&[Lower], "Ann@X.COM"), "ann@x.com");
    assert_eq!(normalize(&[Lower], "ÀÉÎ ΟΔΟΣ"), "àéî οδος");
    assert_eq!(normalize(&[Upper], "straße ǆ"), "STRASSE Ǆ");
    assert_eq!(
        normalize(&[CollapseWhitespace], "  a \t\n b\u{3000}\u{a0}c  "),
        " a b c "
    );
    assert_eq!(normalize(&[StripPunctuation], "a.b,c!d-e_f(g)«h»"), "abcdefg«h»");
    assert_eq!(normalize(&[DigitsOnly], "+1 (555) 010-9999 ٣"), "15550109999");
    assert_eq!(normalize(&[Nfkc], "ﬁ①Ａ e\u{301}"), "fi1A é");
    assert_eq!(normalize(&[Nfkc], "plain ascii"), "plain ascii");
    // Steps run in the order given.
    assert_eq!(
        normalize(&[Nfkc, Upper, CollapseWhitespace, Trim], "  ﬁne   Ａ "),
        "FINE A"
    );
    assert_eq!(normalize(&[Trim, CollapseWhitespace], "  a   b  "), "a b");
    assert_eq!(
        normalize(&[CollapseWhitespace, Trim, DigitsOnly, StripPunctuation], " 1-2 "),
        "12"
    );
}

#[test]
pub(crate) fn lower_and_upper_match_the_standard_library() {
    let samples = [
        "ΣΑΣ ΟΔΟΣ",
        "Σ",
        "aΣ",
        "AΣb",
        "ΑΣ.",
        "İstanbul",
        "ǅungla",
        "ẞ",
        "ΌΣΟΣ",
        "Hello World",
        "ÅNGSTRÖM",
        "ﬀ",
        "Ꭰ",
        "🦀Σ🦀",
        "",
    ];
    for s in samples {
        assert_eq!(normalize(&[NormalizeStep::Lower], s), s.to_lowercase(), "lower {s:?}");
        assert_eq!(normalize(&[NormalizeStep::Upper], s), s.to_uppercase(), "upper {s:?}");
    }
}

#[test]
pub(crate) fn normalize_buffers_are_reused() {
    let (mut out, mut scratch) = (String::from("stale"), String::from("junk"));
    let steps = [
        NormalizeStep::Trim,
        NormalizeStep::Lower,
        NormalizeStep::CollapseWhitespace,
    ];
    normalize_into(&steps, "  A  B ", &mut out, &mut scratch);
    assert_eq!(out, "a b");
    normalize_into(&steps, "C", &mut out, &mut scratch);
    assert_eq!(out, "c");
}

#[test]
pub(crate) fn step_names_parse_and_unknown_names_list_the_valid_ones() {
    for name in NormalizeStep::NAMES {
        let step = NormalizeStep::parse(name).unwrap();
        assert_eq!(step.name(), *name);
    }
    assert_eq!(NormalizeStep::NAMES.len(), 7);
    assert_eq!(NormalizeStep::parse("Trim"), None);
    assert_eq!(NormalizeStep::parse(""), None);
    assert_eq!(
        parse_steps(" trim , lower,nfkc").unwrap(),
        [NormalizeStep::Trim, NormalizeStep::Lower, NormalizeStep::Nfkc]
    );
    assert!(parse_steps("").unwrap().is_empty());
    let err = parse_steps("trim,bogus").unwrap_err().to_string();
    assert!(err.contains("\"bogus\""), "{err}");
    for name in NormalizeStep::NAMES {
        assert!(err.contains(name), "{err}");
    }
}

#[test]
pub(crate) fn normalize_array_handles_every_string_type_and_nulls() {
    let values = vec![Some(" Ann@X.com "), None, Some(""), Some("ΟΔΟΣ  X")];
    let steps = [
        NormalizeStep::Trim,
        NormalizeStep::Lower,
        NormalizeStep::CollapseWhitespace,
    ];
    let expected = vec![
        Some("ann@x.com".to_string()),
        None,
        Some(String::new()),
        Some("οδος x".into()),
    ];
    let inputs: Vec<ArrayRef> = vec![
        arr(StringArray::from(values.clone())),
        arr(LargeStringArray::from(values.clone())),
        arr(StringViewArray::from(values)),
    ];
    for input in inputs {
        let out = normalize_array(&steps, input.as_ref()).unwrap();
        assert_eq!(out.data_type(), &DataType::Utf8);
        assert_eq!(strings(&out), expected);
    }
    assert_eq!(
        strings(&normalize_array(&steps, &NullArray::new(2)).unwrap()),
        [None, None]
    );
    let err = normalize_array(&steps, &Int64Array::from(vec![1]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("strings only") && err.contains("Int64"), "{err}");
}

#[test]
pub(crate) fn normalized_variants_give_one_fingerprint_and_one_row_hash() {
    let steps = [NormalizeStep::Trim, NormalizeStep::Lower];
    let raw = normalize_array(&steps, &StringArray::from(vec![" Ann@X.com", "ann@x.com"])).unwrap();
    let fingerprints = strings(&fingerprint_array(1, std::slice::from_ref(&raw)).unwrap());
    let row_hashes = strings(&row_hash_array(&[raw]).unwrap());
    let ann = "fb585cf78b67c11e158b639fc209328f30c1b239fe13c8a313b5b19662d910da";
    assert_eq!(fingerprints, [Some(ann.into()), Some(ann.into())]);
    // "1|ann@x.com" happens to be the same message for row_hash.
    assert_eq!(row_hashes, [Some(ann.into()), Some(ann.into())]);
}

// ---------------------------------------------------------------------------------------
// SQL UDFs

#[test]
pub(crate) fn udf_names() {
    let names: Vec<_> = udfs().iter().map(|u| u.name().to_string()).collect();
    assert_eq!(
        names,
        [
            "row_hash",
            "natural_key_fingerprint",
            "canonical_text",
            "normalize_text",
            "namespaced_fingerprint"
        ]
    );
}

#[tokio::test]
pub(crate) async fn sql_row_hash_matches_the_kernel_and_the_golden() {
    let ctx = context();
    let rows = sql_rows(
        &ctx,
        "SELECT row_hash('a|b', NULL, 1.5, CAST('2013-01-01T06:00:00.25Z' AS TIMESTAMP))",
    )
    .await;
    let kernel = row_hash_of(vec![
        utf8(&[Some("a|b")]),
        arr(NullArray::new(1)),
        arr(Float64Array::from(vec![1.5])),
        arr(TimestampNanosecondArray::from(vec![NS_2013])),
    ]);
    assert_eq!(rows, [[Some(kernel.clone())]]);
    assert_eq!(
        kernel,
        "680ac72da95ee900a07a9c74acdbf7b4536dd3b92adcec75ab8c6333a84791b8"
    );

    let rows = sql_rows(
        &ctx,
        "SELECT natural_key_fingerprint(1, normalize_text(' Ann@X.com', 'trim,lower')) AS a, \
                natural_key_fingerprint(1, 'ann@x.com') AS b, \
                natural_key_fingerprint(CAST(1 AS TINYINT), 'ann@x.com') AS c, \
                natural_key_fingerprint(7) AS d",
    )
    .await;
    let ann = "fb585cf78b67c11e158b639fc209328f30c1b239fe13c8a313b5b19662d910da".to_string();
    let seven = "81954e298f1ec7961525f1b1f69e87cfdc5e2b6ab821d324cf9b9a9b267f314d".to_string();
    assert_eq!(rows, [[Some(ann.clone()), Some(ann.clone()), Some(ann), Some(seven)]]);
}

#[tokio::test]
pub(crate) async fn sql_canonical_text_and_normalize_text() {
    let ctx = context();
    let rows = sql_rows(
        &ctx,
        "SELECT canonical_text(CAST(12.5 AS DECIMAL(10,2))), \
                canonical_text(CAST('2013-01-01T06:00:00.25Z' AS TIMESTAMP)), \
                canonical_text(CAST(1e21 AS DOUBLE)), \
                canonical_text(-0.0), \
                canonical_text(DATE '2013-01-01'), \
                canonical_text(true), \
                canonical_text(NULL), \
                normalize_text('  Ａ  b ', 'nfkc, collapse_whitespace, trim, upper'), \
                normalize_text(NULL, 'trim'), \
                normalize_text('x', '')",
    )
    .await;
    let expected: Vec<Option<String>> = vec![
        Some("12.50".into()),
        Some("2013-01-01T06:00:00.25Z".into()),
        Some("1000000000000000000000".into()),
        Some("-0".into()),
        Some("2013-01-01".into()),
        Some("true".into()),
        None,
        Some("A B".into()),
        None,
        Some("x".into()),
    ];
    assert_eq!(rows, [expected]);
}

#[tokio::test]
pub(crate) async fn sql_udfs_over_a_table_match_the_kernels() {
    let values = vec![Some("a|b"), None, Some(""), Some(" Ann@X.com"), Some("\\")];
    let ints = Int64Array::from(vec![Some(1), Some(2), None, Some(-4), Some(5)]);
    let versions = Int32Array::from(vec![1, 2, 3, 1, 1]);
    let batch = RecordBatch::try_from_iter(vec![
        ("s", arr(StringArray::from(values.clone()))),
        ("ls", arr(LargeStringArray::from(values.clone()))),
        ("vs", arr(StringViewArray::from(values.clone()))),
        ("i", arr(ints.clone())),
        ("v", arr(versions)),
    ])
    .unwrap();
    let ctx = context();
    ctx.register_batch("t", batch).unwrap();

    let rows = sql_rows(
        &ctx,
        "SELECT row_hash(s, i), row_hash(ls, i), row_hash(vs, i), row_hash(s, 'const'), \
                natural_key_fingerprint(1, s, i), natural_key_fingerprint(v, vs), \
                canonical_text(i), normalize_text(vs, 'trim,lower') FROM t",
    )
    .await;
    let s = arr(StringArray::from(values.clone()));
    let i = arr(ints);
    let row_hash = strings(&row_hash_array(&[s.clone(), i.clone()]).unwrap());
    let with_const = strings(&row_hash_array(&[s.clone(), utf8(&[Some("const"); 5])]).unwrap());
    let fp = strings(&fingerprint_array(1, &[s.clone(), i.clone()]).unwrap());
    let per_version: Vec<_> = [1, 2, 3, 1, 1]
        .iter()
        .enumerate()
        .map(|(row, v)| strings(&fingerprint_array(*v, &[s.slice(row, 1)]).unwrap())[0].clone())
        .collect();
    let canonical_i = canon(i.as_ref());
    let steps = parse_steps("trim,lower").unwrap();
    let normalized = strings(&normalize_array(&steps, s.as_ref()).unwrap());
    for (row, got) in rows.iter().enumerate() {
        assert_eq!(got[0], row_hash[row]);
        assert_eq!(got[1], row_hash[row]);
        assert_eq!(got[2], row_hash[row]);
        assert_eq!(got[3], with_const[row]);
        assert_eq!(got[4], fp[row]);
        assert_eq!(got[5], per_version[row]);
        assert_eq!(got[6], canonical_i[row]);
        assert_eq!(got[7], normalized[row]);
    }
    assert_eq!(rows.len(), 5);

    // normalize_text's steps must be a literal.
    let err = sql_error(&ctx, "SELECT normalize_text(s, s) FROM t").await;
    assert!(err.contains("string literal"), "{err}");
}

#[tokio::test]
pub(crate) async fn sql_errors_name_the_function_argument_and_type() {
    let ctx = context();
    let err = sql_error(&ctx, "SELECT normalize_text('x', 'trim,bogus')").await;
    assert!(
        err.contains("\"bogus\"") && err.contains("collapse_whitespace"),
        "{err}"
    );
    let err = sql_error(&ctx, "SELECT row_hash('a', make_array(1, 2))").await;
    assert!(
        err.contains("row_hash") && err.contains("argument 2") && err.contains("List"),
        "{err}"
    );
    let err = sql_error(&ctx, "SELECT natural_key_fingerprint('1', 'a')").await;
    assert!(err.contains("argument 1 (version) must be an integer"), "{err}");
    let err = sql_error(&ctx, "SELECT natural_key_fingerprint(1, 'a', make_array(1))").await;
    assert!(err.contains("argument 3"), "{err}");
    let err = sql_error(&ctx, "SELECT canonical_text(1, 2)").await;
    assert!(err.contains("canonical_text") && err.contains("1 argument"), "{err}");
    let err = sql_error(&ctx, "SELECT normalize_text(42, 'trim')").await;
    assert!(err.contains("strings only") && err.contains("Int64"), "{err}");
    let err = sql_error(&ctx, "SELECT natural_key_fingerprint(CAST(NULL AS BIGINT), 'a')").await;
    assert!(err.contains("version is null"), "{err}");
}

/// The worked example of docs/formats.md#file_hash-of-an-api-pull, with ingot's own functions:
/// the two typed records' fingerprints and row hashes through the SQL UDFs (values typed as the
/// example's contract types them, `fetched_at` left out as `volatile`), the rejected record's
/// line, then the pull's hash in either record order; every digest is the one the page shows.
#[tokio::test]
async fn the_worked_example_of_a_pull_hash_is_what_the_formats_page_says() {
    let ctx = context();
    let record = |id: &str, status: &str, amount: &str, updated: &str| {
        format!(
            "SELECT natural_key_fingerprint(1, canonical_text(CAST({id} AS BIGINT))), \
             row_hash(canonical_text(CAST({id} AS BIGINT)), normalize_text('{status}', 'trim,lower'), \
             canonical_text(CAST('{amount}' AS DECIMAL(12, 2))), canonical_text(CAST('{updated}' AS TIMESTAMP)))"
        )
    };
    let a = sql_rows(
        &ctx,
        &record("9007199254740993", " Shipped ", "12.5", "2026-11-01T10:00:00+01:00"),
    )
    .await;
    let c = sql_rows(&ctx, &record("9007199254740992", "open", "7", "2026-11-01T08:30:00Z")).await;
    // `amount` spelled 12.50 is the same value
    let a2 = sql_rows(
        &ctx,
        &record("9007199254740993", "shipped", "12.50", "2026-11-01T09:00:00Z"),
    )
    .await;
    assert_eq!(a, a2);
    let (a, c) = (&a[0], &c[0]);
    let line = r#"{"order_id":"x1","status":"open","amount":1,"updated_at":"2026-11-01T08:00:00Z","fetched_at":"2026-11-02T06:00:01Z"}"#;
    let hash = |order: &[usize]| {
        let mut h = ingot::hash::pull::PullHash::new();
        for i in order {
            match i {
                0 => assert!(h.add(a[0].as_deref().unwrap(), a[1].as_deref().unwrap())),
                1 => h.add_rejected(line.as_bytes()),
                _ => assert!(h.add(c[0].as_deref().unwrap(), c[1].as_deref().unwrap())),
            }
        }
        h.finish()
    };
    let page =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/formats.md")).unwrap();
    let section = &page[page.find("### file_hash of an API pull").unwrap()..];
    let mut digests = vec![
        a[0].clone().unwrap(),
        a[1].clone().unwrap(),
        ingot::hash::sha256_hex(line.as_bytes()),
        c[0].clone().unwrap(),
        c[1].clone().unwrap(),
        hash(&[0, 1, 2]),
        ingot::hash::pull::PullHash::new().finish(),
    ];
    assert_eq!(hash(&[2, 1, 0]), digests[5]);
    assert_eq!(hash(&[1, 2, 0]), digests[5]);
    assert_eq!(
        digests[5],
        "b3bdf78802022ee2be6d9f3ae0417d13df8db0aa37b0cee2f859566ed3ff014d"
    );
    for d in digests.drain(..) {
        assert!(section.contains(&d), "docs/formats.md does not show {d}");
    }
    assert!(
        section.contains(line),
        "docs/formats.md does not show the rejected record's line"
    );
}
