//! The `ingot` binary: parse arguments, dispatch, exit with a code schedulers can act on.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match ingot::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => ExitCode::SUCCESS,
                _ => ExitCode::from(2),
            };
        }
    };
    ingot::cli::run(cli)
}
