//! A cluster fit for a shared network: with a token, the scheduler refuses Ballista clients
//! without it (and ingot's client says so), executors' Flight services refuse calls without it,
//! and plans that write or read outside the lake are refused by the scheduler before anything
//! runs, while ingot's own queries still run there.

use std::path::Path;

use ingot::engine::cluster::guard::ClusterSecurity;

use crate::cluster::process_cluster;
use crate::util::{TestLake, landing, stderr};

const TOKEN: &str = "0f3a9c2e7b4d4c1a8e6f5d3b2a190876";

fn token_env() -> Vec<(String, String)> {
    vec![("INGOT_CLUSTER_TOKEN".to_string(), TOKEN.to_string())]
}

/// `statements` in one session over the lake of `t`, on the cluster at `url` through a
/// Ballista session made by ingot's client library with `security` (or in this process when
/// `url` is `None`): the last one's row count, or the error text.
fn run_sql(
    t: &TestLake,
    url: Option<&str>,
    security: &ClusterSecurity,
    statements: &[String],
) -> Result<usize, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let lake = ingot::table::lake::Lake::open(&t.lake().display().to_string()).map_err(|e| e.to_string())?;
        let ws = ingot::engine::session::Workspace::new(lake);
        let local = ws.session().map_err(|e| e.to_string())?;
        let ctx = match url {
            Some(url) => datafusion::prelude::SessionContext::new_with_state(
                ingot::engine::cluster::client::remote_state_with(&local.state(), url, security)
                    .await
                    .map_err(|e| e.to_string())?,
            ),
            None => local,
        };
        let mut rows = 0;
        for sql in statements {
            let df = ctx.sql(sql).await.map_err(|e| e.to_string())?;
            let batches = df.collect().await.map_err(|e| e.to_string())?;
            rows = batches.iter().map(|b| b.num_rows()).sum();
        }
        Ok(rows)
    })
}

/// An external table `name` over `file` (registered in the client), then `SELECT * FROM name`.
fn external(name: &str, file: &Path, format: &str) -> Vec<String> {
    vec![
        format!(
            "CREATE EXTERNAL TABLE {name} STORED AS {format} LOCATION '{}'",
            file.display()
        ),
        format!("SELECT * FROM {name}"),
    ]
}

/// A bronze Parquet file of the lake.
fn bronze_file(t: &TestLake) -> std::path::PathBuf {
    crate::util::files_under(&t.lake().join("bronze/hotels"))
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "parquet"))
        .expect("a bronze file")
}

#[test]
fn a_cluster_with_a_token_refuses_strangers_and_plans_that_write_or_read_outside_the_lake() {
    let t = TestLake::new();
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    let (_cluster, url) = process_cluster(&t.lake().display().to_string(), &token_env());

    // ingot's client without the token, and with a wrong one: refused, and said so
    for (token, want) in [(None, "is not set"), (Some("wrong"), "is set but wrong")] {
        let mut c = t.command();
        c.env_remove("INGOT_CLUSTER_TOKEN").arg("--cluster").arg(&url);
        if let Some(tok) = token {
            c.env("INGOT_CLUSTER_TOKEN", tok);
        }
        let out = c.args(["sql", "SELECT count(*) FROM bronze.hotels"]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("the scheduler refused the token"),
            "{}",
            stderr(&out)
        );
        assert!(stderr(&out).contains(want), "{}", stderr(&out));
    }
    // a plain Ballista client without the token: refused by the scheduler
    let lake_table = external("h", &bronze_file(&t), "PARQUET");
    let none = ClusterSecurity::default();
    let e = run_sql(&t, Some(&url), &none, &lake_table).unwrap_err();
    assert!(e.contains("lacks the cluster's token"), "{e}");

    let with_token = ClusterSecurity {
        token: Some(TOKEN.into()),
        ca: None,
    };
    // with the token, a query of the lake's files runs there (scheduler, executor and the result
    // fetch all pass) and answers what this process answers
    let here = run_sql(&t, None, &none, &lake_table).unwrap();
    assert!(here > 0);
    assert_eq!(run_sql(&t, Some(&url), &with_token, &lake_table), Ok(here));

    // COPY: refused by the scheduler, nothing written
    let out = t.dir.path().join("stolen.parquet");
    let mut copy = lake_table.clone();
    copy.push(format!(
        "COPY (SELECT * FROM h) TO '{}' STORED AS PARQUET",
        out.display()
    ));
    let e = run_sql(&t, Some(&url), &with_token, &copy).unwrap_err();
    assert!(e.contains("plan refused: COPY ... TO"), "{e}");
    assert!(!out.exists(), "COPY wrote {}", out.display());

    // an external table over a file outside the lake: CSV, and Parquet too
    let secret = t.dir.path().join("secret.csv");
    std::fs::write(&secret, "line\nSECRET\n").unwrap();
    let e = run_sql(&t, Some(&url), &with_token, &external("s", &secret, "CSV")).unwrap_err();
    assert!(e.contains("plan refused") && e.contains("not Parquet"), "{e}");
    let outside = t.dir.path().join("outside.parquet");
    std::fs::copy(bronze_file(&t), &outside).unwrap();
    let e = run_sql(&t, Some(&url), &with_token, &external("o", &outside, "PARQUET")).unwrap_err();
    assert!(e.contains("plan refused") && e.contains("outside the lake"), "{e}");
}

#[cfg(feature = "flight")]
#[test]
fn an_executors_flight_service_refuses_calls_without_the_token() {
    let t = TestLake::new();
    let cluster = crate::cluster::process_cluster_with_ports(&t.lake().display().to_string(), &token_env());
    let port = cluster.executor_ports[0];
    let script = r#"
import sys
import pyarrow.flight as f

def call(headers):
    c = f.FlightClient(sys.argv[1])
    try:
        list(c.do_get(f.Ticket(b"x"), options=f.FlightCallOptions(headers=headers)).read_all().to_batches())
        return "ok"
    except Exception as e:
        return str(e).replace("\n", " ")

print(call([]))
print(call([(b"authorization", b"Bearer " + sys.argv[2].encode())]))
"#;
    let out = std::process::Command::new(crate::flight::venv_python())
        .args(["-c", script, &format!("grpc://127.0.0.1:{port}"), TOKEN])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        lines[0].contains("lacks the cluster's token"),
        "without the token: {}",
        lines[0]
    );
    // with the token the call reaches Ballista's service, which rejects the made-up ticket
    assert!(
        !lines[1].contains("lacks the cluster's token"),
        "with the token: {}",
        lines[1]
    );
}

#[cfg(feature = "flight")]
#[test]
fn a_cluster_over_tls_with_a_token_answers_what_one_process_answers() {
    let t = TestLake::new();
    t.ingest_ok("hotels", &landing("hotels/2026-11-01_hotels.csv"));
    let (cert, key, ca) = crate::flight::make_cert(t.dir.path());
    // the token from a file this time (mode 600, so no warning)
    let token_file = t.dir.path().join("cluster-token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&token_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let envs = vec![
        ("INGOT_CLUSTER_TOKEN_FILE".to_string(), token_file.display().to_string()),
        ("INGOT_CLUSTER_CA".to_string(), ca.display().to_string()),
    ];
    let tls = [
        "--tls-cert".to_string(),
        cert.display().to_string(),
        "--tls-key".to_string(),
        key.display().to_string(),
    ];
    let cluster = crate::cluster::process_cluster_with_args(&t.lake().display().to_string(), &envs, &tls);
    let sql = "SELECT hotel_code, row_hash(hotel_code, name) AS h FROM bronze.hotels ORDER BY 1";
    let here = t.query(sql);
    let mut c = t.command();
    c.arg("--cluster").arg(&cluster.url).env("INGOT_CLUSTER_TRACE", "1");
    for (k, v) in &envs {
        c.env(k, v);
    }
    let out = c.args(["sql", sql, "--format", "json"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("on the cluster"), "{}", stderr(&out));
    let there: Vec<std::collections::BTreeMap<String, serde_json::Value>> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(there, here);
    // a client that does not trust the certificate gets nothing
    let mut c = t.command();
    c.arg("--cluster").arg(&cluster.url).env("INGOT_CLUSTER_TOKEN", TOKEN);
    let out = c.args(["sql", sql]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}
