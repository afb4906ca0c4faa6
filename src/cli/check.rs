//! `ingot check`: validate every contract, all problems at once.

use crate::cli::Cli;
use crate::contract::ContractSet;
use crate::error::Result;
use crate::yaml::Problems;

pub fn run(cli: &Cli) -> Result<u8> {
    let mut problems = Problems::default();
    let set = ContractSet::load(&cli.contracts, &mut problems);
    if problems.is_empty() {
        println!(
            "ok: {} contract{} in {} ({})",
            set.contracts.len(),
            if set.contracts.len() == 1 { "" } else { "s" },
            cli.contracts.display(),
            set.names().join(", ")
        );
        return Ok(0);
    }
    for p in &problems.items {
        eprintln!("{p}");
    }
    eprintln!(
        "{} problem{} found",
        problems.items.len(),
        if problems.items.len() == 1 { "" } else { "s" }
    );
    Ok(2)
}
