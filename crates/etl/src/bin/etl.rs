//! The `etl` command line; see `etl::cli`.

fn main() -> std::process::ExitCode {
    etl::cli::main()
}
