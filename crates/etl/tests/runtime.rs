//! The runtime's teardown paths: a panicking transform fails the batch it
//! was working on, so its offsets are never committed.

#![allow(clippy::unwrap_used)]

use etl::{Pipeline, PipelineError, map};
use etl_checkpoint::MemoryStore;
use etl_record::{Offset, PartitionId, Record};
use etl_sink::{BlackholeSink, RawLinesEncoder, SinkDriver};
use etl_source::{GeneratorConfig, GeneratorSource};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_panicking_transform_fails_its_batch() {
    let store = MemoryStore::new();
    let source = GeneratorSource::new(GeneratorConfig {
        partitions: 1,
        records_per_partition: Some(100),
        batch_records: 10,
        ..GeneratorConfig::default()
    })
    .unwrap();
    let pipeline = Pipeline::builder()
        .source(source)
        .transform(map("explodes", |r: &Record| {
            assert!(r.position.offset != Offset(25), "a bug in user code");
            Ok(r.clone())
        }))
        .sink(
            "nowhere",
            SinkDriver::new(BlackholeSink::new(), RawLinesEncoder::new()),
        )
        .offset_store(store.clone())
        .build()
        .unwrap();
    let err = pipeline.run(CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, PipelineError::Internal(_)), "{err}");
    let committed = store
        .offsets()
        .get(&PartitionId(0))
        .copied()
        .unwrap_or(Offset(0));
    assert!(
        committed <= Offset(20),
        "committed {committed}: the batch holding offset 25 never reached the sink"
    );
}
