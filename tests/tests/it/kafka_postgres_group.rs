//! Exactly-once into PostgreSQL from a Kafka consumer group of two `etl`
//! processes sharing one progress table: a partition that comes back to
//! a member after the other advanced it resumes at the progress stored
//! then, so no record is written twice. (Before, each member resumed a
//! returning partition at the progress it read when it started, and
//! wrote everything the other member had written since a second time.)
//!
//! Writes are counted by a trigger: the sink upserts on the idempotency
//! key, so a row written twice is updated, and the trigger counts that.

use crate::kafka_support;
use crate::postgres_support;

use kafka_support::{
    Member, MemberConfig, TestBroker, produce_range, producer, unique, wait_until,
};

const PARTITIONS: i32 = 2;

// A plain test: the PostgreSQL helpers start runtimes of their own.
#[test]
fn a_partition_handed_back_resumes_at_the_progress_the_other_member_stored() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let url = postgres_support::url();
    let table = postgres_support::table("kafka_group_eo");
    let broker = TestBroker::start();
    let topic = unique("eo");
    let group = unique("eo-group");
    runtime.block_on(broker.create_topic(&topic, PARTITIONS));
    let producer = runtime.block_on(async { producer(&broker) });

    let dir = tempfile::tempdir().expect("temp dir");
    let config = MemberConfig::new(&broker, &group, &topic);
    let sink = format!(
        "type = \"postgres\"\nurl = {url:?}\ntable = {table:?}\ncreate_table = true\n\
         exactly_once = true\ncolumns = [{{ name = \"id\", type = \"bigint\" }}]\n"
    );
    let rows = || postgres_support::counts(&url, &table).0;
    let mut a = Member::new("a", dir.path(), &config);
    let mut b = Member::new("b", dir.path(), &config);

    // A first run of `a` stores progress for both partitions, and stops.
    runtime.block_on(produce_range(
        &producer,
        &topic,
        PARTITIONS,
        0..1000,
        "kafka",
    ));
    a.start_with(&sink);
    wait_until("1000 rows", &mut [&mut a], |_| rows() == 1000);
    assert!(a.terminate().success(), "{}", a.log(a.runs));
    // Count every write from now on: an upsert of an existing row is a
    // second write of its record.
    postgres_support::query(
        &url,
        &format!(
            "ALTER TABLE \"{table}\" ADD COLUMN writes int NOT NULL DEFAULT 1;
             CREATE FUNCTION \"{table}_count\"() RETURNS trigger AS $$
             BEGIN NEW.writes := OLD.writes + 1; RETURN NEW; END $$ LANGUAGE plpgsql;
             CREATE TRIGGER \"{table}_count\" BEFORE UPDATE ON \"{table}\"
             FOR EACH ROW EXECUTE FUNCTION \"{table}_count\"();"
        ),
    );

    // `a` again (reading that progress when it starts), then `b` joins
    // and takes one partition; both write.
    a.start_with(&sink);
    wait_until("assigned", &mut [&mut a], |m| {
        m[0].log(m[0].runs).contains("partitions assigned")
    });
    b.start_with(&sink);
    wait_until("assigned", &mut [&mut a, &mut b], |m| {
        m[1].log(m[1].runs).contains("partitions assigned")
    });
    runtime.block_on(produce_range(
        &producer,
        &topic,
        PARTITIONS,
        1000..2000,
        "kafka",
    ));
    wait_until("2000 rows", &mut [&mut a, &mut b], |_| rows() == 2000);

    // `b` leaves: its partition goes back to `a`, which must resume it
    // where `b` stored its progress.
    assert!(b.terminate().success(), "{}", b.log(b.runs));
    runtime.block_on(produce_range(
        &producer,
        &topic,
        PARTITIONS,
        2000..2200,
        "kafka",
    ));
    wait_until("2200 rows", &mut [&mut a], |_| rows() == 2200);
    assert!(a.terminate().success(), "{}", a.log(a.runs));

    let twice = postgres_support::scalar(
        &url,
        &format!("SELECT count(*) FROM \"{table}\" WHERE writes > 1"),
    );
    let (rows, keys, ids) = postgres_support::counts(&url, &table);
    assert_eq!((rows, keys, ids), (2200, 2200, 2200));
    assert_eq!(twice, 0, "records written twice");
}
