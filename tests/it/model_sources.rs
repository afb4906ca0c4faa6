//! Model-based property test of a silver table fed by two sources (docs/guide.md "Several
//! sources"), through the real binary: random deliveries to `a` (incremental) and `b` (`delivery:
//! full`, so a delivery deletes the keys it lacks), re-sent files, undo of earlier runs (some
//! refused or no-ops), new rules versions that swap the precedence or make the sources peers
//! (with and without `--rebuild-where`), decisions on random conflicts (`ingot resolve`), their
//! withdrawal (`ingot undo <decision id>`), and a natural-key change of both sources (`ingot
//! rekey`; the table is refused while only one is re-keyed). After every step an incremental
//! build must equal an independent model that keeps the committed bronze state of each source
//! and applies survivorship as documented: every silver row (data, provenance, lineage, flags,
//! rules version, and the build that wrote it), the latest build's conflict log (candidates,
//! `candidate_set_hash` from the documented formula, status, taken source, decisions,
//! `first_build_id`) and the build's conflict counts. At the end of each case a `--full` build
//! equals the incremental result.
//!
//! Six keys, so the two sources overlap and disagree often; fields: `email` (a listed conflict
//! field), `state` (`most_recent` by the integer `updated`), `phone` (`only: b`), the group
//! `address` (`street`, `city`), `note` (a has it, b does not). Cases run with `on_conflict:
//! flag` or `hold` (hold: the model keeps the previous build's winner of a conflicting field).
//!
//! The four differences from the documentation this test found are fixed; each has its own
//! smallest story at the end of the file (`KNOWN_BUGS` stays false: set it to mirror a known
//! difference while a fix is under way).
//!
//! Cases: 3 random ones in `make test` after two fixed stories; `INGOT_MODEL_CASES=N` runs N,
//! `INGOT_MODEL_SEED=S` picks another (fixed by default) seed, `INGOT_MODEL_SHRINK_SECS` bounds
//! the shrinking of a failure (default 120).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use serde_json::{Value, json};

use crate::util::{TestLake, sha256_hex, stderr, stdout};

type Row = BTreeMap<String, Value>;
type Text = Option<&'static str>;
/// The rows of a delivery: key, row.
type Lines = Vec<(usize, Line)>;

const TABLE: &str = "t";
const KEYS: usize = 6;
const A: usize = 0;
const B: usize = 1;
const NAMES: [&str; 2] = ["a", "b"];

/// Mirror the known discrepancies between ingot and its documentation (each has an ignored test
/// below that fails until it is fixed), so that the property finds new ones: a decision on a
/// record left with one candidate is not counted in `decisions_stale`; a build that processes no
/// record but removes one or changes the rules version drops every carried conflict; `ingot
/// resolve` taking what an overridden (not withdrawn) decision took records nothing.
const KNOWN_BUGS: bool = false;

/// What the cases exercised, over all of them (printed at the end; the stories guarantee each).
static SEEN: [AtomicUsize; 12] = [const { AtomicUsize::new(0) }; 12];
const OPEN: usize = 0;
const DECIDED: usize = 1;
const STALE: usize = 2;
const TIES: usize = 3;
const UNDONE: usize = 4;
const REFUSED: usize = 5;
const REKEYED: usize = 6;
const REBUILT: usize = 7;
const DELETED: usize = 8;
const HELD: usize = 9;
const REVIVED: usize = 10;
const DELTAS: usize = 11;
const SEEN_NAMES: [&str; 12] = [
    "open conflicts",
    "decided conflicts",
    "stale decisions",
    "tie conflicts",
    "runs undone",
    "undos refused",
    "rekeys",
    "rebuilds",
    "deletions",
    "held winners",
    "stale decisions applying again",
    "delta layers",
];

fn seen(what: usize, n: usize) {
    SEEN[what].fetch_add(n, Relaxed);
}

fn key_name(key: usize) -> String {
    format!("k{}", key + 1)
}

/// One record of a source (its key aside).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    email: Text,
    updated: Option<i64>,
    state: Text,
    street: Text,
    city: Text,
    /// `note` in a, `phone` in b.
    extra: Text,
}

const DEFAULT: Rec = Rec {
    email: Some("x@m"),
    updated: Some(1),
    state: Some("open"),
    street: Some("S1"),
    city: Some("C1"),
    extra: None,
};

impl Rec {
    /// The contract fields' canonical texts, in contract order.
    fn fields(&self, key: usize) -> [Option<String>; 7] {
        let s = |t: Text| t.map(String::from);
        [
            Some(key_name(key)),
            s(self.email),
            self.updated.map(|u| u.to_string()),
            s(self.state),
            s(self.street),
            s(self.city),
            s(self.extra),
        ]
    }

    fn csv(&self, key: usize) -> String {
        self.fields(key).map(Option::unwrap_or_default).join(",")
    }

    /// The documented row hash (formats.md): every field, `\N` for a null.
    fn row_hash(&self, key: usize) -> String {
        let mut s = String::from("1");
        for f in self.fields(key) {
            s.push('|');
            s.push_str(f.as_deref().unwrap_or("\\N"));
        }
        sha256_hex(s.as_bytes())
    }
}

/// A row of a generated delivery.
#[derive(Debug, Clone)]
enum Val {
    New(Rec),
    /// The source's current values again (unchanged), else the other source's.
    Same,
    /// The other source's current values (the sources agree), else its own.
    Agree,
    /// A row whose `updated` does not type: rejected, and (full delivery) not a deletion.
    Bad,
}

/// A row as delivered.
#[derive(Debug, Clone, PartialEq)]
enum Line {
    Good(Rec),
    Bad,
}

/// The precedence of a rules version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    AB,
    BA,
    Peers,
}

impl Order {
    fn rank(self, source: usize) -> i64 {
        match (self, source) {
            (Order::AB, A) | (Order::BA, B) | (Order::Peers, _) => 1,
            _ => 2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnConflict {
    Flag,
    Hold,
}

impl OnConflict {
    fn name(self) -> &'static str {
        match self {
            OnConflict::Flag => "flag",
            OnConflict::Hold => "hold",
        }
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// Deliver rows (key, value) to a source.
    Deliver(usize, Vec<(usize, Val)>),
    /// Send the source's last file again, byte for byte.
    Resend(usize),
    /// Undo one of the runs so far (picked modulo their number).
    Undo(usize),
    /// A new rules version; `true`: build it with `--rebuild-where "rules_version < N"` at once.
    Rules(Order, bool),
    /// `--rebuild-where "rules_version < latest"` instead of the incremental build.
    Rebuild,
    /// Decide a conflict of the latest build (picked), taking a candidate (picked).
    Resolve(usize, usize),
    /// `ingot undo` a decision (picked; maybe withdrawn already).
    Withdraw(usize),
    /// Raise both contracts' natural_key version and re-key both sources.
    Rekey,
}

// ---------------------------------------------------------------------------------------------
// files the test writes

fn contract(source: usize, key_version: u32) -> String {
    let (key, mail, extra, delivery) = if source == A {
        ("id", "email", "note", "")
    } else {
        (
            "code",
            "mail",
            "phone",
            "delivery: full\nhold: {max_delete_fraction: off}\n",
        )
    };
    format!(
        "source: {}
version: {key_version}
{delivery}fields:
  - {{name: {key}, type: string, required: true}}
  - {{name: {mail}, type: string}}
  - {{name: updated, type: int64}}
  - {{name: state, type: string}}
  - {{name: street, type: string}}
  - {{name: city, type: string}}
  - {{name: {extra}, type: string}}
natural_key: {{version: {key_version}, fields: [{key}]}}
",
        NAMES[source]
    )
}

fn header(source: usize) -> &'static str {
    if source == A {
        "id,email,updated,state,street,city,note"
    } else {
        "code,mail,updated,state,street,city,phone"
    }
}

fn rules(version: u32, order: Order, on_conflict: OnConflict) -> String {
    let rank = if order == Order::Peers { "    rank: 1\n" } else { "" };
    let a = format!("  - source: a\n{rank}");
    let b = format!("  - source: b\n{rank}    steps:\n      - rename: {{code: id, mail: email}}\n");
    let sources = if order == Order::BA { b + &a } else { a + &b };
    format!(
        "table: {TABLE}
version: {version}
sources:
{sources}survivorship:
  default: precedence
  order_by: updated
  fields:
    state: most_recent
    phone: {{only: b}}
  groups:
    address: {{fields: [street, city]}}
conflicts:
  fields: [email]
  on_conflict: {}
",
        on_conflict.name()
    )
}

// ---------------------------------------------------------------------------------------------
// the model

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Precedence,
    MostRecent,
    OnlyB,
}

/// The survivorship units of the table, in column order (a group where its first field is).
const UNITS: [(&str, &[&str], Rule); 7] = [
    ("id", &["id"], Rule::Precedence),
    ("email", &["email"], Rule::Precedence),
    ("updated", &["updated"], Rule::Precedence),
    ("state", &["state"], Rule::MostRecent),
    ("address", &["street", "city"], Rule::Precedence),
    ("note", &["note"], Rule::Precedence),
    ("phone", &["phone"], Rule::OnlyB),
];

/// A source's current record of a key: its candidate.
#[derive(Debug, Clone)]
struct Cand {
    source: usize,
    key: usize,
    rec: Rec,
    run: String,
}

impl Cand {
    fn name(&self) -> &'static str {
        NAMES[self.source]
    }

    /// The canonical text of a table column in this candidate (after b's rename).
    fn text(&self, col: &str) -> Option<String> {
        let r = &self.rec;
        let t: Text = match col {
            "id" => return Some(key_name(self.key)),
            "updated" => return r.updated.map(|u| u.to_string()),
            "email" => r.email,
            "state" => r.state,
            "street" => r.street,
            "city" => r.city,
            "note" => r.extra.filter(|_| self.source == A),
            "phone" => r.extra.filter(|_| self.source == B),
            _ => unreachable!("{col}"),
        };
        t.map(String::from)
    }

    fn texts(&self, cols: &[&str]) -> Vec<Option<String>> {
        cols.iter().map(|c| self.text(c)).collect()
    }

    fn row_hash(&self) -> String {
        self.rec.row_hash(self.key)
    }

    /// `updated` latest first, a null last.
    fn recency(&self) -> (i64, i64) {
        match self.rec.updated {
            Some(u) => (0, -u),
            None => (1, 0),
        }
    }

    /// The deciding part of the order of `rule` (equal: a tie).
    fn deciding(&self, rule: Rule, order: Order) -> (i64, i64, i64) {
        let (n, u) = self.recency();
        let rank = order.rank(self.source);
        match rule {
            Rule::MostRecent => (n, u, rank),
            _ => (rank, n, u),
        }
    }
}

fn column_json(col: &str, text: Option<String>) -> Value {
    match text {
        None => Value::Null,
        Some(t) if col == "updated" => json!(t.parse::<i64>().unwrap()),
        Some(t) => json!(t),
    }
}

/// The documented candidate set hash (formats.md#candidate_set_hash).
fn candidate_set_hash(field: &str, candidates: &[(&str, Vec<Option<String>>)]) -> String {
    let mut sorted = candidates.to_vec();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut s = format!("{field}\n");
    for (source, texts) in sorted {
        s.push_str(source);
        s.push('\n');
        for t in texts {
            match t {
                None => s.push_str("-\n"),
                Some(t) => s.push_str(&format!("{}:{t}\n", t.len())),
            }
        }
    }
    sha256_hex(s.as_bytes())
}

#[derive(Debug, Clone)]
struct Run {
    id: String,
    source: usize,
    /// The file's bytes (none: a rekey run).
    content: Option<String>,
    /// false: skipped as a duplicate file.
    loaded: bool,
    undone: bool,
    rekey: bool,
    /// What it wrote: a version, or a tombstone (`None`).
    written: BTreeMap<usize, Option<Rec>>,
}

#[derive(Debug, Clone)]
struct Decision {
    id: String,
    fp: String,
    field: String,
    take: String,
    hash: String,
    withdrawn: bool,
}

/// A record as the latest build left it.
#[derive(Debug, Clone)]
struct Built {
    version: u32,
    /// Its candidates' runs, in source-name order, joined by `+`.
    state: String,
    row: Row,
    primary: String,
    /// (field or group, source) where another source than `primary` gave it, in column order.
    field_sources: Vec<(String, String)>,
    /// Its rows of the conflict log, without `build_id`.
    conflicts: Vec<Row>,
}

/// How a build is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Incremental,
    Rebuild(u32),
    Full,
}

/// What a build must publish.
#[derive(Debug)]
struct Expected {
    silver: BTreeMap<String, Row>,
    conflicts: BTreeMap<(String, String), Row>,
    counts: Row,
}

struct Model {
    on_conflict: OnConflict,
    runs: Vec<Run>,
    key_version: u32,
    /// The precedence of rules version `i + 1`.
    rules: Vec<Order>,
    decisions: Vec<Decision>,
    /// Records whose decisions changed since the latest build.
    touched: BTreeSet<String>,
    /// The latest build's records, by fingerprint.
    built: BTreeMap<String, Built>,
    /// The rules version of the latest build (none: no build yet).
    built_rules: Option<u32>,
    /// Each source's last file (for a re-send).
    last: [Option<(String, Lines)>; 2],
}

impl Model {
    fn new(on_conflict: OnConflict) -> Model {
        Model {
            on_conflict,
            runs: Vec::new(),
            key_version: 1,
            rules: vec![Order::AB],
            decisions: Vec::new(),
            touched: BTreeSet::new(),
            built: BTreeMap::new(),
            built_rules: None,
            last: [None, None],
        }
    }

    fn fingerprint(&self, key: usize) -> String {
        sha256_hex(format!("{}|{}", self.key_version, key_name(key)).as_bytes())
    }

    fn key_of(&self, fp: &str) -> String {
        (0..KEYS)
            .find(|k| self.fingerprint(*k) == fp)
            .map_or_else(|| fp[..12].to_string(), key_name)
    }

    /// `bronze.<source>_current`: from the latest rekey run on, the latest version each
    /// committed, not undone run wrote; a tombstone deletes.
    fn current(&self, source: usize) -> BTreeMap<usize, (Rec, String)> {
        let runs: Vec<&Run> = self
            .runs
            .iter()
            .filter(|r| r.source == source && r.loaded && !r.undone)
            .collect();
        let start = runs.iter().rposition(|r| r.rekey).unwrap_or(0);
        let mut out = BTreeMap::new();
        for r in &runs[start..] {
            for (k, v) in &r.written {
                match v {
                    Some(rec) => out.insert(*k, (rec.clone(), r.id.clone())),
                    None => out.remove(k),
                };
            }
        }
        out
    }

    /// Every key's candidates, in source-name order.
    fn candidates(&self) -> BTreeMap<usize, Vec<Cand>> {
        let mut out: BTreeMap<usize, Vec<Cand>> = BTreeMap::new();
        for source in [A, B] {
            for (key, (rec, run)) in self.current(source) {
                out.entry(key).or_default().push(Cand { source, key, rec, run });
            }
        }
        out
    }

    /// A committed file run of the source with the same bytes: the file is skipped.
    fn is_duplicate(&self, source: usize, content: &str) -> bool {
        self.runs
            .iter()
            .any(|r| r.source == source && r.loaded && !r.undone && r.content.as_deref() == Some(content))
    }

    /// Does bronze hold keyed records (a run that wrote something, or a rekey)?
    fn keyed(&self, source: usize) -> bool {
        self.runs
            .iter()
            .any(|r| r.source == source && r.loaded && !r.undone && (r.rekey || !r.written.is_empty()))
    }

    /// The decision in force on a record's field: the latest one not withdrawn.
    fn decision(&self, fp: &str, field: &str) -> Option<&Decision> {
        self.decisions
            .iter()
            .rev()
            .find(|d| !d.withdrawn && d.fp == fp && d.field == field)
    }

    /// Survivorship of one record under rules `version`: its row and conflicts, and how many
    /// decisions on it no longer apply.
    fn survive(
        &self,
        fp: &str,
        mut cands: Vec<Cand>,
        version: u32,
        build_id: &str,
        prev: Option<&Built>,
    ) -> (Built, usize) {
        let order = self.rules[version as usize - 1];
        let by_name = cands.clone();
        cands.sort_by_key(|c| (order.rank(c.source), c.name()));
        let primary = cands[0].clone();
        let mut row = Row::new();
        let mut field_sources: Vec<(String, String)> = Vec::new();
        let mut conflict_fields = Vec::new();
        let mut conflicts = Vec::new();
        let mut stale = 0;
        for (unit, cols, rule) in UNITS {
            let mut with: Vec<&Cand> = cands
                .iter()
                .filter(|c| c.texts(cols).iter().any(Option::is_some))
                .collect();
            if rule == Rule::OnlyB {
                with.retain(|c| c.source == B);
            }
            with.sort_by_key(|c| (c.deciding(rule, order), c.name(), c.row_hash()));
            let mut winner: Option<&Cand> = with.first().copied();
            let differs = |set: &[&Cand]| set.iter().any(|c| c.texts(cols) != set[0].texts(cols));
            let tied: Vec<&Cand> = match winner {
                Some(w) => with
                    .iter()
                    .copied()
                    .filter(|c| c.deciding(rule, order) == w.deciding(rule, order))
                    .collect(),
                None => Vec::new(),
            };
            let listed = unit == "email" && differs(&with);
            let tie = rule != Rule::OnlyB && differs(&tied);
            let decision = self.decision(fp, unit);
            if listed || tie {
                let set: Vec<(&str, Vec<Option<String>>)> = by_name.iter().map(|c| (c.name(), c.texts(cols))).collect();
                let hash = candidate_set_hash(unit, &set);
                let applies = decision.filter(|d| d.hash == hash);
                let (status, decision_id, stale_id) = match applies {
                    Some(d) => {
                        let was_stale = prev.is_some_and(|p| {
                            p.conflicts
                                .iter()
                                .any(|r| r["field"] == json!(unit) && r.get("stale_decision_id") == Some(&json!(d.id)))
                        });
                        if was_stale {
                            // the candidates are back to the set decided on
                            seen(REVIVED, 1);
                        }
                        winner = cands.iter().find(|c| c.name() == d.take);
                        ("decided", Some(d.id.clone()), None)
                    }
                    None => {
                        if decision.is_some() {
                            stale += 1;
                        }
                        conflict_fields.push(unit);
                        if self.on_conflict == OnConflict::Hold
                            && let Some(p) = prev
                        {
                            let held = p
                                .field_sources
                                .iter()
                                .find(|(f, _)| f == unit)
                                .map_or(&p.primary, |(_, s)| s);
                            if let Some(c) = with.iter().find(|c| c.name() == held) {
                                if winner.is_some_and(|w| w.source != c.source) {
                                    seen(HELD, 1);
                                }
                                winner = Some(c);
                            }
                        }
                        ("open", None, decision.map(|d| d.id.clone()))
                    }
                };
                let first = prev
                    .and_then(|p| {
                        p.conflicts
                            .iter()
                            .find(|r| r["field"] == json!(unit) && r["candidate_set_hash"] == json!(hash))
                    })
                    .map_or(json!(build_id), |r| r["first_build_id"].clone());
                let candidates: Vec<Value> = by_name
                    .iter()
                    .map(|c| {
                        let value = if cols.len() == 1 {
                            column_json("", c.text(cols[0]))
                        } else {
                            let obj: serde_json::Map<String, Value> = cols
                                .iter()
                                .map(|col| (col.to_string(), column_json("", c.text(col))))
                                .collect();
                            Value::Object(obj)
                        };
                        json!({"source": c.name(), "ingestion_run_id": c.run, "row_hash": c.row_hash(), "value": value})
                    })
                    .collect();
                conflicts.push(clean(&json!({
                    "table": TABLE,
                    "rules_version": version,
                    "natural_key_fingerprint": fp,
                    "field": unit,
                    "kind": if listed { "listed" } else { "tie" },
                    "candidates": candidates,
                    "candidate_set_hash": hash,
                    "on_conflict": self.on_conflict.name(),
                    "status": status,
                    "taken_source": winner.map(|w| w.name()),
                    "decision_id": decision_id,
                    "stale_decision_id": stale_id,
                    "first_build_id": first,
                })));
            } else if decision.is_some() && (cands.len() > 1 || !KNOWN_BUGS) {
                // decided, but the candidates agree now (or one is left): the decision is moot
                stale += 1;
            }
            if let Some(w) = winner
                && w.source != primary.source
            {
                field_sources.push((unit.to_string(), w.name().to_string()));
            }
            for col in cols {
                let v = column_json(col, winner.and_then(|w| w.text(col)));
                if !v.is_null() {
                    row.insert(col.to_string(), v);
                }
            }
        }
        row.insert(
            "contributing_sources".into(),
            json!(cands.iter().map(Cand::name).collect::<Vec<_>>()),
        );
        // `{field, source}` pairs in column order; empty, never null, when none (formats.md)
        let pairs: Vec<Value> = field_sources
            .iter()
            .map(|(f, s)| json!({"field": f, "source": s}))
            .collect();
        row.insert("field_sources".into(), json!(pairs));
        if !conflict_fields.is_empty() {
            row.insert("conflict_fields".into(), json!(conflict_fields));
        }
        let flags: Vec<&str> = if conflict_fields.is_empty() {
            vec![]
        } else {
            vec!["source_conflict"]
        };
        row.insert("rules_version".into(), json!(version));
        row.insert("is_anomaly".into(), json!(!flags.is_empty()));
        row.insert("anomaly_flags".into(), json!(flags));
        row.insert("natural_key_fingerprint".into(), json!(fp));
        row.insert("row_hash".into(), json!(primary.row_hash()));
        row.insert("ingestion_run_id".into(), json!(primary.run));
        row.insert("silver_build_id".into(), json!(build_id));
        let state = by_name.iter().map(|c| c.run.as_str()).collect::<Vec<_>>().join("+");
        let built = Built {
            version,
            state,
            row,
            primary: primary.name().to_string(),
            field_sources,
            conflicts,
        };
        (built, stale)
    }

    /// Apply a build: which records it processes and what it publishes.
    fn build(&mut self, mode: Mode, build_id: &str) -> Result<Expected, String> {
        let latest = self.rules.len() as u32;
        let mut next = BTreeMap::new();
        let (mut stale, mut processed) = (0, 0);
        for (key, cands) in self.candidates() {
            let fp = self.fingerprint(key);
            let state = cands.iter().map(|c| c.run.as_str()).collect::<Vec<_>>().join("+");
            let prev = self.built.get(&fp);
            let changed = prev.is_none_or(|p| p.state != state) || self.touched.contains(&fp);
            let process = match mode {
                Mode::Incremental => changed,
                Mode::Full => true,
                Mode::Rebuild(n) => {
                    if changed {
                        return Err(format!(
                            "the model has no rebuild of a changed record ({})",
                            key_name(key)
                        ));
                    }
                    prev.is_some_and(|p| p.version < n)
                }
            };
            if !process {
                next.insert(fp, prev.cloned().unwrap());
                continue;
            }
            processed += 1;
            let (built, s) = self.survive(&fp, cands, latest, build_id, prev);
            stale += s;
            next.insert(fp, built);
        }
        let removed = self.built.keys().filter(|fp| !next.contains_key(*fp)).count();
        let unchanged = mode == Mode::Incremental && processed == 0 && removed == 0 && self.built_rules == Some(latest);
        if KNOWN_BUGS && processed == 0 && !unchanged && self.built_rules.is_some() {
            // a build that processes no record but is not `unchanged` (it removes one, or the
            // rules version changed) publishes no conflicts at all: the kept records' are lost
            for b in next.values_mut() {
                b.conflicts.clear();
            }
        }
        self.built = next;
        self.built_rules = Some(latest);
        self.touched.clear();
        let mut conflicts = BTreeMap::new();
        let (mut open, mut decided) = (0, 0);
        for (fp, b) in &self.built {
            for c in &b.conflicts {
                let mut c = c.clone();
                c.insert("build_id".into(), json!(build_id));
                match c["status"].as_str() {
                    Some("open") => open += 1,
                    _ => decided += 1,
                }
                if c["kind"] == json!("tie") {
                    seen(TIES, 1);
                }
                conflicts.insert((fp.clone(), c["field"].as_str().unwrap().to_string()), c);
            }
        }
        seen(OPEN, open);
        seen(DECIDED, decided);
        seen(STALE, stale);
        let counts: Row = [
            ("conflicts_open", json!(open)),
            ("conflicts_decided", json!(decided)),
            ("decisions_stale", json!(stale)),
            ("rows_read", json!(processed)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        Ok(Expected {
            silver: self.built.iter().map(|(fp, b)| (fp.clone(), b.row.clone())).collect(),
            conflicts,
            counts,
        })
    }

    /// What ingesting `lines` writes: versions and tombstones, and the counts.
    fn classify(&self, source: usize, lines: &[(usize, Line)]) -> (BTreeMap<usize, Option<Rec>>, Row) {
        let current = self.current(source);
        let mut written = BTreeMap::new();
        let (mut inserted, mut updated, mut unchanged, mut failed, mut deleted) = (0, 0, 0, 0, 0);
        for (k, line) in lines {
            match (line, current.get(k)) {
                (Line::Bad, _) => failed += 1,
                (Line::Good(r), None) => {
                    inserted += 1;
                    written.insert(*k, Some(r.clone()));
                }
                (Line::Good(r), Some((have, _))) if have != r => {
                    updated += 1;
                    written.insert(*k, Some(r.clone()));
                }
                (Line::Good(_), Some(_)) => unchanged += 1,
            }
        }
        if source == B {
            for k in current.keys().filter(|k| !lines.iter().any(|(l, _)| l == *k)) {
                deleted += 1;
                written.insert(*k, None);
            }
        }
        let counts = [
            ("rows_inserted", inserted),
            ("rows_updated", updated),
            ("rows_unchanged", unchanged),
            ("rows_failed", failed),
            ("rows_deleted", deleted),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
        (written, counts)
    }
}

/// `v` without null members of objects (JSON output omits them), recursively.
fn clean(v: &Value) -> Row {
    fn go(v: &Value) -> Value {
        match v {
            Value::Object(o) => Value::Object(
                o.iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k.clone(), go(v)))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(go).collect()),
            v => v.clone(),
        }
    }
    match go(v) {
        Value::Object(o) => o.into_iter().collect(),
        other => panic!("not an object: {other}"),
    }
}

// ---------------------------------------------------------------------------------------------
// the lake

struct Lake {
    t: TestLake,
    rules: PathBuf,
    inbox: PathBuf,
    files: usize,
}

impl Lake {
    fn new() -> Lake {
        let mut t = TestLake::new();
        // every other case lets delta layers replace any share of its small table, so that its
        // incremental builds are delta layers where they can be (the others: whole snapshots)
        static CASES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        if CASES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 2 == 1 {
            t.envs.push(("INGOT_SILVER_DELTA_LIMIT".into(), "100".into()));
        }
        // only this test's contracts
        for e in std::fs::read_dir(t.contracts()).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        let rules = t.dir.path().join("rules");
        let inbox = t.dir.path().join("inbox");
        std::fs::create_dir_all(rules.join(TABLE)).unwrap();
        std::fs::create_dir_all(&inbox).unwrap();
        Lake {
            t,
            rules,
            inbox,
            files: 0,
        }
    }

    fn write_contract(&self, source: usize, key_version: u32) {
        let path = self.t.contracts().join(format!("{}.yaml", NAMES[source]));
        std::fs::write(path, contract(source, key_version)).unwrap();
    }

    fn write_rules(&self, version: u32, order: Order, on_conflict: OnConflict) {
        let path = self.rules.join(TABLE).join(format!("v{version}.yaml"));
        std::fs::write(path, rules(version, order, on_conflict)).unwrap();
    }

    fn ingot(&self, args: &[&str]) -> Output {
        self.t
            .command()
            .arg("--rules")
            .arg(&self.rules)
            .args(args)
            .output()
            .unwrap()
    }

    fn file(&mut self, source: usize, content: &str) -> String {
        self.files += 1;
        let path = self.inbox.join(format!("{}-{:03}.csv", NAMES[source], self.files));
        std::fs::write(&path, content).unwrap();
        path.display().to_string()
    }

    fn query(&self, sql: &str) -> Vec<Row> {
        self.t.query(sql)
    }
}

/// The last JSON line of a command's output.
fn json_line(out: &Output) -> Row {
    let text = stdout(out);
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or("{}");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn said(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        stdout(out),
        stderr(out)
    )
}

// ---------------------------------------------------------------------------------------------
// one case

struct Case {
    l: Lake,
    m: Model,
    /// What happened so far, for failure messages.
    log: Vec<String>,
}

impl Case {
    fn fail(&self, what: String) -> TestCaseError {
        TestCaseError::fail(format!("{what}\nhistory:\n  {}", self.log.join("\n  ")))
    }

    fn check(&self, ok: bool, what: impl FnOnce() -> String) -> Result<(), TestCaseError> {
        if ok { Ok(()) } else { Err(self.fail(what())) }
    }

    fn describe(&self, lines: &[(usize, Line)]) -> String {
        lines
            .iter()
            .map(|(k, l)| match l {
                Line::Good(r) => format!("{}={}", key_name(*k), r.csv(*k).split_once(',').unwrap().1),
                Line::Bad => format!("{}=<bad>", key_name(*k)),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn deliver(&mut self, source: usize, vals: &[(usize, Val)]) -> Result<(), TestCaseError> {
        let own = self.m.current(source);
        let other = self.m.current(1 - source);
        let own_extra = |k: &usize| own.get(k).and_then(|o| o.0.extra);
        let lines: Vec<(usize, Line)> = vals
            .iter()
            .map(|(k, v)| {
                let mine = own.get(k).map(|o| o.0.clone());
                // the other source's values; its `extra` is another field (note vs phone)
                let theirs = other.get(k).map(|o| Rec {
                    extra: own_extra(k),
                    ..o.0.clone()
                });
                let line = match v {
                    Val::New(r) => Line::Good(r.clone()),
                    Val::Bad => Line::Bad,
                    Val::Same => Line::Good(mine.or(theirs).unwrap_or(DEFAULT)),
                    Val::Agree => Line::Good(theirs.or(mine).unwrap_or(DEFAULT)),
                };
                (*k, line)
            })
            .collect();
        let mut content = format!("{}\n", header(source));
        for (k, line) in &lines {
            match line {
                Line::Good(r) => content.push_str(&r.csv(*k)),
                Line::Bad => content.push_str(&format!("{},,oops,,,,", key_name(*k))),
            }
            content.push('\n');
        }
        self.ingest(source, content, lines)
    }

    fn ingest(&mut self, source: usize, content: String, lines: Vec<(usize, Line)>) -> Result<(), TestCaseError> {
        let path = self.l.file(source, &content);
        let out = self.l.ingot(&["ingest", NAMES[source], &path, "--json"]);
        self.check(out.status.success(), || {
            format!("ingest {}: {}", NAMES[source], said(&out))
        })?;
        let rec = json_line(&out);
        let id = rec["run_id"].as_str().unwrap().to_string();
        let status = rec["status"].as_str().unwrap_or_default().to_string();
        self.log.push(format!(
            "deliver {} [{}] -> run {id} {status}",
            NAMES[source],
            self.describe(&lines)
        ));
        let duplicate = self.m.is_duplicate(source, &content);
        let mut run = Run {
            id,
            source,
            content: Some(content.clone()),
            loaded: !duplicate,
            undone: false,
            rekey: false,
            written: BTreeMap::new(),
        };
        if duplicate {
            self.check(status == "skipped_duplicate_file", || {
                format!("a file a committed run loaded is skipped: {rec:?}")
            })?;
        } else {
            let (written, counts) = self.m.classify(source, &lines);
            let want = if counts["rows_failed"] == json!(0) {
                "succeeded"
            } else {
                "succeeded_with_failures"
            };
            let got: Row = counts.keys().map(|k| (k.clone(), rec[k].clone())).collect();
            self.check(status == want && got == counts, || {
                format!("ingest of {}: want {want} {counts:?}, got {rec:?}", NAMES[source])
            })?;
            seen(DELETED, counts["rows_deleted"].as_u64().unwrap() as usize);
            run.written = written;
        }
        self.m.runs.push(run);
        self.m.last[source] = Some((content, lines));
        Ok(())
    }

    fn undo(&mut self, pick: usize) -> Result<(), TestCaseError> {
        let choices: Vec<usize> = (0..self.m.runs.len()).filter(|&i| !self.m.runs[i].rekey).collect();
        let Some(&i) = choices.get(pick % choices.len().max(1)) else {
            self.log.push("undo: no run yet".into());
            return Ok(());
        };
        let run = self.m.runs[i].clone();
        let blocked = self.m.runs[i + 1..]
            .iter()
            .any(|r| r.source == run.source && r.rekey && r.loaded && !r.undone);
        let out = self.l.ingot(&["undo", &run.id]);
        let text = said(&out);
        self.log.push(format!(
            "undo run {} of {} -> exit {:?}",
            run.id,
            NAMES[run.source],
            out.status.code()
        ));
        if !run.loaded {
            self.check(out.status.success() && text.contains("nothing to undo"), || {
                format!("undo of a skipped run: {text}")
            })
        } else if run.undone {
            self.check(out.status.success() && text.contains("already rolled back"), || {
                format!("undo of an undone run: {text}")
            })
        } else if blocked {
            seen(REFUSED, 1);
            self.check(out.status.code() == Some(2) && text.contains("cannot undo run"), || {
                format!("undo of a run before a rekey is refused: {text}")
            })
        } else {
            self.check(out.status.success() && text.contains("rolled back run"), || {
                format!("undo of run {}: {text}", run.id)
            })?;
            seen(UNDONE, 1);
            self.m.runs[i].undone = true;
            Ok(())
        }
    }

    fn resolve(&mut self, pick: usize, take: usize) -> Result<(), TestCaseError> {
        let all: Vec<Row> = self.m.built.values().flat_map(|b| b.conflicts.clone()).collect();
        let Some(c) = all.get(pick % all.len().max(1)) else {
            self.log.push("resolve: no conflict".into());
            return Ok(());
        };
        let fp = c["natural_key_fingerprint"].as_str().unwrap().to_string();
        let field = c["field"].as_str().unwrap().to_string();
        let hash = c["candidate_set_hash"].as_str().unwrap().to_string();
        let sources: Vec<&str> = c["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["source"].as_str().unwrap())
            .collect();
        let take = sources[take % sources.len()].to_string();
        let out = self.l.ingot(&[
            "resolve", TABLE, &fp, "--field", &field, "--take", &take, "--reason", "model", "--by", "model",
        ]);
        let text = said(&out);
        self.check(out.status.success(), || format!("resolve: {text}"))?;
        // the same decision as the one in force records nothing
        let same = self
            .m
            .decision(&fp, &field)
            .is_some_and(|d| d.take == take && d.hash == hash)
            // ingot: any decision not withdrawn, even one a later decision overrode
            || (KNOWN_BUGS
                && self.m.decisions.iter().any(|d| {
                    !d.withdrawn && d.fp == fp && d.field == field && d.take == take && d.hash == hash
                }));
        self.log.push(format!(
            "resolve {} {field} ({}) take {take} -> {}",
            self.m.key_of(&fp),
            c["status"],
            stdout(&out).trim()
        ));
        if same {
            self.check(text.contains("nothing recorded"), || {
                format!("the decision in force already takes {take}: {text}")
            })
        } else {
            self.check(text.contains("takes") && !text.contains("nothing recorded"), || {
                format!(
                    "a new decision (in force: {:?}) is recorded: {text}",
                    self.m.decision(&fp, &field)
                )
            })?;
            let id = stdout(&out)
                .split_whitespace()
                .nth(1)
                .unwrap()
                .trim_end_matches(':')
                .to_string();
            self.m.decisions.push(Decision {
                id,
                fp: fp.clone(),
                field,
                take,
                hash,
                withdrawn: false,
            });
            self.m.touched.insert(fp);
            Ok(())
        }
    }

    fn withdraw(&mut self, pick: usize) -> Result<(), TestCaseError> {
        let n = self.m.decisions.len();
        if n == 0 {
            self.log.push("withdraw: no decision".into());
            return Ok(());
        }
        let d = self.m.decisions[pick % n].clone();
        let out = self.l.ingot(&["undo", &d.id]);
        let text = said(&out);
        self.log.push(format!(
            "withdraw decision {} ({} {} take {}) -> {}",
            d.id,
            self.m.key_of(&d.fp),
            d.field,
            d.take,
            stdout(&out).trim()
        ));
        if d.withdrawn {
            self.check(out.status.success() && text.contains("withdrawn already"), || {
                format!("a second withdrawal: {text}")
            })
        } else {
            self.check(out.status.success() && text.contains("withdrew decision"), || {
                format!("withdrawal: {text}")
            })?;
            self.m.decisions[pick % n].withdrawn = true;
            self.m.touched.insert(d.fp);
            Ok(())
        }
    }

    fn rekey(&mut self) -> Result<(), TestCaseError> {
        let v = self.m.key_version + 1;
        for source in [A, B] {
            self.l.write_contract(source, v);
            let out = self.l.ingot(&["rekey", NAMES[source]]);
            let text = said(&out);
            self.check(out.status.success(), || format!("rekey {}: {text}", NAMES[source]))?;
            self.log
                .push(format!("rekey {} to v{v} -> {}", NAMES[source], stdout(&out).trim()));
            if self.m.keyed(source) {
                self.check(text.contains("re-keyed"), || format!("rekey writes a run: {text}"))?;
                let id = text
                    .split("[run ")
                    .nth(1)
                    .and_then(|t| t.split(']').next())
                    .unwrap()
                    .to_string();
                let written = self
                    .m
                    .current(source)
                    .into_iter()
                    .map(|(k, (r, _))| (k, Some(r)))
                    .collect();
                self.m.runs.push(Run {
                    id,
                    source,
                    content: None,
                    loaded: true,
                    undone: false,
                    rekey: true,
                    written,
                });
                seen(REKEYED, 1);
            } else {
                self.check(text.contains("nothing to re-key"), || {
                    format!("nothing to re-key: {text}")
                })?;
            }
            if source == A {
                // b's key recipe differs from a's: the table is refused
                let out = self.l.ingot(&["build", TABLE]);
                let text = said(&out);
                self.check(
                    out.status.code() == Some(2) && text.contains("do not build the same natural_key_fingerprint"),
                    || format!("a build while only a is re-keyed is refused (exit 2): {text}"),
                )?;
            }
        }
        self.m.key_version = v;
        Ok(())
    }

    /// Run a build and compare everything it published with the model.
    fn build(&mut self, mode: Mode) -> Result<(), TestCaseError> {
        let filter;
        let mut args = vec!["build", TABLE, "--json"];
        match mode {
            Mode::Incremental => {}
            Mode::Full => args.push("--full"),
            Mode::Rebuild(n) => {
                filter = format!("rules_version < {n}");
                args.extend(["--rebuild-where", &filter]);
                seen(REBUILT, 1);
            }
        }
        let out = self.l.ingot(&args);
        self.check(out.status.success(), || format!("build {mode:?}: {}", said(&out)))?;
        let rec = json_line(&out);
        let build_id = rec["build_id"].as_str().unwrap().to_string();
        let layer = self
            .l
            .t
            .lake()
            .join(format!("silver/{TABLE}/build_id={build_id}/deleted-00000.parquet"));
        if layer.exists() {
            seen(DELTAS, 1);
        }
        self.log.push(format!(
            "build {mode:?} -> {build_id}{}",
            if layer.exists() { " (a delta layer)" } else { "" }
        ));
        let want = self.m.build(mode, &build_id).map_err(|e| self.fail(e))?;
        self.compare(&want, &build_id, &format!("after build {mode:?}"))
    }

    fn compare(&self, want: &Expected, build_id: &str, context: &str) -> Result<(), TestCaseError> {
        let got: BTreeMap<String, Row> = self
            .l
            .query(&format!("SELECT * FROM silver.{TABLE}"))
            .into_iter()
            .map(|r| {
                let r = clean(&json!(r));
                (r["natural_key_fingerprint"].as_str().unwrap().to_string(), r)
            })
            .collect();
        self.same_maps(
            &got,
            &want.silver,
            |fp| self.m.key_of(fp),
            &format!("{context}: silver"),
        )?;
        let got: BTreeMap<(String, String), Row> = self
            .l
            .query(&format!(
                "SELECT * FROM audit.source_conflict_log WHERE build_id = '{build_id}'"
            ))
            .into_iter()
            .map(|r| {
                let mut r = clean(&json!(r));
                if r["field"] == json!("address")
                    && let Some(Value::Array(cands)) = r.get_mut("candidates")
                {
                    // a group's value is the JSON text of its columns: compare it parsed
                    for c in cands.iter_mut() {
                        if let Some(Value::String(s)) = c.get("value").cloned() {
                            // (without its null members, as `clean` leaves the model's)
                            c["value"] = match serde_json::from_str::<Value>(&s) {
                                Ok(v) if v.is_object() => Value::Object(clean(&v).into_iter().collect()),
                                _ => Value::String(s),
                            };
                        }
                    }
                }
                let key = (
                    r["natural_key_fingerprint"].as_str().unwrap().to_string(),
                    r["field"].as_str().unwrap().to_string(),
                );
                (key, r)
            })
            .collect();
        self.same_maps(
            &got,
            &want.conflicts,
            |(fp, f)| format!("{} {f}", self.m.key_of(fp)),
            &format!("{context}: audit.source_conflict_log"),
        )?;
        let log = self.l.query(&format!(
            "SELECT conflicts_open, conflicts_decided, decisions_stale, rows_read FROM audit.silver_build_log WHERE \
             build_id = '{build_id}'"
        ));
        let got = log.first().map(|r| clean(&json!(r))).unwrap_or_default();
        self.check(got == want.counts, || {
            format!("{context}: build log counts: want {:?}, got {got:?}", want.counts)
        })
    }

    fn same_maps<K: Ord + Clone + std::fmt::Debug>(
        &self,
        got: &BTreeMap<K, Row>,
        want: &BTreeMap<K, Row>,
        name: impl Fn(&K) -> String,
        context: &str,
    ) -> Result<(), TestCaseError> {
        let keys: BTreeSet<&K> = got.keys().chain(want.keys()).collect();
        for k in keys {
            let (g, w) = (got.get(k), want.get(k));
            if g != w {
                let diff = match (g, w) {
                    (Some(g), Some(w)) => {
                        let cols: BTreeSet<&String> = g.keys().chain(w.keys()).collect();
                        cols.into_iter()
                            .filter(|c| g.get(*c) != w.get(*c))
                            .map(|c| format!("{c}: want {:?}, got {:?}", w.get(c), g.get(c)))
                            .collect::<Vec<_>>()
                            .join("; ")
                    }
                    _ => String::new(),
                };
                return Err(self.fail(format!(
                    "{context}: {} differs: {diff}\n  want {w:?}\n  got  {g:?}",
                    name(k)
                )));
            }
        }
        Ok(())
    }

    fn step(&mut self, step: &Step) -> Result<(), TestCaseError> {
        let latest = self.m.rules.len() as u32;
        let mode = match step {
            Step::Deliver(source, vals) => {
                self.deliver(*source, vals)?;
                Mode::Incremental
            }
            Step::Resend(source) => {
                if let Some((content, lines)) = self.m.last[*source].clone() {
                    self.ingest(*source, content, lines)?;
                }
                Mode::Incremental
            }
            Step::Undo(pick) => {
                self.undo(*pick)?;
                Mode::Incremental
            }
            Step::Rules(order, now) => {
                let v = latest + 1;
                self.l.write_rules(v, *order, self.m.on_conflict);
                self.m.rules.push(*order);
                self.log.push(format!("rules v{v}: {order:?}"));
                if *now && !self.m.built.is_empty() {
                    Mode::Rebuild(v)
                } else {
                    Mode::Incremental
                }
            }
            Step::Rebuild => {
                if self.m.built.values().any(|b| b.version < latest) {
                    Mode::Rebuild(latest)
                } else {
                    Mode::Incremental
                }
            }
            Step::Resolve(pick, take) => {
                self.resolve(*pick, *take)?;
                Mode::Incremental
            }
            Step::Withdraw(pick) => {
                self.withdraw(*pick)?;
                Mode::Incremental
            }
            Step::Rekey => {
                self.rekey()?;
                Mode::Incremental
            }
        };
        self.build(mode)
    }
}

fn run_case(on_conflict: OnConflict, steps: &[Step]) -> Result<(), TestCaseError> {
    let l = Lake::new();
    l.write_contract(A, 1);
    l.write_contract(B, 1);
    l.write_rules(1, Order::AB, on_conflict);
    let mut c = Case {
        l,
        m: Model::new(on_conflict),
        log: vec![format!("on_conflict: {}", on_conflict.name())],
    };
    for (i, step) in steps.iter().enumerate() {
        c.log.push(format!("-- step {i}: {step:?}"));
        c.step(step)?;
    }
    // the rows of older rules versions rebuilt, then a full build equals the incremental result
    let latest = c.m.rules.len() as u32;
    if c.m.built.values().any(|b| b.version < latest) {
        c.build(Mode::Rebuild(latest))?;
    }
    let strip = |rows: Vec<Row>, col: &str| -> BTreeSet<String> {
        rows.into_iter()
            .map(|mut r| {
                r.remove(col);
                serde_json::to_string(&r).unwrap()
            })
            .collect()
    };
    let silver = strip(c.l.query(&format!("SELECT * FROM silver.{TABLE}")), "silver_build_id");
    let conflicts_sql = format!(
        "SELECT * FROM audit.source_conflict_log WHERE build_id = (SELECT build_id FROM audit.silver_build_log WHERE \
         \"table\" = '{TABLE}' AND status = 'succeeded' ORDER BY commit_seq DESC LIMIT 1)"
    );
    let conflicts = strip(c.l.query(&conflicts_sql), "build_id");
    c.log.push("-- at the end: --full".into());
    c.build(Mode::Full)?;
    let full_silver = strip(c.l.query(&format!("SELECT * FROM silver.{TABLE}")), "silver_build_id");
    c.check(full_silver == silver, || {
        format!(
            "a full build differs from the incremental one:\n  only incremental: {:?}\n  only full: {:?}",
            silver.difference(&full_silver).collect::<Vec<_>>(),
            full_silver.difference(&silver).collect::<Vec<_>>()
        )
    })?;
    let full_conflicts = strip(c.l.query(&conflicts_sql), "build_id");
    c.check(full_conflicts == conflicts, || {
        format!("the conflicts of a full build differ: {full_conflicts:?} vs {conflicts:?}")
    })
}

// ---------------------------------------------------------------------------------------------
// strategies

fn rec() -> impl Strategy<Value = Rec> {
    let text = |a: &'static str, b: &'static str| prop::sample::select(vec![None, Some(a), Some(b)]);
    (
        text("x@m", "y@m"),
        prop::sample::select(vec![Some(1i64), Some(2), Some(3), Some(2), None]),
        text("open", "shut"),
        text("S1", "S2"),
        text("C1", "C2"),
        text("e1", "e2"),
    )
        .prop_map(|(email, updated, state, street, city, extra)| Rec {
            email,
            updated,
            state,
            street,
            city,
            extra,
        })
}

fn val() -> impl Strategy<Value = Val> {
    prop_oneof![
        5 => rec().prop_map(Val::New),
        2 => Just(Val::Same),
        2 => Just(Val::Agree),
        1 => Just(Val::Bad),
    ]
}

/// Rows with distinct keys (a file with one key twice is a natural-key conflict, tested elsewhere).
fn rows(n: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<(usize, Val)>> {
    prop::collection::vec((0..KEYS, val()), n).prop_map(|rows| {
        let mut seen = BTreeSet::new();
        rows.into_iter().filter(|(k, _)| seen.insert(*k)).collect()
    })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => rows(1..=4).prop_map(|r| Step::Deliver(A, r)),
        3 => prop_oneof![8 => rows(2..=8), 1 => Just(Vec::new())].prop_map(|r| Step::Deliver(B, r)),
        1 => (0..2usize).prop_map(Step::Resend),
        2 => (0..64usize).prop_map(Step::Undo),
        1 => (prop::sample::select(vec![Order::AB, Order::BA, Order::Peers]), any::<bool>())
            .prop_map(|(o, now)| Step::Rules(o, now)),
        1 => Just(Step::Rebuild),
        3 => (0..64usize, 0..2usize).prop_map(|(p, t)| Step::Resolve(p, t)),
        1 => (0..64usize).prop_map(Step::Withdraw),
        1 => Just(Step::Rekey),
    ]
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// The stories the issue describes, step by step; then random cases.
fn stories() -> Vec<(OnConflict, Vec<Step>)> {
    let r = |email: Text, updated: i64, state: Text, street: Text, extra: Text| Rec {
        email,
        updated: Some(updated),
        state,
        street,
        city: Some("C1"),
        extra,
    };
    let a1 = vec![
        (0, Val::New(r(Some("x@m"), 1, Some("open"), Some("S1"), Some("e1")))),
        (1, Val::New(r(Some("x@m"), 2, Some("open"), Some("S1"), None))),
        (2, Val::New(r(None, 2, Some("shut"), Some("S2"), None))),
        (3, Val::New(r(Some("y@m"), 3, None, None, Some("e2")))),
    ];
    let b1 = vec![
        (0, Val::New(r(Some("y@m"), 2, Some("shut"), Some("S2"), Some("e1")))),
        (1, Val::New(r(Some("y@m"), 2, Some("shut"), Some("S1"), Some("e2")))),
        (2, Val::Agree),
        (4, Val::New(r(Some("x@m"), 1, Some("open"), Some("S1"), None))),
    ];
    let flag = vec![
        Step::Deliver(A, a1.clone()),
        Step::Deliver(B, b1.clone()),
        // decide k2's email for b, then decide again: the same decision records nothing; then
        // for a, and back for b: a new decision each time
        Step::Resolve(0, 1),
        Step::Resolve(0, 1),
        Step::Resolve(0, 0),
        Step::Resolve(0, 1),
        // b changes k1's and k2's email: the decision is stale; k5 goes (full delivery)
        Step::Deliver(
            B,
            vec![
                (0, Val::New(r(Some("z@m"), 2, Some("shut"), Some("S2"), None))),
                (1, Val::New(r(Some("z@m"), 2, Some("shut"), Some("S1"), Some("e2")))),
                (2, Val::Same),
            ],
        ),
        // undo b's last run: k2's candidates are the decided set again
        Step::Undo(2),
        // peers: ties on state and address; then b first, rebuilt at once
        Step::Rules(Order::Peers, false),
        Step::Deliver(
            A,
            vec![(1, Val::New(r(Some("x@m"), 2, Some("open"), Some("S2"), None)))],
        ),
        Step::Rebuild,
        Step::Resolve(1, 0),
        Step::Rules(Order::BA, true),
        Step::Rekey,
        // before the rekey: refused; a skipped re-send; a withdrawal
        Step::Undo(0),
        Step::Resend(A),
        Step::Resend(A),
        Step::Undo(6),
        Step::Withdraw(0),
        Step::Withdraw(0),
        Step::Deliver(B, vec![(0, Val::Same), (3, Val::Agree)]),
    ];
    let hold = vec![
        Step::Deliver(A, a1),
        Step::Deliver(B, b1),
        Step::Deliver(
            B,
            vec![
                (0, Val::New(r(Some("z@m"), 3, Some("open"), Some("S1"), None))),
                (1, Val::Same),
            ],
        ),
        Step::Rules(Order::BA, true),
        Step::Rules(Order::Peers, true),
        Step::Resolve(0, 1),
        Step::Undo(2),
        Step::Rekey,
        Step::Deliver(
            A,
            vec![(0, Val::New(r(Some("q@m"), 3, Some("shut"), Some("S2"), None)))],
        ),
    ];
    vec![(OnConflict::Flag, flag), (OnConflict::Hold, hold)]
}

#[test]
fn two_sources_follow_the_model_through_deliveries_undo_rules_decisions_and_rekeys() {
    let started = std::time::Instant::now();
    for (i, (on_conflict, steps)) in stories().into_iter().enumerate() {
        if let Err(e) = run_case(on_conflict, &steps) {
            panic!("story {i}: {e}");
        }
    }
    let cases = env("INGOT_MODEL_CASES", 3) as u32;
    let seed = env("INGOT_MODEL_SEED", 0x1960_2026);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        max_shrink_time: 1000 * env("INGOT_MODEL_SHRINK_SECS", 120) as u32,
        ..Config::default()
    });
    let on_conflict = prop_oneof![2 => Just(OnConflict::Flag), 1 => Just(OnConflict::Hold)];
    let result = runner.run(
        &(on_conflict, prop::collection::vec(step(), 8..=12)),
        |(on_conflict, steps)| run_case(on_conflict, &steps),
    );
    if let Err(e) = result {
        panic!("seed {seed}: {e}");
    }
    let seen: Vec<String> = SEEN_NAMES
        .iter()
        .zip(&SEEN)
        .map(|(n, c)| format!("{} {n}", c.load(Relaxed)))
        .collect();
    eprintln!(
        "model_sources: 2 stories and {cases} random cases (seed {seed}) in {:.1?}: {}",
        started.elapsed(),
        seen.join(", ")
    );
    for (n, c) in SEEN_NAMES.iter().zip(&SEEN) {
        assert!(c.load(Relaxed) > 0, "no case had {n}");
    }
}

// ---------------------------------------------------------------------------------------------
// The discrepancies the property found (fixed), each as the smallest story.

/// A lake with both contracts (key version 1) and rules v1 (a first).
fn small_lake(on_conflict: OnConflict) -> Lake {
    let l = Lake::new();
    l.write_contract(A, 1);
    l.write_contract(B, 1);
    l.write_rules(1, Order::AB, on_conflict);
    l
}

fn ok(l: &Lake, args: &[&str]) -> String {
    let out = l.ingot(args);
    assert!(out.status.success(), "ingot {args:?}: {}", said(&out));
    stdout(&out)
}

/// Ingest `lines` (after the header) into `source`; returns the run id.
fn ingest_lines(l: &mut Lake, source: usize, lines: &[&str]) -> String {
    let mut content = format!("{}\n", header(source));
    for line in lines {
        content.push_str(line);
        content.push('\n');
    }
    let path = l.file(source, &content);
    let out = l.ingot(&["ingest", NAMES[source], &path, "--json"]);
    assert!(out.status.success(), "{}", said(&out));
    json_line(&out)["run_id"].as_str().unwrap().to_string()
}

fn latest_build(l: &Lake) -> Row {
    l.query(&format!(
        "SELECT * FROM audit.silver_build_log WHERE \"table\" = '{TABLE}' ORDER BY commit_seq DESC LIMIT 1"
    ))
    .remove(0)
}

fn latest_conflicts(l: &Lake) -> Vec<Row> {
    let b = latest_build(l);
    l.query(&format!(
        "SELECT * FROM audit.source_conflict_log WHERE build_id = '{}'",
        b["build_id"].as_str().unwrap()
    ))
}

fn fp1(version: u32, key: &str) -> String {
    sha256_hex(format!("{version}|{key}").as_bytes())
}

/// guide.md: `decisions_stale` counts "decisions on the records this build processed that no
/// longer apply (a candidate changed, or the candidates agree now)". A full delivery of b that
/// drops k1 leaves a's candidate alone: the decision no longer applies, but is not counted
/// (records with one candidate skip the survivorship pass that counts).
#[test]
fn a_decision_on_a_record_left_with_one_candidate_is_stale() {
    let mut l = small_lake(OnConflict::Flag);
    ingest_lines(&mut l, A, &["k1,x@m,1,open,S1,C1,"]);
    ingest_lines(&mut l, B, &["k1,y@m,1,open,S1,C1,"]);
    ok(&l, &["build", TABLE]);
    let fp = fp1(1, "k1");
    ok(
        &l,
        &[
            "resolve", TABLE, &fp, "--field", "email", "--take", "a", "--reason", "r",
        ],
    );
    ok(&l, &["build", TABLE]);
    assert_eq!(latest_build(&l)["conflicts_decided"], json!(1));
    ingest_lines(&mut l, B, &[]); // b's whole source is now empty: k1 is a's alone
    ok(&l, &["build", TABLE]);
    let b = latest_build(&l);
    assert_eq!((&b["rows_read"], &b["conflicts_decided"]), (&json!(1), &json!(0)));
    assert_eq!(b["decisions_stale"], json!(1), "the decision no longer applies: {b:?}");
}

/// guide.md/formats.md: a build's conflict log holds "one row per conflict the published table
/// holds (the conflicts of the records a build kept are carried from the previous build's)". A
/// build that processes no record but is not `unchanged` publishes none: here an undo that
/// removes k2 (a's alone), and a new rules version. k1 keeps its flag and `conflict_fields` in
/// silver, but `ingot conflicts` is empty, `conflicts_open` is 0 and `ingot resolve` finds no
/// conflict. (`merged_input` in src/silver/build/sources.rs returns early, without the carried
/// conflicts, when no source has a record to read.)
#[test]
fn a_build_that_processes_no_record_keeps_the_conflicts_of_the_kept_ones() {
    for trigger in ["undo", "rules"] {
        let mut l = small_lake(OnConflict::Flag);
        ingest_lines(&mut l, A, &["k1,x@m,1,open,S1,C1,"]);
        ingest_lines(&mut l, B, &["k1,y@m,1,open,S1,C1,"]);
        let k2 = ingest_lines(&mut l, A, &["k2,x@m,1,open,S1,C1,"]);
        ok(&l, &["build", TABLE]);
        assert_eq!(latest_conflicts(&l).len(), 1);
        match trigger {
            "undo" => drop(ok(&l, &["undo", &k2])),
            _ => l.write_rules(2, Order::AB, OnConflict::Flag),
        }
        let built = ok(&l, &["build", TABLE]);
        assert!(built.contains("0 rows read"), "{built}");
        let k1 = &l.query(&format!("SELECT * FROM silver.{TABLE} WHERE id = 'k1'"))[0];
        assert_eq!(k1["conflict_fields"], json!(["email"]), "silver still flags k1");
        let b = latest_build(&l);
        assert_eq!(
            (latest_conflicts(&l).len(), &b["conflicts_open"]),
            (1, &json!(1)),
            "{trigger}: the kept record's conflict is still the table's: {b:?}"
        );
    }
}

/// guide.md: "The same decision given twice records nothing." Deciding b, then a, then b again:
/// the third is not the decision in force (a is), yet ingot answers "decision <the first>
/// already says so; nothing recorded" and silver keeps a's value. (src/ops/resolve.rs compares
/// with every decision not withdrawn instead of the one in force.)
#[test]
fn deciding_back_to_an_earlier_choice_records_a_decision() {
    let mut l = small_lake(OnConflict::Flag);
    ingest_lines(&mut l, A, &["k1,x@m,1,open,S1,C1,"]);
    ingest_lines(&mut l, B, &["k1,y@m,1,open,S1,C1,"]);
    ok(&l, &["build", TABLE]);
    let fp = fp1(1, "k1");
    for take in ["b", "a", "b"] {
        let out = ok(
            &l,
            &[
                "resolve", TABLE, &fp, "--field", "email", "--take", take, "--reason", "r",
            ],
        );
        assert!(!out.contains("nothing recorded"), "take {take}: {out}");
        ok(&l, &["build", TABLE]);
    }
    let k1 = &l.query(&format!("SELECT email FROM silver.{TABLE}"))[0];
    assert_eq!(k1["email"], json!("y@m"), "the last decision takes b");
}

/// guide.md: "After `ingot rekey` of one source its contract's key differs from the others', and
/// the table is refused until they build the same fingerprint again." Between editing b's
/// contract to the new key and `ingot rekey b`, the contracts agree but bronze.b still holds
/// v1 fingerprints: `ingot ingest b` is refused (run `ingot rekey b` first), while `ingot build`
/// succeeds and publishes k1 twice (a's candidate under v2, b's under v1), as two records that
/// never meet.
#[test]
fn a_build_is_refused_until_every_source_is_rekeyed() {
    let mut l = small_lake(OnConflict::Flag);
    ingest_lines(&mut l, A, &["k1,x@m,1,open,S1,C1,"]);
    ingest_lines(&mut l, B, &["k1,x@m,1,open,S1,C1,P1"]);
    ok(&l, &["build", TABLE]);
    l.write_contract(A, 2);
    ok(&l, &["rekey", "a"]);
    assert_eq!(
        l.ingot(&["build", TABLE]).status.code(),
        Some(2),
        "the key recipes differ"
    );
    l.write_contract(B, 2);
    let path = l.file(B, &format!("{}\nk1,x@m,1,open,S1,C1,P1\n", header(B)));
    let ingest = l.ingot(&["ingest", "b", &path]);
    assert_eq!(ingest.status.code(), Some(2), "bronze.b is keyed v1: {}", said(&ingest));
    let out = l.ingot(&["build", TABLE]);
    let rows = l.query(&format!(
        "SELECT id, natural_key_fingerprint, contributing_sources FROM silver.{TABLE}"
    ));
    assert_eq!(
        out.status.code(),
        Some(2),
        "a build before `ingot rekey b` is refused; it published {rows:?}"
    );
}
