//! `ingot run`, the nightly job: every new landing file once, every affected table built, and a
//! second run in a row changes nothing.

use std::path::Path;

use crate::util::{TestLake, assert_ok, repo, stderr, stdout};

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

/// `ingot run` over the landing folder of the test directory, with the repository's rules.
pub fn nightly(t: &TestLake) -> std::process::Output {
    let landing = t.dir.path().join("landing");
    t.command()
        .arg("--landing")
        .arg(&landing)
        .arg("--rules")
        .arg(repo().join("rules"))
        .arg("run")
        .output()
        .unwrap()
}

/// Every table a lake has, whole (ids normalized by the snapshot), plus silver and the build log.
fn state(
    t: &TestLake,
) -> (
    crate::util::LakeSnapshot,
    Vec<std::collections::BTreeMap<String, serde_json::Value>>,
) {
    let silver = t.query(
        "SELECT 'bookings' AS t, natural_key_fingerprint, row_hash, silver_build_id FROM silver.bookings \
         UNION ALL SELECT 'marketing_spend', natural_key_fingerprint, row_hash, silver_build_id FROM silver.marketing_spend \
         UNION ALL SELECT 'site_traffic', natural_key_fingerprint, row_hash, silver_build_id FROM silver.site_traffic \
         UNION ALL SELECT 'web_sessions', natural_key_fingerprint, row_hash, silver_build_id FROM silver.web_sessions \
         ORDER BY 1, 2",
    );
    (
        t.snapshot(&["bookings", "hotels", "marketing_spend", "site_traffic", "web_sessions"]),
        silver,
    )
}

#[test]
fn the_nightly_job_loads_every_new_file_once_and_a_second_run_changes_nothing() {
    let t = TestLake::new();
    copy_dir(&repo().join("data/landing"), &t.dir.path().join("landing"));
    let out = nightly(&t);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(
        text.contains("nightly job: 14 runs (1 skipped as duplicates, 0 failed), 4 builds (0 failed)"),
        "{text}"
    );
    // the runs are exactly those of ingesting each source's files in order (the oracle's counts)
    let oracle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("data/expected.json")).unwrap()).unwrap();
    let runs = t.query("SELECT source, file_path, status, rows_seen, rows_inserted, rows_updated, rows_unchanged, rows_failed FROM audit.ingestion_run_log ORDER BY source, file_path");
    let want = oracle["landing"].as_array().unwrap();
    assert_eq!(runs.len(), want.len());
    for (got, want) in runs.iter().zip(want) {
        assert!(
            got["file_path"]
                .as_str()
                .unwrap()
                .ends_with(want["file"].as_str().unwrap()),
            "{got:?} vs {want:?}"
        );
        for k in [
            "status",
            "rows_seen",
            "rows_inserted",
            "rows_updated",
            "rows_unchanged",
            "rows_failed",
        ] {
            assert_eq!(got[k], want[k], "{k} of {}", want["file"]);
        }
    }
    let builds = t.query("SELECT \"table\", mode, status FROM audit.silver_build_log ORDER BY \"table\"");
    assert_eq!(builds.len(), 4, "{builds:?}");

    let before = state(&t);
    let again = nightly(&t);
    assert_ok(&again);
    assert!(
        stdout(&again).starts_with("nightly job: 0 runs (0 skipped as duplicates, 0 failed), 0 builds (0 failed); 14 landing files already loaded"),
        "{}",
        stdout(&again)
    );
    let after = state(&t);
    before.0.assert_same(&after.0, "second nightly run");
    assert_eq!(before.1, after.1, "silver changed on the second nightly run");
    assert_eq!(t.query("SELECT * FROM audit.silver_build_log").len(), 4);
}

#[test]
fn a_new_file_is_ingested_alone_and_only_affected_tables_are_rebuilt() {
    let t = TestLake::new();
    let landing = t.dir.path().join("landing");
    copy_dir(&repo().join("data/landing"), &landing);
    assert_ok(&nightly(&t));
    // a new web-sessions delivery: one more session
    let line = std::fs::read_to_string(landing.join("web_sessions/2026-11-02_web_sessions.ndjson")).unwrap();
    let first = line
        .lines()
        .next()
        .unwrap()
        .replacen("\"session_id\":\"", "\"session_id\":\"new-", 1);
    std::fs::write(
        landing.join("web_sessions/2026-11-09_web_sessions.ndjson"),
        format!("{first}\n"),
    )
    .unwrap();
    let out = nightly(&t);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(text.contains("nightly job: 1 run (0 skipped as duplicates, 0 failed), 1 build (0 failed); 14 landing files already loaded"), "{text}");
    assert!(text.contains("silver.web_sessions"), "{text}");
    assert!(!text.contains("silver.bookings"), "{text}");
    assert!(!text.contains("silver.site_traffic"), "{text}");
    assert_eq!(
        t.query("SELECT count(*) AS n FROM silver.web_sessions WHERE natural_key_fingerprint IS NOT NULL")[0]["n"],
        215
    );
}

/// `ingot run | head -1`, or a terminal that went away: printing stops, the job does not. With its
/// stdout closed before it prints anything, the nightly job still ingests and builds everything
/// and exits 0; so do `ingot sql` with a closed pipe and a second run.
#[test]
fn a_closed_stdout_never_stops_the_job() {
    let t = TestLake::new();
    copy_dir(&repo().join("data/landing"), &t.dir.path().join("landing"));
    let landing = t.dir.path().join("landing");
    let closed = |args: &[&str]| {
        let mut child = t
            .command()
            .arg("--landing")
            .arg(&landing)
            .arg("--rules")
            .arg(repo().join("rules"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        child.wait_with_output().unwrap()
    };
    let out = closed(&["run"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let builds = t.query("SELECT DISTINCT \"table\" FROM audit.silver_build_log WHERE status = 'succeeded' ORDER BY 1");
    assert_eq!(builds.len(), 4, "every table was built: {builds:?}");
    let out = closed(&["sql", "SELECT * FROM bronze.bookings", "--format", "csv"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let out = closed(&["run"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The nightly job heals: after an undo, a manual ingest and a build killed before its commit
/// (none of them through the job), `ingot run` rebuilds exactly the tables whose latest build no
/// longer shows their inputs, says why, and leaves a lake `doctor` finds clean; the run after
/// that builds nothing.
#[test]
fn the_nightly_job_rebuilds_whatever_changed_its_inputs() {
    let t = TestLake::new();
    copy_dir(&repo().join("data/landing"), &t.dir.path().join("landing"));
    assert_ok(&nightly(&t));
    let rules = repo().join("rules");
    let with_rules = |args: &[&str]| t.command().arg("--rules").arg(&rules).args(args).output().unwrap();
    // an undo of a bookings run and a manual site_traffic ingest, outside the job
    let run = t.query(
        "SELECT run_id FROM audit.ingestion_run_log WHERE source = 'bookings' AND rows_inserted > 0 \
         ORDER BY started_at DESC LIMIT 1",
    )[0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ok(&with_rules(&["undo", &run]));
    let extra = t.dir.path().join("extra_site_traffic.csv");
    std::fs::write(
        &extra,
        "hotel_code,day,sessions,pageviews,conversions\nAMS01,2026-12-01,5,9,1\n",
    )
    .unwrap();
    let out = t.ingest("site_traffic", &extra);
    assert!(out.status.success(), "{}", stderr(&out));
    // a build of marketing_spend killed after writing its files, before its commit
    let mut killed = t.command();
    killed
        .env("INGOT_FAILPOINT", "build.after_data")
        .arg("--rules")
        .arg(&rules)
        .args(["build", "marketing_spend"]);
    let _ = killed.output().unwrap();
    let doctor = t.run(&["doctor"]);
    assert_eq!(
        doctor.status.code(),
        Some(1),
        "the undo left silver.bookings behind: {}",
        stdout(&doctor)
    );

    let out = nightly(&t);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(
        text.contains("built silver.bookings: its latest build does not show the committed state of its inputs"),
        "{text}"
    );
    assert!(
        text.contains("built silver.site_traffic: its latest build does not show"),
        "{text}"
    );
    assert!(!text.contains("built silver.web_sessions"), "{text}");
    let doctor = t.run(&["doctor"]);
    assert_eq!(doctor.status.code(), Some(0), "{}", stdout(&doctor));
    let again = stdout(&nightly(&t));
    assert!(again.contains("0 builds"), "{again}");
}

/// A file that failed for a passing cause (here: touched while it was read) is recorded with
/// failure class `transient` and retried by the next nightly job; a file that failed for its
/// content is not retried until its contract changes.
#[test]
fn the_nightly_job_retries_a_run_that_failed_for_a_passing_cause() {
    let t = TestLake::new();
    let landing = t.dir.path().join("landing");
    std::fs::create_dir_all(landing.join("hotels")).unwrap();
    let file = landing.join("hotels/2026-11-01_hotels.csv");
    std::fs::copy(repo().join("data/landing/hotels/2026-11-01_hotels.csv"), &file).unwrap();
    std::fs::create_dir_all(landing.join("bookings")).unwrap();
    std::fs::write(landing.join("bookings/empty.csv"), "").unwrap();
    let marker = t.dir.path().join("reached");
    let mut job = t.command();
    job.env("INGOT_FAILPOINT", "ingest.after_hash:sleep:3000")
        .env("INGOT_FAILPOINT_MARKER", &marker)
        .arg("--landing")
        .arg(&landing)
        .arg("--rules")
        .arg(repo().join("rules"))
        .arg("run")
        .stdout(std::process::Stdio::piped());
    let child = job.spawn().unwrap();
    crate::util::wait_for_marker(&marker, "the nightly job");
    // touched while it is read: same bytes, a new modification time
    let f = std::fs::File::options().write(true).open(&file).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    drop(f);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let runs =
        || t.query("SELECT source, status, failure_class FROM audit.ingestion_run_log ORDER BY source, started_at");
    let first: Vec<String> = runs()
        .iter()
        .map(|r| format!("{} {} {}", r["source"], r["status"], r["failure_class"]))
        .collect();
    assert_eq!(
        first,
        vec![
            "\"bookings\" \"failed\" \"content\"".to_string(),
            "\"hotels\" \"failed\" \"transient\"".to_string()
        ]
    );
    // the next job retries the transient failure only
    let out = nightly(&t);
    let text = stdout(&out);
    assert!(text.contains("ingest hotels"), "{text}");
    assert!(!text.contains("ingest bookings"), "{text}");
    assert!(
        text.contains("failed for a passing cause:") && text.contains("the file changed while it was being ingested"),
        "the summary says why it retried: {text}"
    );
    let last = runs().into_iter().last().unwrap();
    assert_eq!(last["status"], "succeeded");
    assert_eq!(last.get("failure_class"), None, "null on a run that did not fail");
}
