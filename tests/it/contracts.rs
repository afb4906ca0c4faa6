//! Contracts: the repository's contracts load; every problem of a bad contract is reported at
//! once, located, with the valid choices.

use std::path::Path;

use ingot::spec::contract::{Contract, ContractSet, FieldType};
use ingot::spec::yaml::Problems;

use crate::util::{TestLake, repo, stderr};

#[test]
fn repository_contracts_are_valid() {
    let mut problems = Problems::default();
    let set = ContractSet::load(&repo().join("contracts"), &mut problems);
    assert!(problems.is_empty(), "{:?}", problems.items);
    assert_eq!(
        set.names(),
        vec!["bookings", "hotels", "marketing_spend", "site_traffic", "web_sessions"]
    );
    let b = &set.contracts["bookings"];
    let key: Vec<&str> = b
        .natural_key
        .fields
        .iter()
        .map(|&i| b.fields[i].name.as_str())
        .collect();
    assert_eq!(key, vec!["hotel_code", "booking_ref"]);
    assert_eq!(
        b.fields[b.field_index("amount").unwrap()].ty,
        FieldType::Decimal {
            precision: 12,
            scale: 2
        }
    );
    assert!(b.fields[b.field_index("exported_at").unwrap()].volatile);
    assert_eq!(b.csv.null_values, vec!["", "NA", "NULL"]);
}

const BAD: &str = r#"source: bookings
version: 0
formatt: csv
fields:
  - name: booking_ref
    type: strin
    normalize: [trim, uper]
  - name: row_hash
    type: int64
  - name: amount
    type: decimal(12,2)
    min: abc
  - name: amount
    type: date
    format: "%Y-%m-%d"
  - name: Guest
    type: string
    allowed: [a, b]
    requried: true
natural_key:
  version: 1
  fields: [hotel_code]
"#;

fn problems_of(name: &str, text: &str) -> Vec<String> {
    let mut problems = Problems::default();
    let c = Contract::from_str(Path::new(name), text, &mut problems);
    assert!(c.is_none());
    problems.items.iter().map(|p| p.to_string()).collect()
}

#[test]
fn every_problem_is_reported_with_location_and_choices() {
    let got = problems_of("contracts/bookings.yaml", BAD);
    let expected = [
        "contracts/bookings.yaml:3:1: unknown key \"formatt\" in the contract; valid keys are: source, version, description, format, csv, unknown_fields, delivery, hold, fields, natural_key, resolve, api",
        "contracts/bookings.yaml:2:10: version must be an integer >= 1, found \"0\"",
        "contracts/bookings.yaml:6:11: unknown type \"strin\" for field \"booking_ref\"; valid types are: string, int32, int64, float64, decimal(p,s), boolean, date, timestamp (decimal precision 1..=38, 0 <= scale <= precision)",
        "contracts/bookings.yaml:7:23: unknown normalize step \"uper\"; valid steps are: trim, lower, upper, collapse_whitespace, strip_punctuation, digits_only, nfkc",
    ];
    for (i, e) in expected.iter().enumerate() {
        assert_eq!(
            got.get(i).map(String::as_str),
            Some(*e),
            "problem {i}; all problems:\n{}",
            got.join("\n")
        );
    }
    let rest = got[expected.len()..].join("\n");
    for needle in [
        ":8:11: field name \"row_hash\" is reserved by ingot",
        ":22:12: natural key names unknown field \"hotel_code\"; fields are: booking_ref, amount",
        ":12:10: min \"abc\" is not a valid decimal(12,2) value for field \"amount\"",
        ":13:11: duplicate field \"amount\" (first defined at line 10)",
        ":19:5: unknown key \"requried\" in a field; valid keys are: name, type, required, normalize, format, min, max, allowed, pattern, volatile, missing, renamed_from, older_values, description",
        ":16:11: field name \"Guest\" must match [a-z_][a-z0-9_]{0,62}",
    ] {
        assert!(rest.contains(needle), "missing {needle:?} in:\n{}", got.join("\n"));
    }
}

#[test]
fn natural_key_and_source_name_are_checked() {
    let text = r#"source: other
version: 1
fields:
  - name: a
    type: string
natural_key:
  version: 1
  fields: [a, b, a]
"#;
    let got = problems_of("contracts/bookings.yaml", text);
    assert_eq!(
        got,
        vec![
            "contracts/bookings.yaml:1:9: source \"other\" must equal the file name \"bookings\"",
            "contracts/bookings.yaml:8:15: natural key names unknown field \"b\"; fields are: a",
            "contracts/bookings.yaml:8:18: natural key field \"a\" is listed twice",
        ]
    );
}

#[test]
fn names_ingot_adds_inside_its_plans_are_reserved() {
    let text = r#"source: t
version: 1
fields:
  - name: __ingot_slot
    type: int64
  - name: id
    type: int64
    renamed_from: __ingot_run
natural_key:
  version: 1
  fields: [id]
"#;
    let got = problems_of("contracts/t.yaml", text);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("contracts/t.yaml:4:11: field name \"__ingot_slot\" is reserved by ingot")
            && got[0].ends_with("and every name beginning with __ingot"),
        "{got:?}"
    );
    // renaming away from such a name is how runs loaded under it are read
    let mut problems = Problems::default();
    let renamed = text.replace("  - name: __ingot_slot\n    type: int64\n", "");
    let c = Contract::from_str(Path::new("contracts/t.yaml"), &renamed, &mut problems);
    assert!(problems.is_empty(), "{:?}", problems.items);
    assert_eq!(c.unwrap().fields[0].renamed_from.as_deref(), Some("__ingot_run"));
}

#[test]
fn yaml_syntax_error_is_located() {
    let got = problems_of(
        "c/x.yaml",
        r#"source: x
fields: [a
"#,
    );
    assert_eq!(got.len(), 1);
    assert!(got[0].starts_with("c/x.yaml:3:"), "{got:?}");
    assert!(got[0].contains("invalid YAML"), "{got:?}");
}

#[test]
fn check_command_reports_all_files_and_exits_2() {
    let t = TestLake::new();
    std::fs::write(t.contracts().join("bookings.yaml"), BAD).unwrap();
    std::fs::write(
        t.contracts().join("extra.yaml"),
        r#"source: extra
version: 1
fields: []
natural_key: {version: 1, fields: []}
"#,
    )
    .unwrap();
    let out = t.run(&["check"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("bookings.yaml:6:11: unknown type \"strin\""), "{err}");
    assert!(
        err.contains("extra.yaml:3:9: fields must list at least one field"),
        "{err}"
    );
    // the lookups of the other contracts still resolve: no problem reported for them
    assert!(!err.contains("hotels.yaml"), "{err}");
}

#[test]
fn check_command_passes_on_repository_contracts() {
    let t = TestLake::new();
    let out = t.run(&["check"]);
    crate::util::assert_ok(&out);
    assert_eq!(
        crate::util::stdout(&out).lines().next().unwrap_or(""),
        format!(
            "ok: 5 contracts in {} (bookings, hotels, marketing_spend, site_traffic, web_sessions)",
            t.contracts().display()
        )
    );
}
