//! The sqllogictest files in `tests/sqllogictests/*.slt`, run against the catalog of the demo
//! lake (the nightly job over `data/landing` with the repository's rules), through the same
//! read-only path as `ingot sql` ([`ingot::query::sql::query`]).
//!
//! `INGOT_SLT_COMPLETE=1 cargo test --test it slt` rewrites the expected results of the files
//! from the current behaviour (review the diff before committing it).

use std::path::PathBuf;

use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use sqllogictest::{DBOutput, DefaultColumnType};

use crate::util::{TestLake, assert_ok, repo};

struct IngotDb {
    ctx: SessionContext,
}

fn column_type(t: &DataType) -> DefaultColumnType {
    match t {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => DefaultColumnType::Integer,
        DataType::Float16
        | DataType::Float32
        | DataType::Float64
        | DataType::Decimal128(_, _)
        | DataType::Decimal256(_, _) => DefaultColumnType::FloatingPoint,
        _ => DefaultColumnType::Text,
    }
}

#[async_trait::async_trait]
impl sqllogictest::AsyncDB for IngotDb {
    type Error = ingot::Error;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, ingot::Error> {
        let df = ingot::query::sql::query(&self.ctx, sql).await?;
        let types: Vec<DefaultColumnType> = df
            .schema()
            .fields()
            .iter()
            .map(|f| column_type(f.data_type()))
            .collect();
        let mut stream = df.execute_stream().await?;
        let mut rows = Vec::new();
        let options = FormatOptions::default().with_null("NULL");
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            let formatters = batch
                .columns()
                .iter()
                .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
                .collect::<Result<Vec<_>, _>>()?;
            for r in 0..batch.num_rows() {
                rows.push(
                    formatters
                        .iter()
                        .map(|f| {
                            let s = f.value(r).to_string();
                            if s.is_empty() { "(empty)".to_string() } else { s }
                        })
                        .collect(),
                );
            }
        }
        Ok(DBOutput::Rows { types, rows })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "ingot"
    }
}

fn slt_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("tests/sqllogictests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    files
}

#[test]
fn sqllogictest_files_over_the_demo_lake() {
    let t = TestLake::new();
    let landing = t.dir.path().join("landing");
    crate::nightly::copy_dir(&repo().join("data/landing"), &landing);
    assert_ok(&crate::nightly::nightly(&t));
    let lake = ingot::table::lake::Lake::open(&t.lake().display().to_string()).unwrap();
    let ws = ingot::engine::session::Workspace {
        contracts_dir: t.contracts(),
        rules_dir: repo().join("rules"),
        landing_dir: landing,
        memory_limit: 256 << 20,
        ..ingot::engine::session::Workspace::new(lake)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let catalog = rt.block_on(ingot::query::open_catalog(&ws, None)).unwrap();
    let files = slt_files();
    assert!(files.len() >= 4, "{files:?}");
    let complete = std::env::var("INGOT_SLT_COMPLETE").is_ok_and(|v| v == "1");
    let mut failures = Vec::new();
    for file in files {
        let ctx = catalog.ctx.clone();
        let mut runner = sqllogictest::Runner::new(move || {
            let ctx = ctx.clone();
            async move { Ok::<_, ingot::Error>(IngotDb { ctx }) }
        });
        let result = if complete {
            rt.block_on(runner.update_test_file(
                &file,
                " ",
                sqllogictest::default_validator,
                sqllogictest::default_normalizer,
                sqllogictest::default_column_validator,
            ))
            .map_err(|e| e.to_string())
        } else {
            rt.block_on(runner.run_file_async(&file))
                .map_err(|e| e.display(true).to_string())
        };
        if let Err(e) = result {
            failures.push(format!("{}: {e}", file.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
