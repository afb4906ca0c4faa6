//! Delta builds: an incremental build that reads only the runs committed since the previous
//! build and publishes a layer (new rows plus a deletion set) on top of the previous snapshot.
//! Random small deliveries (new records, changed values, records moving between window groups,
//! rows a filter removes or a validation rejects, undos) into a lake whose incremental builds use
//! deltas whenever they can, against a lake rebuilt in full each time: the same rows and flags,
//! the same counts; the layers really are used, compacted after the limit, kept by `gc` and
//! accepted by `doctor`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use crate::util::{Rng, TestLake, assert_ok, stdout};

type Row = BTreeMap<String, Value>;

const CONTRACT: &str = "\
source: events
version: 1
format: csv
fields:
  - {name: id, type: string, required: true}
  - {name: grp, type: string}
  - {name: day, type: date, required: true}
  - {name: val, type: int64}
natural_key: {version: 1, fields: [id]}
";

const RULES: &str = "\
table: events
source: events
version: 1
steps:
  - set: val2
    expr: \"val * 2\"
  - filter: \"val IS NULL OR val >= 0\"
validate:
  - name: small
    check: \"val IS NULL OR val < 1000\"
    reason: \"too big\"
anomalies:
  - name: big
    when: \"val > 800\"
  - name: jump
    spike: {column: val, by: [grp], order: day, window: 4, factor: 2}
  - name: new_group
    first_seen: {by: [grp], order: day, gap_days: 20}
";

struct Lake {
    t: TestLake,
    rules: PathBuf,
    /// Whether its incremental builds may always be delta builds.
    delta: bool,
}

impl Lake {
    fn new(delta: bool) -> Lake {
        Lake::with_contract(delta, CONTRACT)
    }

    fn with_contract(delta: bool, contract: &str) -> Lake {
        let t = TestLake::new();
        std::fs::write(t.contracts().join("events.yaml"), contract).unwrap();
        let rules = t.dir.path().join("rules");
        std::fs::create_dir_all(rules.join("events")).unwrap();
        std::fs::write(rules.join("events/v1.yaml"), RULES).unwrap();
        Lake { t, rules, delta }
    }

    fn ingot(&self, args: &[&str]) -> Output {
        let mut c = self.t.command();
        c.arg("--rules").arg(&self.rules).args(args);
        if self.delta {
            c.env("INGOT_SILVER_DELTA_LIMIT", "1");
        }
        c.output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.ingot(args);
        assert_ok(&out);
        stdout(&out)
    }

    fn ingest(&self, file: &Path) {
        self.ok(&["ingest", "events", file.to_str().unwrap()]);
    }

    /// Layers of the latest build's manifest (0 for a whole snapshot).
    fn layers(&self) -> usize {
        let b = self.t.query(
            "SELECT build_id FROM audit.silver_build_log WHERE status = 'succeeded' ORDER BY started_at DESC LIMIT 1",
        );
        let id = b[0]["build_id"].as_str().unwrap();
        let m = self.t.lake().join(format!("silver/events/build_id={id}/manifest.json"));
        let m: Value = serde_json::from_slice(&std::fs::read(m).unwrap()).unwrap();
        m["deltas"].as_array().map(Vec::len).unwrap_or(0)
    }

    /// silver.events without the build id, run ids by commit order.
    fn silver(&self) -> Vec<Row> {
        let names: BTreeMap<String, String> = self
            .t
            .query("SELECT run_id FROM audit.ingestion_run_log ORDER BY started_at, run_id")
            .iter()
            .enumerate()
            .map(|(i, r)| (r["run_id"].as_str().unwrap().to_string(), format!("run#{i}")))
            .collect();
        self.t
            .query("SELECT * FROM silver.events ORDER BY natural_key_fingerprint")
            .into_iter()
            .map(|mut r| {
                r.remove("silver_build_id");
                let id = r["ingestion_run_id"].as_str().unwrap().to_string();
                r.insert("ingestion_run_id".into(), Value::String(names[&id].clone()));
                r
            })
            .collect()
    }

    /// Flagged rows of the latest build's record, and the rows of the table.
    fn counts(&self) -> (Value, Value) {
        let b = self.t.query(
            "SELECT rows_flagged FROM audit.silver_build_log WHERE status = 'succeeded' ORDER BY started_at DESC LIMIT 1",
        );
        let n = self.t.query("SELECT count(*) AS n FROM silver.events");
        (b[0]["rows_flagged"].clone(), n[0]["n"].clone())
    }

    /// The id of the `i`-th committed events run (commit order).
    fn run_id(&self, i: usize) -> String {
        let runs = self
            .t
            .query("SELECT run_id FROM audit.ingestion_run_log WHERE source = 'events' ORDER BY started_at, run_id");
        runs[i]["run_id"].as_str().unwrap().to_string()
    }
}

/// A vendor's correction of a delivered row: the same record, group and day, another value (the
/// usual correction; the record stays in its `grp` group).
fn correction(rng: &mut Rng, line: &str) -> String {
    let mut fields: Vec<String> = line.trim_end().split(',').map(str::to_string).collect();
    fields[3] = rng.range(1, 1100).to_string();
    format!("{}\n", fields.join(","))
}

fn row(rng: &mut Rng, id: &str) -> String {
    let grp = if rng.chance(5) {
        String::new()
    } else {
        format!("g{}", rng.below(6))
    };
    let val = match rng.below(100) {
        0..=4 => String::new(),
        5..=8 => format!("-{}", rng.range(1, 50)),
        9..=11 => rng.range(1000, 1200).to_string(),
        12..=20 => rng.range(300, 900).to_string(),
        _ => rng.range(1, 120).to_string(),
    };
    format!("{id},{grp},2026-{:02}-{:02},{val}\n", rng.range(1, 4), rng.range(1, 28))
}

#[test]
fn delta_builds_after_random_small_deliveries_equal_full_builds() {
    for seed in [3u64, 2024] {
        let mut rng = Rng(seed);
        let inc = Lake::new(true);
        let full = Lake::new(false);
        let dir = inc.t.dir.path().join("landing");
        std::fs::create_dir_all(&dir).unwrap();
        let mut ids = 120usize;
        let mut last: BTreeMap<String, String> = BTreeMap::new();
        let mut body = String::new();
        for i in 0..ids {
            let (id, line) = (format!("e{i}"), row(&mut rng, &format!("e{i}")));
            body.push_str(&line);
            last.insert(id, line);
        }
        let (mut layers_seen, mut compacted, mut runs) = (0usize, false, 0usize);
        for step in 0..16 {
            let file = dir.join(format!("d{step:02}.csv"));
            std::fs::write(&file, format!("id,grp,day,val\n{body}")).unwrap();
            for l in [&inc, &full] {
                l.ingest(&file);
            }
            runs += 1;
            // now and then an undo of an earlier run: the next build cannot be a delta
            if step > 2 && rng.chance(15) {
                let i = rng.below(runs as u64) as usize;
                for l in [&inc, &full] {
                    l.ok(&["undo", &l.run_id(i)]);
                }
            }
            inc.ok(&["build", "events"]);
            full.ok(&["build", "events", "--full"]);
            let layers = inc.layers();
            layers_seen = layers_seen.max(layers);
            if step > 0 && layers == 0 && layers_seen >= 8 {
                compacted = true;
            }
            assert_eq!(inc.silver(), full.silver(), "seed {seed}, step {step}");
            assert_eq!(
                inc.counts(),
                full.counts(),
                "seed {seed}, step {step}: rows_flagged, rows"
            );
            // now and then a rebuild of every version over the layers: the same rows again
            if rng.chance(10) {
                inc.ok(&["build", "events", "--rebuild-where", "rules_version >= 1"]);
                assert_eq!(inc.silver(), full.silver(), "seed {seed}, step {step}: rebuild-where");
            }
            // the next delivery: a few records corrected, changed (maybe into another group) or new
            body.clear();
            for _ in 0..rng.range(1, 6) {
                let id = if rng.chance(60) {
                    format!("e{}", rng.below(ids as u64))
                } else {
                    ids += 1;
                    format!("e{ids}")
                };
                let line = match last.get(&id) {
                    Some(prev) if rng.chance(50) => correction(&mut rng, prev),
                    _ => row(&mut rng, &id),
                };
                body.push_str(&line);
                last.insert(id, line);
            }
        }
        assert!(layers_seen >= 3, "seed {seed}: delta layers were used ({layers_seen})");
        assert!(compacted || layers_seen < 8, "seed {seed}: compaction after 8 layers");
        // gc keeps every file the current layers name; doctor accepts the lake
        inc.ok(&["gc", "--grace", "0s", "--retain", "0s"]);
        assert_eq!(inc.silver(), full.silver(), "seed {seed}, after gc");
        inc.ok(&["doctor"]);
    }
}

#[test]
fn undoing_a_delta_build_restores_the_previous_snapshot_and_the_next_build_continues() {
    let mut rng = Rng(11);
    let inc = Lake::new(true);
    let full = Lake::new(false);
    let dir = inc.t.dir.path().join("landing");
    std::fs::create_dir_all(&dir).unwrap();
    let first: String = (0..60).map(|i| row(&mut rng, &format!("e{i}"))).collect();
    let second: String = (0..4).map(|i| row(&mut rng, &format!("e{}", i * 7))).collect();
    let (a, b) = (dir.join("a.csv"), dir.join("b.csv"));
    std::fs::write(&a, format!("id,grp,day,val\n{first}")).unwrap();
    std::fs::write(&b, format!("id,grp,day,val\n{second}")).unwrap();
    inc.ingest(&a);
    inc.ok(&["build", "events"]);
    let before = inc.silver();
    inc.ingest(&b);
    inc.ok(&["build", "events"]);
    assert_eq!(inc.layers(), 1);
    let build = inc
        .t
        .query("SELECT build_id FROM audit.silver_build_log ORDER BY started_at DESC LIMIT 1")[0]["build_id"]
        .as_str()
        .unwrap()
        .to_string();
    inc.ok(&["undo", &build]);
    assert_eq!(inc.silver(), before, "the previous snapshot");
    // the next incremental build picks the run up again, as a full build sees it
    inc.ok(&["build", "events"]);
    for f in [&a, &b] {
        full.ingest(f);
    }
    full.ok(&["build", "events", "--full"]);
    assert_eq!(inc.silver(), full.silver());
    assert_eq!(inc.counts(), full.counts());
}

/// Full snapshots (`delivery: full`): each delivery is the whole source with a few records
/// changed, added or left out; left-out records get tombstones and leave silver. Delta builds
/// give what full builds give.
#[test]
fn delta_builds_after_full_snapshot_deliveries_with_deletions_equal_full_builds() {
    let contract = CONTRACT.replace("format: csv\n", "format: csv\ndelivery: full\n");
    let mut rng = Rng(99);
    let inc = Lake::with_contract(true, &contract);
    let full = Lake::with_contract(false, &contract);
    let dir = inc.t.dir.path().join("landing");
    std::fs::create_dir_all(&dir).unwrap();
    let mut records: BTreeMap<String, String> = (0..100)
        .map(|i| {
            let id = format!("e{i}");
            let r = row(&mut rng, &id);
            (id, r)
        })
        .collect();
    let mut next_id = 100;
    let mut layers_seen = 0;
    for step in 0..10 {
        let body: String = records.values().cloned().collect();
        let file = dir.join(format!("full{step:02}.csv"));
        std::fs::write(&file, format!("id,grp,day,val\n{body}")).unwrap();
        for l in [&inc, &full] {
            l.ingest(&file);
        }
        inc.ok(&["build", "events"]);
        full.ok(&["build", "events", "--full"]);
        layers_seen = layers_seen.max(inc.layers());
        assert_eq!(inc.silver(), full.silver(), "step {step}");
        assert_eq!(inc.counts(), full.counts(), "step {step}: rows_flagged, rows");
        // the next snapshot: a few records changed, a few new, a few gone
        for _ in 0..rng.range(1, 3) {
            let victim = records.keys().nth(rng.below(records.len() as u64) as usize).cloned();
            if let Some(v) = victim {
                records.remove(&v);
            }
        }
        for _ in 0..rng.range(0, 3) {
            let id = records
                .keys()
                .nth(rng.below(records.len() as u64) as usize)
                .cloned()
                .unwrap();
            let r = row(&mut rng, &id);
            records.insert(id, r);
        }
        for _ in 0..rng.range(0, 2) {
            let id = format!("e{next_id}");
            next_id += 1;
            let r = row(&mut rng, &id);
            records.insert(id, r);
        }
    }
    assert!(layers_seen >= 3, "delta layers were used ({layers_seen})");
    let deleted = inc
        .t
        .query("SELECT sum(rows_deleted) AS n FROM audit.ingestion_run_log");
    assert!(deleted[0]["n"].as_i64().unwrap() > 5, "{deleted:?}");
}

/// A crash at every build failpoint of a delta build, then the same command again: the state of
/// one clean delta build (and nothing of the crashed build visible before its commit).
#[test]
fn every_build_failpoint_of_a_delta_build_crash_then_rerun_equals_one_clean_build() {
    let mut rng = Rng(5);
    let first: String = (0..80).map(|i| row(&mut rng, &format!("e{i}"))).collect();
    let second: String = (0..5).map(|i| row(&mut rng, &format!("e{}", i * 9))).collect();
    let seed = |l: &Lake| -> (PathBuf, PathBuf) {
        let dir = l.t.dir.path().join("landing");
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.csv"), dir.join("b.csv"));
        std::fs::write(&a, format!("id,grp,day,val\n{first}")).unwrap();
        std::fs::write(&b, format!("id,grp,day,val\n{second}")).unwrap();
        l.ingest(&a);
        l.ok(&["build", "events"]);
        l.ingest(&b);
        (a, b)
    };
    let clean = |noop: bool| {
        let l = Lake::new(true);
        seed(&l);
        l.ok(&["build", "events"]);
        assert_eq!(l.layers(), 1, "a delta build");
        if noop {
            l.ok(&["build", "events"]);
        }
        (l.silver(), l.counts(), l.layers())
    };
    let (once, then_noop) = (clean(false), clean(true));
    for point in ingot::table::failpoint::BUILD {
        let l = Lake::new(true);
        seed(&l);
        let before = (l.silver(), l.counts());
        let mut c = l.t.command();
        c.env("INGOT_FAILPOINT", point)
            .env("INGOT_SILVER_DELTA_LIMIT", "1")
            .arg("--rules")
            .arg(&l.rules)
            .args(["build", "events"]);
        let out = c.output().unwrap();
        assert!(!out.status.success(), "{point}: the process should have crashed");
        let committed = *point == "build.after_commit";
        if !committed {
            assert_eq!(
                (l.silver(), l.counts()),
                before,
                "{point}: nothing of the crashed build is visible"
            );
        }
        l.ok(&["build", "events"]);
        let want = if committed { &then_noop } else { &once };
        assert_eq!(&(l.silver(), l.counts(), l.layers()), want, "{point}: crash + re-run");
        l.ok(&["doctor"]);
    }
}
