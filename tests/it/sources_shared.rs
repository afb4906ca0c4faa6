//! A namespaced source whose `shared_key` maps its ids to the shared ones through a lookup (an
//! identifier map): mapped records meet the other source's, unmapped ones keep their namespaced
//! key, an ambiguous map (one id to two values, two ids to one value) merges nothing, and a
//! change of the map, a correction and a deletion each build incrementally what a full build
//! gives.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::sources::{CRM, FLAG, Lake, PMS, provenance, rules, s};
use crate::util::sha256_hex;

const XREF: &str = "source: xref
version: 1
format: csv
delivery: full
fields:
  - {name: pms_no, type: string, required: true, normalize: [trim, upper]}
  - {name: crm_id, type: string, required: true}
natural_key: {version: 1, fields: [pms_no, crm_id]}
";

/// pms maps its guest numbers to crm's guest ids through xref.
fn mapped_lake() -> Lake {
    let l = Lake::new(FLAG);
    assert!(CRM.contains("normalize: [trim, upper]"));
    std::fs::write(l.t.contracts().join("xref.yaml"), XREF).unwrap();
    let pms = PMS.replace(
        "natural_key: {version: 1, fields: [guest_no]}\n",
        "natural_key: {version: 1, fields: [guest_no]}\nresolve:\n  - {name: crm_guest, from: guest_no, lookup: xref, key: pms_no, value: crm_id, as: crm_guest_id, on_missing: 'null'}\n",
    );
    std::fs::write(l.t.contracts().join("pms.yaml"), pms).unwrap();
    let r = rules(1, FLAG).replace(
        "  - source: pms\n",
        "  - source: pms\n    key_namespace: pms\n    shared_key: [crm_guest]\n",
    );
    std::fs::write(l.rules.join("guests/v1.yaml"), r).unwrap();
    l
}

fn map(l: &Lake, lines: &[&str]) {
    let file = l.inbox.join(format!("xref-{}.csv", lines.len()));
    std::fs::write(&file, format!("pms_no,crm_id\n{}\n", lines.join("\n"))).unwrap();
    l.ok(&["ingest", "xref", file.to_str().unwrap()]);
}

/// Each record's key, contributing sources and email, by its `guest_id`.
fn records(l: &Lake) -> BTreeMap<String, (Value, Value, Value)> {
    l.silver()
        .into_iter()
        .map(|(g, r)| {
            (
                g,
                (
                    r["natural_key_fingerprint"].clone(),
                    provenance(&r).0,
                    r["email"].clone(),
                ),
            )
        })
        .collect()
}

fn plain(id: &str) -> Value {
    s(&sha256_hex(format!("1|{id}").as_bytes()))
}

fn namespaced(id: &str) -> Value {
    let fp = sha256_hex(format!("1|{id}").as_bytes());
    s(&sha256_hex(format!("pms|{fp}").as_bytes()))
}

const PMS_ROWS: [&str; 6] = [
    "p1,p1@x.nl,+31 1,1 Main St,Amsterdam,2026-02-01",
    "p2,p2@x.nl,+31 2,2 Side St,Utrecht,2026-02-01",
    "p3,p3@x.nl,+31 3,3 Dock,Rotterdam,2026-02-01",
    "p4,p4@x.nl,+31 4,4 Dam,Delft,2026-02-01",
    "p5,p5@x.nl,+31 5,5 Dijk,Leiden,2026-02-01",
    "p6,p6@x.nl,+31 6,6 Gracht,Gouda,2026-02-01",
];

#[test]
fn a_shared_key_merges_mapped_records_and_keeps_the_others_apart() {
    let mut l = mapped_lake();
    l.t.envs.push(("INGOT_SILVER_DELTA_LIMIT".into(), "100".into()));
    l.deliver(
        "crm",
        &[
            "c1,c1@x.nl,gold,1 Main St,Amsterdam,2026-01-01",
            "c2,c2@x.nl,silver,2 Side St,Utrecht,2026-01-01",
            "c3,c3@x.nl,bronze,3 Dock,Rotterdam,2026-01-01",
        ],
    );
    l.deliver("pms", &PMS_ROWS);
    // p1 maps to c1 (the value takes crm's key normalize: " c1" is C1); p3 and p4 both to C3
    // (ambiguous: neither merges); p5 to C9, which crm lacks; p6 twice (ambiguous); p2 not at all
    map(&l, &[" p1 , c1", "P3,C3", "P4,c3", "P5,C9", "P6,C1", "P6,C2"]);
    l.build();
    let want: BTreeMap<String, (Value, Value, Value)> = [
        ("C1", plain("C1"), json!(["crm", "pms"]), "p1@x.nl"),
        ("C2", plain("C2"), json!(["crm"]), "c2@x.nl"),
        ("C3", plain("C3"), json!(["crm"]), "c3@x.nl"),
        ("P2", namespaced("P2"), json!(["pms"]), "p2@x.nl"),
        ("P3", namespaced("P3"), json!(["pms"]), "p3@x.nl"),
        ("P4", namespaced("P4"), json!(["pms"]), "p4@x.nl"),
        ("P5", plain("C9"), json!(["pms"]), "p5@x.nl"),
        ("P6", namespaced("P6"), json!(["pms"]), "p6@x.nl"),
    ]
    .into_iter()
    .map(|(g, fp, src, email)| (g.to_string(), (fp, src, s(email))))
    .collect();
    assert_eq!(records(&l), want);
    // crm's key is the same fingerprint bronze gave it: the records met
    let crm_c1 =
        l.t.query("SELECT natural_key_fingerprint AS f FROM bronze.crm_current WHERE guest_id = 'c1'");
    assert_eq!(crm_c1[0]["f"], plain("C1"));
    // the email is most_recent: pms's is newer; the conflict on email names both candidates
    let c = &l.conflicts()[&("C1".to_string(), "email".to_string())];
    let sources: Vec<&Value> = c["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["source"])
        .collect();
    assert_eq!(sources, vec![&s("crm"), &s("pms")]);
    let explain = l.ok(&["explain", "guests"]);
    assert!(
        explain.contains("shared_key: a record that resolve crm_guest maps"),
        "{explain}"
    );
    assert!(explain.contains("sample: guest_no=p1 -> "), "{explain}");
    let doctor = l.ingot(&["doctor"]);
    assert!(doctor.status.success(), "{}", crate::util::stdout(&doctor));
    l.assert_full_equals_incremental("first build");

    // the map learns p2 -> c2 and drops p5: the build processes every record again; p2 meets c2
    map(&l, &[" p1 , c1", "P2,C2", "P3,C3", "P4,c3", "P6,C1", "P6,C2"]);
    l.build();
    let now = records(&l);
    assert_eq!(now["C2"], (plain("C2"), json!(["crm", "pms"]), s("p2@x.nl")));
    assert_eq!(now["P5"].0, namespaced("P5"));
    assert!(!now.contains_key("P2"), "p2's namespaced record is gone: {now:?}");
    assert_eq!(now.len(), 7, "{now:?}");
    l.assert_full_equals_incremental("after the map changed");

    // pms corrects p1 and no longer has p2 (a full delivery): c1 takes the correction, c2 keeps
    // its crm candidate alone
    let mut rows = PMS_ROWS.to_vec();
    rows[0] = "p1,p1-new@x.nl,+31 1,1 Main St,Amsterdam,2026-03-01";
    rows.remove(1);
    l.deliver("pms", &rows);
    let plan: Value = serde_json::from_str(l.ok(&["build", "guests", "--dry-run", "--json"]).trim()).unwrap();
    assert_eq!(plan["kind"], json!("delta"), "{plan}");
    l.build();
    let now = records(&l);
    assert_eq!(now["C1"], (plain("C1"), json!(["crm", "pms"]), s("p1-new@x.nl")));
    assert_eq!(now["C2"], (plain("C2"), json!(["crm"]), s("c2@x.nl")));
    l.assert_full_equals_incremental("after a correction and a deletion in pms");
}
