//! `ingot build --dry-run` and the plan in `ingot explain`, through the real binary over the demo
//! data: a dry run writes nothing, and the build that follows does what the plan said (mode,
//! what kind of build, the runs it reads, the records it processes, keeps and removes), over the
//! life of a table: first build, nothing new, a correction (a delta layer), an undo (a whole
//! snapshot again), `--full`, `--rebuild-where`, and a rules file edited after use.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::util::{TestLake, assert_ok, landing, repo, sha256_hex, stderr, stdout};

/// Every file of the lake with the SHA-256 of its bytes.
fn files(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                out.insert(rel, sha256_hex(&std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

fn json(out: &std::process::Output) -> Value {
    assert_ok(out);
    serde_json::from_str(stdout(out).trim()).unwrap_or_else(|e| panic!("{e}: {}", stdout(out)))
}

fn count(t: &TestLake, sql: &str) -> u64 {
    t.query(sql)[0]["n"].as_u64().unwrap()
}

/// Plan `ingot build bookings <args>` with a dry run (which must write nothing), then build, and
/// check the build against the plan. Returns the plan.
fn plan_then_build(t: &TestLake, args: &[&str], kind: &str) -> Value {
    let before = files(&t.lake());
    let mut dry = vec!["build", "bookings", "--dry-run", "--json"];
    dry.extend_from_slice(args);
    let plan = json(&t.run(&dry));
    assert_eq!(files(&t.lake()), before, "the dry run {args:?} changed the lake");
    assert_eq!(plan["kind"], kind, "plan {args:?}: {plan}");
    assert_eq!(plan["table"], "bookings");
    assert_eq!(plan["rules_version"], 2);
    let mut real = vec!["build", "bookings", "--json"];
    real.extend_from_slice(args);
    let built = json(&t.run(&real));
    assert_eq!(built["status"], "succeeded", "{built}");
    assert_eq!(
        built["mode"], plan["mode"],
        "the build's mode is the plan's: {plan} vs {built}"
    );
    assert_eq!(
        built["rows_read"], plan["process"],
        "the build processed the records the plan said: {plan} vs {built}"
    );
    let read: u64 = plan["read"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["process"].as_u64().unwrap())
        .sum();
    assert_eq!(Some(read), plan["process"].as_u64(), "per-run counts add up: {plan}");
    let rows = count(t, "SELECT count(*) AS n FROM silver.bookings");
    let written = built["rows_written"].as_u64().unwrap();
    let kept = plan["kept"].as_u64().unwrap();
    match kind {
        // a delta layer's `kept` is the previous layers' rows, some of which it replaces
        "delta" => assert!(rows <= kept + written, "{rows} rows after {plan} / {built}"),
        _ => assert_eq!(rows, kept + written, "rows in the table: {plan} / {built}"),
    }
    plan
}

fn run_ids(t: &TestLake) -> Vec<String> {
    t.query("SELECT run_id FROM audit.ingestion_run_log WHERE source = 'bookings' ORDER BY started_at")
        .into_iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_dry_run_writes_nothing_and_the_build_does_what_it_planned() {
    let t = TestLake::new();
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));

    let first = plan_then_build(&t, &[], "full");
    assert_eq!(first["mode"], "full");
    assert!(
        first["reason"].as_str().unwrap().contains("no succeeded build"),
        "{first}"
    );
    assert_eq!(first["runs"], 1);
    assert_eq!(first["kept"], 0);
    assert_eq!(first["read"][0]["whole"], true);

    let again = plan_then_build(&t, &[], "unchanged");
    assert_eq!(again["mode"], "incremental");
    assert_eq!(again["process"], 0);
    assert_eq!(again["read"], serde_json::json!([]));

    // a correction: only its run is read, as a delta layer on the previous build
    t.ingest_ok("bookings", &landing("bookings/2026-11-04_bookings_corrected.csv"));
    let correction = run_ids(&t).pop().unwrap();
    let delta = plan_then_build(&t, &[], "delta");
    assert_eq!(delta["delta_layer"], 1);
    assert_eq!(delta["runs"], 2);
    let read: Vec<&str> = delta["read"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(read, vec![correction.as_str()]);
    assert!(delta["process"].as_u64().unwrap() > 0);

    // an undo rules delta layers out: a whole snapshot, and the plan says why
    let out = t.run(&["undo", &correction]);
    assert_ok(&out);
    let after_undo = plan_then_build(&t, &[], "incremental");
    assert!(
        after_undo["reason"].as_str().unwrap().contains("undone"),
        "{after_undo}"
    );
    assert_eq!(after_undo["runs"], 1);

    let full = plan_then_build(&t, &["--full"], "full");
    assert_eq!(full["reason"], "--full");
    assert_eq!(full["kept"], 0);

    let rebuild = plan_then_build(&t, &["--rebuild-where", "rules_version >= 2"], "rebuild");
    assert_eq!(rebuild["mode"], "rebuild");
    assert_eq!(rebuild["rebuild_filter"], "rules_version >= 2");
    assert_eq!(rebuild["kept"], 0);
    let none = plan_then_build(&t, &["--rebuild-where", "rules_version < 2"], "rebuild");
    assert_eq!(none["process"], 0);

    // explain shows the plan of now, in words
    let out = t.run(&["explain", "bookings"]);
    assert_ok(&out);
    let text = stdout(&out);
    let last = t
        .query("SELECT build_id FROM audit.silver_build_log WHERE \"table\" = 'bookings' ORDER BY started_at DESC, build_id DESC LIMIT 1")[0]
        ["build_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.contains(&format!(
            "build plan (ingot build bookings now):\nsilver.bookings with rules v2: nothing to do since build {last}"
        )),
        "{text}"
    );
}

#[test]
fn a_dry_run_refuses_what_the_build_would_refuse() {
    let t = TestLake::new();
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    t.ingest_ok("bookings", &landing("bookings/2026-11-01_bookings.csv"));
    let out = t.run(&["build", "bookings", "--dry-run", "--rebuild-where", "rules_version < 2"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("has no succeeded build to rebuild rows of"),
        "{}",
        stderr(&out)
    );
    let out = t.run(&["build", "nosuchtable", "--dry-run"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // a rules version edited after a build used it: the dry run refuses as the build does
    let rules = t.dir.path().join("rules");
    for table in ["bookings"] {
        std::fs::create_dir_all(rules.join(table)).unwrap();
        for f in std::fs::read_dir(repo().join("rules").join(table)).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, rules.join(table).join(f.file_name().unwrap())).unwrap();
        }
    }
    let with_rules = |args: &[&str]| t.command().arg("--rules").arg(&rules).args(args).output().unwrap();
    assert_ok(&with_rules(&["build", "bookings"]));
    let v2 = rules.join("bookings/v2.yaml");
    let text = std::fs::read_to_string(&v2).unwrap();
    std::fs::write(&v2, format!("{text}\n# edited\n")).unwrap();
    let dry = with_rules(&["build", "bookings", "--dry-run"]);
    let real = with_rules(&["build", "bookings"]);
    assert_eq!(dry.status.code(), Some(2), "{}", stderr(&dry));
    assert_eq!(stderr(&dry), stderr(&real), "the dry run and the build refuse alike");
    assert!(
        stderr(&dry).contains("a rules version is immutable once used"),
        "{}",
        stderr(&dry)
    );
    let explain = with_rules(&["explain", "bookings"]);
    assert_ok(&explain);
    assert!(
        stdout(&explain).contains("build plan (ingot build bookings now): refused: "),
        "{}",
        stdout(&explain)
    );
}
