//! Shared helpers of the integration tests: a scripted source of acked
//! batches and a way to read what became of them.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use etl_ack::{AckEvent, AckMsg, AckReceiver, AckStatus, Acked, Acker, BatchId, BatchMeta};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};

/// Opens batches the way a source driver does and collects resolutions.
#[derive(Debug)]
pub struct TestSource {
    acker: Acker,
    receiver: AckReceiver,
    seq: u64,
}

pub fn record(partition: u32, offset: i64) -> Record {
    Record::new(
        Position::new(SourceId::new("in"), PartitionId(partition), Offset(offset)),
        format!("{{\"p\":{partition},\"o\":{offset}}}"),
    )
}

impl TestSource {
    pub fn new() -> Self {
        let (acker, receiver) = etl_ack::channel();
        TestSource {
            acker,
            receiver,
            seq: 0,
        }
    }

    /// One poll batch of `partition` covering `offsets`, with JSON values.
    pub fn batch(&mut self, partition: u32, offsets: std::ops::Range<i64>) -> Acked<Vec<Record>> {
        let records: Vec<Record> = offsets.clone().map(|o| record(partition, o)).collect();
        self.batch_of(records)
    }

    /// One poll batch of the given records (all of one partition).
    pub fn batch_of(&mut self, records: Vec<Record>) -> Acked<Vec<Record>> {
        let first = records.first().map_or(0, |r| r.position.offset.0);
        let last = records.last().map_or(0, |r| r.position.offset.0);
        let partition = records
            .first()
            .map_or(PartitionId(0), |r| r.position.partition);
        let id = BatchId {
            partition,
            epoch: 1,
            seq: self.seq,
        };
        self.seq += 1;
        let ack = self
            .acker
            .open(BatchMeta {
                id,
                first_offset: Offset(first),
                last_offset: Offset(last),
                records: u32::try_from(records.len()).unwrap(),
                bytes: records.iter().map(|r| r.byte_len() as u64).sum(),
            })
            .expect("receiver alive");
        Acked::new(records, ack)
    }

    /// Every resolution received so far.
    pub fn resolutions(&mut self) -> Vec<AckMsg> {
        let mut out = Vec::new();
        while let Ok(event) = self.receiver.try_next() {
            if let AckEvent::Resolved(msg) = event {
                out.push(msg);
            }
        }
        out
    }

    /// The next event, waiting up to a generous failure guard.
    pub fn next_resolution(&mut self) -> Option<AckMsg> {
        loop {
            match self
                .receiver
                .next_timeout(std::time::Duration::from_secs(20))
            {
                Ok(AckEvent::Resolved(msg)) => return Some(msg),
                Ok(AckEvent::Opened(_)) => {}
                Err(_) => return None,
            }
        }
    }
}

/// `(delivered, failed)` counts.
pub fn tally(msgs: &[AckMsg]) -> (usize, usize) {
    let delivered = msgs
        .iter()
        .filter(|m| m.status == AckStatus::Delivered)
        .count();
    (delivered, msgs.len() - delivered)
}
