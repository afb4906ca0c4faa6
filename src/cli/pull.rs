//! `ingot pull <source>...`: one pull (one run) per `format: api` source, a line per run.

use crate::cli::Cli;
use crate::cli::ingest::show_run;
use crate::error::{Error, ExitStatus, Result};
use crate::ingest::IngestOptions;
use crate::spec::contract::{ContractSet, Format};

#[derive(Debug, clap::Args)]
pub struct PullArgs {
    /// Sources to pull (contracts/<source>.yaml with `format: api`), one run each, in the
    /// order given.
    #[arg(required = true)]
    pub sources: Vec<String>,
    /// Print each run record as one JSON object per line instead of a sentence.
    #[arg(long)]
    pub json: bool,
    /// Publish each run even when a hold gate of the contract would hold it for review.
    #[arg(long)]
    pub no_hold: bool,
    #[command(flatten)]
    pub wait: crate::cli::WaitArgs,
}

pub async fn run(cli: &Cli, args: &PullArgs) -> Result<ExitStatus> {
    let ws = cli.writer_workspace(&args.wait)?;
    let mut contracts = Vec::new();
    for source in &args.sources {
        let c = ContractSet::load_one(&ws.contracts_dir, source)?;
        if c.format != Format::Api {
            return Err(Error::Invalid(format!(
                "source \"{source}\" is format: {}, not api: `ingot ingest {source} <file>` loads its files",
                c.format.name()
            )));
        }
        contracts.push(c);
    }
    let opts = IngestOptions {
        no_hold: args.no_hold,
        ..Default::default()
    };
    let mut code = ExitStatus::Success;
    for contract in contracts {
        let record = crate::ingest::pull::pull(&ws, contract, &opts).await?;
        show_run(&record, args.json, &mut code);
    }
    Ok(code)
}
