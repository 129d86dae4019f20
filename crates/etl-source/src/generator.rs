//! A deterministic synthetic source, for tests and benchmarks.

use std::fmt::Write as _;

use async_trait::async_trait;
use bytes::{BufMut, BytesMut};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use tokio::time::{Duration, Instant};

use crate::{PollBatch, Source, SourceError, SourceEvent};

/// What a [`GeneratorSource`] produces.
#[derive(Clone, Debug)]
pub struct GeneratorConfig {
    /// The source's name, part of every record's idempotency key.
    pub name: SourceId,
    /// Number of partitions, numbered from 0.
    pub partitions: u32,
    /// Records per partition; offsets run densely from 0. `None` is
    /// unbounded.
    pub records_per_partition: Option<u64>,
    /// Records per batch (at least 1).
    pub max_batch_records: usize,
    /// Records per second over all partitions; `None` is as fast as asked.
    pub rate: Option<f64>,
    /// Varies the generated content; the same seed gives the same records.
    pub seed: u64,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        GeneratorConfig {
            name: SourceId::new("generator"),
            partitions: 1,
            records_per_partition: Some(1000),
            max_batch_records: 4096,
            rate: None,
            seed: 0,
        }
    }
}

/// Generates NDJSON records of about 100 bytes such as
/// `{"id":7,"user":"u17","amount":123.45,"ts":1700000000007,"tags":["red","new"]}`.
///
/// The record at `(partition, offset)` is a pure function of the seed,
/// partition and offset, so a replay after a seek yields the same bytes.
/// `id` is unique over partitions (`offset * partitions + partition`).
/// Partitions are served round-robin, one batch at a time; a batch's
/// values share one buffer.
#[derive(Debug)]
pub struct GeneratorSource {
    config: GeneratorConfig,
    /// Next offset per partition.
    next: Vec<u64>,
    announced: bool,
    turn: usize,
    /// Rate limiting: when the first record went out, and how many since.
    started: Option<Instant>,
    emitted: u64,
}

impl GeneratorSource {
    /// A generator with this configuration.
    ///
    /// # Errors
    ///
    /// [`SourceError::Config`] for zero partitions, zero records per batch
    /// or a rate that is not a positive number.
    pub fn new(config: GeneratorConfig) -> Result<Self, SourceError> {
        if config.partitions == 0 || config.max_batch_records == 0 {
            return Err(SourceError::Config(
                "a generator needs at least one partition and one record per batch".into(),
            ));
        }
        if let Some(rate) = config.rate
            && !(rate.is_finite() && rate > 0.0)
        {
            return Err(SourceError::Config(format!(
                "generator rate must be a positive number of records per second, got {rate}"
            )));
        }
        Ok(GeneratorSource {
            next: vec![0; config.partitions as usize],
            config,
            announced: false,
            turn: 0,
            started: None,
            emitted: 0,
        })
    }

    /// The value of the record at `(partition, offset)` for `seed`.
    #[must_use]
    pub fn value(seed: u64, partitions: u32, partition: PartitionId, offset: u64) -> String {
        let mut out = String::with_capacity(112);
        write_value(&mut out, seed, partitions, partition, offset);
        out
    }

    fn remaining(&self, index: usize) -> u64 {
        match self.config.records_per_partition {
            Some(n) => n.saturating_sub(self.next[index]),
            None => u64::MAX,
        }
    }

    fn batch(&mut self, index: usize, count: usize) -> PollBatch {
        let partition = PartitionId(index as u32);
        let first = self.next[index];
        let mut buf = BytesMut::with_capacity(count * 112);
        let mut ends = Vec::with_capacity(count);
        let mut text = String::with_capacity(112);
        for offset in first..first + count as u64 {
            text.clear();
            write_value(
                &mut text,
                self.config.seed,
                self.config.partitions,
                partition,
                offset,
            );
            buf.put_slice(text.as_bytes());
            ends.push(buf.len());
        }
        let buf = buf.freeze();
        let mut start = 0;
        let records = ends
            .into_iter()
            .zip(first..)
            .map(|(end, offset)| {
                let value = buf.slice(start..end);
                start = end;
                let position =
                    Position::new(self.config.name.clone(), partition, Offset(offset as i64));
                Record::new(position, value)
            })
            .collect();
        self.next[index] = first + count as u64;
        PollBatch::from_records(partition, records)
    }
}

fn mix(mut z: u64) -> u64 {
    // splitmix64: cheap, well distributed, and stable across platforms.
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn write_value(out: &mut String, seed: u64, partitions: u32, partition: PartitionId, offset: u64) {
    const TAGS: [&str; 6] = ["red", "green", "blue", "new", "sale", "vip"];
    let h = mix(seed ^ mix(u64::from(partition.0) << 40 ^ offset));
    let id = offset * u64::from(partitions) + u64::from(partition.0);
    let user = h % 1000;
    let cents = (h >> 10) % 100_000;
    let ts = 1_700_000_000_000u64 + id;
    let tag1 = TAGS[((h >> 30) % 6) as usize];
    let tag2 = TAGS[((h >> 40) % 6) as usize];
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        r#"{{"id":{id},"user":"u{user}","amount":{}.{:02},"ts":{ts},"tags":["{tag1}","{tag2}"]}}"#,
        cents / 100,
        cents % 100
    );
}

#[async_trait]
impl Source for GeneratorSource {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        if !self.announced {
            self.announced = true;
            let all = (0..self.config.partitions).map(PartitionId).collect();
            return Ok(SourceEvent::Assigned(all));
        }
        let n = self.next.len();
        let Some(index) = (0..n)
            .map(|k| (self.turn + k) % n)
            .find(|&i| self.remaining(i) > 0)
        else {
            return Ok(SourceEvent::End);
        };
        let count = (self.config.max_batch_records as u64).min(self.remaining(index)) as usize;
        if let Some(rate) = self.config.rate {
            let started = *self.started.get_or_insert_with(Instant::now);
            // The batch may go out once the records before it are due.
            // Nothing changes before the sleep completes, so dropping this
            // future loses nothing.
            let due = started + Duration::from_secs_f64(self.emitted as f64 / rate);
            tokio::time::sleep_until(due).await;
        }
        self.turn = (index + 1) % n;
        self.emitted += count as u64;
        Ok(SourceEvent::Batch(self.batch(index, count)))
    }

    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError> {
        let slot = self
            .next
            .get_mut(partition.0 as usize)
            .ok_or(SourceError::UnknownPartition { partition })?;
        *slot = offset.0.max(0) as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn drain(source: &mut GeneratorSource) -> Vec<Record> {
        let mut out = Vec::new();
        loop {
            match source.next().await.unwrap() {
                SourceEvent::Batch(b) => {
                    assert_eq!(b.check(), Ok(()));
                    out.extend(b.records);
                }
                SourceEvent::End => return out,
                SourceEvent::Assigned(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn produces_every_offset_of_every_partition_once_as_json() {
        let mut source = GeneratorSource::new(GeneratorConfig {
            partitions: 3,
            records_per_partition: Some(10),
            max_batch_records: 4,
            ..GeneratorConfig::default()
        })
        .unwrap();
        assert!(matches!(source.next().await.unwrap(), SourceEvent::Assigned(p) if p.len() == 3));
        let records = drain(&mut source).await;
        assert_eq!(records.len(), 30);
        let mut ids: Vec<u64> = records
            .iter()
            .map(|r| {
                let v: serde_json::Value = serde_json::from_slice(&r.value).unwrap();
                assert!((60..=120).contains(&r.value.len()), "{}", r.value.len());
                v["id"].as_u64().unwrap()
            })
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..30).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_seek_replays_the_same_bytes() {
        let config = GeneratorConfig {
            records_per_partition: Some(20),
            max_batch_records: 7,
            seed: 9,
            ..GeneratorConfig::default()
        };
        let mut source = GeneratorSource::new(config).unwrap();
        let first = drain(&mut source).await;
        source.seek(PartitionId(0), Offset(5)).await.unwrap();
        let again = drain(&mut source).await;
        assert_eq!(&first[5..], &again[..]);
        assert!(source.seek(PartitionId(1), Offset(0)).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_spaces_batches_out() {
        let mut source = GeneratorSource::new(GeneratorConfig {
            records_per_partition: Some(100),
            max_batch_records: 10,
            rate: Some(100.0),
            ..GeneratorConfig::default()
        })
        .unwrap();
        let start = Instant::now();
        let records = drain(&mut source).await;
        assert_eq!(records.len(), 100);
        // 90 records were emitted before the last batch: 0.9 s of virtual time.
        assert_eq!(start.elapsed(), Duration::from_millis(900));
    }

    #[test]
    fn rejects_an_empty_configuration() {
        let bad = GeneratorConfig {
            partitions: 0,
            ..GeneratorConfig::default()
        };
        assert!(matches!(
            GeneratorSource::new(bad),
            Err(SourceError::Config(_))
        ));
        let bad = GeneratorConfig {
            rate: Some(0.0),
            ..GeneratorConfig::default()
        };
        assert!(GeneratorSource::new(bad).is_err());
    }
}
