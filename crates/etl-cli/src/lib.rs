//! The `etl` command line: run, validate and inspect pipelines described
//! in a TOML file. This crate is the `etl` binary and the command as a
//! library, so that the library crates below it (`etl` and its parts)
//! build without the command line's own dependencies (argument parsing,
//! the metrics endpoint's HTTP server, the status line, the log
//! formatter).
//!
//! * [`main`] is the `etl` binary: its arguments from the process, the
//!   built-in components and the connectors of this build (features
//!   `kafka`, `postgres`, `postgres-cdc`, `object-store`, `http`), each connector
//!   crate registered by one line, as your own would be.
//! * [`main_with`] is the same command with your own sources, sinks and
//!   transforms from an [`etl::Registry`], configured from the TOML file
//!   like the built-ins and checked by `etl validate` with your own config
//!   structs.
//! * [`keep_large_buffers_out_of_the_heap`] is the allocator setting the
//!   binary starts with; call it first in your own `main` for the same
//!   memory use.
//!
//! Run the binary with `cargo run --release -p etl-cli -- run
//! pipeline.toml`; `etl --help` lists the commands and the exit codes.
//!
//! # Example
//!
//! The `etl` command with one transform of your own, `type = "upper"` in
//! the file:
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
//!     etl_cli::keep_large_buffers_out_of_the_heap();
//!     let registry = Registry::new().transform("upper", |config: Upper, _context| {
//!         let field = config.field;
//!         Ok(Box::new(etl::map("upper", move |mut record: etl_record::Record| {
//!             let _ = &field; // ... change `record`'s value at `field`
//!             record.value = record.value.to_ascii_uppercase().into();
//!             Ok(record)
//!         })))
//!     });
//!     etl_cli::main_with(registry)
//! }
//! ```
//!
//! # Features
//!
//! `kafka`, `postgres` and `remap` (all default) are the `etl` crate's
//! features of the same names, forwarded: the binary built without one
//! refuses that `type` in the file.

mod alloc;
mod args;
mod exit;
mod logging;
mod metrics_server;
mod offsets;
mod progress;
mod run;

use std::process::ExitCode;

use clap::Parser;
use etl::Registry;

use args::{Cli, Command};
use exit::Exit;

pub use alloc::keep_large_buffers_out_of_the_heap;

/// The `etl` command: its arguments from the process, the built-in
/// components and this build's connectors.
#[must_use]
pub fn main() -> ExitCode {
    main_with(etl::registry())
}

/// `registry` with every connector of this build where it has no type of
/// their name: the connector crates the command is built with
/// (`postgres_cdc`, `object_store`, `http`), each registered by its one line, then
/// `etl`'s own ([`etl::with_connectors`]).
fn with_connectors(registry: Registry) -> Registry {
    #[cfg(feature = "postgres-cdc")]
    let registry = if registry.has_source("postgres_cdc") {
        registry
    } else {
        etl_postgres_cdc::register(registry)
    };
    #[cfg(feature = "object-store")]
    let registry = if registry.has_sink("object_store") {
        registry
    } else {
        etl_object_store::register(registry)
    };
    #[cfg(feature = "http")]
    let registry = if registry.has_sink("http") {
        registry
    } else {
        etl_http::register(registry)
    };
    etl::with_connectors(registry)
}

/// The `etl` command with the components of `registry` as well as the
/// built-ins: a `type` the registry knows is built by its factory, from
/// the rest of its table. This build's connectors (`kafka`, `postgres`)
/// are added where `registry` has no type of their name.
#[must_use]
pub fn main_with(registry: Registry) -> ExitCode {
    let registry = with_connectors(registry);
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
    let config = registry.loader().file(path).map_err(Exit::from_config)?;
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
