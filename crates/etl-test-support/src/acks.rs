//! [`AckedBatches`]: batches opened on a real acknowledgement channel, the
//! way a source driver opens them, for testing what a sink does with them.
//!
//! A sink under test takes the batches; the test then reads what became
//! of each one (delivered or failed) from the channel's other end.

use std::time::Duration;

use etl_ack::{AckEvent, AckMsg, AckReceiver, AckStatus, Acked, Acker, BatchId, BatchMeta};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};

/// How long [`AckedBatches::next_resolution`] waits: a guard against a
/// test hanging, far above what any resolution takes.
const PATIENCE: Duration = Duration::from_secs(20);

/// Record `offset` of `partition` from source `in`, its value
/// `{"p":P,"o":O}`.
#[must_use]
pub fn record(partition: u32, offset: i64) -> Record {
    Record::new(
        Position::new(SourceId::new("in"), PartitionId(partition), Offset(offset)),
        format!("{{\"p\":{partition},\"o\":{offset}}}"),
    )
}

/// `(delivered, failed)`: how many of `msgs` resolved each way.
#[must_use]
pub fn tally(msgs: &[AckMsg]) -> (usize, usize) {
    let delivered = msgs
        .iter()
        .filter(|m| m.status == AckStatus::Delivered)
        .count();
    (delivered, msgs.len() - delivered)
}

/// Opens batches the way a source driver does (epoch 1, one sequence
/// number after another) and collects their resolutions.
#[derive(Debug)]
pub struct AckedBatches {
    acker: Acker,
    receiver: AckReceiver,
    seq: u64,
}

impl Default for AckedBatches {
    fn default() -> Self {
        Self::new()
    }
}

impl AckedBatches {
    /// A fresh acknowledgement channel with no batch open.
    #[must_use]
    pub fn new() -> Self {
        let (acker, receiver) = etl_ack::channel();
        AckedBatches {
            acker,
            receiver,
            seq: 0,
        }
    }

    /// One batch of `partition` covering `offsets`, each record made by
    /// [`record`].
    ///
    /// # Panics
    ///
    /// If the channel's receiver is gone (it lives as long as `self`).
    pub fn batch(&mut self, partition: u32, offsets: std::ops::Range<i64>) -> Acked<Vec<Record>> {
        self.batch_of(offsets.map(|o| record(partition, o)).collect())
    }

    /// One batch of the given records, all of one partition (the first
    /// record's; partition 0 when there is none).
    ///
    /// # Panics
    ///
    /// If the channel's receiver is gone (it lives as long as `self`), or
    /// the batch holds more than `u32::MAX` records.
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
                records: u32::try_from(records.len()).expect("a batch under u32::MAX records"),
                bytes: records.iter().map(|r| r.byte_len() as u64).sum(),
            })
            .expect("the receiver lives as long as the batches' opener");
        Acked::new(records, ack)
    }

    /// Every resolution received so far, without waiting.
    pub fn resolutions(&mut self) -> Vec<AckMsg> {
        let mut out = Vec::new();
        while let Ok(event) = self.receiver.try_next() {
            if let AckEvent::Resolved(msg) = event {
                out.push(msg);
            }
        }
        out
    }

    /// The next resolution, waiting up to a generous guard (20 s); `None`
    /// if none came by then.
    pub fn next_resolution(&mut self) -> Option<AckMsg> {
        loop {
            match self.receiver.next_timeout(PATIENCE) {
                Ok(AckEvent::Resolved(msg)) => return Some(msg),
                Ok(AckEvent::Opened(_)) => {}
                Err(_) => return None,
            }
        }
    }

    /// [`tally`] of the resolutions received so far (which are consumed).
    pub fn tally(&mut self) -> (usize, usize) {
        tally(&self.resolutions())
    }
}
