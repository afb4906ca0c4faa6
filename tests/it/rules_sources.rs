//! Rules files of a table fed by several sources (`sources:`, `survivorship:`, `conflicts:`):
//! a valid file is read whole; every problem is located at its node with what would be valid;
//! the entries of one key namespace must build the same natural-key fingerprint; a file with
//! plain `source:` reads as before.
//!
//! The contracts are small: `crm` and `pms` (the same key), `web` (another key), `nul` and
//! `rez` (resolving from `shops`, with `on_missing: null` and the default `reject`), and `k_*`
//! variations of one key, each differing from `k_base` in one way.

use std::collections::BTreeMap;
use std::path::Path;

use datafusion::arrow::datatypes::{DataType, Field};
use ingot::spec::columns::{is_reserved, timestamp_type};
use ingot::spec::contract::ContractSet;
use ingot::spec::rules::sources::{OnConflict, PROVENANCE_COLUMNS, Rule, SamePrecedence, Sources, merged_fields};
use ingot::spec::rules::{RuleSet, RulesSet, Step};
use ingot::spec::yaml::Problems;

/// Every contract's fields and key, each after a `# <source>` line.
const CONTRACTS: &str = "# crm
fields:
  - {name: guest_id, type: string, required: true, normalize: [trim, lower]}
  - {name: email_address, type: string}
  - {name: tier, type: string}
  - {name: city, type: string}
  - {name: zip, type: string}
  - {name: updated_at, type: timestamp}
  - {name: vip, type: boolean}
natural_key: {version: 1, fields: [guest_id]}
# pms
fields:
  - {name: guest_id, type: string, required: true, normalize: [trim, lower]}
  - {name: email, type: string}
  - {name: city, type: string}
  - {name: zip, type: int64}
  - {name: updated_at, type: timestamp}
  - {name: nights, type: int64}
natural_key: {version: 1, fields: [guest_id]}
# web
fields:
  - {name: visitor, type: string, required: true}
  - {name: email, type: string}
  - {name: seen_at, type: timestamp}
natural_key: {version: 1, fields: [visitor]}
# nul
fields:
  - {name: guest_id, type: string, required: true, normalize: [trim, lower]}
  - {name: shop, type: string}
  - {name: updated_at, type: timestamp}
natural_key: {version: 1, fields: [guest_id]}
resolve:
  - {name: shop, from: shop, lookup: shops, key: shop, value: shop_id, on_missing: 'null'}
# ali
fields:
  - {name: guest_id, type: string, required: true, normalize: [trim, lower]}
  - {name: shop, type: string}
natural_key: {version: 1, fields: [guest_id]}
resolve:
  - {name: shop, from: shop, lookup: shops, key: shop, value: shop_id, as: conflict_fields, on_missing: 'null'}
# rez
fields:
  - {name: guest_id, type: string, required: true, normalize: [trim, lower]}
  - {name: shop, type: string}
natural_key: {version: 1, fields: [guest_id]}
resolve:
  - {name: shop, from: shop, lookup: shops, key: shop, value: shop_id}
# shops
fields:
  - {name: shop, type: string, required: true}
  - {name: shop_id, type: int64}
natural_key: {version: 1, fields: [shop]}
# k_base
fields:
  - {name: id, type: string, required: true, normalize: [trim]}
  - {name: other, type: string}
natural_key: {version: 1, fields: [id]}
# k_version
fields:
  - {name: id, type: string, required: true, normalize: [trim]}
natural_key: {version: 2, fields: [id]}
# k_arity
fields:
  - {name: id, type: string, required: true, normalize: [trim]}
  - {name: other, type: string, required: true}
natural_key: {version: 1, fields: [id, other]}
# k_type
fields:
  - {name: id, type: int64, required: true}
natural_key: {version: 1, fields: [id]}
# k_normalize
fields:
  - {name: id, type: string, required: true, normalize: [trim, upper]}
natural_key: {version: 1, fields: [id]}
# k_same
fields:
  - {name: id, type: string, required: true, normalize: [trim]}
natural_key: {version: 1, fields: [id]}
# k_map
fields:
  - {name: id, type: string, required: true, normalize: [trim]}
  - {name: other, type: string}
natural_key: {version: 1, fields: [id]}
resolve:
  - {name: to_base, from: id, lookup: k_xref, key: id, value: base_id, as: base_a, on_missing: 'null'}
  - {name: by_other, from: other, lookup: k_xref, key: id, value: base_id, as: base_b, on_missing: 'null'}
  - {name: to_int, from: id, lookup: k_xref, key: id, value: n, as: n_c, on_missing: 'null'}
# k_xref
fields:
  - {name: id, type: string, required: true}
  - {name: base_id, type: string}
  - {name: n, type: int64}
natural_key: {version: 1, fields: [id]}
";

const ALL: &str =
    "ali, crm, k_arity, k_base, k_map, k_normalize, k_same, k_type, k_version, k_xref, nul, pms, rez, shops, web";

/// The bronze columns every source has after its contract fields.
const META: &str = "ingestion_run_id, file_hash, row_hash, natural_key_fingerprint, natural_key_version, \
                    contract_version, source_row_number, ingested_at, is_deleted, previous_natural_key_fingerprint";

fn write_contracts(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for part in CONTRACTS.split("# ").skip(1) {
        let (name, body) = part.split_once('\n').unwrap();
        let text = format!("source: {name}\nversion: 1\nformat: csv\n{body}");
        std::fs::write(dir.join(format!("{name}.yaml")), text).unwrap();
    }
}

fn contracts() -> (tempfile::TempDir, ContractSet) {
    let dir = tempfile::tempdir().unwrap();
    write_contracts(dir.path());
    let mut problems = Problems::default();
    let set = ContractSet::load(dir.path(), &mut problems);
    assert!(problems.is_empty(), "{:?}", problems.items);
    assert_eq!(set.names().join(", "), ALL);
    (dir, set)
}

/// Every problem of `text` read as `rules/guests/v1.yaml`, as `file:line:column: message`.
fn problems_of(text: &str) -> Vec<String> {
    let (_dir, set) = contracts();
    let mut problems = Problems::default();
    let rules = RuleSet::from_str(Path::new(F), text, &set, &mut problems);
    assert!(rules.is_none(), "expected problems in:\n{text}");
    problems.items.iter().map(|p| p.to_string()).collect()
}

fn rules_of(text: &str) -> RuleSet {
    let (_dir, set) = contracts();
    let mut problems = Problems::default();
    let rules = RuleSet::from_str(Path::new(F), text, &set, &mut problems);
    assert!(problems.is_empty(), "{:#?}", problems.items);
    rules.unwrap()
}

const F: &str = "rules/guests/v1.yaml";

/// `expected` are `line:column: message` of [`F`].
fn assert_problems(text: &str, expected: &[&str]) {
    let got = problems_of(text);
    let expected: Vec<String> = expected.iter().map(|e| format!("{F}:{e}")).collect();
    assert_eq!(
        got,
        expected,
        "\ngot:\n{}\nexpected:\n{}",
        got.join("\n"),
        expected.join("\n")
    );
}

fn names(schema: &datafusion::common::DFSchema) -> Vec<String> {
    schema.fields().iter().map(|f| f.name().clone()).collect()
}

fn list(s: &str) -> Vec<String> {
    s.split(", ").map(String::from).collect()
}

fn sources(r: &RuleSet) -> &Sources {
    r.sources.as_deref().expect("a table with sources")
}

/// An entry as the tests compare it: source, rank, key namespace, step kinds, (line, column).
type EntrySummary<'a> = (&'a str, u32, Option<&'a str>, Vec<&'a str>, (usize, usize));

const VALID: &str = r#"table: guests
version: 1
sources:
  - source: crm
    steps:
      - rename: {email_address: email}
      - set: shop_id
        expr: "CAST(7 AS BIGINT)"
  - source: pms
    rank: 1
    steps:
      - cast: {zip: string}
  - source: nul
    rank: 4
  - source: web
    key_namespace: web
    steps:
      - rename: {seen_at: updated_at}
survivorship:
  default: most_recent
  order_by: updated_at
  fields:
    email: precedence
    tier: {only: crm}
    nights: {most_recent: updated_at}
    shop_id: most_recent
  groups:
    address: {fields: [city, zip], rule: precedence}
    contact: {fields: [vip, visitor]}
conflicts:
  fields: [email, address]
  same_precedence: break
  on_conflict: hold
steps:
  - set: email
    expr: "lower(email)"
  - drop: [tier]
validate:
  - name: has_email
    check: "email IS NOT NULL AND cardinality(contributing_sources) > 0"
anomalies:
  - name: long_stay
    when: "nights > 30"
"#;

#[test]
fn a_table_with_several_sources_is_read_whole() {
    let r = rules_of(VALID);
    assert_eq!(r.source, "crm");
    let s = sources(&r);
    assert_eq!((s.pos.line, s.pos.column), (3, 1));
    let entries: Vec<EntrySummary> = s
        .entries
        .iter()
        .map(|e| {
            (
                e.source.as_str(),
                e.rank,
                e.key_namespace.as_deref(),
                e.steps.iter().map(Step::kind).collect(),
                (e.pos.line, e.pos.column),
            )
        })
        .collect();
    assert_eq!(
        entries,
        vec![
            ("crm", 1, None, vec!["rename", "set"], (4, 5)),
            ("pms", 1, None, vec!["cast"], (9, 5)),
            ("nul", 4, None, vec![], (13, 5)),
            ("web", 4, Some("web"), vec!["rename"], (15, 5)),
        ]
    );
    // each entry's columns before and after its own steps
    let crm = s.entry("crm").unwrap();
    assert_eq!(
        names(&crm.input_schema),
        list(&format!(
            "guest_id, email_address, tier, city, zip, updated_at, vip, {META}"
        ))
    );
    assert_eq!(
        names(&crm.output_schema),
        list(&format!(
            "guest_id, email, tier, city, zip, updated_at, vip, {META}, shop_id"
        ))
    );
    let pms = s.entry("pms").unwrap();
    let zip =
        |schema: &datafusion::common::DFSchema| schema.field_with_unqualified_name("zip").unwrap().data_type().clone();
    assert_eq!(
        (zip(&pms.input_schema), zip(&pms.output_schema)),
        (DataType::Int64, DataType::Utf8)
    );
    // the resolve value is in its contract's entry from the start
    assert_eq!(
        names(&s.entry("nul").unwrap().input_schema),
        list(&format!("guest_id, shop, updated_at, {META}, shop_id"))
    );
    assert_eq!(s.names(), vec!["crm", "pms", "nul", "web"]);

    // the table's columns in order of first appearance, one type each (pms's zip cast)
    let columns: Vec<String> = s.columns.iter().map(|(n, t)| format!("{n} {t}")).collect();
    let ts = timestamp_type();
    let want = format!(
        "guest_id Utf8; email Utf8; tier Utf8; city Utf8; zip Utf8; updated_at {ts}; vip Boolean; \
         shop_id Int64; nights Int64; shop Utf8; visitor Utf8"
    );
    assert_eq!(columns.join("; "), want);

    let most_recent = || Rule::MostRecent("updated_at".into());
    assert_eq!(s.survivorship.default, most_recent());
    assert_eq!(s.survivorship.order_by.as_deref(), Some("updated_at"));
    let fields: BTreeMap<String, Rule> = [
        ("email", Rule::Precedence),
        ("tier", Rule::Only("crm".into())),
        ("nights", most_recent()),
        ("shop_id", most_recent()),
    ]
    .into_iter()
    .map(|(n, r)| (n.to_string(), r))
    .collect();
    assert_eq!(s.survivorship.fields, fields);
    let groups: Vec<String> = s
        .survivorship
        .groups
        .iter()
        .map(|g| format!("{} {:?} {:?} line {}", g.name, g.fields, g.rule, g.pos.line))
        .collect();
    // contact has no rule: the default's
    let want = [
        r#"address ["city", "zip"] Precedence line 28"#,
        r#"contact ["vip", "visitor"] MostRecent("updated_at") line 29"#,
    ];
    assert_eq!(groups, want);
    assert_eq!(s.rule_of("address"), &Rule::Precedence);
    assert_eq!(s.rule_of("tier"), &Rule::Only("crm".into()));
    assert_eq!(s.rule_of("guest_id"), &most_recent(), "a field not named: the default");
    assert_eq!(s.group_of("zip").map(|g| g.name.as_str()), Some("address"));
    assert_eq!(s.conflicts.fields, vec!["email", "address"]);
    assert_eq!(s.conflicts.same_precedence, SamePrecedence::Break);
    assert_eq!(s.conflicts.on_conflict, OnConflict::Hold);
    assert_eq!((s.conflicts.pos.line, s.conflicts.pos.column), (31, 3));

    // the top-level steps see the merged columns: survivorship's, provenance, bronze bookkeeping
    let merged = format!(
        "guest_id, email, tier, city, zip, updated_at, vip, shop_id, nights, shop, visitor, \
         contributing_sources, field_sources, conflict_fields, {META}"
    );
    assert_eq!(names(&r.input_schema), list(&merged));
    let want: Vec<Field> = merged_fields(&s.columns);
    let got: Vec<Field> = r.input_schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    assert_eq!(got, want);
    assert_eq!(names(&r.output_schema), list(&merged.replace("tier, ", "")));
    assert_eq!(r.steps.iter().map(Step::kind).collect::<Vec<_>>(), vec!["set", "drop"]);
    // the flag of rows in conflict comes first among the anomalies (on_conflict hold: no validation)
    assert_eq!(
        r.rule_names().collect::<Vec<_>>(),
        vec!["has_email", "source_conflict", "long_stay"]
    );
}

#[test]
fn defaults_of_rank_survivorship_and_conflicts() {
    let r = rules_of(
        r#"table: guests
version: 1
sources:
  - source: crm
  - source: pms
    rank: 2
    steps:
      - cast: {zip: string}
  - source: nul
"#,
    );
    let s = sources(&r);
    let ranks: Vec<u32> = s.entries.iter().map(|e| e.rank).collect();
    assert_eq!(ranks, vec![1, 2, 3]);
    assert_eq!(s.survivorship.default, Rule::Precedence);
    assert_eq!(s.survivorship.order_by, None);
    assert!(s.survivorship.fields.is_empty() && s.survivorship.groups.is_empty());
    assert!(s.conflicts.fields.is_empty());
    assert_eq!(s.conflicts.same_precedence, SamePrecedence::Conflict);
    assert_eq!(s.conflicts.on_conflict, OnConflict::Flag);
    // one source is a valid list too
    let r = rules_of("table: guests\nversion: 1\nsources:\n  - source: crm\n");
    assert_eq!(sources(&r).names(), vec!["crm"]);
    assert_eq!(r.source, "crm");
}

#[test]
fn a_plain_source_file_reads_as_before() {
    let r = rules_of(
        r#"table: guests
source: crm
version: 1
steps:
  - rename: {email_address: email}
validate:
  - name: source_conflict
    check: "email IS NOT NULL"
"#,
    );
    assert!(r.sources.is_none());
    assert_eq!(r.source, "crm");
    assert_eq!(
        names(&r.input_schema),
        list(&format!(
            "guest_id, email_address, tier, city, zip, updated_at, vip, {META}"
        ))
    );
    assert_eq!(
        names(&r.output_schema),
        list(&format!("guest_id, email, tier, city, zip, updated_at, vip, {META}"))
    );
    // the conflict flag's name is only reserved where there are conflicts
    assert_eq!(r.validate[0].name, "source_conflict");
}

#[test]
fn source_and_sources_are_exclusive() {
    assert_problems(
        r#"table: guests
source: crm
sources:
  - source: pms
version: 1
"#,
        &[
            "3:1: a table reads either \"source\" (one bronze source) or \"sources\" (a list of several, in precedence order), not both",
        ],
    );
    assert_problems(
        r#"table: guests
version: 1
"#,
        &[
            "1:1: missing required key \"source\" (the bronze source the table reads), or \"sources\" (a list of sources in precedence order)",
        ],
    );
    assert_problems(
        r#"table: guests
source: crm
version: 1
survivorship:
  default: precedence
conflicts:
  on_conflict: flag
"#,
        &[
            "4:1: \"survivorship\" is only for a table with \"sources:\" (several sources); this one reads one \"source\"",
            "6:1: \"conflicts\" is only for a table with \"sources:\" (several sources); this one reads one \"source\"",
        ],
    );
}

#[test]
fn every_problem_of_the_sources_list_is_located() {
    assert_problems(
        "table: guests\nversion: 1\nsources: []\n",
        &["3:10: sources must list at least one source (a mapping such as \"- source: crm\")"],
    );
    assert_problems(
        "table: guests\nversion: 1\nsources: crm\n",
        &["3:10: sources must be a list, found a scalar"],
    );
    assert_problems(
        r#"table: guests
version: 1
sources:
  - crm
  - rank: 2
  - source: crm
    ranking: 1
  - source: crm
  - source: nope
  - source: pms
    rank: 0
    key_namespace: Pms
    steps:
      - cast: {zip: string}
  - source: k_same
    rank: "x"
"#,
        &[
            "4:5: a sources entry must be a mapping, found a scalar",
            "5:5: a sources entry is missing \"source\" (the contract whose rows it reads)",
            "7:5: unknown key \"ranking\" in a sources entry; valid keys are: source, rank, key_namespace, shared_key, steps",
            "8:13: source \"crm\" is listed twice in sources (first at line 6); list each source once",
            &format!("9:13: source \"nope\" is not a known contract; sources are: {ALL}"),
            "11:11: rank must be an integer >= 1, found \"0\"",
            "12:20: key_namespace \"Pms\" must match [a-z][a-z0-9_]{0,62}",
            "16:11: rank must be an integer >= 1, found \"x\"",
            // the key of k_same is not crm's; the contracts that loaded are still compared
            "15:13: sources \"crm\" and \"k_same\" do not build the same natural_key_fingerprint: part 1 normalize [trim, lower] vs [trim]; the candidates of one record would never meet. Give both contracts the same natural key, or set key_namespace on one to keep their keys apart",
        ],
    );
}

#[test]
fn a_contract_with_problems_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    write_contracts(dir.path());
    std::fs::write(dir.path().join("broken.yaml"), "source: broken\nversion: 1\n").unwrap();
    let mut problems = Problems::default();
    let set = ContractSet::load(dir.path(), &mut problems);
    assert!(!problems.is_empty());
    let mut problems = Problems::default();
    let text = "table: guests\nversion: 1\nsources:\n  - source: crm\n  - source: broken\n";
    assert!(RuleSet::from_str(Path::new(F), text, &set, &mut problems).is_none());
    let got: Vec<String> = problems.items.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        got,
        vec![format!(
            "{F}:5:13: source \"broken\": its contract has problems (reported with the contract); the columns of this file cannot be checked until it is fixed"
        )]
    );
}

#[test]
fn ranks_must_not_decrease_along_the_list() {
    assert_problems(
        r#"table: guests
version: 1
sources:
  - source: crm
    rank: 3
  - source: nul
    rank: 3
  - source: pms
    steps:
      - cast: {zip: string}
  - source: k_base
    key_namespace: k
    rank: 1
"#,
        &[
            "13:11: rank 1 of source \"k_base\" is below rank 3 of \"pms\" listed before it; ranks must not decrease along the list: list the sources in precedence order",
        ],
    );
    assert_problems(
        "table: guests\nversion: 1\nsources:\n  - source: crm\n    rank: 3000000000\n",
        &["5:11: rank 3000000000 is too large (at most 2147483647)"],
    );
    // a default rank (the position) below an earlier explicit one
    assert_problems(
        r#"table: guests
version: 1
sources:
  - source: crm
    rank: 5
  - source: nul
"#,
        &[
            "6:13: rank 2 (its position in the list) of source \"nul\" is below rank 5 of \"crm\" listed before it; ranks must not decrease along the list: list the sources in precedence order",
        ],
    );
}

#[test]
fn a_sources_steps_are_read_against_its_own_contract() {
    assert_problems(
        r#"table: guests
version: 1
sources:
  - source: crm
    steps:
      - filter: "vip"
      - set: row_hash
        expr: "'x'"
      - set: shop_id
        expr: "CAST(1 AS BIGINT)"
      - rename: {tier: contributing_sources}
      - set: field_sources
        expr: "'x'"
      - drop: [nights]
  - source: nul
    steps:
      - set: shop_id
        expr: "CAST(2 AS BIGINT)"
      - drop: [natural_key_fingerprint]
"#,
        &[
            "6:9: a source's steps cannot filter rows: a record must be a candidate of every source that has it; put the filter in the top-level steps",
            "7:14: column \"row_hash\" is a bronze column ingot maintains; steps may read it but not set it",
            "11:24: column name \"contributing_sources\" is reserved by ingot (a column of its bronze, silver or audit tables)",
            "12:14: column name \"field_sources\" is reserved by ingot (a column of its bronze, silver or audit tables)",
            &format!(
                "14:16: unknown column \"nights\"; columns at this step are: guest_id, email_address, tier, city, zip, updated_at, vip, {META}, shop_id, contributing_sources, field_sources"
            ),
            // shop_id is crm's own column above, but nul's resolve value here
            "17:14: column \"shop_id\" is the value of resolve \"shop\" of contract \"nul\"; steps may read it but not set it",
            "19:16: column \"natural_key_fingerprint\" is a bronze column ingot maintains; steps may read it but not drop it",
        ],
    );
}

#[test]
fn a_contract_rejecting_a_missing_resolve_is_accepted() {
    // a candidate whose lookup misses rejects its record as a whole (docs/guide.md)
    let r = rules_of(
        r#"table: guests
version: 1
sources:
  - source: crm
  - source: rez
"#,
    );
    assert_eq!(sources(&r).names(), vec!["crm", "rez"]);
}

#[test]
fn a_column_has_one_type_across_sources() {
    assert_problems(
        r#"table: guests
version: 1
sources:
  - source: crm
  - source: pms
  - source: web
    key_namespace: web
    steps:
      - set: city
        expr: "nope + 1"
      - set: tier
        expr: "CAST(NULL AS VARCHAR)"
      - set: updated_at
        expr: "CAST(seen_at AS TIMESTAMP)"
  - source: ali
"#,
        &[
            &format!("10:15: unknown column \"nope\"; columns at this step are: visitor, email, seen_at, {META}"),
            "5:5: column \"zip\" is string in source \"crm\" but int64 in source \"pms\"; a column has one type in the table: add a cast step to the steps of \"pms\" (cast: {zip: string})",
            // city has no type after its problem, and every string is a string (tier): no message;
            // timestamps of another unit are told apart by their Arrow types
            "6:5: column \"updated_at\" is Timestamp(µs, \"UTC\") in source \"crm\" but Timestamp(ns) in source \"web\"; a column has one type in the table: add a cast step to the steps of \"web\" (cast: {updated_at: timestamp})",
            "15:5: source \"ali\": its contract's resolve value \"conflict_fields\" takes the name of a provenance column ingot maintains; name it otherwise with \"as:\" in contract \"ali\"",
        ],
    );
}

/// A two-source file reading `k_base` then `other` (`namespace` on the second when given).
fn key_pair(other: &str, namespace: Option<&str>) -> String {
    let ns = namespace
        .map(|n| format!("    key_namespace: {n}\n"))
        .unwrap_or_default();
    // the key column keeps one type in the table
    let cast = if other == "k_type" {
        "    steps:\n      - cast: {id: string}\n"
    } else {
        ""
    };
    format!("table: guests\nversion: 1\nsources:\n  - source: k_base\n  - source: {other}\n{ns}{cast}")
}

#[test]
fn sources_of_one_key_namespace_must_build_the_same_fingerprint() {
    let msg = |other: &str, diff: &str| {
        format!(
            "5:13: sources \"k_base\" and \"{other}\" do not build the same natural_key_fingerprint: {diff}; the candidates of one record would never meet. Give both contracts the same natural key, or set key_namespace on one to keep their keys apart"
        )
    };
    for (other, diff) in [
        ("k_version", "key version 1 vs 2"),
        ("k_arity", "key arity 1 vs 2"),
        ("k_type", "part 1 type string vs int64, part 1 normalize [trim] vs []"),
        ("k_normalize", "part 1 normalize [trim] vs [trim, upper]"),
    ] {
        assert_problems(&key_pair(other, None), &[&msg(other, diff)]);
        // a namespace of its own keeps the keys apart
        let r = rules_of(&key_pair(other, Some("own")));
        assert_eq!(sources(&r).entries[1].key_namespace.as_deref(), Some("own"));
    }
    // the same key: valid without a namespace
    let r = rules_of(&key_pair("k_same", None));
    assert_eq!(sources(&r).names(), vec!["k_base", "k_same"]);
    // entries with the same namespace are compared with each other, not with the others
    let text = "table: guests\nversion: 1\nsources:\n  - source: k_base\n  - source: k_version\n    key_namespace: a\n  - source: k_type\n    key_namespace: a\n    steps:\n      - cast: {id: string}\n";
    assert_problems(
        text,
        &[
            "7:13: sources \"k_version\" and \"k_type\" do not build the same natural_key_fingerprint: key version 2 vs 1, part 1 type string vs int64, part 1 normalize [trim] vs []; the candidates of one record would never meet. Give both contracts the same natural key, or set key_namespace on one to keep their keys apart",
        ],
    );
}

/// k_base, then k_map with `entry` (its lines after `source`).
fn mapped(entry: &str) -> String {
    format!("table: guests\nversion: 1\nsources:\n  - source: k_base\n  - source: k_map\n{entry}")
}

#[test]
fn a_shared_key_names_one_resolve_per_part_from_the_sources_own_key() {
    let r = rules_of(&mapped("    key_namespace: m\n    shared_key: [to_base]\n"));
    assert_eq!(sources(&r).entries[1].shared_key, vec!["to_base".to_string()]);
    assert!(sources(&r).entries[0].shared_key.is_empty());
    assert_problems(
        &mapped("    shared_key: [to_base]\n"),
        &[
            "6:17: shared_key maps a namespaced source's keys to the shared ones, but source \"k_map\" has no key_namespace: its keys already are the shared ones; remove shared_key or add key_namespace",
        ],
    );
    assert_problems(
        &mapped("    key_namespace: m\n    shared_key: [nope]\n"),
        &[
            "7:18: \"nope\" is not a resolve entry of contract \"k_map\"; its resolve entries are: to_base, by_other, to_int",
        ],
    );
    assert_problems(
        &mapped("    key_namespace: m\n    shared_key: [by_other]\n"),
        &[
            "7:18: resolve \"by_other\" maps from \"other\", which is not a natural_key field of \"k_map\" (id): a shared key must come from the record's own key, or two versions of one record could map apart",
        ],
    );
    assert_problems(
        &mapped("    key_namespace: m\n    shared_key: [to_int]\n"),
        &[
            "7:18: resolve \"to_int\" gives k_xref.n of type int64, but part \"id\" of the shared key is string: the fingerprints would never meet",
        ],
    );
    assert_problems(
        &mapped("    key_namespace: m\n    shared_key: [to_base, to_int]\n"),
        &[
            "7:17: shared_key of \"k_map\" names 2 resolve entries, but the shared key of \"k_base\" has 1 part(s) (id): name one resolve per part, in that order",
        ],
    );
    let all_namespaced = "table: guests\nversion: 1\nsources:\n  - source: k_base\n    key_namespace: b\n  - source: k_map\n    key_namespace: m\n    shared_key: [to_base]\n";
    assert_problems(
        all_namespaced,
        &[
            "8:17: shared_key maps keys to those of the sources without a key_namespace, and every source of this table has one",
        ],
    );
}

/// crm and pms (zip cast) with the given survivorship and conflicts sections.
fn two_sources(rest: &str) -> String {
    format!(
        "table: guests\nversion: 1\nsources:\n  - source: crm\n  - source: pms\n    steps:\n      - cast: {{zip: string}}\n{rest}"
    )
}

const COLS: &str = "guest_id, email_address, tier, city, zip, updated_at, vip, email, nights";

#[test]
fn survivorship_problems_are_located() {
    assert_problems(
        &two_sources(
            r#"survivorship:
  default: newest
  order_by: vip
  fields:
    email: most_recent
    tier: {only: web}
    nights: {most_recent: email_address}
    street: precedence
    guest_id: {latest: updated_at}
    vip: [precedence]
"#,
        ),
        &[
            // vip is crm's only, and boolean
            "10:13: order_by column \"vip\" is not a column of source \"pms\" after its steps; every source must have it (rename or set it in that source's steps)",
            "10:13: order_by column \"vip\" must be a string, integer, float, decimal, date or timestamp column to order candidates by; it is boolean",
            "9:12: default must be one of: precedence, most_recent; found \"newest\"",
            // order_by was given (with a problem): no second message for email's most_recent
            "13:18: only: \"web\" is not a source of this table; sources are: crm, pms",
            "14:27: most_recent column \"email_address\" is not a column of source \"pms\" after its steps; every source must have it (rename or set it in that source's steps)",
            &format!("15:5: unknown column \"street\" in survivorship.fields; the table's columns are: {COLS}"),
            "16:16: a survivorship rule must be one of: precedence, most_recent, {most_recent: <column>}, {only: <source>}; found \"{latest: ...}\"",
            "17:10: a survivorship rule must be one of: precedence, most_recent, {most_recent: <column>}, {only: <source>}; found a list",
        ],
    );
    assert_problems(
        &two_sources(
            r#"survivorship:
  groups:
    address: {fields: [city, zip]}
    email: {fields: [guest_id, nights]}
    Bad: {fields: [guest_id, nights]}
    again: {fields: [zip, nights], rule: {most_recent: tier}}
    lone: {fields: [tier]}
    address: {fields: [vip, email]}
    named: {fields: [updated_at, nope, updated_at]}
  fields:
    city: precedence
    nights: precedence
"#,
        ),
        &[
            "15:5: \"address\" is given twice in survivorship.groups (first at line 10)",
            "11:5: group name \"email\" is a column of the table; give the group a name of its own",
            "12:5: group name \"Bad\" must match [a-z][a-z0-9_]{0,62}",
            "13:22: column \"zip\" is already in group \"address\"; a column belongs to one group at most",
            "13:56: most_recent column \"tier\" is not a column of source \"pms\" after its steps; every source must have it (rename or set it in that source's steps)",
            "14:20: group \"lone\" needs at least 2 columns taken together; found 1 (give a lone column its rule in survivorship.fields)",
            &format!("16:34: unknown column \"nope\" in group \"named\"; the table's columns are: {COLS}"),
            "16:40: column \"updated_at\" is listed twice in group \"named\"",
            "18:5: \"city\" is in group \"address\"; its rule is the group's (set it in survivorship.groups.address)",
            // a group with a problem still holds its other fields
            "19:5: \"nights\" is in group \"again\"; its rule is the group's (set it in survivorship.groups.again)",
        ],
    );
}

#[test]
fn most_recent_needs_a_column() {
    let need = "most_recent needs a column: set survivorship.order_by or write {most_recent: <column>}";
    assert_problems(
        &two_sources(
            r#"survivorship:
  default: most_recent
  fields:
    email: most_recent
    tier: {most_recent: updated_at}
  groups:
    address: {fields: [city, zip], rule: most_recent}
"#,
        ),
        &[
            &format!("9:12: {need}"),
            &format!("14:42: {need}"),
            &format!("11:12: {need}"),
        ],
    );
    // an order_by every source has, of an orderable type; an unknown one lists the columns
    assert_problems(
        &two_sources("survivorship:\n  order_by: nights\n"),
        &[
            "9:13: order_by column \"nights\" is not a column of source \"crm\" after its steps; every source must have it (rename or set it in that source's steps)",
        ],
    );
    assert_problems(
        &two_sources("survivorship:\n  order_by: updated\n"),
        &[&format!(
            "9:13: unknown column \"updated\" for order_by; the table's columns are: {COLS}"
        )],
    );
    let r = rules_of(&two_sources(
        "survivorship:\n  order_by: zip\n  fields:\n    email: most_recent\n",
    ));
    assert_eq!(sources(&r).survivorship.fields["email"], Rule::MostRecent("zip".into()));
}

#[test]
fn conflicts_problems_are_located() {
    assert_problems(
        &two_sources(
            r#"survivorship:
  groups:
    address: {fields: [city, zip]}
conflicts:
  fields: [email, city, address, email, nope]
  same_precedence: tie
  on_conflict: ignore
"#,
        ),
        &[
            "12:19: \"city\" is in group \"address\"; name the group (\"address\") in conflicts.fields: its fields are taken together",
            "12:34: \"email\" is listed twice in conflicts.fields",
            &format!(
                "12:41: unknown field \"nope\" in conflicts.fields; the table's columns are: {COLS}; its groups are: address"
            ),
            "13:20: same_precedence must be one of: conflict, break; found \"tie\"",
            "14:16: on_conflict must be one of: hold, flag, reject, fail; found \"ignore\"",
        ],
    );
    assert_problems(
        &two_sources("conflicts:\n  fields: [street]\n  mode: x\n"),
        &[
            "10:3: unknown key \"mode\" in conflicts; valid keys are: fields, same_precedence, on_conflict",
            &format!(
                "9:12: unknown field \"street\" in conflicts.fields; the table's columns are: {COLS}; its groups are: (none)"
            ),
        ],
    );
}

#[test]
fn the_top_level_steps_see_the_merged_columns() {
    let merged = format!("{COLS}, contributing_sources, field_sources, conflict_fields, {META}");
    assert_problems(
        &two_sources(
            r#"steps:
  - set: contributing_sources
    expr: "field_sources"
  - drop: [natural_key_fingerprint, conflict_fields]
  - set: x
    expr: "shop_id"
validate:
  - name: source_conflict
    check: "email IS NOT NULL"
anomalies:
  - name: source_conflict
    when: "nights > 3"
"#,
        ),
        &[
            "9:10: column \"contributing_sources\" is a provenance column ingot maintains (which sources gave the row, and its conflicts); steps may read it but not set it",
            "11:12: column \"natural_key_fingerprint\" is a bronze column ingot maintains; steps may read it but not drop it",
            "11:37: column \"conflict_fields\" is a provenance column ingot maintains (which sources gave the row, and its conflicts); steps may read it but not drop it",
            &format!("13:11: unknown column \"shop_id\"; columns at this step are: {merged}"),
            "15:11: rule name \"source_conflict\" is reserved: ingot flags rows in conflict with it (a table with several sources); choose another name",
            "18:11: rule name \"source_conflict\" is reserved: ingot flags rows in conflict with it (a table with several sources); choose another name",
        ],
    );
}

#[test]
fn provenance_column_names_are_reserved() {
    for name in PROVENANCE_COLUMNS {
        assert!(is_reserved(name), "{name}");
    }
}

/// A rules tree of `files` (path under rules/, text) read by [`RulesSet::load`]: the problems
/// and the versions of `guests`.
fn load(files: &[(&str, &str)]) -> (Vec<String>, Vec<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let contracts_dir = dir.path().join("contracts");
    write_contracts(&contracts_dir);
    let rules_dir = dir.path().join("rules");
    for (rel, text) in files {
        let p = rules_dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let mut problems = Problems::default();
    let contracts = ContractSet::load(&contracts_dir, &mut problems);
    let rules = RulesSet::load(&rules_dir, &contracts, &mut problems);
    let got = problems.items.iter().map(|p| p.to_string()).collect();
    let versions = rules
        .tables
        .get("guests")
        .map(|t| t.keys().copied().collect())
        .unwrap_or_default();
    (got, versions, rules_dir.display().to_string())
}

#[test]
fn a_new_version_may_add_or_reorder_sources() {
    let plain = |v: u32, s: &str| format!("table: guests\nsource: {s}\nversion: {v}\n");
    let several = |v: u32, list: &[&str]| {
        let mut t = format!("table: guests\nversion: {v}\nsources:\n");
        for s in list {
            t.push_str(&format!("  - source: {s}\n"));
        }
        t
    };
    let (got, versions, _) = load(&[
        ("guests/v1.yaml", &plain(1, "crm")),
        ("guests/v2.yaml", &several(2, &["crm", "nul"])),
        ("guests/v3.yaml", &several(3, &["nul", "crm"])),
        ("guests/v4.yaml", &plain(4, "crm")),
    ]);
    assert!(got.is_empty(), "{got:#?}");
    assert_eq!(versions, vec![1, 2, 3, 4]);

    // versions reading one `source:` are still held to the same one, across sources versions
    let (got, versions, r) = load(&[
        ("guests/v1.yaml", &several(1, &["crm", "nul"])),
        ("guests/v2.yaml", &plain(2, "nul")),
        ("guests/v3.yaml", &several(3, &["crm"])),
        ("guests/v4.yaml", &plain(4, "crm")),
    ]);
    assert_eq!(
        got,
        vec![format!(
            "{r}/guests/v4.yaml:2:9: source \"crm\" differs from v2, which reads \"nul\"; every version of a table reads the same source"
        )]
    );
    assert_eq!(versions, vec![1, 2, 3]);
}
