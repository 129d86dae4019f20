//! Runs the `memory_log` example through the driver and a real
//! checkpointer, so the example in `docs/writing-a-source.md` stays true.
#![allow(clippy::unwrap_used)]

#[allow(
    dead_code,
    unreachable_pub,
    reason = "the example is a binary; `main` is not called here"
)]
#[path = "../../examples/memory_log.rs"]
mod example;

use etl_record::{Offset, PartitionId};

#[tokio::test]
async fn the_example_source_delivers_and_commits_every_partition() {
    let committed = example::run(3, 50).await.unwrap();
    let expected: Vec<(PartitionId, Offset)> =
        (0..3).map(|p| (PartitionId(p), Offset(50))).collect();
    assert_eq!(committed.into_iter().collect::<Vec<_>>(), expected);
}
