//! `ingot serve` (Arrow Flight SQL) tested with a real client: the ADBC Flight SQL driver for
//! Python from PyPI, in a venv this test creates (`.venv-test`, pinned versions), against a
//! server on a free loopback port over the demo lake: queries (compared with `ingot sql`),
//! a prepared statement with a parameter, catalog browsing, refusal of DDL and DML, refusal
//! without the token, and ten concurrent clients.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::util::{TestLake, assert_ok, python_venv, repo};

const ADBC: &str = "adbc-driver-flightsql==1.13.0";
const PYARROW: &str = "pyarrow==26.0.1";
/// makes the TLS certificate of tests/it/flight_security.rs
const CRYPTOGRAPHY: &str = "cryptography==46.0.3";

/// The test venv's python, created (and its packages installed) on first use.
pub fn venv_python() -> PathBuf {
    python_venv(
        ".venv-test",
        "import adbc_driver_flightsql, pyarrow, cryptography",
        &[ADBC, PYARROW, CRYPTOGRAPHY],
    )
}

/// A test certificate authority and a server certificate it signs for 127.0.0.1 and localhost,
/// made in `dir` by tests/py/make_cert.py: (certificate, key, authority), PEM files.
pub fn make_cert(dir: &std::path::Path) -> (PathBuf, PathBuf, PathBuf) {
    let (cert, key, ca) = (dir.join("cert.pem"), dir.join("key.pem"), dir.join("ca.pem"));
    let made = Command::new(venv_python())
        .arg(repo().join("tests/py/make_cert.py"))
        .args([&cert, &key, &ca])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    (cert, key, ca)
}

/// Run the repository's Python script `script` with `args`; insist on exit 0 and return the
/// one JSON value it prints.
pub fn py_json(python: &std::path::Path, script: &str, args: &[&str]) -> Value {
    let out = Command::new(python)
        .arg(repo().join(script))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Kills the server when the test ends, pass or fail.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_real_flight_sql_client_queries_browses_and_is_refused_what_it_may_not_do() {
    let python = venv_python();
    let t = TestLake::new();
    crate::nightly::copy_dir(&repo().join("data/landing"), &t.dir.path().join("landing"));
    assert_ok(&crate::nightly::nightly(&t));
    let mut child = t
        .command()
        .arg("--rules")
        .arg(repo().join("rules"))
        .args(["serve", "--addr", "127.0.0.1:0"])
        .env("INGOT_TOKEN", "s3cret")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let server = Server(child);
    let mut first = String::new();
    std::io::BufReader::new(stdout).read_line(&mut first).unwrap();
    let addr = first
        .strip_prefix("listening on ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_string();
    assert!(addr.starts_with("127.0.0.1:"), "loopback: {addr}");

    let got = py_json(
        &python,
        "tests/py/flight_client.py",
        &[&format!("grpc://{addr}"), "s3cret"],
    );
    // rows of `ingot sql` as arrays; the JSON objects' keys come back sorted, so the queries
    // name their columns a, b, ... in select order
    let rows = |sql: &str| -> Value {
        let q = t.query(sql);
        Value::Array(q.iter().map(|r| Value::Array(r.values().cloned().collect())).collect())
    };
    // the same answers as `ingot sql` over the same lake
    assert_eq!(
        got["current"],
        rows("SELECT count(*) AS n FROM bronze.bookings_current")
    );
    assert_eq!(
        got["runs"],
        rows("SELECT status AS a, count(*) AS b FROM audit.ingestion_run_log GROUP BY 1 ORDER BY 1")
    );
    assert_eq!(
        got["silver"],
        rows("SELECT rules_version AS a, count(*) AS b FROM silver.bookings GROUP BY 1 ORDER BY 1")
    );
    assert_eq!(
        got["udf"],
        rows("SELECT natural_key_fingerprint(1, 'AMS01', 'BK1') AS f")
    );
    assert_eq!(
        got["prepared"],
        rows("SELECT count(*) AS n FROM silver.bookings WHERE rules_version = 2"),
        "a prepared statement with a parameter"
    );
    // catalog browsing: ADBC's get_objects (GetCatalogs, then GetDbSchemas and GetTables without
    // a catalog name) lists exactly the tables information_schema lists in-process (the
    // information_schema views themselves are queryable but not browsed)
    let listed: Vec<String> = t
        .query(
            "SELECT table_catalog || '.' || table_schema || '.' || table_name AS t \
             FROM information_schema.tables WHERE table_schema <> 'information_schema' ORDER BY 1",
        )
        .iter()
        .map(|r| r["t"].as_str().unwrap().to_string())
        .collect();
    for want in [
        "ingot.silver.bookings",
        "ingot.bronze.bookings_current",
        "ingot.audit.ingestion_run_log",
    ] {
        assert!(listed.iter().any(|t| t == want), "{want} not in {listed:?}");
    }
    assert_eq!(got["objects"], serde_json::json!(listed), "get_objects");
    // and a table's columns through GetTables with its schema
    let columns: Vec<&str> = got["table_schema"]
        .as_array()
        .unwrap_or_else(|| panic!("{got}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for want in [
        "natural_key_fingerprint",
        "rules_version",
        "anomaly_flags",
        "is_anomaly",
    ] {
        assert!(columns.contains(&want), "{want} not in {columns:?}");
    }
    // refusals
    for (step, what) in [("ddl", "CREATE TABLE"), ("insert", "INSERT")] {
        let e = got[step]["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{what} was accepted: {got}"));
        assert!(e.contains("not supported") || e.contains("read-only"), "{what}: {e}");
    }
    let e = got["no_token"]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no token accepted: {got}"));
    assert!(e.contains("bearer token is required"), "{e}");
    // ten clients at once, each with its own answer
    let n = rows("SELECT count(*) AS n FROM bronze.bookings")[0][0].clone();
    let concurrent = got["concurrent"].as_array().unwrap();
    assert_eq!(concurrent.len(), 10);
    for (i, r) in concurrent.iter().enumerate() {
        assert_eq!(r, &Value::Array(vec![Value::from(i), n.clone()]), "client {i}");
    }
    drop(server);
}
