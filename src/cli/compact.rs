//! `ingot compact`: see [`crate::ops::compact`].

use crate::cli::Cli;
use crate::error::{ExitStatus, Result};

#[derive(Debug, clap::Args)]
pub struct CompactArgs {
    /// Sources to compact (default: every source with a contract).
    pub sources: Vec<String>,
    /// Also merge fewer small runs than a segment's usual 16 (at least two).
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub wait: crate::cli::WaitArgs,
}

pub async fn run(cli: &Cli, args: &CompactArgs) -> Result<ExitStatus> {
    let ws = cli.writer_workspace(&args.wait)?;
    let sources = if args.sources.is_empty() {
        let mut problems = crate::spec::yaml::Problems::default();
        let set = crate::spec::contract::ContractSet::load(&ws.contracts_dir, &mut problems);
        set.contracts.keys().cloned().collect()
    } else {
        args.sources.clone()
    };
    for source in &sources {
        let contract = crate::spec::contract::ContractSet::load_one(&ws.contracts_dir, source)?;
        let done = crate::ops::compact::compact(&ws, &contract, args.all).await?;
        crate::show!(
            "{source}: {} segment{} written, {} run{} newly compacted; {} segment{} in all",
            done.segments,
            if done.segments == 1 { "" } else { "s" },
            done.runs,
            if done.runs == 1 { "" } else { "s" },
            done.live,
            if done.live == 1 { "" } else { "s" },
        );
    }
    Ok(ExitStatus::Success)
}
