//! `ingot explain <table> [--rules-version N]`: the rules in words, what `ingot build` would do
//! now (the build plan), then the DataFusion logical plans the rules compile to (silver's rows
//! with their flags, and the rejected rows).

use std::fmt::Write;

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};
use crate::silver::build::{BuildOptions, load_rules, plan_summary};
use crate::silver::compile::{explain, read_inputs};
use crate::spec::rules::{Action, AnomalyKind, RuleSet, Step};

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// Silver table: rules/<table>/v<N>.yaml must exist.
    pub table: String,
    /// Explain this rules version instead of the latest.
    #[arg(long, value_name = "N")]
    pub rules_version: Option<i32>,
}

pub async fn run(cli: &Cli, args: &ExplainArgs) -> Result<ExitStatus> {
    let ws = cli.workspace()?;
    let catalog = crate::query::open_catalog(&ws, None).await?;
    let rules = load_rules(&ws, &catalog, &args.table, args.rules_version)?;
    let inputs = read_inputs(&catalog.ctx, &catalog.contracts, &rules).await?;
    let mut out = summary(&rules, &inputs.contract);
    if rules.sources.is_some() {
        out.push_str(&sources_summary(&catalog, &rules).await?);
    }
    out.push('\n');
    let opts = BuildOptions {
        rules_version: args.rules_version,
        ..BuildOptions::default()
    };
    // The plan of an incremental build now; a build that would be refused says why.
    match plan_summary(&ws, &catalog, &rules, &opts).await {
        Ok(p) => {
            let _ = writeln!(out, "build plan (ingot build {} now):\n{}\n", args.table, p);
        }
        Err(e) => {
            let _ = writeln!(out, "build plan (ingot build {} now): refused: {e}\n", args.table);
        }
    }
    out.push_str(&explain(
        &catalog.ctx,
        &rules,
        &inputs.contract,
        inputs.input,
        &inputs.lookups,
    )?);
    // `ingot explain t | head` closes the pipe early: not an error.
    let mut stdout = std::io::stdout().lock();
    match std::io::Write::write_all(&mut stdout, out.as_bytes()).and_then(|()| std::io::Write::flush(&mut stdout)) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(crate::error::Error::io("stdout", e)),
        _ => Ok(ExitStatus::Success),
    }
}

/// The rules of a build in words: what is read, resolved, each step, validation and anomaly.
pub fn summary(rules: &RuleSet, contract: &crate::spec::contract::Contract) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "silver.{} with rules v{} ({}, sha256 {})",
        rules.table,
        rules.version,
        rules.path.display(),
        rules.sha256
    );
    if rules.sources.is_none() {
        let _ = writeln!(s, "reads bronze.{}_current", rules.source);
    }
    for r in &contract.resolve {
        let _ = writeln!(
            s,
            "resolve {}: {} -> {}.{} by {} as {} (on_missing: {})",
            r.name,
            r.from,
            r.lookup,
            r.value,
            r.key,
            r.alias,
            match r.on_missing {
                crate::spec::contract::OnMissing::Reject => "reject",
                crate::spec::contract::OnMissing::Null => "null",
            }
        );
    }
    let _ = writeln!(s, "steps:");
    if rules.steps.is_empty() {
        let _ = writeln!(s, "  (none)");
    }
    for (i, step) in rules.steps.iter().enumerate() {
        let what = match step {
            Step::Set { column, expr } => format!("set {} = {}", column.name, expr.sql),
            Step::Map {
                column,
                values,
                default,
            } => format!(
                "map {} {{{}}}{}",
                column.name,
                values
                    .iter()
                    .map(|(k, v)| format!("{k:?}: {v:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                default.as_ref().map(|d| format!(" default {d:?}")).unwrap_or_default()
            ),
            Step::Rename(pairs) => format!(
                "rename {}",
                pairs
                    .iter()
                    .map(|(a, b)| format!("{} -> {}", a.name, b.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Step::Cast(pairs) => format!(
                "cast {}",
                pairs
                    .iter()
                    .map(|(a, t)| format!("{} as {}", a.name, t.name()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Step::Drop(cols) => format!(
                "drop {}",
                cols.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
            Step::Filter(e) => format!("filter {}", e.sql),
        };
        let _ = writeln!(s, "  {}. {what}", i + 1);
    }
    let _ = writeln!(s, "validate:");
    if rules.validate.is_empty() {
        let _ = writeln!(s, "  (none)");
    }
    for v in &rules.validate {
        let action = match v.action {
            Action::Reject => "reject",
            Action::Fail => "fail",
        };
        let _ = writeln!(s, "  {}: {} ({action})", v.name, v.check.sql);
    }
    let _ = writeln!(s, "anomalies:");
    if rules.anomalies.is_empty() {
        let _ = writeln!(s, "  (none)");
    }
    for a in &rules.anomalies {
        let what = match &a.kind {
            AnomalyKind::When(e) => format!("when {}", e.sql),
            AnomalyKind::Spike {
                column,
                by,
                order,
                window,
                factor,
                min_history,
            } => format!(
                "spike {} > {factor} x mean of the previous {window} rows by [{}] order {} (min_history {min_history})",
                column.name,
                by.iter().map(|b| b.name.as_str()).collect::<Vec<_>>().join(", "),
                order.name
            ),
            AnomalyKind::FirstSeen { by, order, gap_days } => format!(
                "first_seen by [{}] order {} gap_days {gap_days}",
                by.iter().map(|b| b.name.as_str()).collect::<Vec<_>>().join(", "),
                order.name
            ),
        };
        let _ = writeln!(s, "  {}: {what}", a.name);
    }
    s
}

/// A table fed by several sources: each source's key recipe with one sample record's key,
/// then survivorship and conflicts in words.
async fn sources_summary(catalog: &crate::engine::catalog::Catalog, rules: &RuleSet) -> Result<String> {
    use crate::spec::rules::sources::Rule;
    let mut s = String::new();
    let Some(src) = rules.sources.as_deref() else {
        return Ok(s);
    };
    let _ = writeln!(s, "sources, in precedence order (each keyed as the table keys it):");
    let inputs = crate::silver::sources::read_source_inputs(&catalog.ctx, &catalog.contracts, rules).await?;
    for (e, input) in src.entries.iter().zip(&inputs) {
        let Some(contract) = catalog.contracts.contracts.get(&e.source) else {
            continue;
        };
        let ns = e
            .key_namespace
            .as_deref()
            .map(|n| format!(", namespaced_fingerprint('{n}', fingerprint)"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "  {} (rank {}): reads bronze.{}_current; key v{}: {}{ns}",
            e.source,
            e.rank,
            e.source,
            contract.natural_key.version,
            contract.key_definition()
        );
        for r in &contract.resolve {
            let _ = writeln!(
                s,
                "    resolve {}: {} -> {}.{} as {}",
                r.name, r.from, r.lookup, r.value, r.alias
            );
        }
        if !e.shared_key.is_empty() {
            let _ = writeln!(
                s,
                "    shared_key: a record that resolve {} maps is keyed as the sources without a namespace key the mapped value(s); the others keep the namespaced key",
                e.shared_key.join(", ")
            );
        }
        if !e.steps.is_empty() {
            let kinds: Vec<&str> = e.steps.iter().map(Step::kind).collect();
            let _ = writeln!(s, "    its steps: {}", kinds.join(", "));
        }
        let names: Vec<datafusion::logical_expr::Expr> = contract
            .natural_key
            .fields
            .iter()
            .filter_map(|i| contract.fields.get(*i))
            .map(|f| datafusion::prelude::col(f.name.as_str()))
            .chain([datafusion::prelude::col(crate::spec::columns::FINGERPRINT).alias("__key")])
            .collect();
        let sample = input
            .keyed(input.current.clone())?
            .select(names)?
            .limit(0, Some(1))?
            .collect()
            .await?;
        match sample.iter().find(|b| b.num_rows() > 0) {
            Some(b) => {
                let mut parts = Vec::new();
                for i in 0..b.num_columns() - 1 {
                    let v = datafusion::arrow::util::display::array_value_to_string(b.column(i), 0)?;
                    parts.push(format!("{}={v}", b.schema().field(i).name()));
                }
                let key = datafusion::arrow::util::display::array_value_to_string(b.column(b.num_columns() - 1), 0)?;
                let _ = writeln!(s, "    sample: {} -> {key}", parts.join(", "));
            }
            None => {
                let _ = writeln!(s, "    sample: (no current record yet)");
            }
        }
    }
    let rule = |r: &Rule| match r {
        Rule::Precedence => "precedence".to_string(),
        Rule::MostRecent(c) => format!("most_recent by {c}"),
        Rule::Only(x) => format!("only {x}"),
    };
    let sv = &src.survivorship;
    let _ = writeln!(
        s,
        "survivorship: default {}{}",
        rule(&sv.default),
        sv.order_by
            .as_deref()
            .map(|o| format!(", ties by {o}"))
            .unwrap_or_default()
    );
    for (f, r) in &sv.fields {
        let _ = writeln!(s, "  {f}: {}", rule(r));
    }
    for g in &sv.groups {
        let _ = writeln!(s, "  group {} [{}]: {}", g.name, g.fields.join(", "), rule(&g.rule));
    }
    let c = &src.conflicts;
    let _ = writeln!(
        s,
        "conflicts: fields [{}], same_precedence {}, on_conflict {}",
        c.fields.join(", "),
        match c.same_precedence {
            crate::spec::rules::sources::SamePrecedence::Conflict => "conflict",
            crate::spec::rules::sources::SamePrecedence::Break => "break",
        },
        c.on_conflict.name()
    );
    Ok(s)
}
