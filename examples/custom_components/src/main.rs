//! `etl` with the `sensors` source, the `scale` transform and the `csv`
//! sink of this crate: every command of `etl` (`run`, `validate`,
//! `offsets`), and configuration files may use the three types.

fn main() -> std::process::ExitCode {
    etl_cli::main_with(etl_example_custom::registry())
}
