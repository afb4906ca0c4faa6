//! `ingot check`: validate every contract and every rules file, all problems at once.
//!
//! Contracts are read first (rules are checked against them); a missing rules directory means
//! there are no silver tables yet, which is fine. Problems go to stderr as
//! `file:line:column: message`, then a count; the exit code is 2 when there is any. With a lake,
//! contracts are also checked against the runs it holds (a type its runs cannot be read as).

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};
use crate::spec::contract::ContractSet;
use crate::spec::rules::RulesSet;
use crate::spec::yaml::{Pos, Problems};

pub async fn run(cli: &Cli) -> Result<ExitStatus> {
    let mut problems = Problems::default();
    let set = ContractSet::load(&cli.contracts, &mut problems);
    let rules = RulesSet::load(&cli.rules, &set, &mut problems);
    lake_problems(cli, &set, &mut problems).await?;
    if problems.is_empty() {
        crate::show!(
            "ok: {} contract{} in {} ({})",
            set.contracts.len(),
            if set.contracts.len() == 1 { "" } else { "s" },
            cli.contracts.display(),
            set.names().join(", ")
        );
        crate::show!("{}", rules_summary(&rules));
        return Ok(ExitStatus::Success);
    }
    for p in &problems.items {
        crate::tell!("{p}");
    }
    crate::tell!(
        "{} problem{} found",
        problems.items.len(),
        if problems.items.len() == 1 { "" } else { "s" }
    );
    Ok(ExitStatus::Invalid)
}

/// Contracts against the runs already in the lake (when there is one): a field whose stored
/// values some runs cannot be read as (docs/formats.md#contract-evolution), located at the field.
async fn lake_problems(cli: &Cli, set: &ContractSet, problems: &mut Problems) -> Result<()> {
    let ws = cli.workspace()?;
    let runs = crate::table::audit::read_run_log(&ws.lake).await?;
    for contract in set.contracts.values() {
        let mine = crate::engine::catalog::bronze_runs(&runs, &contract.source);
        let stored: Vec<_> = mine
            .iter()
            .map(|r| crate::table::evolve::StoredRun::new(&ws.lake, r))
            .collect();
        let text = std::fs::read_to_string(&contract.path).unwrap_or_default();
        for (field, message) in crate::table::evolve::unreadable_runs(contract, &stored) {
            let line = text
                .lines()
                .position(|l| l.contains(&format!("name: {field}")))
                .map_or(1, |i| i + 1);
            problems.push(&contract.path, Pos { line, column: 1 }, message);
        }
    }
    Ok(())
}

/// `ok: 2 rules tables in rules (bookings v2, web_sessions v1)`: each table with its latest version.
fn rules_summary(rules: &RulesSet) -> String {
    let n = rules.tables.len();
    if n == 0 {
        return format!("ok: no rules tables in {}", rules.dir.display());
    }
    let tables: Vec<String> = rules
        .tables
        .iter()
        .filter_map(|(t, versions)| versions.keys().next_back().map(|v| format!("{t} v{v}")))
        .collect();
    format!(
        "ok: {n} rules table{} in {} ({})",
        if n == 1 { "" } else { "s" },
        rules.dir.display(),
        tables.join(", ")
    )
}
