//! The `etl` command line; see the `etl_cli` crate.

fn main() -> std::process::ExitCode {
    etl_cli::keep_large_buffers_out_of_the_heap();
    etl_cli::main()
}
