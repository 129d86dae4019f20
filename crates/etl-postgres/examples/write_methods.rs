//! Compares the two write methods (`COPY` + merge, multi-row `INSERT`) on
//! a real server and prints records per second for each.
//!
//! ```text
//! cargo run --release -p etl-postgres --example write_methods
//! ETL_TEST_POSTGRES=postgres://... cargo run --release -p etl-postgres --example write_methods
//! ```
//!
//! Without `ETL_TEST_POSTGRES` it starts a throwaway server the way
//! `cargo xtask postgres` does (installing PostgreSQL if needed).

use std::time::Instant;

use etl_postgres::{PostgresSink, PostgresSinkConfig, WriteMethod};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::{EncodedBatch, NdjsonEncoder, Sink};

const RECORDS: i64 = 50_000;
const BATCH: i64 = 1_000;
const ROUNDS: usize = 3;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut _server = None;
    let url = match std::env::var("ETL_TEST_POSTGRES") {
        Ok(url) => url,
        Err(_) => {
            let started = etl_test_support::postgres::start()?;
            let url = started.url();
            _server = Some(started);
            url
        }
    };
    let batches: Vec<EncodedBatch> = (0..RECORDS / BATCH)
        .map(|b| {
            let records = (b * BATCH..(b + 1) * BATCH)
                .map(|o| {
                    let at = Position::new(SourceId::new("bench"), PartitionId(0), Offset(o));
                    let value = format!(
                        r#"{{"id":{o},"customer":{{"name":"c{}"}},"total":{}.25,"tags":["a","b"]}}"#,
                        o % 97,
                        o % 1000
                    );
                    Record::new(at, value)
                })
                .collect();
            EncodedBatch::encode(records, &NdjsonEncoder::new()).0
        })
        .collect();

    let mut rates = Vec::new();
    for method in [WriteMethod::Copy, WriteMethod::Insert] {
        let mut best = 0.0f64;
        for round in 0..ROUNDS {
            let config = PostgresSinkConfig::new(&url, format!("bench_{method:?}_{round}"))
                .column("id", "id", "bigint")
                .column("customer", "customer.name", "text")
                .column("total", "total", "numeric(12,2)")
                .column("tags", "tags", "jsonb")
                .create_table(true)
                .method(method);
            let sink = PostgresSink::connect(config).await?;
            let started = Instant::now();
            for batch in &batches {
                sink.write(batch).await?;
            }
            let rate = RECORDS as f64 / started.elapsed().as_secs_f64();
            best = best.max(rate);
        }
        println!("{method:?}: {best:.0} records/s (best of {ROUNDS}, batches of {BATCH})");
        rates.push(best);
    }
    println!("Copy / Insert: {:.2}", rates[0] / rates[1]);
    Ok(())
}
