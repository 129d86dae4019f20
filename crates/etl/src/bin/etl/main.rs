//! The `etl` command line: run, validate and inspect pipelines.

mod args;
mod exit;
mod logging;
mod metrics_server;
mod offsets;
mod progress;
mod run;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};
use exit::Exit;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let status_line = logging::init(cli.log_format, cli.quiet);
    let result = match &cli.command {
        Command::Validate { config } => validate(config),
        Command::Run(args) => run::run(args, status_line),
        Command::Offsets { command } => offsets::offsets(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(exit) => exit.report(),
    }
}

fn validate(path: &std::path::Path) -> Result<(), Exit> {
    let config = etl::load_config(path).map_err(Exit::from_config)?;
    let problems = etl::check_connectors(&config);
    if !problems.is_empty() {
        return Err(Exit::new(
            exit::code::CONFIG,
            format!(
                "{} has connector problems:\n  {}",
                path.display(),
                problems.join("\n  ")
            ),
        ));
    }
    exit::say(format_args!(
        "{}: ok ({} transform{}, {} sink{})",
        path.display(),
        config.transforms.len(),
        if config.transforms.len() == 1 {
            ""
        } else {
            "s"
        },
        config.sinks.len(),
        if config.sinks.len() == 1 { "" } else { "s" },
    ))
}
