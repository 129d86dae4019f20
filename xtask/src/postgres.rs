//! `cargo xtask postgres`: a throwaway PostgreSQL server in the
//! foreground. The server itself is `etl_test_support::postgres`, the same
//! code the suites start theirs with.

use std::io::{BufRead, Write};

pub(crate) use etl_test_support::postgres::start;

/// `cargo xtask postgres`: a server in the foreground until Enter or
/// Ctrl-C.
pub(crate) fn run_foreground(args: &[String]) -> crate::Result {
    if !args.is_empty() {
        return Err("usage: cargo xtask postgres".to_owned());
    }
    let server = start().map_err(|e| e.to_string())?;
    println!("PostgreSQL listening on 127.0.0.1:{}", server.port());
    println!("ETL_TEST_POSTGRES={}", server.url());
    println!(
        "ETL_TEST_POSTGRES={} cargo test -p etl-postgres  # in another terminal",
        server.url()
    );
    println!("Enter or Ctrl-C stops it.");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    drop(server);
    println!("stopped");
    Ok(())
}
