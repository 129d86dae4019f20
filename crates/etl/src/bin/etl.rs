//! The `etl` command line; see `etl::cli`.

fn main() -> std::process::ExitCode {
    etl::keep_large_buffers_out_of_the_heap();
    etl::cli::main()
}
