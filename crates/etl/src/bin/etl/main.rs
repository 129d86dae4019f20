//! The `etl` command line: run, validate and inspect pipelines.

mod args;

use clap::Parser;

fn main() {
    let cli = args::Cli::parse();
    drop(cli);
}
