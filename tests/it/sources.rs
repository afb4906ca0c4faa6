//! Tables fed by several sources, through the real binary: survivorship per field (precedence,
//! most_recent, only, lock-step groups), provenance columns, the conflict log, decisions that
//! apply while the candidates stay and go stale when one changes, withdrawal, `hold`,
//! `reject`, `fail`, ties at one rank, key namespaces, a full-delivery deletion and an undo in
//! one source, and incremental builds equal to full ones after every step.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::util::{TestLake, assert_ok, stderr, stdout};

pub(crate) type Row = BTreeMap<String, Value>;

pub(crate) const CRM: &str = "source: crm
version: 1
format: csv
fields:
  - {name: guest_id, type: string, required: true, normalize: [trim, upper]}
  - {name: email, type: string}
  - {name: tier, type: string}
  - {name: street, type: string}
  - {name: city, type: string}
  - {name: updated_at, type: date}
natural_key: {version: 1, fields: [guest_id]}
";

pub(crate) const PMS: &str = "source: pms
version: 1
format: csv
delivery: full
fields:
  - {name: guest_no, type: string, required: true, normalize: [trim, upper]}
  - {name: email_address, type: string}
  - {name: phone, type: string}
  - {name: street, type: string}
  - {name: city, type: string}
  - {name: changed_on, type: date}
natural_key: {version: 1, fields: [guest_no]}
";

/// Rules of `guests` with `extra` after the sources (survivorship, conflicts).
pub(crate) fn rules(version: u32, conflicts: &str) -> String {
    format!(
        "table: guests
version: {version}
sources:
  - source: crm
  - source: pms
    steps:
      - rename: {{guest_no: guest_id, email_address: email, changed_on: updated_at}}
survivorship:
  default: precedence
  order_by: updated_at
  fields:
    email: most_recent
    phone: {{only: pms}}
  groups:
    address: {{fields: [street, city]}}
conflicts:
{conflicts}
"
    )
}

pub(crate) const FLAG: &str = "  fields: [email, address]\n  on_conflict: flag\n";

pub(crate) struct Lake {
    pub(crate) t: TestLake,
    pub(crate) rules: PathBuf,
    pub(crate) inbox: PathBuf,
    n: usize,
    /// Run every command on this cluster (with the placement trace on).
    cluster: Option<String>,
}

impl Lake {
    pub(crate) fn new(conflicts: &str) -> Lake {
        let t = TestLake::new();
        std::fs::write(t.contracts().join("crm.yaml"), CRM).unwrap();
        std::fs::write(t.contracts().join("pms.yaml"), PMS).unwrap();
        let rules = t.dir.path().join("rules");
        let inbox = t.dir.path().join("inbox");
        std::fs::create_dir_all(&inbox).unwrap();
        let l = Lake {
            t,
            rules,
            inbox,
            n: 0,
            cluster: None,
        };
        l.write_rules(1, conflicts);
        l
    }

    pub(crate) fn write_rules(&self, version: u32, conflicts: &str) {
        let dir = self.rules.join("guests");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("v{version}.yaml")), rules(version, conflicts)).unwrap();
    }

    pub(crate) fn ingot(&self, args: &[&str]) -> std::process::Output {
        let mut c = self.t.command();
        c.arg("--rules").arg(&self.rules);
        if let Some(url) = &self.cluster {
            c.arg("--cluster").arg(url).env("INGOT_CLUSTER_TRACE", "1");
        }
        c.args(args).output().unwrap()
    }

    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let out = self.ingot(args);
        assert_ok(&out);
        stdout(&out)
    }

    /// Deliver `lines` (after the header) as a file of `source`; returns its run id.
    pub(crate) fn deliver(&mut self, source: &str, lines: &[&str]) -> String {
        let header = match source {
            "crm" => "guest_id,email,tier,street,city,updated_at",
            _ => "guest_no,email_address,phone,street,city,changed_on",
        };
        self.n += 1;
        let file = self.inbox.join(format!("{source}-{:03}.csv", self.n));
        std::fs::write(&file, format!("{header}\n{}\n", lines.join("\n"))).unwrap();
        self.ok(&["ingest", source, file.to_str().unwrap()]);
        let runs = self.t.query(&format!(
            "SELECT run_id FROM audit.ingestion_run_log WHERE source = '{source}' ORDER BY commit_seq DESC LIMIT 1"
        ));
        runs[0]["run_id"].as_str().unwrap().to_string()
    }

    pub(crate) fn build(&self) {
        self.ok(&["build", "guests"]);
    }

    /// `ingot resolve guests FP --field F --take S --reason R`; the decision's id.
    pub(crate) fn decide(&self, fp: &str, field: &str, take: &str, reason: &str) -> String {
        let out = self.ok(&[
            "resolve", "guests", fp, "--field", field, "--take", take, "--reason", reason,
        ]);
        out.split_whitespace().nth(1).unwrap().trim_end_matches(':').to_string()
    }

    /// silver.guests by guest, without the build id.
    pub(crate) fn silver(&self) -> BTreeMap<String, Row> {
        self.t
            .query("SELECT * FROM silver.guests")
            .into_iter()
            .map(|mut r| {
                r.remove("silver_build_id");
                (r["guest_id"].as_str().unwrap().trim().to_uppercase(), r)
            })
            .collect()
    }

    pub(crate) fn latest_build(&self) -> Row {
        self.t
            .query("SELECT * FROM audit.silver_build_log WHERE \"table\" = 'guests' ORDER BY commit_seq DESC LIMIT 1")
            .remove(0)
    }

    /// The conflicts the table holds now (its latest build's), by guest and field.
    pub(crate) fn conflicts(&self) -> BTreeMap<(String, String), Row> {
        let b = self.latest_build();
        let fps = self.fingerprints();
        self.t
            .query(&format!(
                "SELECT * FROM audit.source_conflict_log WHERE build_id = '{}'",
                b["build_id"].as_str().unwrap()
            ))
            .into_iter()
            .map(|r| {
                let fp = r["natural_key_fingerprint"].as_str().unwrap();
                let guest = fps
                    .iter()
                    .find(|(_, f)| f.as_str() == fp)
                    .map(|(g, _)| g.clone())
                    .unwrap();
                ((guest, r["field"].as_str().unwrap().to_string()), r)
            })
            .collect()
    }

    pub(crate) fn fingerprints(&self) -> BTreeMap<String, String> {
        self.t
            .query("SELECT guest_id, natural_key_fingerprint FROM silver.guests")
            .into_iter()
            .map(|r| {
                (
                    r["guest_id"].as_str().unwrap().trim().to_uppercase(),
                    r["natural_key_fingerprint"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    pub(crate) fn row_hash(&self, source: &str, key: &str) -> String {
        let col = if source == "crm" { "guest_id" } else { "guest_no" };
        let r = self.t.query(&format!(
            "SELECT row_hash FROM bronze.{source}_current WHERE normalize_text({col}, 'trim,upper') = '{key}'"
        ));
        r[0]["row_hash"].as_str().unwrap().to_string()
    }

    /// A full build of the same lake (in a copy) gives the same rows and conflicts.
    pub(crate) fn assert_full_equals_incremental(&self, context: &str) {
        let copy = tempfile::tempdir().unwrap();
        copy_dir(self.t.dir.path(), copy.path());
        let other = Lake {
            rules: copy.path().join("rules"),
            inbox: copy.path().join("inbox"),
            t: TestLake {
                dir: copy,
                envs: Vec::new(),
                lake_url: None,
            },
            n: 0,
            cluster: None,
        };
        let before = self.silver();
        let conflicts = strip(self.conflicts());
        other.ok(&["build", "guests", "--full"]);
        assert_eq!(
            other.silver(),
            before,
            "{context}: a full build differs from the incremental one"
        );
        assert_eq!(
            strip(other.conflicts()),
            conflicts,
            "{context}: conflicts of a full build differ"
        );
    }
}

/// Conflict rows without the columns that name the build.
fn strip(c: BTreeMap<(String, String), Row>) -> BTreeMap<(String, String), Row> {
    c.into_iter()
        .map(|(k, mut r)| {
            r.remove("build_id");
            (k, r)
        })
        .collect()
}

fn copy_dir(from: &Path, to: &Path) {
    for e in walk(from) {
        let rel = e.strip_prefix(from).unwrap();
        let dest = to.join(rel);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&e, &dest).unwrap();
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

pub(crate) fn s(v: &str) -> Value {
    json!(v)
}

/// The expected provenance of a row: contributing sources and field_sources (none: null).
pub(crate) fn provenance(r: &Row) -> (Value, Value, Value) {
    (
        r.get("contributing_sources").cloned().unwrap_or(Value::Null),
        r.get("field_sources").cloned().unwrap_or(Value::Null),
        r.get("conflict_fields").cloned().unwrap_or(Value::Null),
    )
}

#[test]
fn two_sources_survive_field_by_field_and_conflicts_are_decided() {
    let mut l = Lake::new(FLAG);
    let crm1 = l.deliver(
        "crm",
        &[
            "g1,a@x.nl,gold,1 Main St,Amsterdam,2026-01-01",
            "g2,b@x.nl,silver,2 Side St,Utrecht,2026-01-05",
        ],
    );
    let pms1 = l.deliver(
        "pms",
        &[
            " G1 ,a2@x.nl,+31 1,1 Main St,Amsterdam,2026-02-01",
            "g3,c@x.nl,+31 3,3 Dock,Rotterdam,2026-01-02",
        ],
    );
    // the plan counts records, not candidates (g1 has two)
    let plan: Value = serde_json::from_str(l.ok(&["build", "guests", "--dry-run", "--json"]).trim()).unwrap();
    assert_eq!(plan["process"], json!(3), "{plan}");
    l.build();
    let rows = l.silver();
    assert_eq!(rows.len(), 3, "{rows:?}");
    // g1: email most_recent (pms's is later, and differs: a listed conflict, flagged), tier
    // from crm only, phone only from pms, the address group from crm (precedence; same values)
    let g1 = &rows["G1"];
    assert_eq!(g1["email"], s("a2@x.nl"));
    assert_eq!(g1["tier"], s("gold"));
    assert_eq!(g1["phone"], s("+31 1"));
    assert_eq!((&g1["street"], &g1["city"]), (&s("1 Main St"), &s("Amsterdam")));
    assert_eq!(
        provenance(g1),
        (
            json!(["crm", "pms"]),
            json!([{"field": "email", "source": "pms"}, {"field": "phone", "source": "pms"}]),
            json!(["email"])
        )
    );
    assert_eq!(g1["anomaly_flags"], json!(["source_conflict"]));
    assert_eq!(
        g1["ingestion_run_id"],
        s(&crm1),
        "lineage names the first contributing source's run"
    );
    assert_eq!(g1["row_hash"], s(&l.row_hash("crm", "G1")));
    // g2 and g3 have one source: its values; a field only the other gives is null
    let g2 = &rows["G2"];
    assert_eq!((&g2["email"], &g2["tier"]), (&s("b@x.nl"), &s("silver")));
    assert!(g2.get("phone").is_none_or(Value::is_null), "{g2:?}");
    assert_eq!(provenance(g2), (json!(["crm"]), json!([]), Value::Null));
    assert_eq!(g2["anomaly_flags"], json!([]));
    let g3 = &rows["G3"];
    assert!(g3.get("tier").is_none_or(Value::is_null));
    assert_eq!((&g3["phone"], &g3["ingestion_run_id"]), (&s("+31 3"), &s(&pms1)));
    assert_eq!(provenance(g3), (json!(["pms"]), json!([]), Value::Null));

    // the conflict log: one open conflict with both candidates
    let c = l.conflicts();
    assert_eq!(
        c.keys().cloned().collect::<Vec<_>>(),
        vec![("G1".to_string(), "email".to_string())]
    );
    let c1 = &c[&("G1".into(), "email".into())];
    assert_eq!(c1["status"], s("open"));
    assert_eq!(c1["kind"], s("listed"));
    assert_eq!(c1["taken_source"], s("pms"));
    assert_eq!(
        c1["candidates"],
        json!([
            {"source": "crm", "ingestion_run_id": crm1, "row_hash": l.row_hash("crm", "G1"), "value": "a@x.nl"},
            {"source": "pms", "ingestion_run_id": pms1, "row_hash": l.row_hash("pms", "G1"), "value": "a2@x.nl"},
        ])
    );
    let hash = candidate_set_hash("email", &[("crm", &[Some("a@x.nl")]), ("pms", &[Some("a2@x.nl")])]);
    assert_eq!(c1["candidate_set_hash"], s(&hash), "the documented formula");
    let b = l.latest_build();
    assert_eq!((&b["conflicts_open"], &b["conflicts_decided"]), (&json!(1), &json!(0)));
    l.assert_full_equals_incremental("first build");

    // a decision: crm's email, applied while the candidates stay as they are
    let fp = l.fingerprints()["G1"].clone();
    let out = l.ok(&[
        "resolve",
        "guests",
        &fp[..12],
        "--field",
        "email",
        "--take",
        "crm",
        "--reason",
        "CRM is the master",
        "--by",
        "ana",
    ]);
    assert!(out.contains("takes email from crm"), "{out}");
    let again = l.ok(&[
        "resolve",
        "guests",
        &fp,
        "--field",
        "email",
        "--take",
        "crm",
        "--reason",
        "CRM is the master",
        "--by",
        "ana",
    ]);
    assert!(again.contains("nothing recorded"), "{again}");
    let decisions = l.t.query("SELECT * FROM audit.source_conflict_decision_log");
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    let d = &decisions[0];
    assert_eq!(
        (
            &d["natural_key_fingerprint"],
            &d["field"],
            &d["take_source"],
            &d["candidate_set_hash"],
            &d["decided_by"]
        ),
        (&s(&fp), &s("email"), &s("crm"), &s(&hash), &s("ana"))
    );
    let decision = d["decision_id"].as_str().unwrap().to_string();
    l.build();
    let g1 = &l.silver()["G1"];
    assert_eq!(g1["email"], s("a@x.nl"));
    assert_eq!(provenance(g1).1, json!([{"field": "phone", "source": "pms"}]));
    assert_eq!(provenance(g1).2, Value::Null);
    assert_eq!(g1["anomaly_flags"], json!([]));
    let c1 = &l.conflicts()[&("G1".into(), "email".into())];
    assert_eq!(
        (&c1["status"], &c1["decision_id"], &c1["taken_source"]),
        (&s("decided"), &s(&decision), &s("crm"))
    );
    let b = l.latest_build();
    assert_eq!((&b["conflicts_open"], &b["conflicts_decided"]), (&json!(0), &json!(1)));
    l.assert_full_equals_incremental("after the decision");

    // pms changes its email again: the decision is stale, the conflict open again
    let pms2 = l.deliver(
        "pms",
        &[
            "g1,a3@x.nl,+31 1,1 Main St,Amsterdam,2026-03-01",
            "g3,c@x.nl,+31 3,3 Dock,Rotterdam,2026-01-02",
        ],
    );
    l.build();
    let g1 = &l.silver()["G1"];
    assert_eq!(g1["email"], s("a3@x.nl"));
    assert_eq!(g1["anomaly_flags"], json!(["source_conflict"]));
    let c1 = &l.conflicts()[&("G1".into(), "email".into())];
    assert_eq!((&c1["status"], &c1["stale_decision_id"]), (&s("open"), &s(&decision)));
    assert_eq!(c1["candidates"][1]["ingestion_run_id"], s(&pms2));
    let b = l.latest_build();
    assert_eq!((&b["conflicts_open"], &b["decisions_stale"]), (&json!(1), &json!(1)));
    l.assert_full_equals_incremental("after a stale decision");

    // decide again, then withdraw it: the conflict is open again
    let id = l.decide(&fp, "email", "crm", "still CRM");
    l.build();
    assert_eq!(l.silver()["G1"]["email"], s("a@x.nl"));
    let undone = l.ok(&["undo", &id]);
    assert!(undone.contains("withdrew decision"), "{undone}");
    let twice = l.ok(&["undo", &id]);
    assert!(twice.contains("withdrawn already"), "{twice}");
    l.build();
    assert_eq!(l.silver()["G1"]["email"], s("a3@x.nl"));
    assert_eq!(l.conflicts()[&("G1".into(), "email".into())]["status"], s("open"));
    l.assert_full_equals_incremental("after a withdrawal");

    // a full delivery of pms without g1: the row stays, from crm alone
    l.deliver("pms", &["g3,c@x.nl,+31 3,3 Dock,Rotterdam,2026-01-02"]);
    l.build();
    let rows = l.silver();
    let g1 = &rows["G1"];
    assert_eq!((&g1["email"], &g1["tier"]), (&s("a@x.nl"), &s("gold")));
    assert!(g1.get("phone").is_none_or(Value::is_null));
    assert_eq!(provenance(g1), (json!(["crm"]), json!([]), Value::Null));
    assert!(l.conflicts().is_empty());
    l.assert_full_equals_incremental("after a deletion in one source");

    // undo of crm's run: g1 and g2 go; g3 stays
    l.ok(&["undo", &crm1]);
    l.build();
    let rows = l.silver();
    assert_eq!(rows.keys().cloned().collect::<Vec<_>>(), vec!["G3".to_string()]);
    l.assert_full_equals_incremental("after an undo in one source");
}

/// The documented candidate set hash, computed here from the formula.
fn candidate_set_hash(field: &str, candidates: &[(&str, &[Option<&str>])]) -> String {
    let mut text = format!("{field}\n");
    let mut sorted = candidates.to_vec();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    for (source, values) in sorted {
        text.push_str(source);
        text.push('\n');
        for v in values {
            match v {
                None => text.push_str("-\n"),
                Some(v) => text.push_str(&format!("{}:{v}\n", v.len())),
            }
        }
    }
    crate::util::sha256_hex(text.as_bytes())
}

#[test]
fn hold_keeps_the_previous_winner_until_a_person_decides() {
    let mut l = Lake::new("  fields: [email, address]\n  on_conflict: hold\n");
    l.deliver("crm", &["g1,a@x.nl,gold,1 Main St,Amsterdam,2026-01-01"]);
    l.build();
    assert_eq!(l.silver()["G1"]["email"], s("a@x.nl"));
    // pms brings a later, different email and address: most_recent would take pms's email, the
    // group crm's (precedence); hold keeps what silver had: crm for both
    l.deliver("pms", &["g1,z@x.nl,+31 1,9 New St,Haarlem,2026-02-01"]);
    l.build();
    let g1 = &l.silver()["G1"];
    assert_eq!(
        (&g1["email"], &g1["street"], &g1["city"]),
        (&s("a@x.nl"), &s("1 Main St"), &s("Amsterdam"))
    );
    assert_eq!(provenance(g1).2, json!(["email", "address"]));
    assert_eq!(g1["anomaly_flags"], json!(["source_conflict"]));
    let c = l.conflicts();
    assert_eq!(c[&("G1".into(), "email".into())]["taken_source"], s("crm"));
    assert_eq!(c[&("G1".into(), "address".into())]["taken_source"], s("crm"));
    assert_eq!(
        c[&("G1".into(), "address".into())]["candidates"][1]["value"],
        s("{\"street\":\"9 New St\",\"city\":\"Haarlem\"}")
    );
    // a rebuild that changes nothing else keeps holding
    l.assert_full_equals_incremental("hold");
    // a key new to the table in conflict: the survivorship winner (pms's later email)
    l.deliver(
        "crm",
        &[
            "g1,a@x.nl,gold,1 Main St,Amsterdam,2026-01-01",
            "g5,e@x.nl,gold,5 A,Ams,2026-01-01",
        ],
    );
    l.deliver(
        "pms",
        &[
            "g1,z@x.nl,+31 1,9 New St,Haarlem,2026-02-01",
            "g5,f@x.nl,+31 5,5 A,Ams,2026-03-01",
        ],
    );
    l.build();
    let rows = l.silver();
    assert_eq!(rows["G5"]["email"], s("f@x.nl"));
    assert_eq!(rows["G1"]["email"], s("a@x.nl"), "still held");
    // deciding for pms releases the hold on that field
    let fp = l.fingerprints()["G1"].clone();
    l.ok(&[
        "resolve", "guests", &fp, "--field", "email", "--take", "pms", "--reason", "moved",
    ]);
    l.build();
    let g1 = &l.silver()["G1"];
    assert_eq!(g1["email"], s("z@x.nl"));
    assert_eq!(provenance(g1).2, json!(["address"]));
    l.assert_full_equals_incremental("hold after a decision");
}

#[test]
fn reject_sends_the_record_to_the_failure_log_and_fail_fails_the_build() {
    let mut l = Lake::new("  fields: [email]\n  on_conflict: reject\n");
    l.deliver(
        "crm",
        &[
            "g1,a@x.nl,gold,1 Main St,Amsterdam,2026-01-01",
            "g2,b@x.nl,gold,2 B,Ams,2026-01-01",
        ],
    );
    l.deliver(
        "pms",
        &[
            "g1,z@x.nl,+31 1,1 Main St,Amsterdam,2026-02-01",
            "g2,b@x.nl,+31 2,2 B,Ams,2026-02-01",
        ],
    );
    l.build();
    let rows = l.silver();
    assert_eq!(
        rows.keys().cloned().collect::<Vec<_>>(),
        vec!["G2".to_string()],
        "g1 rejected, g2 agrees"
    );
    let failures = l.t.query("SELECT * FROM audit.row_failure_log WHERE layer = 'silver'");
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0]["rule"], s("source_conflict"));
    assert_eq!(
        failures[0]["source"],
        s("crm"),
        "the record's first contributing source"
    );
    let reason = failures[0]["reason"].as_str().unwrap();
    assert!(reason.contains("email: crm a@x.nl vs pms z@x.nl"), "{reason}");
    let b = l.latest_build();
    assert_eq!((&b["rows_rejected"], &b["conflicts_open"]), (&json!(1), &json!(1)));
    // the conflict is logged, nothing was taken
    let fps =
        l.t.query("SELECT natural_key_fingerprint FROM bronze.crm_current WHERE guest_id = 'g1'");
    let log = l.t.query("SELECT * FROM audit.source_conflict_log");
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["natural_key_fingerprint"], fps[0]["natural_key_fingerprint"]);
    assert!(log[0].get("taken_source").is_none_or(Value::is_null));
    // deciding lets it in
    let fp = fps[0]["natural_key_fingerprint"].as_str().unwrap().to_string();
    l.ok(&[
        "resolve", "guests", &fp, "--field", "email", "--take", "crm", "--reason", "master",
    ]);
    l.build();
    assert_eq!(l.silver()["G1"]["email"], s("a@x.nl"));

    // on_conflict: fail (v2): a new conflict fails the build, nothing is published
    l.write_rules(2, "  fields: [email]\n  on_conflict: fail\n");
    l.deliver(
        "pms",
        &[
            "g1,z@x.nl,+31 1,1 Main St,Amsterdam,2026-02-01",
            "g2,q@x.nl,+31 2,2 B,Ams,2026-02-01",
        ],
    );
    let before = l.silver();
    let out = l.ingot(&["build", "guests"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(said.contains("source_conflict") && said.contains("q@x.nl"), "{said}");
    assert_eq!(l.silver(), before, "a failed build publishes nothing");
}

#[test]
fn peers_at_one_rank_conflict_unless_ties_are_broken() {
    let mut l = Lake::new("  same_precedence: conflict\n  on_conflict: flag\n");
    let dir = l.rules.join("guests");
    let peers = rules(1, "  same_precedence: conflict\n  on_conflict: flag\n")
        .replace("  - source: crm\n", "  - source: crm\n    rank: 1\n")
        .replace("  - source: pms\n", "  - source: pms\n    rank: 1\n");
    std::fs::write(dir.join("v1.yaml"), &peers).unwrap();
    // same rank, same updated_at: tier/street differ? tier is crm-only; the address group ties
    l.deliver("crm", &["g1,a@x.nl,gold,1 Main St,Amsterdam,2026-01-01"]);
    l.deliver("pms", &["g1,a@x.nl,+31 1,7 Other St,Amsterdam,2026-01-01"]);
    l.build();
    let g1 = &l.silver()["G1"];
    assert_eq!(
        provenance(g1).2,
        json!(["address"]),
        "a tie at one rank with different values"
    );
    // the tie-break takes the first source by name (crm) for the flagged value
    assert_eq!(g1["street"], s("1 Main St"));
    assert_eq!(l.conflicts()[&("G1".into(), "address".into())]["kind"], s("tie"));
    // same_precedence: break (v2) and a rebuild of v1's rows: no conflict, the same winner
    std::fs::write(
        dir.join("v2.yaml"),
        peers
            .replace("version: 1", "version: 2")
            .replace("same_precedence: conflict", "same_precedence: break"),
    )
    .unwrap();
    l.ok(&["build", "guests", "--rebuild-where", "rules_version < 2"]);
    let g1 = &l.silver()["G1"];
    assert_eq!((&g1["street"], &g1["rules_version"]), (&s("1 Main St"), &json!(2)));
    assert_eq!(provenance(g1).2, Value::Null);
    assert!(l.conflicts().is_empty());
}

#[test]
fn a_precedence_change_switches_winners_only_where_rebuilt() {
    let mut l = Lake::new(FLAG);
    l.deliver("crm", &["g1,a@x.nl,gold,1 Main St,Amsterdam,2026-01-01"]);
    l.deliver("pms", &["g1,a@x.nl,+31 1,9 New St,Haarlem,2026-01-01"]);
    l.build();
    assert_eq!(l.silver()["G1"]["street"], s("1 Main St"));
    // v2 puts pms first: an incremental build leaves v1's row alone
    let v2 = rules(2, FLAG).replace(
        "  - source: crm\n  - source: pms\n    steps:\n      - rename: {guest_no: guest_id, email_address: email, changed_on: updated_at}\n",
        "  - source: pms\n    steps:\n      - rename: {guest_no: guest_id, email_address: email, changed_on: updated_at}\n  - source: crm\n",
    );
    assert_ne!(v2, rules(2, FLAG));
    std::fs::write(l.rules.join("guests/v2.yaml"), v2).unwrap();
    l.build();
    let g1 = &l.silver()["G1"];
    assert_eq!((&g1["street"], &g1["rules_version"]), (&s("1 Main St"), &json!(1)));
    l.ok(&["build", "guests", "--rebuild-where", "rules_version < 2"]);
    let g1 = &l.silver()["G1"];
    assert_eq!(
        (&g1["street"], &g1["city"], &g1["rules_version"]),
        (&s("9 New St"), &s("Haarlem"), &json!(2))
    );
    assert_eq!(provenance(g1).0, json!(["pms", "crm"]));
    // the address conflict (listed) is logged with pms taken
    assert_eq!(
        l.conflicts()[&("G1".into(), "address".into())]["taken_source"],
        s("pms")
    );
}

#[test]
fn a_key_namespace_keeps_equal_ids_of_two_sources_apart() {
    let mut l = Lake::new(FLAG);
    let ns = rules(1, FLAG).replace("  - source: pms\n", "  - source: pms\n    key_namespace: pms\n");
    std::fs::write(l.rules.join("guests/v1.yaml"), ns).unwrap();
    l.deliver("crm", &["g1,a@x.nl,gold,1 Main St,Amsterdam,2026-01-01"]);
    l.deliver("pms", &["g1,z@x.nl,+31 1,9 New St,Haarlem,2026-02-01"]);
    l.build();
    let rows =
        l.t.query("SELECT guest_id, natural_key_fingerprint, contributing_sources FROM silver.guests");
    assert_eq!(rows.len(), 2, "two records: {rows:?}");
    let crm_fp = l.t.query("SELECT natural_key_fingerprint AS f FROM bronze.crm_current")[0]["f"].clone();
    let pms_fp = l.t.query("SELECT natural_key_fingerprint AS f FROM bronze.pms_current")[0]["f"].clone();
    let want_pms = crate::util::sha256_hex(format!("pms|{}", pms_fp.as_str().unwrap()).as_bytes());
    let by_source: BTreeMap<String, Value> = rows
        .iter()
        .map(|r| {
            (
                r["contributing_sources"][0].as_str().unwrap().to_string(),
                r["natural_key_fingerprint"].clone(),
            )
        })
        .collect();
    assert_eq!(by_source["crm"], crm_fp);
    assert_eq!(
        by_source["pms"],
        s(&want_pms),
        "namespaced_fingerprint(ns, fp) = sha256(ns|fp)"
    );
    let sql = l.t.query(&format!(
        "SELECT namespaced_fingerprint('pms', '{}') AS f",
        pms_fp.as_str().unwrap()
    ));
    assert_eq!(sql[0]["f"], s(&want_pms));
    assert!(l.conflicts().is_empty());
    // explain prints each source's key recipe and one sample key each
    let explain = l.ok(&["explain", "guests"]);
    assert!(
        explain.contains("crm (rank 1): reads bronze.crm_current; key v1: guest_id string [trim, upper]\n"),
        "{explain}"
    );
    assert!(
        explain.contains(
            "pms (rank 2): reads bronze.pms_current; key v1: guest_no string [trim, upper], \
             namespaced_fingerprint('pms', fingerprint)"
        ),
        "{explain}"
    );
    assert!(
        explain.contains(&format!("sample: guest_id=g1 -> {}", crm_fp.as_str().unwrap())),
        "{explain}"
    );
    assert!(
        explain.contains(&format!("sample: guest_no=g1 -> {want_pms}")),
        "{explain}"
    );
}

#[test]
fn the_demo_story_two_booking_sources_and_one_decided_conflict() {
    let t = TestLake::new();
    let repo = crate::util::repo();
    std::fs::copy(
        repo.join("examples/partner/partner_bookings.yaml"),
        t.contracts().join("partner_bookings.yaml"),
    )
    .unwrap();
    let rules = t.dir.path().join("rules");
    copy_dir(&repo.join("rules"), &rules);
    copy_dir(&repo.join("examples/partner/rules"), &rules);
    let l = Lake {
        t,
        inbox: PathBuf::new(),
        rules,
        n: 0,
        cluster: None,
    };
    for (s, f) in [
        ("hotels", "hotels/2026-11-01_hotels.csv"),
        ("bookings", "bookings/2026-11-01_bookings.csv"),
    ] {
        l.ok(&["ingest", s, crate::util::landing(f).to_str().unwrap()]);
    }
    let partner = repo.join("data/partner/partner_bookings/2026-11-02_partner_bookings.csv");
    l.ok(&["ingest", "partner_bookings", partner.to_str().unwrap()]);
    l.ok(&["build", "all_bookings"]);
    let by = l.t.query(
        "SELECT array_to_string(contributing_sources, '+') AS s, count(*) AS n FROM silver.all_bookings GROUP BY 1",
    );
    let by: BTreeMap<String, Value> = by
        .into_iter()
        .map(|r| (r["s"].as_str().unwrap().to_string(), r["n"].clone()))
        .collect();
    assert_eq!(by["bookings+partner_bookings"], json!(21), "{by:?}");
    assert_eq!(by["partner_bookings"], json!(5), "{by:?}");
    let open = l.t.query(
        "SELECT b.booking_ref, c.field, c.natural_key_fingerprint AS fp, c.candidates FROM audit.source_conflict_log c \
         JOIN silver.all_bookings b USING (natural_key_fingerprint) WHERE c.status = 'open'",
    );
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(
        (&open[0]["booking_ref"], &open[0]["field"]),
        (&s("BK100018"), &s("amount"))
    );
    let values: Vec<&Value> = open[0]["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["value"])
        .collect();
    assert_eq!(values, vec![&s("558.12"), &s("568.12")]);
    let fp = open[0]["fp"].as_str().unwrap().to_string();
    l.ok(&[
        "resolve",
        "all_bookings",
        &fp,
        "--field",
        "amount",
        "--take",
        "partner_bookings",
        "--reason",
        "city tax",
    ]);
    l.ok(&["build", "all_bookings"]);
    let row = l.t.query(&format!(
        "SELECT amount, anomaly_flags FROM silver.all_bookings WHERE natural_key_fingerprint = '{fp}'"
    ));
    assert_eq!(
        (&row[0]["amount"], &row[0]["anomaly_flags"]),
        (&json!(568.12), &json!([]))
    );
    let b = l.t.query(
        "SELECT rows_read, conflicts_open, conflicts_decided FROM audit.silver_build_log \
         WHERE \"table\" = 'all_bookings' ORDER BY commit_seq DESC LIMIT 1",
    );
    assert_eq!(
        (&b[0]["rows_read"], &b[0]["conflicts_open"], &b[0]["conflicts_decided"]),
        (&json!(1), &json!(0), &json!(1))
    );
}

/// silver.guests and its conflicts, without what names a build, run ids named `source#n`.
fn state_of(l: &Lake) -> String {
    let conflicts: BTreeMap<(String, String), Row> = strip(l.conflicts())
        .into_iter()
        .map(|(k, mut r)| {
            r.remove("first_build_id");
            (k, r)
        })
        .collect();
    let mut text = format!("{:?}\n{:?}", l.silver(), conflicts);
    let decisions =
        l.t.query("SELECT decision_id FROM audit.source_conflict_decision_log ORDER BY decided_at");
    for (i, d) in decisions.iter().enumerate() {
        text = text.replace(d["decision_id"].as_str().unwrap(), &format!("decision#{i}"));
    }
    let runs =
        l.t.query("SELECT run_id, source, commit_seq FROM audit.ingestion_run_log");
    for r in runs {
        let name = format!("{}#{}", r["source"].as_str().unwrap(), r["commit_seq"]);
        text = text.replace(r["run_id"].as_str().unwrap(), &name);
    }
    text
}

fn crash_story(l: &mut Lake) {
    l.deliver(
        "crm",
        &[
            "g1,a@x.nl,gold,1 Main St,Amsterdam,2026-01-01",
            "g2,b@x.nl,gold,2 B,Ams,2026-01-01",
        ],
    );
    l.deliver(
        "pms",
        &[
            "g1,z@x.nl,+31 1,9 New St,Haarlem,2026-02-01",
            "g3,c@x.nl,+31 3,3 C,Rdam,2026-01-01",
        ],
    );
}

/// For every build failpoint: `story`, a crash there during `build guests`, then the same build
/// gives the clean lake's state (`want`), with `built` succeeded builds before it.
fn crash_at_every_build_failpoint(story: impl Fn(&mut Lake), want: &str, built: u64) {
    for point in ingot::table::failpoint::BUILD {
        let mut l = Lake::new(FLAG);
        story(&mut l);
        let out =
            l.t.command()
                .arg("--rules")
                .arg(&l.rules)
                .env("INGOT_FAILPOINT", point)
                .args(["build", "guests"])
                .output()
                .unwrap();
        assert!(
            stderr(&out).contains(&format!("failpoint {point} reached")),
            "{point}: {}",
            stderr(&out)
        );
        l.build();
        assert_eq!(state_of(&l), want, "{point}: crash + the same build");
        let builds =
            l.t.query("SELECT count(*) AS n FROM audit.silver_build_log WHERE status = 'succeeded'");
        let committed = *point == "build.after_commit";
        assert_eq!(builds[0]["n"], json!(built + if committed { 2 } else { 1 }), "{point}");
        assert_ok(&l.ingot(&["doctor"]));
    }
}

#[test]
fn a_crash_at_every_build_failpoint_then_the_same_build_equals_one_clean_build() {
    let mut clean = Lake::new(FLAG);
    crash_story(&mut clean);
    clean.build();
    crash_at_every_build_failpoint(crash_story, &state_of(&clean), 0);
}

#[test]
fn a_crash_while_deciding_then_the_same_command_records_one_decision() {
    for point in ["resolve.before_commit", "resolve.after_commit"] {
        let mut l = Lake::new(FLAG);
        crash_story(&mut l);
        l.build();
        let fp = l.fingerprints()["G1"].clone();
        let args = [
            "resolve", "guests", &fp, "--field", "email", "--take", "crm", "--reason", "master",
        ];
        let out =
            l.t.command()
                .arg("--rules")
                .arg(&l.rules)
                .env("INGOT_FAILPOINT", point)
                .args(args)
                .output()
                .unwrap();
        assert!(
            stderr(&out).contains(&format!("failpoint {point} reached")),
            "{point}: {}",
            stderr(&out)
        );
        let said = l.ok(&args);
        let n =
            l.t.query("SELECT count(*) AS n FROM audit.source_conflict_decision_log")[0]["n"].clone();
        assert_eq!(n, json!(1), "{point}: {said}");
        l.build();
        assert_eq!(l.silver()["G1"]["email"], s("a@x.nl"), "{point}");
        // a crash while withdrawing, then the same undo: withdrawn once
        let id = l.t.query("SELECT decision_id FROM audit.source_conflict_decision_log")[0]["decision_id"]
            .as_str()
            .unwrap()
            .to_string();
        let out =
            l.t.command()
                .env("INGOT_FAILPOINT", "undo.decision.before_commit")
                .args(["undo", &id])
                .output()
                .unwrap();
        assert!(!out.status.success());
        let still = l.t.query("SELECT withdrawn_at FROM audit.source_conflict_decision_log");
        assert!(still[0].get("withdrawn_at").is_none_or(Value::is_null), "{still:?}");
        l.ok(&["undo", &id]);
        let after = l.t.query("SELECT withdrawn_at FROM audit.source_conflict_decision_log");
        assert_eq!(after.len(), 1);
        assert!(!after[0]["withdrawn_at"].is_null());
        l.build();
        assert_eq!(
            l.silver()["G1"]["email"],
            s("z@x.nl"),
            "{point}: open again, most_recent"
        );
    }
}

#[test]
fn a_candidate_whose_lookup_misses_rejects_its_record() {
    let mut l = Lake::new(FLAG);
    // pms resolves a loyalty tier from a lookup source; g3's code is unknown there
    std::fs::write(
        l.t.contracts().join("tiers.yaml"),
        "source: tiers\nversion: 1\nformat: csv\nfields:\n  - {name: code, type: string, required: true}\n  - {name: label, type: string}\nnatural_key: {version: 1, fields: [code]}\n",
    )
    .unwrap();
    let pms = PMS.replace(
        "natural_key: {version: 1, fields: [guest_no]}\n",
        "natural_key: {version: 1, fields: [guest_no]}\nresolve:\n  - {name: tier, from: phone, lookup: tiers, key: code, value: label, as: pms_tier}\n",
    );
    std::fs::write(l.t.contracts().join("pms.yaml"), pms).unwrap();
    let tiers = l.inbox.join("tiers.csv");
    std::fs::write(&tiers, "code,label\n+31 1,gold\n").unwrap();
    l.ok(&["ingest", "tiers", tiers.to_str().unwrap()]);
    l.deliver(
        "crm",
        &[
            "g1,a@x.nl,gold,1 Main St,Amsterdam,2026-01-01",
            "g3,c@x.nl,gold,3 C,Rdam,2026-01-01",
        ],
    );
    l.deliver(
        "pms",
        &[
            "g1,a@x.nl,+31 1,1 Main St,Amsterdam,2026-01-01",
            "g3,c@x.nl,+31 9,3 C,Rdam,2026-01-01",
            "g7,g@x.nl,+31 7,7 G,Gouda,2026-01-01",
        ],
    );
    l.build();
    let rows = l.silver();
    assert_eq!(rows.keys().cloned().collect::<Vec<_>>(), vec!["G1".to_string()]);
    assert_eq!(rows["G1"]["pms_tier"], s("gold"));
    let f =
        l.t.query("SELECT rule, reason, source FROM audit.row_failure_log WHERE layer = 'silver' ORDER BY reason");
    assert_eq!(f.len(), 2, "{f:?}");
    // each failure names the record's first contributing source: g7 is pms's alone
    assert_eq!((&f[0]["source"], &f[1]["source"]), (&s("pms"), &s("crm")), "{f:?}");
    assert!(f[0]["reason"].as_str().unwrap().contains("+31 7"), "{f:?}");
    let f = &f[1..];
    assert_eq!(f[0]["rule"], s("resolve:tier"));
    assert!(
        f[0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("pms: no tiers row has code \"+31 9\""),
        "{f:?}"
    );
    // the lookup learns the code: the record comes in, nothing else is rebuilt wrongly
    std::fs::write(&tiers, "code,label\n+31 1,gold\n+31 9,silver\n+31 7,bronze\n").unwrap();
    l.ok(&["ingest", "tiers", tiers.to_str().unwrap()]);
    l.build();
    assert_eq!(l.silver()["G3"]["pms_tier"], s("silver"));
    l.assert_full_equals_incremental("after the lookup learned the code");
}

#[test]
fn other_engines_read_the_table_and_its_provenance_from_its_delta_log() {
    let mut l = Lake::new(FLAG);
    crash_story(&mut l);
    l.build();
    let fp = l.fingerprints()["G1"].clone();
    l.ok(&[
        "resolve", "guests", &fp, "--field", "email", "--take", "crm", "--reason", "master",
    ]);
    l.build();
    let lake = l.t.lake();
    let checks = crate::delta::lake_checks(
        lake.to_str().unwrap(),
        &["crm", "pms"],
        &["guests"],
        &["duckdb", "deltalake"],
    );
    let rules = l.rules.clone();
    let cmd = || {
        let mut c = l.t.command();
        c.arg("--rules").arg(&rules);
        c
    };
    let result = crate::delta::compare(&cmd, l.t.dir.path(), &checks, None);
    crate::delta::assert_agree(
        &result,
        &["silver.guests", "bronze.crm", "bronze.pms"],
        "a table fed by two sources",
    );
}

#[cfg(feature = "cluster")]
#[test]
fn a_build_on_a_cluster_gives_the_rows_and_conflicts_a_local_build_gives() {
    let local = Lake::new(FLAG);
    let mut remote = Lake::new(FLAG);
    let (_rt, url) = crate::cluster::loopback(&mut remote.t, ingot::engine::cluster::udfs());
    remote.cluster = Some(url);
    let mut states = Vec::new();
    for mut l in [local, remote] {
        crash_story(&mut l);
        let out = l.ingot(&["build", "guests"]);
        assert_ok(&out);
        if l.cluster.is_some() {
            let trace = stderr(&out);
            assert!(trace.contains("cluster: build: transform: on the cluster"), "{trace}");
            assert!(
                trace.contains("cluster: build: bronze fingerprints: on the cluster"),
                "{trace}"
            );
        }
        let fp = l.fingerprints()["G1"].clone();
        l.ok(&[
            "resolve", "guests", &fp, "--field", "email", "--take", "crm", "--reason", "master",
        ]);
        l.deliver(
            "pms",
            &[
                "g1,z@x.nl,+31 1,9 New St,Haarlem,2026-02-01",
                "g3,c2@x.nl,+31 3,3 C,Rdam,2026-01-01",
            ],
        );
        l.build();
        let incremental = state_of(&l);
        l.ok(&["build", "guests", "--full"]);
        let state = state_of(&l);
        assert_eq!(state, incremental, "a full build on the same lake");
        assert!(
            state.contains("decided") && state.contains("source_conflict"),
            "{state}"
        );
        states.push(state);
    }
    if states[0] != states[1] {
        let at = states[0]
            .bytes()
            .zip(states[1].bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "the cluster's lake differs from the local one at {at}:\n{}\n{}",
            &states[0][at.saturating_sub(300)..(at + 200).min(states[0].len())],
            &states[1][at.saturating_sub(300)..(at + 200).min(states[1].len())]
        );
    }
}

#[test]
fn incremental_builds_are_delta_layers_equal_to_full_builds() {
    let mut l = Lake::new(FLAG);
    // layers may replace any share of this small table
    l.t.envs.push(("INGOT_SILVER_DELTA_LIMIT".into(), "100".into()));
    l.deliver(
        "crm",
        &[
            "g1,a@x.nl,gold,1 Main St,Amsterdam,2026-01-01",
            "g2,b@x.nl,silver,2 Side St,Utrecht,2026-01-05",
            "g4,d@x.nl,bronze,4 Dam,Delft,2026-01-03",
        ],
    );
    let pms1 = l.deliver(
        "pms",
        &[
            "g1,a2@x.nl,+31 1,1 Main St,Amsterdam,2026-02-01",
            "g3,c@x.nl,+31 3,3 Dock,Rotterdam,2026-01-02",
            "g4,d@x.nl,+31 4,4 Dam,Delft,2026-01-04",
        ],
    );
    l.build();
    let plan =
        |l: &Lake| -> Value { serde_json::from_str(l.ok(&["build", "guests", "--dry-run", "--json"]).trim()).unwrap() };
    let delta_of = |p: &Value, n: u64| {
        assert_eq!((&p["kind"], &p["process"]), (&json!("delta"), &json!(n)), "{p}");
    };

    // crm corrects g1 alone: one record, its pms candidate read from pms's older run
    let crm2 = l.deliver("crm", &["g1,a@x.nl,platinum,1 Main St,Amsterdam,2026-03-01"]);
    delta_of(&plan(&l), 1);
    l.build();
    let rows = l.silver();
    let g1 = &rows["G1"];
    assert_eq!((&g1["tier"], &g1["phone"]), (&s("platinum"), &s("+31 1")));
    assert_eq!(provenance(g1).0, json!(["crm", "pms"]));
    assert_eq!(g1["ingestion_run_id"], s(&crm2));
    let c1 = &l.conflicts()[&("G1".into(), "email".into())];
    assert_eq!(c1["candidates"][0]["ingestion_run_id"], s(&crm2));
    assert_eq!(c1["candidates"][1]["ingestion_run_id"], s(&pms1));
    assert_eq!(rows.len(), 4, "{rows:?}");
    l.assert_full_equals_incremental("a correction in one source");

    // a full delivery of pms without g4: g4 stays, from crm alone
    l.deliver(
        "pms",
        &[
            "g1,a2@x.nl,+31 1,1 Main St,Amsterdam,2026-02-01",
            "g3,c@x.nl,+31 3,3 Dock,Rotterdam,2026-01-02",
        ],
    );
    delta_of(&plan(&l), 1);
    l.build();
    let g4 = &l.silver()["G4"];
    assert_eq!(provenance(g4), (json!(["crm"]), json!([]), Value::Null));
    assert!(g4.get("phone").is_none_or(Value::is_null), "{g4:?}");
    let b = l.latest_build();
    assert_eq!(b["conflicts_open"], json!(1), "g1's conflict is carried: {b:?}");
    l.assert_full_equals_incremental("a deletion in one source");

    // and then without g3, which no other source has: the row is gone
    l.deliver("pms", &["g1,a2@x.nl,+31 1,1 Main St,Amsterdam,2026-02-01"]);
    delta_of(&plan(&l), 0);
    l.build();
    let rows = l.silver();
    assert!(!rows.contains_key("G3"), "{rows:?}");
    assert_eq!(rows.len(), 3, "{rows:?}");
    l.assert_full_equals_incremental("a deletion of the last candidate");

    // a decision alone, with no new run: a delta layer of its record
    let fp = l.fingerprints()["G1"].clone();
    let id = l.decide(&fp, "email", "pms", "PMS checked it");
    delta_of(&plan(&l), 1);
    l.build();
    // (crm's email is the later one, so the decision changes the winner)
    assert_eq!(l.silver()["G1"]["email"], s("a2@x.nl"));
    assert_eq!(l.conflicts()[&("G1".into(), "email".into())]["status"], s("decided"));
    l.assert_full_equals_incremental("a decision");

    // withdrawn: the conflict is open again
    l.ok(&["undo", &id]);
    delta_of(&plan(&l), 1);
    l.build();
    assert_eq!(l.silver()["G1"]["email"], s("a@x.nl"));
    assert_eq!(l.conflicts()[&("G1".into(), "email".into())]["status"], s("open"));
    l.assert_full_equals_incremental("a withdrawal");

    // nothing since: the same table
    assert_eq!(plan(&l)["process"], json!(0));
    let manifest = l.latest_build();
    l.build();
    assert_eq!(l.latest_build()["rows_written"], json!(0), "{manifest:?}");
}

#[test]
fn a_crash_at_every_failpoint_of_a_delta_build_then_the_same_build_equals_one_clean_build() {
    let story = |l: &mut Lake| {
        l.t.envs.push(("INGOT_SILVER_DELTA_LIMIT".into(), "100".into()));
        crash_story(l);
        l.build();
        // g1 changes in crm; its pms candidate stays where it was
        l.deliver("crm", &["g1,a@x.nl,platinum,1 Main St,Amsterdam,2026-03-01"]);
    };
    let mut clean = Lake::new(FLAG);
    story(&mut clean);
    let plan: Value = serde_json::from_str(clean.ok(&["build", "guests", "--dry-run", "--json"]).trim()).unwrap();
    assert_eq!(plan["kind"], json!("delta"), "{plan}");
    clean.build();
    crash_at_every_build_failpoint(story, &state_of(&clean), 1);
}

#[test]
fn a_build_under_a_small_memory_limit_decides_the_shared_records_within_it() {
    // 10,000 records in both sources, each with a listed conflict: the survivorship sort gets
    // a share of the 32 MiB pool beside the writers, and spills rather than fail
    let mut l = Lake::new(FLAG);
    let crm: Vec<String> = (0..20_000)
        .map(|i| format!("g{i},e{i}@x.nl,gold,{i} Main St,Amsterdam,2026-01-01"))
        .collect();
    let pms: Vec<String> = (10_000..30_000)
        .map(|i| format!("g{i},f{i}@x.nl,+31 {i},{i} Main St,Amsterdam,2026-02-01"))
        .collect();
    l.deliver("crm", &crm.iter().map(String::as_str).collect::<Vec<_>>());
    l.deliver("pms", &pms.iter().map(String::as_str).collect::<Vec<_>>());
    let out = l.ingot(&["--memory-limit", "32M", "build", "guests"]);
    assert_ok(&out);
    let counts = l.t.query(
        "SELECT count(*) AS n, count(*) FILTER (WHERE cardinality(contributing_sources) = 2) AS both, \
         count(*) FILTER (WHERE email LIKE 'f%') AS pms_email FROM silver.guests",
    );
    assert_eq!(
        (&counts[0]["n"], &counts[0]["both"], &counts[0]["pms_email"]),
        (&json!(30_000), &json!(10_000), &json!(20_000)),
        "{counts:?}"
    );
    let b = l.latest_build();
    assert_eq!(b["conflicts_open"], json!(10_000), "{b:?}");
    l.assert_full_equals_incremental("under a small memory limit");
    // the candidates met in memory, or (none may wait) all of them through the sort that
    // spills: the same rows and conflicts
    let (met, met_conflicts) = (l.silver(), strip(l.conflicts()));
    let out =
        l.t.command()
            .arg("--rules")
            .arg(&l.rules)
            .env("INGOT_SURVIVORSHIP_MEMORY", "1")
            .args(["--memory-limit", "32M", "build", "guests", "--full"])
            .output()
            .unwrap();
    assert_ok(&out);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("did not fit in the survivorship's memory"), "{said}");
    assert_eq!(l.silver(), met, "the sorted candidates give other rows");
    assert_eq!(
        strip(l.conflicts()),
        met_conflicts,
        "the sorted candidates give other conflicts"
    );
}

#[test]
fn both_paths_of_the_shared_records_give_the_same_table() {
    // A plan that reads its input once splits each source's candidates as it reads them (one
    // read); a `filter` step reads the input twice, so there the shared records' candidates are
    // read a second time instead. The same bronze gives the same rows and conflicts either way.
    let mut l = Lake::new(FLAG);
    let dir = l.rules.join("guests_f");
    std::fs::create_dir_all(&dir).unwrap();
    let filtered = rules(1, &format!("{FLAG}steps:\n  - filter: \"guest_id <> 'g0'\"\n"));
    std::fs::write(
        dir.join("v1.yaml"),
        filtered.replace("table: guests", "table: guests_f"),
    )
    .unwrap();
    let crm: Vec<String> = (0..300)
        .map(|i| format!("g{i},e{i}@x.nl,gold,{i} Main St,Amsterdam,2026-01-0{}", 1 + i % 3))
        .collect();
    let pms: Vec<String> = (200..500)
        .map(|i| {
            let email = if i % 2 == 0 {
                format!("e{i}@x.nl")
            } else {
                format!("f{i}@x.nl")
            };
            format!("g{i},{email},+31 {i},{i} Main St,Utrecht,2026-01-0{}", 1 + i % 4)
        })
        .collect();
    l.deliver("crm", &crm.iter().map(String::as_str).collect::<Vec<_>>());
    l.deliver("pms", &pms.iter().map(String::as_str).collect::<Vec<_>>());
    l.build();
    l.ok(&["build", "guests_f"]);
    let rows = |table: &str| -> BTreeMap<String, Row> {
        l.t.query(&format!("SELECT * FROM silver.{table}"))
            .into_iter()
            .map(|mut r| {
                r.remove("silver_build_id");
                (r["guest_id"].as_str().unwrap().to_string(), r)
            })
            .collect()
    };
    let (mut once, twice) = (rows("guests"), rows("guests_f"));
    assert!(once.remove("g0").is_some());
    assert_eq!(once.len(), 499);
    assert_eq!(once, twice, "the table of one read differs from the table of two");
    let both = twice
        .values()
        .filter(|r| r["contributing_sources"].as_array().unwrap().len() == 2)
        .count();
    assert_eq!(both, 100);
    let conflicts = |table: &str| -> Vec<Row> {
        l.t.query(&format!(
            "SELECT natural_key_fingerprint, field, candidates, candidate_set_hash, taken_source, status \
             FROM audit.source_conflict_log WHERE \"table\" = '{table}' ORDER BY natural_key_fingerprint, field"
        ))
    };
    let g0 = once_fp(&l);
    let once_c: Vec<Row> = conflicts("guests")
        .into_iter()
        .filter(|r| r["natural_key_fingerprint"] != g0)
        .collect();
    assert_eq!(once_c.len(), 150, "100 addresses and 50 emails differ");
    assert_eq!(once_c, conflicts("guests_f"));
}

/// g0's fingerprint in bronze.crm.
fn once_fp(l: &Lake) -> Value {
    l.t.query("SELECT natural_key_fingerprint FROM bronze.crm WHERE guest_id = 'g0'")
        .remove(0)
        .remove("natural_key_fingerprint")
        .unwrap()
}
