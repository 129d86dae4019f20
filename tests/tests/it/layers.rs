//! End-to-end check that the two lowest layers work together from outside:
//! opening, cloning, folding and resolving handles through the public API.

use etl_ack::{AckEvent, AckSet, AckStatus, BatchId, BatchMeta};
use etl_record::{Offset, PartitionId};

#[test]
fn a_torn_down_sink_batch_fails_and_a_written_one_delivers() {
    let (acker, mut rx) = etl_ack::channel();
    let open = |seq| {
        acker
            .open(BatchMeta {
                id: BatchId {
                    partition: PartitionId(0),
                    epoch: 1,
                    seq,
                },
                first_offset: Offset(seq as i64 * 100),
                last_offset: Offset(seq as i64 * 100 + 99),
                records: 100,
                bytes: 1000,
            })
            .unwrap()
    };
    let (a, b) = (open(0), open(1));
    let written: AckSet = std::iter::repeat_n(a, 100).collect();
    let torn: AckSet = std::iter::repeat_n(b, 100).collect();
    written.deliver();
    drop(torn);
    let mut resolved = Vec::new();
    while let Ok(ev) = rx.try_next() {
        if let AckEvent::Resolved(msg) = ev {
            resolved.push((msg.id.seq, msg.status));
        }
    }
    resolved.sort();
    assert_eq!(
        resolved,
        vec![(0, AckStatus::Delivered), (1, AckStatus::Failed)]
    );
}
