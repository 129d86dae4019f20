//! Log output through `tracing`: human text on a terminal, JSON lines
//! otherwise, filtered by `ETL_LOG` (as `RUST_LOG`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::args::LogFormat;

/// Install the global subscriber. Returns whether output is human text on
/// a terminal (then a live status line may be drawn).
pub(crate) fn init(format: LogFormat, quiet: bool) -> bool {
    let default = if quiet { "error" } else { "info" };
    let filter = EnvFilter::try_from_env("ETL_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let terminal = std::io::stderr().is_terminal();
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !terminal,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A closed or full standard error drops log lines; reporting
        // that on standard error would panic the process.
        .log_internal_errors(false)
        .with_target(false);
    if json {
        builder.json().flatten_event(true).init();
    } else {
        builder.with_ansi(terminal).init();
    }
    terminal && !json && !quiet
}
