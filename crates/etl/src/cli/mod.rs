//! The `etl` command line (run, validate and inspect pipelines), as a
//! library: [`main`] is the `etl` binary, and [`main_with`] is the same
//! command with your own sources, sinks and transforms, configured from
//! the TOML file like the built-ins and checked by `etl validate` with
//! your own config structs.
//!
//! ```no_run
//! use std::process::ExitCode;
//!
//! use etl::Registry;
//!
//! #[derive(serde::Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct Upper {
//!     field: String,
//! }
//!
//! fn main() -> ExitCode {
//!     let registry = Registry::new().transform("upper", |config: Upper, _context| {
//!         let field = config.field;
//!         Ok(Box::new(etl::map("upper", move |mut record: etl_record::Record| {
//!             let _ = &field; // ... change `record`'s value at `field`
//!             record.value = record.value.to_ascii_uppercase().into();
//!             Ok(record)
//!         })))
//!     });
//!     etl::cli::main_with(registry)
//! }
//! ```

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

use crate::Registry;

/// The `etl` command: its arguments from the process, the built-in
/// components only.
#[must_use]
pub fn main() -> ExitCode {
    main_with(Registry::new())
}

/// The `etl` command with the components of `registry` as well as the
/// built-ins: a `type` the registry knows is built by its factory, from
/// the rest of its table.
#[must_use]
pub fn main_with(registry: Registry) -> ExitCode {
    let cli = Cli::parse();
    let status_line = logging::init(cli.log_format, cli.quiet);
    let result = match &cli.command {
        Command::Validate { config } => validate(config, &registry),
        Command::Run(args) => run::run(args, status_line, &registry),
        Command::Offsets { command } => offsets::offsets(command, &registry),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(exit) => exit.report(),
    }
}

fn validate(path: &std::path::Path, registry: &Registry) -> Result<(), Exit> {
    let config = registry.load_config(path).map_err(Exit::from_config)?;
    let problems = crate::check_connectors(&config);
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
    // Warnings go where problems go, and do not fail the check.
    for w in &config.warnings {
        exit::say_err(format_args!("warning: {}:{w}", path.display()));
    }
    let warnings = match config.warnings.len() {
        0 => String::new(),
        1 => ", 1 warning".to_owned(),
        n => format!(", {n} warnings"),
    };
    exit::say(format_args!(
        "{}: ok ({} transform{}, {} sink{}{warnings})",
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
