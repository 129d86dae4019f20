//! `cargo xtask kafka`: the Kafka-compatible test broker (Tansu, in
//! memory, on loopback) in the foreground, and the broker the `bench` task
//! runs its Kafka row against. The broker itself is
//! `etl_test_support::tansu`, the same code the suites start theirs with.

use etl_test_support::tansu::{Broker, BrokerCommand};

/// A port on 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> crate::Result<u16> {
    etl_test_support::free_port().map_err(|e| e.to_string())
}

/// Start the broker on `127.0.0.1:port` (fetching the binary first if it
/// is not cached) and wait until it accepts connections.
pub(crate) fn start(port: u16) -> crate::Result<Broker> {
    BrokerCommand::new()
        .port(port)
        .start()
        .map_err(|e| e.to_string())
}

/// `cargo xtask kafka [--port N]`: a broker in the foreground until
/// interrupted.
pub(crate) fn run(args: &[String]) -> crate::Result {
    let port = match args {
        [] => free_port()?,
        [flag, n] if flag == "--port" => n
            .parse()
            .map_err(|_| format!("--port takes a port number, got `{n}`"))?,
        _ => return Err("usage: cargo xtask kafka [--port N]".to_owned()),
    };
    let broker = start(port)?;
    println!("Kafka-compatible broker listening on {}", broker.addr());
    println!(
        "ETL_TEST_KAFKA={} cargo test -p etl-kafka  # in another terminal",
        broker.addr()
    );
    println!("Ctrl-C stops it.");
    broker.wait().map_err(|e| e.to_string())
}
