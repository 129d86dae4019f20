//! Command-line arguments (clap).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Move records from partitioned, replayable sources to sinks, at least
/// once: a source offset is committed only after every record before it
/// was durably written, filtered out, or dead-lettered.
#[derive(Debug, Parser)]
#[command(name = "etl", version, propagate_version = true)]
#[command(after_long_help = "\
EXIT CODES:
    0    the pipeline finished (source exhausted) or stopped on a signal after its final commit
    1    the pipeline failed at run time (a sink, the offset store, a halt policy); see the error
    2    the command line is invalid
    65   halted on bad data (a poison record or a rejected record with poison = \"halt\")
    66   an input file is missing or unreadable
    74   an I/O error on the offset store or an output
    75   the state is in use: another run holds the offset store or a file output (its pid is named)
    78   the configuration is invalid (every problem is listed with its line)
    130  aborted by a second SIGINT/SIGTERM/SIGHUP (nothing is lost: uncommitted work replays)

ENVIRONMENT:
    ETL_LOG    log filter, as RUST_LOG (default: info)")]
pub(crate) struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Auto)]
    pub(crate) log_format: LogFormat,
    /// Only print errors.
    #[arg(long, short, global = true)]
    pub(crate) quiet: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// How logs are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human text with a live status line on a terminal, JSON otherwise.
    Auto,
    /// Human text.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a pipeline until its source ends or a signal stops it.
    ///
    /// SIGINT, SIGTERM or SIGHUP stops polling, drains in-flight records,
    /// flushes the sinks and makes a final commit (within
    /// `shutdown_timeout`); a second signal aborts at once, which loses
    /// nothing: uncommitted records are replayed on the next run. SIGUSR1
    /// and SIGUSR2 are ignored.
    Run(RunArgs),
    /// Check a configuration and report every problem with its line.
    Validate {
        /// The pipeline's TOML configuration.
        config: PathBuf,
    },
    /// Show or reset the committed offsets of a pipeline's offset store.
    Offsets {
        #[command(subcommand)]
        command: OffsetsCommand,
    },
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The pipeline's TOML configuration.
    pub(crate) config: PathBuf,
    /// Serve metrics as Prometheus text at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_addr: Option<SocketAddr>,
    /// Seconds between progress reports (status line or log line).
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    pub(crate) progress_interval: f64,
}

#[derive(Debug, Subcommand)]
pub(crate) enum OffsetsCommand {
    /// Print the committed offset of every partition.
    Show {
        /// The pipeline's TOML configuration (names the offset store).
        config: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Set committed offsets, so the next run replays from there.
    ///
    /// With no --partition, every partition in the store is reset. Stop the
    /// pipeline first: a running pipeline would overwrite the reset with
    /// its next commit.
    Reset {
        /// The pipeline's TOML configuration (names the offset store).
        config: PathBuf,
        /// Only this partition (repeatable).
        #[arg(long = "partition", value_name = "ID")]
        partitions: Vec<u32>,
        /// The offset to set (default 0: replay from the beginning).
        #[arg(long, default_value_t = 0)]
        to: i64,
    },
}
