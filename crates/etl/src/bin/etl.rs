//! The `etl` command line.
fn main() {}
