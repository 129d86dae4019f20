//! A stop that gives multipart uploads up: their aborts run as tasks of
//! the sink, awaited by the stop within its own settle time, so they
//! neither hold the final commit nor leave parts on the server.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use etl::Pipeline;
use etl_checkpoint::{CheckpointConfig, MemoryStore};
use etl_object_store::ObjectStoreSink;
use etl_record::{Offset, PartitionId, SourceId};
use etl_sink::{RetryPolicy, SinkDriver, SinkDriverConfig};
use etl_source::{GeneratorConfig, GeneratorSource};
use etl_test_support::garage::Garage;
use object_store::local::LocalFileSystem;
use tokio_util::sync::CancellationToken;

use crate::faults::FaultyStore;
use crate::garage::{faulty_sink, multipart_driver, padded};
use crate::support::config;

/// Every object a multipart upload of one part, into a local folder.
const MULTIPART: &str = r#"
    key = "gen/{partition}-{first_offset}.ndjson"
    multipart_threshold = 0
    [store]
    kind = "local"
    path = "unused"
    [encoding]
    format = "ndjson"
"#;

/// A stop whose sink gives a multipart upload up, the abort slow to
/// answer, under a `shutdown_timeout` of 4 s: the final commit still has
/// its time, and commits the write delivered before. (The drop that waited
/// for the abort took 1 s out of the final commit's 0.4 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_commit_still_happens_at_a_short_shutdown_timeout_while_an_abort_is_slow() {
    let folder = tempfile::tempdir().unwrap();
    let local: Arc<dyn object_store::ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(folder.path()).unwrap());
    let store = Arc::new(FaultyStore::new(local));
    // The first object's part is answered, the next ones never are; the
    // abort of the upload given up answers only after 10 s.
    store.hang_parts.store(true, Ordering::SeqCst);
    store.parts_before_hanging.store(1, Ordering::SeqCst);
    *store.abort_delay.lock().unwrap() = Duration::from_secs(10);

    let source = GeneratorSource::new(GeneratorConfig {
        name: SourceId::new("gen"),
        partitions: 1,
        records_per_partition: Some(30),
        max_batch_records: 10,
        ..GeneratorConfig::default()
    })
    .unwrap();
    let sink = ObjectStoreSink::with_store("lake", config(MULTIPART), store.clone()).unwrap();
    let encoder = sink.encoder();
    let driver = SinkDriver::new(sink, encoder).config(SinkDriverConfig {
        batch_max_records: 10,
        retry: RetryPolicy::never(),
        ..SinkDriverConfig::default()
    });
    let offsets = MemoryStore::new();
    let pipeline = Pipeline::builder()
        .source(source)
        .sink("lake", driver)
        .offset_store(offsets.clone())
        .checkpoint(CheckpointConfig {
            // Only the final commit commits.
            commit_interval: Duration::from_secs(3600),
            shutdown_timeout: Duration::from_secs(4),
            ..CheckpointConfig::default()
        })
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(pipeline.run(shutdown.clone()));
    let started = Instant::now();
    while store.hung.load(Ordering::SeqCst) == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "no write hung");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stopped_at = Instant::now();
    shutdown.cancel();
    let ended = run.await.unwrap();
    let took = stopped_at.elapsed();
    // The sink was given up at the deadline: the run says so.
    assert!(ended.is_err(), "{ended:?}");
    assert!(took < Duration::from_millis(4500), "the stop took {took:?}");
    assert_eq!(store.aborted.load(Ordering::SeqCst), 1);
    assert_eq!(
        offsets.offsets().get(&PartitionId(0)).copied(),
        Some(Offset(10)),
        "the final commit did not commit the first write ({ended:?})"
    );
    assert_eq!(offsets.commits(), 1);
}

/// Give `uploads` multipart uploads of one write up at a stop's deadline
/// on `runtime`, each abort 400 ms slow, then shut the runtime down in the
/// background at once, as the `etl` command does. Returns the most
/// aborts under way at one time, and how many uploads were aborted and
/// are left unfinished on the server.
fn give_up_at_the_stop(runtime: tokio::runtime::Runtime, uploads: u32) -> (usize, usize, u64) {
    let server = Garage::start().unwrap();
    let (stopped, together, store) = runtime.block_on(async {
        let (sink, store) = faulty_sink(&server);
        store.hang_parts.store(true, Ordering::SeqCst);
        *store.abort_delay.lock().unwrap() = Duration::from_millis(400);
        let driver = multipart_driver(sink, None);
        // One batch, one multipart object per partition.
        let records: Vec<_> = (0..uploads).flat_map(|p| padded(p, 200)).collect();
        let (acker, _events) = etl_ack::channel();
        let meta = etl_ack::BatchMeta {
            id: etl_ack::BatchId {
                partition: PartitionId(0),
                epoch: 1,
                seq: 0,
            },
            first_offset: Offset(0),
            last_offset: Offset(199),
            records: u32::try_from(records.len()).unwrap(),
            bytes: records.iter().map(|r| r.value.len() as u64).sum(),
        };
        let ack = acker.open(meta).unwrap();
        driver
            .send(etl_ack::Acked::new(records, ack))
            .await
            .unwrap();
        // Every upload started, each with a part held unanswered: what
        // the store saw itself (the server's count of unfinished uploads
        // is a counter it updates apart from them).
        let waited = Instant::now();
        while store.hung.load(Ordering::SeqCst) < uploads as usize {
            assert!(
                waited.elapsed() < Duration::from_secs(60),
                "{} of {uploads} uploads have a part held; the server counts {} unfinished",
                store.hung.load(Ordering::SeqCst),
                server.unfinished_multipart_uploads("orders").unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let stopped = driver.shutdown(Duration::from_millis(100)).await;
        // The stop returned with every abort done, not only begun.
        assert_eq!(
            store.aborting.load(Ordering::SeqCst),
            0,
            "an abort was still under way"
        );
        (stopped, store.most_aborting.load(Ordering::SeqCst), store)
    });
    assert!(
        matches!(stopped, Err(etl_sink::SinkDriverError::ShutdownTimeout(_))),
        "{stopped:?}"
    );
    runtime.shutdown_background();
    // The aborts reached the server: its count of unfinished uploads (a
    // counter it updates apart from them) comes down to what is left.
    let waited = Instant::now();
    let mut unfinished = server.unfinished_multipart_uploads("orders").unwrap();
    while unfinished > 0 && waited.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
        unfinished = server.unfinished_multipart_uploads("orders").unwrap();
    }
    (together, store.aborted.load(Ordering::SeqCst), unfinished)
}

/// Several multipart uploads of one write given up at once, at a stop's
/// deadline: their aborts run together, so every one is done on the
/// server before the stop returns and the runtime ends, and they are all
/// under way at once, not one after another. (Drops that waited in turn
/// took 400 ms each: five of them did not fit in the sink's settle
/// time.)
#[test]
fn several_multipart_uploads_given_up_at_once_are_all_aborted_together_before_the_runtime_ends() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (together, aborted, unfinished) = give_up_at_the_stop(runtime, 5);
    assert_eq!(aborted, 5);
    assert_eq!(unfinished, 0, "uploads given up are left unfinished");
    assert_eq!(together, 5, "the aborts ran one after another");
}

/// On a current-thread runtime too, the upload given up at the stop is
/// aborted before the runtime ends. (A drop cannot wait there: the abort
/// was only spawned, and dropped with the runtime.)
#[test]
fn a_multipart_upload_given_up_on_a_current_thread_runtime_is_aborted_before_it_ends() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (_, aborted, unfinished) = give_up_at_the_stop(runtime, 1);
    assert_eq!(aborted, 1);
    assert_eq!(unfinished, 0, "the upload given up is left unfinished");
}
